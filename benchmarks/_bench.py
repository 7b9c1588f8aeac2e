"""What the benchmarks at a sweep's shapes share: their command line and how they save what they measured."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parser(description: str, repeats: int, sweep: str = "LLaMA") -> argparse.ArgumentParser:
    """--out, --profile (of the ``sweep``), --widths, --repeats (default ``repeats``), --threads and --seed; a
    benchmark adds its own."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT") or REPO / "results" / "bench"),
                      help="output folder (default: $BENCH_OUT, else results/bench)")
    made.add_argument("--profile", default="cpu",
                      help=f"the {sweep} sweep's profile whose shapes are timed (default cpu)")
    made.add_argument("--widths", type=int, nargs="+", help="widths to time (default: the profile's)")
    made.add_argument("--repeats", type=int, default=repeats,
                      help=f"timed rounds after the warm-up (the best is kept; default {repeats})")
    made.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a sweep worker's)")
    made.add_argument("--seed", type=int, default=0)
    return made


def target(figure: str, measured: float, limit: float | None, *, unit: str = "x", at_least: bool = False,
           peers: str = "") -> dict:
    """One figure of a benchmark beside its target, as ``benchmarks/summary.py`` prints it.

    ``measured`` is met when it is at most ``limit`` (``at_least=True``: at least ``limit``); ``limit=None`` records
    a figure that has no target (``met`` is then None, as it is when ``measured`` is not a number). ``unit``: how the
    two read (``"x"`` a ratio, ``"s"`` seconds, ``"%"`` a percentage, ``""`` a plain number); ``peers``: the same
    figure of the peers on the same run, in words (``"torch.func 0.41 s, BackPACK 0.38 s"``).
    """
    measured = float(measured)
    met = None
    if limit is not None and not math.isnan(measured):
        met = bool(measured >= limit) if at_least else bool(measured <= limit)
    return {"figure": figure, "measured": measured, "limit": limit, "sense": ">=" if at_least else "<=",
            "unit": unit, "met": met, "peers": peers}


def save(out: Path, name: str, records: list[dict], started: float, targets: list[dict] = (), **settings) -> None:
    """``out/<name>.csv`` (a row per record) and ``out/<name>.json`` (the records, ``settings``, the machine), atomically.

    ``started``: the ``time.perf_counter()`` at the benchmark's start, for its total wall time; ``targets``: the
    benchmark's figures beside their targets (:func:`target`), which ``make bench`` prints together at the end.
    """
    import pandas as pd
    import torch

    from dalign_core.atomic import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.csv", pd.DataFrame(records).to_csv(index=False))
    meta = {"benchmark": name, **settings, "targets": list(targets), "platform": platform.platform(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "records": records, "total_wall_s": round(time.perf_counter() - started, 1),
            "loadavg_end": os.getloadavg(), "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(out / f"{name}.json", json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out / f'{name}.csv'} and {name}.json")
