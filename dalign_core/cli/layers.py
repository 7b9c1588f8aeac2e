"""``dalign layers``: a model's insertion points (residual blocks), with ``--data`` the redundancy of q at each.

``dalign layers --model MODEL`` lists the insertion points; with ``--data`` it adds each
one's redundancy fraction (:mod:`dalign_core.capture.redundancy`) of the shared and the full q on
``--redundancy-examples`` examples: the share of q that trained parameters' gradients
already own (above 0.9, training drives ‖μ‖² to zero at any width and d_align there
says little about width).

Without ``--data`` it loads the model on the cpu and prints one name a line (``--all-modules``: every named module).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dalign_core.cli.options import check_seq_len_option, is_local_data
from dalign_core.cli.output import clip_left, render_table, with_progress
from dalign_core.cli.redundancy_check import is_redundant, owner_of, redundancy_by_layer

__all__ = ["format_redundancy", "layers_command"]


def format_redundancy(names: list[str], owned: dict, n: int, width: int = 80) -> str:
    """The ``dalign layers --data`` table: each block's redundancy fraction of the shared and the full q."""
    from dalign_core.capture.redundancy import REDUNDANT

    header = (f"redundancy of q at each block on n={n} examples: the share already owned by\n"
              f"trained parameters' gradients (held-out fit; 1 = exactly one's gradient).\n"
              f"Above {REDUNDANT}, training drives ||mu||^2 to 0 at any width (*).")
    rows = []
    for name in names:
        shared, full = owned[name, "shared"], owned[name, "full"]
        flag = "*" if is_redundant(shared) or is_redundant(full) else ""
        owner = owner_of(shared) if is_redundant(shared) else owner_of(full) if is_redundant(full) else None
        rows.append([name, f"{shared['fraction']:.2f}", f"{full['fraction']:.2f}", flag, owner or "-"])
    used = max(len("layer"), *(len(r[0]) for r in rows)) + 2 + 6 + 2 + 4 + 2 + 1 + 2
    for row in rows:
        row[-1] = clip_left(row[-1], max(width - used, 8))
    return header + "\n" + render_table(["layer", "shared", "full", "", "owned by"], rows, ["l", "r", "r", "l", "l"])


def layers_command(args: argparse.Namespace) -> None:
    """``dalign layers``: the model's insertion points, and with --data which of them repeat each other's gradients."""
    from dalign_core.device import resolve_device
    from dalign_core.capture.layers import insertion_points
    from dalign_core.cli.examples import read_sequences, check_data_file
    from dalign_core.cli.loading import (
        check_seq_len,
        check_tokenizer_fits,
        load_model,
        load_tokenizer,
        resolve_model_source,
    )

    if args.data is not None and args.all_modules:
        raise ValueError("--all-modules lists names only; the redundancy column (--data) is for residual blocks: "
                         "drop one of them")
    if args.data is not None:
        if args.arch is None:
            check_seq_len_option(args)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.data is not None and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be at least 4 (the held-out fit needs them), "
                         f"got {args.redundancy_examples}")
    if args.arch is not None:
        return _layers_arch(args)
    source = resolve_model_source(args.model, revision=args.revision)
    data_path = Path(args.data).expanduser() if args.data is not None and is_local_data(args.data) else None
    if data_path is not None:
        check_data_file(data_path)
    device = resolve_device(args.device) if args.data is not None else "cpu"
    model = load_model(source, device=device)
    names = [n for n, _ in model.named_modules() if n] if args.all_modules else insertion_points(model)
    if args.data is None:
        for name in names:
            print(name)
        return
    tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
    check_tokenizer_fits(tokenizer, model)
    check_seq_len(model, args.seq_len)
    sequences = read_sequences(args, tokenizer, args.redundancy_examples, data_path)
    if len(sequences) < 4:
        raise ValueError(f"{args.data} gives only {len(sequences)} example(s) of up to {args.seq_len} tokens; the "
                         "redundancy check needs at least 4: use more text or a smaller --seq-len")
    owned = redundancy_by_layer(model, names, sequences, args.batch_size, ("shared", "full"),
                                 progress=not getattr(args, "quiet", False))
    print(format_redundancy(names, owned, len(sequences)))


def _layers_arch(args: argparse.Namespace) -> None:
    """``dalign layers --arch``: the insertion points of the model a callable builds, with --data their redundancy."""
    from dalign_core.device import resolve_device
    from dalign_core.capture.layers import insertion_points
    from dalign_core.capture.redundancy import redundancy_rows
    from dalign_core.cli.examples import arch_batches, arch_examples
    from dalign_core.cli.loading import load_arch

    device = resolve_device(args.device) if args.data is not None else "cpu"
    model = load_arch(args, device)
    names = [n for n, _ in model.named_modules() if n] if args.all_modules else insertion_points(model)
    if args.data is None:
        for name in names:
            print(name)
        return
    inputs, targets = arch_examples(args, args.redundancy_examples)
    if len(targets) < 4:
        raise ValueError(f"{args.data} gives only {len(targets)} example(s); the redundancy check needs at least 4")
    batches = arch_batches(inputs, targets, args.batch_size)(0, len(targets))
    rows = redundancy_rows(model, names, with_progress(batches, "redundancy check", not getattr(args, "quiet", False)),
                           reductions=("shared", "full"))
    owned = {(row["layer"], row["reduction"]): row for row in rows}
    print(format_redundancy(names, owned, len(targets)))
