"""Benchmark: the Gram U-statistics (``estimate_geometry``) at the float32 kernel's limit, and their memory.

**The Gram against its floor.** At n x d = 1,024 x 16,384 and 4,096 x 16,384 (``--shapes``) on near-zero-mean
float32 rows (``||mu||^2 = tr(Sigma) / 1000``, where trained models' gradients sit), on ``--threads`` threads
(default 1), it times a plain float32 ``Q @ Q.T`` of the same rows, ``estimate_geometry(Q)`` (the default:
float32 symmetric products summed in float64 there) and ``estimate_geometry(Q, precision="float64")`` (the
float64 product every estimate used before), interleaved, best of ``--repeats`` rounds. It prints each
figure beside its target:

* ``estimate_over_floor`` = estimate / (Q @ Q.T): target at most 1.3;
* ``worst_se``: the largest difference of a moment or dimension from the float64 result, in units of that
  result's own jackknife standard error: target at most 0.01.

**Memory.** For d in ``--dims`` and n in ``--ns`` it times each estimator, U-statistics and the covariance-
forming plug-in, each case in its own process, and records the peak memory it adds on top of the rows (on
the CPU the growth of the maximum resident set after Q is allocated; on a GPU ``max_memory_allocated`` above
Q). Cases whose work (n^2 d, or d^2 n for the plug-in) exceeds ``--max-work`` or whose memory exceeds the
budget are listed as skipped.

``--quick`` (for CI, about a minute): the 1,024 x 16,384 target in one round, and a small memory table.

    python benchmarks/bench_estimators.py [--out results/bench] [--quick] [--shapes 1024x16384 4096x16384]

Writes ``<out>/bench_estimators.csv`` (memory), ``<out>/bench_estimators_gram.csv`` (the targets) and their
``.json`` provenance, atomically.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

from benchmarks._bench import parser, save, target  # noqa: E402

FLOOR_TARGET = 1.3
ACCURACY_TARGET = 0.01
MEAN_RATIO = 1e-3  # ||mu||^2 / tr(Sigma) of the timed rows


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def near_zero_mean_rows(n: int, d: int, seed: int, device: str = "cpu"):
    """float32 rows ``z + mu`` with z standard normal and ``||mu||^2 = MEAN_RATIO * d`` (each entry sqrt(ratio))."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, d, generator=generator, device=device).add_(math.sqrt(MEAN_RATIO))  # in place: one buffer


def time_gram(n: int, d: int, repeats: int, seed: int, device: str) -> dict:
    """One shape: Q @ Q.T, the default estimate and the float64 estimate, interleaved; and the accuracy."""
    import torch

    from dalign_core.geometry.estimators import estimate_geometry
    from dalign_core.geometry.ustatistics import DIMENSIONS, MOMENTS

    Q = near_zero_mean_rows(n, d, seed, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(function):
        sync()
        start = time.perf_counter()
        value = function()
        sync()
        return time.perf_counter() - start, value

    estimate_geometry(Q[:64, :64])  # warm-up outside the timed region
    best = {"floor": math.inf, "estimate": math.inf, "float64": math.inf}
    results = {}
    for _ in range(repeats):
        for name, function in (("floor", lambda: Q @ Q.T), ("estimate", lambda: estimate_geometry(Q)),
                               ("float64", lambda: estimate_geometry(Q, precision="float64"))):
            seconds, results[name] = timed(function)
            best[name] = min(best[name], seconds)
    got, want = results["estimate"], results["float64"]
    differences = {name: abs(getattr(got, name) - getattr(want, name)) / want.intervals[name].se
                   for name in MOMENTS + DIMENSIONS}
    worst = max(differences, key=differences.get)
    return {
        "n": n, "d": d, "device": device, "floor_s": best["floor"], "estimate_s": best["estimate"],
        "float64_s": best["float64"], "estimate_over_floor": best["estimate"] / best["floor"],
        "float64_over_floor": best["float64"] / best["floor"], "worst_se": differences[worst], "worst_moment": worst,
        "d_align": got.d_align, "d_align_float64": want.d_align,
    }


def run_case(method: str, n: int, d: int, device: str, seed: int) -> dict:
    """One timed estimate in this process; returns wall time and peak extra memory in bytes."""
    import torch

    from dalign_core.geometry.estimators import estimate_geometry, plugin_geometry

    Q = near_zero_mean_rows(n, d, seed, device)
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
    from dalign_core.geometry import rows

    return 4 * 8 * n * n + 2 * 8 * rows._COLUMN_ELEMENTS


def available_bytes(device: str) -> int:
    import torch

    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_table(args) -> list[dict]:
    budget = int(args.memory_fraction * available_bytes(args.device))
    records = []
    for d in args.dims:
        for n in args.ns:
            q_bytes = 4 * n * d
            for method in ("u-statistic", "plug-in"):
                row = {"method": method, "n": n, "d": d, "device": args.device, "q_gb": q_bytes / 2**30}
                needed = q_bytes + (plugin_bytes(n, d) if method == "plug-in" else u_statistic_bytes(n))
                work = float(d) * d * n if method == "plug-in" else float(n) * n * d
                if needed > budget:
                    row["status"] = f"skipped: needs {needed / 2**30:.1f} GiB, budget {budget / 2**30:.1f} GiB"
                elif work > args.max_work:
                    row["status"] = f"skipped: work {work:.2g} beyond --max-work {args.max_work:.2g}"
                else:
                    command = [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads),
                               "--case", method, str(n), str(d)]
                    done = subprocess.run(command, capture_output=True, text=True)
                    if done.returncode != 0:
                        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode
                        row["status"] = f"failed: {last}"
                    else:
                        result = json.loads(done.stdout.strip().splitlines()[-1])
                        row.update(status="ok", wall_s=result["wall_s"],
                                   peak_extra_gb=result["peak_extra_bytes"] / 2**30, d_align=result["d_align"])
                records.append(row)
                shown = (f"{row['wall_s']:8.2f} s  peak +{row['peak_extra_gb']:6.2f} GiB" if row["status"] == "ok"
                         else row["status"])
                print(f"{method:>11}  n={n:>5}  d={d:>7}  {shown}", flush=True)
    return records


def _shape(text: str) -> tuple[int, int]:
    try:
        n, d = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes takes NxD pairs such as 1024x16384, got {text!r}") from None
    return n, d


def main(argv=None) -> None:
    import torch

    made = parser(__doc__.splitlines()[0], repeats=2)
    made.add_argument("--shapes", nargs="+", type=_shape,
                      help="n x d shapes of the Gram targets (default 1024x16384 4096x16384; --quick: the first)")
    made.add_argument("--dims", type=int, nargs="+", help="d of the memory table (default 1024 16384 262144)")
    made.add_argument("--ns", type=int, nargs="+", help="n of the memory table (default 256 1024 4096)")
    made.add_argument("--max-work", type=float, default=2.0**36,
                      help="largest n^2 d (d^2 n for the plug-in) the memory table runs (default 2^36)")
    made.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    made.add_argument("--memory-fraction", type=float, default=0.5, help="share of free memory a case may use")
    made.add_argument("--quick", action="store_true",
                      help="1,024 x 16,384 in one round and a small memory table, unless given otherwise (CI)")
    made.add_argument("--case", nargs=3, metavar=("METHOD", "N", "D"), help=argparse_suppress())
    args = made.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.case:  # child process: run one case and print its JSON
        method, n, d = args.case[0], int(args.case[1]), int(args.case[2])
        print(json.dumps(run_case(method, n, d, args.device, seed=args.seed)))
        return
    quick = {"shapes": [(1024, 16384)], "dims": [1024, 4096], "ns": [256, 1024]}
    full = {"shapes": [(1024, 16384), (4096, 16384)], "dims": [1024, 16384, 262144], "ns": [256, 1024, 4096]}
    for name, default in (quick if args.quick else full).items():  # what is given on the command line stays
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.quick:
        args.repeats = 1

    started = time.perf_counter()
    gram = []
    for n, d in args.shapes:
        row = time_gram(n, d, args.repeats, args.seed, args.device)
        gram.append(row)
        print(f"Gram {n:>5} x {d:>6}: Q @ Q.T {row['floor_s']:.2f} s; estimate_geometry {row['estimate_s']:.2f} s = "
              f"{row['estimate_over_floor']:.2f}x (target <= {FLOOR_TARGET}x); float64 path {row['float64_s']:.2f} s "
              f"= {row['float64_over_floor']:.2f}x; worst moment {row['worst_se']:.1e} SE of the float64 result "
              f"({row['worst_moment']}; target <= {ACCURACY_TARGET}); d_align {row['d_align']:.6g} "
              f"(float64 {row['d_align_float64']:.6g})", flush=True)
    settings = dict(threads=args.threads, device=args.device, mean_ratio=MEAN_RATIO, quick=args.quick,
                    floor_target=FLOOR_TARGET, accuracy_target=ACCURACY_TARGET, repeats=args.repeats)
    targets = [item for r in gram for item in (
        target(f"estimate_geometry / Q @ Q.T, {r['n']:,} x {r['d']:,}", r["estimate_over_floor"], FLOOR_TARGET,
               peers=f"Q @ Q.T {r['floor_s']:.2f} s, float64 path {r['float64_s']:.2f} s"),
        target(f"worst moment off float64 (its SEs), {r['n']:,} x {r['d']:,}", r["worst_se"], ACCURACY_TARGET,
               unit=""))]
    save(args.out, "bench_estimators_gram", gram, started, targets=targets, **settings,
         met=all(r["estimate_over_floor"] <= FLOOR_TARGET and r["worst_se"] <= ACCURACY_TARGET for r in gram))
    print()
    memory = memory_table(args)
    done = [r for r in memory if r["status"] == "ok"]
    for d in args.dims:
        for n in args.ns:
            pair = {r["method"]: r["wall_s"] for r in done if (r["n"], r["d"]) == (n, d)}
            if len(pair) == 2:
                print(f"n={n:>5} d={d:>7}: plug-in / u-statistic = {pair['plug-in'] / pair['u-statistic']:.3g}")
    save(args.out, "bench_estimators", memory, started, **settings, dims=args.dims, ns=args.ns,
         max_work=args.max_work)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
