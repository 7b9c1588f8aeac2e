"""The sweep's time in capture: one capture pass per reduction against one pass for all (``make bench``).

The Pythia and ResNet-20 families capture two reductions of q (``("full", "shared")``). The sweep's measurement
(:mod:`dalign_repro.sweep.measure`) once called the capture once per reduction, each call with the determinism
self-check; it now makes one forward and backward pass serve both, and checks determinism once per model (its
first capture). For one model of the Pythia sweep's 6-layer regime at ``--profile`` (default ``cpu``:
``dalign_repro.experiments.pythia_width.Config.for_profile("cpu")``), this times:

* ``step_s``: a training step of the sweep's loop (``--steps`` steps after as many warm-up steps);
* ``capture_s_per_example``: capture and estimation per q row, at every insertion point and at the primary one,
  for the two reductions from one pass (``one_pass``) and from a pass each (``pass_per_reduction``), on
  ``--examples`` examples of the held-out pool without the self-check;
* ``check_s``: the self-check, which recomputes example 0 alone: timed as the capture of one example;
* ``evaluation_s`` and ``redundancy_s``: the held-out evaluation of a checkpoint and the redundancy check, scaled
  from a batch to the config's examples as the dry run does (the same in both designs).

From these and the config's schedule (which checkpoints capture every layer, which capture the train pool, and
how many examples each captures) it projects one measured run: training (``step_s`` x steps), an evaluation at
every checkpoint, the captures, the capture of the evaluation set for the certificates and the redundancy check
(the misalignment resampling, the same in both designs, is left out). It prints each design's share of the run in
capture, and the projected wall-time change of the run.

Timing: the designs alternate over ``--repeats`` rounds after a warm-up round and the best round is kept; torch
runs on ``--threads`` threads (default 1, what each worker of a CPU sweep uses). The model is trained for the timed
steps only: the arithmetic of a capture does not depend on how far training went.

Usage::

    python benchmarks/bench_sweep_measure.py                   # N = 64 of the cpu profile, results/bench
    python benchmarks/bench_sweep_measure.py --widths 128 --examples 32 --repeats 1
    python benchmarks/bench_sweep_measure.py --profile smoke --examples 8 --steps 1 --repeats 1   # seconds

Writes ``DIR/bench_sweep_measure.csv`` (a row per design) and ``DIR/bench_sweep_measure.json`` atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

from _bench import parser, save  # noqa: E402  (after the path set-up above)

DESIGNS = ("pass_per_reduction", "one_pass")


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(config, width: int, examples: int, steps: int, repeats: int) -> dict:
    """Seconds of each part of one measured run of ``config``'s Pythia family at ``width`` (see the module docstring)."""
    import torch

    from dalign_core.capture.hooks import accumulate_geometry
    from dalign_repro.experiments.pythia_width import FAMILY
    from dalign_repro.sweep.family import count, take
    from dalign_repro.sweep.measure import measure_redundancy, checkpoint_pool
    from dalign_repro.sweep.pools import prepare
    from dalign_repro.training.loop import TrainConfig, train

    family = FAMILY
    splits, _, pools = prepare(config, family)
    heldout, evaluation = take(splits.test, pools.heldout), take(splits.test, pools.evaluation)
    model = family.build(config, width, config.seed, splits)
    probe = TrainConfig(steps=steps, batch_size=config.batch_size, lr=min(config.lr_grid(width)), seed=config.seed,
                        progress=False, **family.train_settings(config))
    train(model, splits.train, probe, loss_fn=family.train_loss)  # warm-up: kernels, allocator, caches
    start = time.perf_counter()
    train(model, splits.train, probe, loss_fn=family.train_loss)
    step_s = (time.perf_counter() - start) / steps
    model.eval()

    reductions = list(family.reductions)
    sample = family.batches(take(heldout, torch.arange(min(examples, count(heldout)))), config.capture_batch)
    rows = min(examples, count(heldout))
    one = family.batches(take(heldout, torch.arange(1)), 1)
    sets = {"every": family.insertion_points(config, model), "primary": [family.primary_layer(config)]}
    designs = {
        "one_pass": lambda layers: [a.result() for by_layer in accumulate_geometry(
            model, layers, sample, reduction=reductions, check_determinism=False).values() for a in by_layer.values()],
        "pass_per_reduction": lambda layers: [a.result() for reduction in reductions for a in accumulate_geometry(
            model, layers, sample, reduction=reduction, check_determinism=False).values()],
    }
    per_example = {}
    for which, layers in sets.items():
        for design, fn in designs.items():
            fn(layers)  # warm-up
        for design, fn in designs.items():  # alternating designs within each set, best of the rounds
            per_example[design, which] = _best(lambda: fn(layers), repeats) / rows
    check_s = _best(lambda: accumulate_geometry(model, sets["every"], one, check_determinism=False), repeats)

    probe_examples = take(evaluation, torch.arange(min(config.capture_batch, count(evaluation))))
    family.evaluate(model, probe_examples, config)  # warm-up
    evaluation_s = _best(lambda: family.evaluate(model, probe_examples, config), repeats) \
        * config.eval_examples / count(probe_examples)
    redundancy_s = 0.0
    if config.redundancy_examples:
        probed = min(config.redundancy_examples, config.capture_batch, count(heldout))
        measure_redundancy(config, family, model, heldout, min(8, probed), torch.device("cpu"), config.seed)  # warm-up
        redundancy_s = _best(lambda: measure_redundancy(config, family, model, heldout, probed, torch.device("cpu"),
                                                 config.seed), 1) * config.redundancy_examples / probed

    # the run's captures as measure_trained makes them: (layer set, examples) per (checkpoint, pool)
    pool_examples = torch.arange(config.pool_size)
    captures = [("every" if config.layer_steps(step) else "primary", len(checkpoint_pool(config, pool_examples, step)))
                for step in sorted(config.checkpoint_steps)
                for pool in ("heldout", "train") if pool == "heldout" or step in config.train_pool_checkpoints]
    # the evaluation set's capture for the certificates: primary layer, the judged reduction alone, both designs
    final_capture = per_example["pass_per_reduction", "primary"] / len(reductions) * config.eval_examples
    training_s = step_s * config.steps
    evaluations_s = evaluation_s * len(config.checkpoint_steps)
    records = []
    for design in DESIGNS:
        passes = len(reductions) if design == "pass_per_reduction" else 1
        checks = len(captures) * passes + 1 if design == "pass_per_reduction" else 1  # the old: every call checked
        capture_s = sum(per_example[design, which] * n for which, n in captures) + final_capture + checks * check_s
        run_s = training_s + evaluations_s + capture_s + redundancy_s
        records.append({
            "design": design, "width": width, "reductions": "+".join(reductions), "examples_timed": rows, "steps": config.steps, "step_s": step_s,
            "training_s": training_s, "evaluations_s": evaluations_s, "redundancy_s": redundancy_s,
            "captures_per_run": len(captures), "capture_passes_per_run": len(captures) * passes,
            "checks_per_run": checks, "check_s": check_s,
            "capture_s_per_example_every": per_example[design, "every"],
            "capture_s_per_example_primary": per_example[design, "primary"],
            "capture_s": capture_s, "run_s": run_s, "capture_share": capture_s / run_s,
        })
    return records


def main(argv=None) -> int:
    made = parser(__doc__.split("\n\n")[0], repeats=3, sweep="Pythia")
    made.add_argument("--examples", type=int, default=128,
                      help="held-out examples whose capture is timed (default 128: four capture batches at cpu)")
    made.add_argument("--steps", type=int, default=5, help="training steps timed, after as many warm-up steps")
    args = made.parse_args(argv)
    started = time.perf_counter()

    import torch

    from dalign_repro.experiments.pythia_width import Config

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = Config.for_profile(args.profile).sweeps()[0]  # the 6-layer regime
    width = args.widths[0] if args.widths else config.widths[len(config.widths) // 2]
    records = measure(config, width, args.examples, args.steps, args.repeats)
    old, new = records
    change = new["run_s"] - old["run_s"]
    print(f"Pythia {args.profile} profile, {config.depth} layers, N = {width}, one thread: a training step "
          f"{old['step_s'] * 1e3:.0f} ms x {config.steps} steps = {old['training_s']:.0f} s; an evaluation "
          f"{old['evaluations_s'] / len(config.checkpoint_steps):.2f} s x {len(config.checkpoint_steps)} checkpoints; "
          f"redundancy check {old['redundancy_s']:.1f} s; {old['captures_per_run']} pool captures per run "
          f"of reductions {old['reductions']}; the self-check {old['check_s'] * 1e3:.0f} ms")
    for record in records:
        print(f"  {record['design']:18s}: {record['capture_passes_per_run']} capture passes and "
              f"{record['checks_per_run']} self-checks per run, capture {record['capture_s']:.1f} s of a measured "
              f"run's {record['run_s']:.1f} s ({100 * record['capture_share']:.1f}% in capture)")
    print(f"projected wall time of one measured Pythia {args.profile} run: {old['run_s']:.1f} s -> {new['run_s']:.1f} s "
          f"({change:+.1f} s, {100 * change / old['run_s']:+.1f}%); capture {old['capture_s']:.1f} s -> "
          f"{new['capture_s']:.1f} s ({new['capture_s'] / old['capture_s']:.2f}x)")
    save(args.out, "bench_sweep_measure", records, started, profile=args.profile, width=width, threads=args.threads,
         repeats=args.repeats, examples=args.examples, timed_steps=args.steps,
         projected_run_change_s=change, projected_run_change=change / old["run_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
