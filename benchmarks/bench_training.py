"""A training step of the LLaMA sweep against a minimal loop and against the machine's matmul limit (``make bench``).

For each width of the LLaMA sweep's profile (transformers ``LlamaForCausalLM`` built by
:func:`dalign_repro.models.llama.build_llama` at the profile's depth, head dimension,
context, vocabulary and batch size), on random token ids:

* ``project`` — :func:`dalign_repro.training.loop.train` as a sweep calls it (AdamW, warm-up and
  cosine decay, gradient clipping, no checkpoints): the time per optimizer step;
* ``minimal`` — the shortest loop that does the same arithmetic, written out here: the
  same model, batches, AdamW settings, clipping and learning-rate schedule, with nothing
  else (no data order, no history, no checks). ``project / minimal`` is the loop's overhead;
* ``matmul`` — the matmul limit at the model's shapes: every ``nn.Linear`` of the model as a
  bare ``torch.mm`` of a (batch x context, in) by (in, out) matrix, forward and the two
  backward products, timed alone. The step's floating-point operations are counted with
  ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention), so
  ``achieved / limit`` = (FLOPs per step / step time) / (matmul FLOPs / matmul time) is
  the share of the machine's matmul throughput that training reaches. At narrow widths it
  is low because softmax, normalization and the optimizer do not run as matmuls.

Timing: the methods alternate over ``--repeats`` rounds after a warm-up round, and the best
round is kept (the most robust statistic on a shared machine); torch runs on ``--threads``
threads (default 1, what each worker of a CPU sweep uses).

Usage::

    python benchmarks/bench_training.py                     # the cpu profile's widths, results/bench
    python benchmarks/bench_training.py --widths 32 256 --steps 20 --repeats 3

Writes ``DIR/bench_training.csv`` and ``DIR/bench_training.json`` atomically.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)


def _model_and_data(config, width: int, steps: int, seed: int):
    import torch

    from dalign_repro.models.llama import LlamaWidthSpec, build_llama

    spec = LlamaWidthSpec(width=width, depth=config.depth, head_dim=config.head_dim, vocab_size=config.vocab_size,
                          context=config.context)
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(config.vocab_size, (config.batch_size * steps, config.context), generator=generator)
    return (lambda: build_llama(spec, seed=seed)), data


def train_config_for(config, steps: int, lr: float):
    from dalign_repro.training.loop import TrainConfig

    return TrainConfig(steps=steps, batch_size=config.batch_size, lr=lr, warmup_steps=max(steps // 10, 1),
                       weight_decay=config.weight_decay, progress=False)


def project_loop(build, data, settings) -> None:
    """The project's training function, as a sweep runs it (no checkpoints)."""
    from dalign_repro.training.loop import train

    train(build(), data, settings)


def minimal_loop(build, data, settings) -> None:
    """The same arithmetic written out: AdamW, clipping, warm-up then cosine decay, batches in order."""
    import torch

    model = build()
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=settings.lr, betas=settings.betas,
                                  eps=settings.eps)

    def rate(step):
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        progress = (step - settings.warmup_steps) / max(settings.steps - settings.warmup_steps, 1)
        return settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    for step in range(settings.steps):
        batch = data[step * settings.batch_size:(step + 1) * settings.batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()


def step_flops(build, data, batch_size: int) -> int:
    """Floating-point operations of one forward and backward pass (matmuls and attention), counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build()
    batch = data[:batch_size]
    with FlopCounterMode(display=False) as counter:
        model(input_ids=batch, labels=batch).loss.backward()
    return int(counter.get_total_flops())


def matmul_limit(build, tokens: int, repeats: int) -> tuple[float, int]:
    """Seconds and FLOPs of the model's linear layers as bare matmuls: forward, input gradient, weight gradient."""
    import torch

    shapes = [(m.in_features, m.out_features) for m in build().modules() if isinstance(m, torch.nn.Linear)]
    operands = []
    for fan_in, fan_out in shapes:
        x, w, g = torch.randn(tokens, fan_in), torch.randn(fan_in, fan_out), torch.randn(tokens, fan_out)
        operands.append((x, w, g))

    def once():
        for x, w, g in operands:
            torch.mm(x, w), torch.mm(g, w.t()), torch.mm(x.t(), g)

    once()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
    flops = sum(3 * 2 * tokens * fan_in * fan_out for fan_in, fan_out in shapes)
    return best, flops


def time_width(config, width: int, steps: int, repeats: int, seed: int) -> dict:
    """Best-of-``repeats`` seconds per step of both loops (alternating), the FLOPs per step and the matmul limit."""
    build, data = _model_and_data(config, width, steps, seed)
    settings = train_config_for(config, steps, lr=1e-3)
    loops = {"project": project_loop, "minimal": minimal_loop}
    times = {name: [] for name in loops}
    for round_ in range(repeats + 1):  # round 0 warms kernels and the allocator
        for name, loop in loops.items():
            start = time.perf_counter()
            loop(build, data, settings)
            if round_:
                times[name].append((time.perf_counter() - start) / steps)
    flops = step_flops(build, data, config.batch_size)
    limit_s, limit_flops = matmul_limit(build, config.batch_size * config.context, repeats)
    project, minimal = min(times["project"]), min(times["minimal"])
    achieved, limit = flops / project, limit_flops / limit_s
    return dict(width=width, params=sum(p.numel() for p in build().parameters()), steps=steps,
                project_s_per_step=project, minimal_s_per_step=minimal, project_over_minimal=project / minimal,
                flops_per_step=flops, achieved_gflops=achieved / 1e9, matmul_limit_gflops=limit / 1e9,
                achieved_over_limit=achieved / limit)


def main(argv=None) -> int:
    from _bench import parser as bench_parser, save, target

    parser = bench_parser(__doc__.split("\n\n")[0], repeats=2)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per timed loop (default 10)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be at least 1")

    import torch

    from dalign_repro.experiments import llama_width

    torch.set_num_threads(args.threads)
    config = llama_width.Config.for_profile(args.profile)
    widths = args.widths or list(config.widths)
    started = time.perf_counter()
    records = []
    for width in widths:
        record = time_width(config, width, args.steps, args.repeats, args.seed)
        records.append(record)
        print(f"  N={width:5d}: project {record['project_s_per_step'] * 1e3:7.1f} ms/step, minimal loop "
              f"{record['minimal_s_per_step'] * 1e3:7.1f} ms/step ({record['project_over_minimal']:.2f}x); "
              f"{record['achieved_gflops']:6.1f} GFLOP/s of a {record['matmul_limit_gflops']:.1f} GFLOP/s matmul "
              f"limit at these shapes ({record['achieved_over_limit']:.0%})", flush=True)
    print(f"\nLLaMA {args.profile} shapes (depth {config.depth}, head dim {config.head_dim}, context {config.context}, "
          f"batch {config.batch_size}), {args.threads} thread(s), best of {args.repeats} rounds")
    targets = [item for r in records for item in (
        target(f"project's step / a minimal loop's, N = {r['width']}", r["project_over_minimal"], None),
        target(f"achieved / matmul-limit FLOP rate, N = {r['width']}", r["achieved_over_limit"], None, unit="%"))]
    save(args.out, "bench_training", records, started, targets=targets, profile=args.profile, threads=args.threads,
         steps=args.steps,
         repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
