"""Benchmark: Gram U-statistics (``estimate_geometry``) against the covariance-forming plug-in.

For d in {1k, 16k, 256k} and n in {256, 1024, 4096} it times each estimator on
random float32 rows and records the peak memory it adds on top of the rows
themselves. Each case runs in its own process so that peaks do not mix: on the
CPU the peak is the growth of the process's maximum resident set size after Q is
allocated; on a GPU it is ``torch.cuda.max_memory_allocated`` above Q. The plug-in
runs only where its d x d covariance (and one temporary of that size) fits in the
memory budget; the table says so where it does not.

    python benchmarks/bench_estimators.py --out results/bench [--dims 1024 16384] [--ns 256 1024]

Writes ``<out>/bench_estimators.csv`` and ``<out>/bench_estimators.json`` (provenance).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dalign_core.geometry import rows  # noqa: E402
from dalign_repro.config import ExperimentConfig  # noqa: E402
from dalign_core.geometry.estimators import estimate_geometry, plugin_geometry  # noqa: E402
from dalign_repro.report.results import write_table  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchConfig(ExperimentConfig):
    """What the estimator benchmark measured (recorded in its provenance)."""

    profile: str = "cpu"
    seed: int = 0
    dims: tuple[int, ...] = (1024, 16384, 262144)
    ns: tuple[int, ...] = (256, 1024, 4096)
    memory_budget_gb: float = 0.0
    device: str = "cpu"


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run_case(method: str, n: int, d: int, device: str, seed: int) -> dict:
    """One timed estimate in this process; returns wall time and peak extra memory in bytes."""
    generator = torch.Generator(device=device).manual_seed(seed)
    Q = torch.randn(n, d, generator=generator, device=device).add_(0.05)  # in place: no second n x d buffer
    estimate = estimate_geometry if method == "u-statistic" else plugin_geometry
    estimate(Q[:8, :8])  # warm up kernels outside the timed region
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    start = time.perf_counter()
    geometry = estimate(Q)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else _rss_bytes()) - base
    return {"wall_s": wall, "peak_extra_bytes": max(peak, 0), "d_align": geometry.d_align}


def plugin_bytes(n: int, d: int) -> int:
    """Memory the plug-in needs: the float64 covariance, one temporary of its size, and Q in float64."""
    return 2 * 8 * d * d + 8 * n * d


def u_statistic_bytes(n: int) -> int:
    """Memory the U-statistics need beside Q: the Gram matrix and three n x n temporaries, two float64 column slices."""
    return 4 * 8 * n * n + 2 * 8 * rows._COLUMN_ELEMENTS


def available_bytes(device: str) -> int:
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    parser.add_argument("--dims", type=int, nargs="+", default=list(BenchConfig.dims))
    parser.add_argument("--ns", type=int, nargs="+", default=list(BenchConfig.ns))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-fraction", type=float, default=0.5, help="share of free memory the plug-in may use")
    parser.add_argument("--case", nargs=3, metavar=("METHOD", "N", "D"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.case:  # child process: run one case and print its JSON
        method, n, d = args.case[0], int(args.case[1]), int(args.case[2])
        print(json.dumps(run_case(method, n, d, args.device, seed=0)))
        return

    budget = int(args.memory_fraction * available_bytes(args.device))
    config = BenchConfig(
        profile="paper" if args.device == "cuda" else "cpu", dims=tuple(args.dims), ns=tuple(args.ns),
        memory_budget_gb=round(budget / 2**30, 2), device=args.device,
    )
    rows = []
    started = time.perf_counter()
    for d in args.dims:
        for n in args.ns:
            q_bytes = 4 * n * d
            for method in ("u-statistic", "plug-in"):
                row = {"method": method, "n": n, "d": d, "device": args.device, "q_gb": q_bytes / 2**30}
                needed = q_bytes + (plugin_bytes(n, d) if method == "plug-in" else u_statistic_bytes(n))
                if needed > budget:
                    row.update(status=f"skipped: needs {needed / 2**30:.1f} GiB, budget {budget / 2**30:.1f} GiB")
                    rows.append(row)
                    print(f"{method:>11}  n={n:>5}  d={d:>7}  {row['status']}", flush=True)
                    continue
                command = [sys.executable, __file__, "--device", args.device, "--case", method, str(n), str(d)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    row.update(status=f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}")
                else:
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    row.update(status="ok", wall_s=result["wall_s"], peak_extra_gb=result["peak_extra_bytes"] / 2**30,
                               d_align=result["d_align"])
                rows.append(row)
                shown = f"{row.get('wall_s', float('nan')):8.2f} s  peak +{row.get('peak_extra_gb', float('nan')):6.2f} GiB"
                print(f"{method:>11}  n={n:>5}  d={d:>7}  {shown}  {row['status']}", flush=True)

    table = pd.DataFrame(rows)
    wide = table.pivot_table(index=["d", "n"], columns="method", values="wall_s", aggfunc="first")
    if {"u-statistic", "plug-in"} <= set(wide.columns):
        wide["plug-in / u-statistic"] = wide["plug-in"] / wide["u-statistic"]
    print("\nwall time (s); empty = not run (see status):")
    print(wide.to_string(float_format=lambda v: f"{v:.3g}"))
    path = write_table(table, args.out, "bench_estimators", config, time.perf_counter() - started)
    print(f"\nwrote {path} and its provenance")


if __name__ == "__main__":
    main()
