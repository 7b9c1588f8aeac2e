"""Benchmark: the misalignment resampler's draws, kept draws, and its two ways of summing a resample (``make bench``).

At the sweep's pool sizes and budgets (two pools of ``--pool`` rows each, ``--trials`` resamples a budget, the
sweep's default 20,000) it times, for each (M, K):

* ``first_s``: a first call (the index sets drawn), and ``cached_s``: the same call again (the kept draws reused);
  ``draw_share`` = 1 - cached / first, the share of a first call spent drawing;
* ``gather_s`` and ``matmul_s``: the cached call with every resample summed by gathering its M x K block of C and
  by the product of its 0/1 indicators with C; ``chosen`` is the way the resampler keeps after the race of its first
  call (blocks of ``M K`` under 512 are always gathered), and ``chosen_over_best`` its time over the faster one's
  (target: at most 1.2);
* ``same_p_hat``: whether both ways count the same misaligned resamples (target: always), and ``same_bits`` whether
  they give the same statistics bit for bit (the resampler's claim where it races them).

Timing: best of ``--repeats`` rounds (each the mean of calls over at least 0.2 s), ways interleaved, torch on ``--threads`` threads (default 1, a sweep
worker's). ``--quick``: one pool size of 256, 2,000 resamples, 3 rounds (seconds, for CI).

    python benchmarks/bench_misalignment.py [--out results/bench] [--pools 256 1024] [--trials 20000] [--quick]

Writes ``<out>/bench_misalignment.csv`` and ``.json`` atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

from benchmarks._bench import parser, save, target  # noqa: E402

BUDGETS = ((4, 4), (16, 16), (32, 32), (64, 64), (128, 128))  # the sweep's (dalign_repro.sweep.family)
CHOSEN_TARGET = 1.2


def _per_call(function, least_s: float = 0.2) -> float:
    """Mean seconds a call over consecutive calls lasting at least ``least_s`` (short calls are noise alone)."""
    calls, start = 0, time.perf_counter()
    while True:
        function()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= least_s:
            return elapsed / calls


def _best(function, repeats: int) -> float:
    return min(_per_call(function) for _ in range(repeats))


def time_budget(C, M: int, K: int, trials: int, repeats: int, seed: int) -> dict:
    """One budget on the cross-Gram ``C``: first and cached calls, both ways of summing, the statistics of each."""
    import numpy as np
    import torch

    from dalign_core.geometry import misalignment

    n1, n2 = C.shape
    misalignment.clear_index_cache()
    misalignment._fastest_way.clear()
    start = time.perf_counter()
    misalignment.resample_alignment(C, M, K, trials, seed=seed)
    first = time.perf_counter() - start
    cached = _best(lambda: misalignment.resample_alignment(C, M, K, trials, seed=seed), repeats)
    key = (n1, n2, M, K)
    raced = key in misalignment._fastest_way  # else a small block (only ever gathered) or too few resamples to race
    chosen = "matmul" if misalignment._fastest_way.get(key) == "product" else "gather"
    rows, cols = misalignment._index_sets(n1, n2, M, K, trials, seed, False)
    product_way, product_chunk = misalignment._summed_blocks(C, M, K)["product"], max(1, (1 << 18) // max(n1, n2))

    def call(way: str) -> torch.Tensor:
        if raced:  # the resampler itself, made to take this way
            misalignment._fastest_way[key] = "product" if way == "matmul" else "gather"
        elif way == "matmul":  # the indicator product, called directly where the resampler never takes it
            out = np.empty(trials)
            for begin in range(0, trials, product_chunk):
                end = min(trials, begin + product_chunk)
                product_way(rows[begin:end], cols[begin:end], out[begin:end])
            return torch.from_numpy(out)
        return misalignment.resample_alignment(C, M, K, trials, seed=seed)

    stats, seconds = {}, {"gather": float("inf"), "matmul": float("inf")}
    for _ in range(repeats):  # the two ways interleaved
        for way in ("gather", "matmul"):
            stats[way] = call(way)
            seconds[way] = min(seconds[way], _per_call(lambda: call(way)))
    seconds[chosen] = min(seconds[chosen], cached)  # the cached calls took the chosen way too
    misaligned = {way: int((value <= 0).sum()) for way, value in stats.items()}
    return {
        "pool": n1, "M": M, "K": K, "trials": trials, "first_s": first, "cached_s": cached,
        "draw_share": max(0.0, 1.0 - cached / first), "gather_s": seconds["gather"], "matmul_s": seconds["matmul"],
        "chosen": chosen, "chosen_over_best": seconds[chosen] / min(seconds.values()),
        "same_p_hat": misaligned["gather"] == misaligned["matmul"], "misaligned": misaligned["gather"],
        "same_bits": bool(torch.equal(stats["gather"], stats["matmul"])), "raced": raced,
        "max_abs_difference": float((stats["gather"] - stats["matmul"]).abs().max()),
    }


def main(argv=None) -> None:
    made = parser(__doc__.splitlines()[0], repeats=2)
    made.add_argument("--pools", type=int, nargs="+", help="rows in each pool (default 256 1024; --quick: 256)")
    made.add_argument("--trials", type=int, help="resamples a budget (default 20,000, the sweep's; --quick: 2,000)")
    made.add_argument("--dim", type=int, default=128, help="dimension of the random q rows")
    made.add_argument("--quick", action="store_true", help="pool 256, 2,000 resamples, 3 rounds unless given otherwise (seconds, for CI)")
    args = made.parse_args(argv)
    args.pools = args.pools or ([256] if args.quick else [256, 1024])
    args.trials = args.trials or (2_000 if args.quick else 20_000)
    if args.quick:
        args.repeats = 3

    import torch

    from dalign_core.geometry.misalignment import MATMUL_MIN_BLOCK, RACE_ROUNDS, cross_gram

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    records = []
    for pool in args.pools:
        generator = torch.Generator().manual_seed(args.seed)
        train = torch.randn(pool, args.dim, generator=generator) + 0.02
        test = torch.randn(pool, args.dim, generator=generator) + 0.02
        C = cross_gram(train, test)
        for M, K in BUDGETS:
            if 4 * (M + K) > 2 * pool:
                continue
            row = time_budget(C, M, K, args.trials, args.repeats, args.seed)
            records.append(row)
            print(f"pool {pool:>5} M={M:>3} K={K:>3}: first {row['first_s']:6.2f} s, cached {row['cached_s']:6.3f} s "
                  f"(drawing {100 * row['draw_share']:.0f}% of a first call); gather {row['gather_s']:.3f} s, "
                  f"matmul {row['matmul_s']:.3f} s; chosen {row['chosen']} at {row['chosen_over_best']:.2f}x the "
                  f"faster (target <= {CHOSEN_TARGET}); same p̂ {row['same_p_hat']} (target True)"
                  + (f", same bits {row['same_bits']}" if row["raced"] else ""), flush=True)
    worst = max(row["chosen_over_best"] for row in records)
    print(f"\nworst chosen way over the faster: {worst:.2f}x (target <= {CHOSEN_TARGET}); p̂ the same in "
          f"{sum(row['same_p_hat'] for row in records)} of {len(records)} budgets (target: all)")
    same = sum(row["same_p_hat"] for row in records)
    targets = [target("chosen resampling way / the faster way (worst budget)", worst, CHOSEN_TARGET),
               target(f"budgets with the same p̂ both ways (of {len(records)})", same, len(records), unit="",
                      at_least=True),
               target("drawing's share of a first call (worst budget)",
                      max(row["draw_share"] for row in records), None, unit="%")]
    save(args.out, "bench_misalignment", records, started, targets=targets, threads=args.threads, trials=args.trials,
         pools=args.pools, dim=args.dim, race_rounds=RACE_ROUNDS, matmul_min_block=MATMUL_MIN_BLOCK, quick=args.quick,
         worst_chosen_over_best=worst, chosen_target=CHOSEN_TARGET)


if __name__ == "__main__":
    main()
