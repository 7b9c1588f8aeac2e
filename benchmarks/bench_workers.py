"""A whole width sweep on the CPU: one-thread workers on every core against one process of every core's threads.

Runs the smoke-profile LLaMA sweep (``python -m dalign_repro.experiments.llama_width
--profile smoke --force``) end to end, each time in a fresh process with fresh
checkpoints and results folders under a temporary directory, in two modes on a
machine of C usable cores (:func:`dalign_repro.training.workers.cores`):

* ``workers`` — ``DALIGN_WORKERS=C DALIGN_THREADS=1``: the default, C forked workers of one thread;
* ``threads`` — ``DALIGN_WORKERS=1 DALIGN_THREADS=C``: one process, torch on C threads
  (what a sweep did before, when nothing set torch's thread count);
* ``serial`` (only with ``--modes``) — ``DALIGN_WORKERS=1 DALIGN_THREADS=1``.

The modes alternate over ``--repeats`` rounds (robust to drifting load) and the best
wall time of each is reported, with the ratio ``threads / workers`` (above 1: the
workers are faster). Wall time is the whole command (start-up, data, every job,
tables); ``compute_s`` is the runner's own timing of the sweep (the provenance's
``wall_time_s``). Whether the modes' tables agree exactly is reported too: ``workers``
and ``serial`` compute on one thread and must; ``threads`` sums in another order.

Usage::

    python benchmarks/bench_workers.py                       # results/bench (or $BENCH_OUT)
    python benchmarks/bench_workers.py --repeats 3 --modes workers threads serial

Writes ``DIR/bench_workers.json`` atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

MODES = ("workers", "threads", "serial")
EXPERIMENT = "dalign_repro.experiments.llama_width"


def _settings(mode: str, cores: int) -> dict[str, str]:
    return {"workers": {"DALIGN_WORKERS": str(cores), "DALIGN_THREADS": "1"},
            "threads": {"DALIGN_WORKERS": "1", "DALIGN_THREADS": str(cores)},
            "serial": {"DALIGN_WORKERS": "1", "DALIGN_THREADS": "1"}}[mode]


def run_once(mode: str, cores: int, profile: str, root: Path, timeout: int) -> dict:
    """One sweep in a fresh process; its wall time, the runner's compute time and the provenance's threads/workers."""
    folder = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RANK",
                                                             "WORLD_SIZE")}
    env.update(_settings(mode, cores), DALIGN_CHECKPOINTS=str(folder / "checkpoints"), PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", EXPERIMENT, "--profile", profile, "--out", str(folder / "results"),
                          "--force"], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - started
    record = {"mode": mode, **_settings(mode, cores), "wall_s": round(wall, 2), "returncode": run.returncode,
              "results": str(folder / "results")}
    if run.returncode != 0:
        record["error"] = run.stderr[-2000:]
        return record
    provenance = json.loads((folder / "results" / "llama_runs.json").read_text())
    record.update(compute_s=provenance["wall_time_s"], threads_per_process=provenance["hardware"].get(
        "threads_per_process"), workers=provenance["hardware"].get("workers"))
    return record


def _tables_equal(a: Path, b: Path) -> bool:
    import pandas as pd

    for csv in sorted(a.glob("*.csv")):
        left = pd.read_csv(csv).drop(columns=["seconds"], errors="ignore")
        right = pd.read_csv(b / csv.name).drop(columns=["seconds"], errors="ignore")
        if not left.equals(right):
            return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT") or REPO / "results" / "bench"),
                        help="output folder (default: $BENCH_OUT, else results/bench)")
    parser.add_argument("--profile", default="smoke", help="the sweep's profile (default smoke)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["workers", "threads"])
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every mode, alternating (the best is kept)")
    parser.add_argument("--cores", type=int, default=0, help="C (default: the usable cores of this machine)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds one sweep may take")
    args = parser.parse_args(argv)

    from dalign_core.atomic import atomic_write_text
    from dalign_repro.training.workers import cores as usable_cores

    cores = args.cores or usable_cores()
    started = time.perf_counter()
    records: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        for round_ in range(args.repeats):
            for mode in args.modes:
                record = {**run_once(mode, cores, args.profile, Path(tmp), args.timeout), "round": round_}
                records.append(record)
                print(f"  round {round_}: {mode:8s} {record['wall_s']:7.1f} s wall"
                      + (f", {record['compute_s']:.1f} s compute" if "compute_s" in record else
                         f"  FAILED (exit {record['returncode']})"), flush=True)
        best = {}
        for mode in args.modes:
            ok = [r for r in records if r["mode"] == mode and r["returncode"] == 0]
            best[mode] = min(ok, key=lambda r: r["wall_s"]) if ok else None
        agreement = {}
        if best.get("workers"):
            for other in ("serial", "threads"):
                if best.get(other):
                    agreement[f"workers_vs_{other}"] = _tables_equal(Path(best["workers"]["results"]),
                                                                     Path(best[other]["results"]))
    for record in records:
        record.pop("results", None)

    def wall(mode, key="wall_s"):
        return best[mode][key] if best.get(mode) and key in best[mode] else math.nan

    ratio = wall("threads") / wall("workers") if best.get("threads") and best.get("workers") else math.nan
    compute_ratio = (wall("threads", "compute_s") / wall("workers", "compute_s")
                     if best.get("threads") and best.get("workers") else math.nan)
    print()
    print(f"{EXPERIMENT} --profile {args.profile}, {cores} usable cores ({os.cpu_count()} CPUs), best of "
          f"{args.repeats} round(s), modes alternating")
    for mode in args.modes:
        if best.get(mode):
            b = best[mode]
            print(f"  {mode:8s} DALIGN_WORKERS={b['DALIGN_WORKERS']} DALIGN_THREADS={b['DALIGN_THREADS']}: "
                  f"{b['wall_s']:.1f} s wall, {b['compute_s']:.1f} s compute (provenance: "
                  f"{b['threads_per_process']} thread(s) x {b['workers']} worker(s))")
        else:
            print(f"  {mode:8s} failed")
    print(f"ratio (1 process x {cores} threads) / ({cores} workers x 1 thread): {ratio:.2f}x wall, "
          f"{compute_ratio:.2f}x compute")
    for pair, same in agreement.items():
        print(f"tables {pair.replace('_vs_', ' vs ')}: {'identical' if same else 'differ'}")
    print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "bench_workers", "experiment": EXPERIMENT, "profile": args.profile, "cores": cores,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "repeats": args.repeats,
            "ratio_threads_over_workers_wall": ratio, "ratio_threads_over_workers_compute": compute_ratio,
            "tables_identical": agreement, "best": best, "records": records, "loadavg_end": os.getloadavg(),
            "total_wall_s": round(time.perf_counter() - started, 1),
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for record in best.values():
        if record:
            record.pop("results", None)
    atomic_write_text(args.out / "bench_workers.json", json.dumps(meta, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out / 'bench_workers.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
