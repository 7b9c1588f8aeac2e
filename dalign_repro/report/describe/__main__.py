"""``python -m dalign_repro.report.describe results/gpu``: the plain-text summary of every width sweep in a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from dalign_repro.report.describe.summary import summarize

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Summarize the width sweeps in a results folder.")
    parser.add_argument("results_dir", type=Path, help="e.g. results/gpu")
    print(summarize(parser.parse_args().results_dir))
