"""A cpu width chapter's wall time, projected by ``--dry-run``, beside the committed run's measured time (``make bench``).

For each width sweep (LLaMA, Pythia, ResNet-20) this runs ``python -m
dalign_repro.experiments.<sweep> --profile <profile> --dry-run`` in a fresh process (it
builds the data and every model, times a few training steps, one capture batch, one
evaluation batch and the redundancy check, and projects the whole sweep on this machine's
one-thread workers), and reads the committed tables' provenance
(``results/<profile>/<family>_runs.json``: ``wall_time_s``, the workers, the commit, and
how many runs loaded their training from checkpoints) for the time the sweep actually took.
A run whose training was loaded was only measured, so the committed time is comparable with
the projection only where few runs were (one per regime is the rate check's model, reused).
Printed and saved per sweep: the projection on one process, on this machine's workers, and
``measured / projected`` (above 1: the run took longer than projected, e.g. on a machine
shared with other work). The projection counts training, capture, evaluation and the
redundancy check (not resampling, the sample-unit study and start-up).

With ``--seeds`` (default 3, the seeds the chapters had before the width verdict asked for
more) each sweep is projected again at n seeds from the same dry run (``--also-seeds``: the
same timings, the rate fit unchanged). The targets the projections are read against: a chapter
at its profile's seeds within 45 min on 2 cores, at 3 seeds within 20 min.

Usage::

    python benchmarks/bench_projection.py                   # profile cpu, results/bench
    python benchmarks/bench_projection.py --sweeps llama_width --profile lab

Writes ``DIR/bench_projection.json`` atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

SWEEPS = {"llama_width": "llama", "pythia_width": "pythia", "resnet_width": "resnet"}
SERIAL = re.compile(r"^projected: ([\d.]+) s", re.M)
WORKERS = re.compile(r"^on this machine's (\d+) one-thread workers .*?: ([\d.]+) s", re.M)
AT_SEEDS = re.compile(r"^at (\d+) seeds, the same timings: ([\d.]+) s .*? on one process"
                      r"(?:, ([\d.]+) s .*? on this machine's (\d+) one-thread workers)?$", re.M)


def project(sweep: str, profile: str, timeout: int, seeds: list[int]) -> dict:
    """The dry run's projections (seconds) for one sweep, summed over its depth regimes, and at each number of
    ``seeds`` (``seeds<n>``) from the same timings."""
    start = time.perf_counter()
    command = [sys.executable, "-m", f"dalign_repro.experiments.{sweep}", "--profile", profile, "--dry-run"]
    done = subprocess.run(command + (["--also-seeds", *map(str, seeds)] if seeds else []), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    record = {"sweep": sweep, "dry_run_s": round(time.perf_counter() - start, 1), "returncode": done.returncode}
    if done.returncode:
        record["error"] = (done.stderr.strip().splitlines() or [""])[-1][:300]
        return record
    serial = [float(x) for x in SERIAL.findall(done.stdout)]
    shared = [(int(n), float(s)) for n, s in WORKERS.findall(done.stdout)]
    record.update(projected_serial_s=sum(serial), regimes=len(serial),
                  workers=shared[0][0] if shared else 1,
                  projected_workers_s=sum(s for _, s in shared) if shared else sum(serial))
    at_seeds = AT_SEEDS.findall(done.stdout)
    for n in seeds:
        lines = [(float(one), float(many or one)) for count, one, many, _ in at_seeds if int(count) == n]
        record[f"seeds{n}"] = {"projected_serial_s": sum(one for one, _ in lines),
                               "projected_workers_s": sum(many for _, many in lines)}
    return record


def measured(family: str, profile: str) -> dict:
    """The committed run's wall time and settings, from its provenance (empty when there is none)."""
    path = REPO / "results" / profile / f"{family}_runs.json"
    if not path.exists():
        return {}
    provenance = json.loads(path.read_text())
    hardware = provenance.get("hardware", {})
    runs = [sweep["runs"] for sweep in provenance.get("sweeps", []) if sweep.get("runs")] or [provenance.get("runs") or {}]
    return {"measured_s": provenance.get("wall_time_s"), "measured_commit": provenance.get("git", {}).get("commit"),
            "measured_workers": hardware.get("workers"), "measured_threads": hardware.get("threads_per_process"),
            "measured_runs": sum(r.get("count", 0) for r in runs),
            "measured_training_loaded": sum(r.get("training_loaded", 0) for r in runs),
            "measured_utc": provenance.get("written_utc")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT") or REPO / "results" / "bench"),
                        help="output folder (default: $BENCH_OUT, else results/bench)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--sweeps", nargs="+", choices=sorted(SWEEPS), default=list(SWEEPS))
    parser.add_argument("--timeout", type=int, default=900, help="seconds one dry run may take")
    parser.add_argument("--seeds", type=int, nargs="*", default=[3],
                        help="also project each chapter at these numbers of seeds (default 3; none: only the profile)")
    args = parser.parse_args(argv)

    from dalign_core.atomic import atomic_write_text

    records = []
    for sweep in args.sweeps:
        record = {**project(sweep, args.profile, args.timeout, args.seeds), **measured(SWEEPS[sweep], args.profile)}
        if record.get("measured_s") and record.get("projected_workers_s"):
            record["measured_over_projected"] = record["measured_s"] / record["projected_workers_s"]
        records.append(record)
        if record["returncode"]:
            print(f"  {sweep}: dry run FAILED: {record['error']}")
            continue
        line = (f"  {sweep}: projected {record['projected_serial_s'] / 60:.1f} min on one process, "
                f"{record['projected_workers_s'] / 60:.1f} min on {record['workers']} one-thread worker(s)")
        if "measured_over_projected" in record:
            line += (f"; the committed run took {record['measured_s'] / 60:.1f} min "
                     f"({record['measured_over_projected']:.2f}x the projection, with "
                     f"{record['measured_training_loaded']} of its {record['measured_runs']} runs' training loaded "
                     "from checkpoints)")
        print(line, flush=True)
        for seeds in args.seeds:
            print(f"    at {seeds} seeds: projected {record[f'seeds{seeds}']['projected_workers_s'] / 60:.1f} min on "
                  f"{record['workers']} one-thread worker(s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "bench_projection", "profile": args.profile, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "records": records, "loadavg_end": os.getloadavg(),
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(args.out / "bench_projection.json", json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out / 'bench_projection.json'}")
    return 0 if all(r["returncode"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
