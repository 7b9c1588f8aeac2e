"""ResNet-20 in NHWC (``channels_last``) against NCHW memory order, at the ResNet sweep's shapes (``make bench``).

The ResNet sweep's cost is training (about three quarters of a cpu chapter), and a
convolution's speed on a CPU depends on how its tensors lie in memory: oneDNN's kernels
are written for channels last. This times, for each width of the profile, both orders of
the same model (same seed, random weights and images: the arithmetic does not depend on
training):

* ``train_nchw_ms``, ``train_nhwc_ms``, ``train_ratio``: one SGD step (momentum, weight
  decay) at the sweep's batch size, forward, backward and update; ratio NHWC / NCHW;
* ``capture_nchw_ms``, ``capture_nhwc_ms``, ``capture_ratio``: the per-example q of one
  capture batch at the primary insertion point (``full`` reduction, eval mode);
* ``q_relative_difference``: the relative Frobenius difference of the two orders' float32 q,
  and ``q_error_nchw``, ``q_error_nhwc``: each order's from the float64 q (both orders give
  it to 1e-15). Rounding, then, not a different function: a few SGD steps on random labels
  leave a model whose float32 q is itself up to 1e-3 from exact, in either order (a ReLU
  input that rounding moves across zero changes its example's q by a step).

Timing: the orders alternate over ``--repeats`` rounds after a warm-up round, and the best
round is kept; torch runs on ``--threads`` threads (default 1, what each worker of a CPU sweep uses).

Usage::

    python benchmarks/bench_resnet_memory.py                     # the cpu profile's widths, results/bench
    python benchmarks/bench_resnet_memory.py --widths 8 --steps 2 --repeats 1

Writes ``DIR/bench_resnet_memory.csv`` and ``DIR/bench_resnet_memory.json`` atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)


def time_width(config, width: int, steps: int, repeats: int, seed: int) -> dict:
    """One width: milliseconds of a training step and of a capture batch in each memory order, and q's agreement."""
    import copy

    import torch

    from dalign_repro.families.resnet import STAGE_WIDTH, ResNetFamily, to_float
    from dalign_core.capture.hooks import activation_gradients
    from dalign_repro.models.resnet import resnet20

    family = ResNetFamily()
    generator = torch.Generator().manual_seed(seed)
    size = max(config.batch_size, config.capture_batch)
    images = torch.randint(0, 256, (size, 3, 32, 32), generator=generator, dtype=torch.uint8)
    labels = torch.randint(0, 10, (size,), generator=generator)
    batch = (images[:config.batch_size], labels[:config.batch_size])
    capture = (to_float(images[:config.capture_batch]), labels[:config.capture_batch])

    models, optimizers = {}, {}
    for order, channels_last in (("nchw", False), ("nhwc", True)):
        torch.manual_seed(seed)
        models[order] = resnet20(width / STAGE_WIDTH, num_classes=10, channels_last=channels_last)
        optimizers[order] = torch.optim.SGD(models[order].parameters(), lr=config.lr_candidates[0],
                                            momentum=config.momentum, weight_decay=config.weight_decay)

    def train_ms(order: str) -> float:
        model, optimizer = models[order].train(), optimizers[order]
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            family.train_loss(model, batch).backward()
            optimizer.step()
        return (time.perf_counter() - start) / steps * 1e3

    def capture_ms(order: str) -> tuple[float, torch.Tensor]:
        model = models[order].eval()
        start = time.perf_counter()
        q = activation_gradients(model, config.insertion_block, capture[0], capture[1], reduction="full",
                                 check_determinism=False)
        return (time.perf_counter() - start) * 1e3, q

    best = {key: float("inf") for key in ("train_nchw", "train_nhwc", "capture_nchw", "capture_nhwc")}
    for round_ in range(repeats + 1):  # round 0 warms the kernels up
        for order in ("nchw", "nhwc"):
            train = train_ms(order)
            capture_time, _ = capture_ms(order)
            if round_:
                best[f"train_{order}"] = min(best[f"train_{order}"], train)
                best[f"capture_{order}"] = min(best[f"capture_{order}"], capture_time)
    # q of the two orders from the same weights (training above moved each model its own way).
    models["nhwc"].load_state_dict(models["nchw"].state_dict())
    q = {order: capture_ms(order)[1] for order in ("nchw", "nhwc")}
    exact = activation_gradients(copy.deepcopy(models["nchw"]).double().eval(), config.insertion_block,
                                 capture[0].double(), capture[1], reduction="full", check_determinism=False)
    return {"width": width, "k": width / STAGE_WIDTH, "batch_size": config.batch_size,
            "capture_batch": config.capture_batch, "layer": config.insertion_block,
            **{f"{key}_ms": round(value, 2) for key, value in best.items()},
            "train_ratio": round(best["train_nhwc"] / best["train_nchw"], 3),
            "capture_ratio": round(best["capture_nhwc"] / best["capture_nchw"], 3),
            "q_relative_difference": float((q["nhwc"] - q["nchw"]).norm() / q["nchw"].norm()),
            **{f"q_error_{order}": float((q[order].double() - exact).norm() / exact.norm()) for order in q}}


def main(argv: list[str] | None = None) -> None:
    from _bench import parser as bench_parser, save

    parser = bench_parser(__doc__.split("\n\n")[0], repeats=3, sweep="ResNet-20")
    parser.add_argument("--steps", type=int, default=4, help="training steps a round (default 4)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")

    import torch

    from dalign_repro.experiments.resnet_width import Config

    torch.set_num_threads(args.threads)
    config = Config.for_profile(args.profile)
    started = time.perf_counter()
    records = []
    for width in args.widths or config.widths:
        record = time_width(config, width, args.steps, args.repeats, args.seed)
        records.append(record)
        print(f"k={record['k']:g}: training step {record['train_nchw_ms']:.0f} -> {record['train_nhwc_ms']:.0f} ms "
              f"({record['train_ratio']:.2f}x), capture of {config.capture_batch} images "
              f"{record['capture_nchw_ms']:.0f} -> {record['capture_nhwc_ms']:.0f} ms "
              f"({record['capture_ratio']:.2f}x); q differs by {record['q_relative_difference']:.1e} "
              f"(each from float64: {record['q_error_nchw']:.1e}, {record['q_error_nhwc']:.1e})", flush=True)
    save(args.out, "bench_resnet_memory", records, started, profile=args.profile, threads=args.threads,
         steps=args.steps, repeats=args.repeats)


if __name__ == "__main__":
    main()
