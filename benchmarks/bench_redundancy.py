"""The redundancy check's per-example gradients: whole capture batches against micro-batches (``make bench``).

:mod:`dalign_core.capture.redundancy` needs each example's gradient of the candidate parameters, so it
runs one backward pass per example. A backward pass costs as much as the forward graph it
runs through, so from a forward pass of the whole capture batch (64 sequences in the LLaMA
sweep) every example pays for 64; from forward passes of ``MICRO_BATCH`` rows it pays for
those. This times ``redundancy._collect`` both ways at the primary insertion point of a
LLaMA built at the sweep profile's shapes (random weights and token ids: the arithmetic does
not depend on training), and checks that the rows agree:

* ``whole_s_per_example`` and ``micro_s_per_example``: seconds per example, the whole-batch way on the first
  ``--whole-examples`` examples (one forward pass of the whole first batch and one backward pass per example: each
  backward costs the same, so a few give its rate; the forward pass is shared by fewer examples than in a full
  batch, which overstates this way's time by a few per cent), the micro-batched way on all ``--examples``;
* ``speedup``: whole / micro;
* ``max_relative_difference``: the largest relative Frobenius difference between the two
  ways' q rows and gradient rows over the examples both computed (0 where they are bit for bit the same).

With ``--share-examples N``, also the share of a default ``dalign estimate`` its redundancy check takes (on the
setup of ``benchmarks/bench_command.py``: a 2-layer LLaMA of width 128, N examples of 64 tokens; target <= 25%),
as the in-process check over the command and as the difference of the commands with and without it.
``make bench`` leaves it to ``bench_command.py``, which measures the same figure.

Timing: the two ways alternate over ``--repeats`` rounds after a warm-up round, and the best
round is kept; torch runs on ``--threads`` threads (default 1, what each worker of a CPU sweep uses).

Usage::

    python benchmarks/bench_redundancy.py                     # the cpu profile's widths, results/bench
    python benchmarks/bench_redundancy.py --widths 64 --examples 16 --repeats 1

Writes ``DIR/bench_redundancy.csv`` and ``DIR/bench_redundancy.json`` atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)


def time_width(config, width: int, examples: int, whole_examples: int, repeats: int, seed: int) -> dict:
    """One width: seconds per example of ``_collect`` from whole batches (the first ``whole_examples``) and from
    micro-batches (all ``examples``), and their agreement on the examples both computed."""
    import torch

    from dalign_repro.experiments.llama_width import FAMILY
    from dalign_repro.models.llama import LlamaWidthSpec, build_llama
    from dalign_core.capture.redundancy import MICRO_BATCH, _collect, candidate_parameters

    spec = LlamaWidthSpec(width=width, depth=config.depth, head_dim=config.head_dim, vocab_size=config.vocab_size,
                          context=config.context)
    model = build_llama(spec, seed=seed).eval()
    layer = FAMILY.primary_layer(config)
    names = candidate_parameters(model, layer)
    ids = torch.randint(config.vocab_size, (examples, config.context), generator=torch.Generator().manual_seed(seed))
    batches = [{"input_ids": ids[i:i + config.capture_batch]} for i in range(0, examples, config.capture_batch)]

    counts = {None: min(whole_examples, examples), MICRO_BATCH: examples}  # examples each way takes

    def collect(micro_batch):
        start = time.perf_counter()
        qs, gs, _ = _collect(model, [layer], names, batches, tuple(FAMILY.reductions), "auto", None,
                             counts[micro_batch], micro_batch=micro_batch)
        return time.perf_counter() - start, {**{f"q {k}": v for k, v in qs.items()}, **gs}

    collect(MICRO_BATCH)  # warm-up
    best = {None: float("inf"), MICRO_BATCH: float("inf")}
    rows = {}
    for _ in range(repeats):
        for micro_batch in best:
            seconds, rows[micro_batch] = collect(micro_batch)
            best[micro_batch] = min(best[micro_batch], seconds)
    both = counts[None]
    difference = max(float((rows[MICRO_BATCH][k][:both] - rows[None][k]).norm()
                           / rows[None][k].norm().clamp_min(1e-300)) for k in rows[None])
    whole, micro = best[None] / both, best[MICRO_BATCH] / examples
    return dict(width=width, examples=examples, whole_examples=both, capture_batch=config.capture_batch,
                micro_batch=MICRO_BATCH, layer=layer, candidates=len(names), whole_s_per_example=whole,
                micro_s_per_example=micro, speedup=whole / micro, max_relative_difference=difference)


def main(argv=None) -> int:
    from _bench import parser as bench_parser, save, target

    parser = bench_parser(__doc__.split("\n\n")[0], repeats=1)
    parser.add_argument("--examples", type=int, default=64, help="examples per timed pass (default 64)")
    parser.add_argument("--whole-examples", type=int, default=16,
                        help="examples the whole-batch way is timed on (default 16: its backward passes each cost "
                             "the same)")
    parser.add_argument("--share-examples", type=int, default=0,
                        help="examples of the dalign estimate whose redundancy share is timed (default 0: skip; "
                             "bench_command.py measures it on 256)")
    args = parser.parse_args(argv)
    if args.examples < 4 or args.whole_examples < 1 or args.repeats < 1 or args.threads < 1 or args.share_examples < 0:
        parser.error("--examples must be at least 4, --whole-examples, --repeats and --threads at least 1, "
                     "--share-examples at least 0")

    import torch

    from dalign_repro.experiments import llama_width

    torch.set_num_threads(args.threads)
    config = llama_width.Config.for_profile(args.profile)
    started = time.perf_counter()
    records = []
    for width in args.widths or list(config.widths):
        record = time_width(config, width, args.examples, args.whole_examples, args.repeats, args.seed)
        records.append(record)
        print(f"  N={width:5d}: whole batches of {record['capture_batch']} {record['whole_s_per_example'] * 1e3:7.1f} "
              f"ms/example, micro-batches of {record['micro_batch']} {record['micro_s_per_example'] * 1e3:6.1f} "
              f"ms/example ({record['speedup']:.1f}x); rows differ by {record['max_relative_difference']:.1e} "
              "(relative)", flush=True)
    print(f"\nredundancy at LLaMA {args.profile} shapes, {args.examples} examples (whole batches: the first "
          f"{min(args.whole_examples, args.examples)}), {args.threads} thread(s), best of {args.repeats} round(s)")
    share = None
    if args.share_examples:
        from bench_command import measure, redundancy_target, share_lines

        share, _ = measure(128, 2, args.share_examples, 64, args.repeats, args.threads, args.seed, thorough=False,
                           imports=False, warmup=args.profile != "smoke")
        print(f"\nthe redundancy check's share of dalign estimate (LLaMA N=128, 2 layers, {args.share_examples} "
              "examples of 64 tokens):")
        print("\n".join(share_lines(share)))
    targets = [item for r in records for item in (
        target(f"micro-batched redundancy check, speed-up over whole batches, N = {r['width']}", r["speedup"], None),
        target(f"rows' relative difference, micro vs whole, N = {r['width']}", r["max_relative_difference"], 1e-6,
               unit=""))]
    if share is not None:
        targets.append(redundancy_target(share))
    save(args.out, "bench_redundancy", records, started, targets=targets, profile=args.profile, threads=args.threads,
         examples=args.examples, whole_examples=args.whole_examples, repeats=args.repeats, command_share=share)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
