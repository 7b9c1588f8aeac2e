"""Every benchmark's figures beside their targets, in one table: what ``make bench`` prints at its end.

Reads the ``bench_*.json`` files a run of the benchmarks wrote (``--out``, default ``$BENCH_OUT`` or
``results/bench``): the ``targets`` each recorded (:func:`_bench.target`), the machine's load average when it
finished (timings on a loaded machine read slow and scatter), and when it ran. A benchmark that records no target
is listed by name with the figures it prints itself. Exits 0 whether or not the targets are met: a benchmark
measures, it does not pass or fail; the table says which targets a run missed.

    python benchmarks/summary.py --out results/bench
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def number(value: float | None, unit: str) -> str:
    """A figure as the table prints it: ratios to two decimals with ``x``, percentages whole, seconds to 0.01 s."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{100 * value:.0f}%"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.3g}"


def rows(folder: Path) -> tuple[list[list[str]], list[str], list[str]]:
    """The table's rows (benchmark, figure, measured, target, met, peers, load at its end), the benchmarks that
    record no target, and the files that could not be read."""
    table, untargeted, unreadable = [], [], []
    for path in sorted(folder.glob("bench_*.json")):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            unreadable.append(f"{path.name} ({error})")
            continue
        name = meta.get("benchmark", path.stem)
        load = meta.get("loadavg_end")
        load_text = f"{load[0]:.1f}/{meta.get('cpu_count') or os.cpu_count()}" if load else "–"
        targets = meta.get("targets") or []
        if not targets:
            untargeted.append(name)
        for t in targets:
            limit = "–" if t.get("limit") is None else f"{t['sense']} {number(t['limit'], t['unit'])}"
            met = {True: "meets", False: "MISSES", None: "–"}[t.get("met")]
            table.append([name, t["figure"], number(t["measured"], t["unit"]), limit, met, t.get("peers") or "",
                          load_text])
    return table, untargeted, unreadable


def render(table: list[list[str]]) -> str:
    header = ["benchmark", "figure", "measured", "target", "", "peers (same run)", "load"]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    line = lambda row: "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, table)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT") or REPO / "results" / "bench"),
                        help="the folder the benchmarks wrote (default: $BENCH_OUT, else results/bench)")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        print(f"error: {args.out} is not a folder of benchmark results; run `make bench` (or a benchmarks/bench_*.py "
              "with --out) first", file=sys.stderr)
        return 2
    table, untargeted, unreadable = rows(args.out)
    if table:
        print(render(table))
        missed = [row for row in table if row[4] == "MISSES"]
        judged = [row for row in table if row[4] != "–"]
        print(f"\n{len(judged) - len(missed)} of {len(judged)} targets met"
              + (f"; missed: {'; '.join(f'{r[0]}: {r[1]}' for r in missed)}" if missed else "")
              + " (load: the 1-minute load average when the benchmark ended, over the CPUs; timings under load read "
                "slow)")
    else:
        print(f"no benchmark in {args.out} recorded a target")
    if untargeted:
        print("figures without a target (each benchmark prints its own): " + ", ".join(untargeted))
    for entry in unreadable:
        print(f"could not read {entry}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
