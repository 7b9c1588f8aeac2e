"""``dalign estimate``: d_align and the misalignment certificates at one layer or at every residual block.

``dalign estimate --model MODEL [--revision REV] --layer LAYER|all --data DATA --examples N [--m M --k K] [--out FILE]``
estimates the activation-gradient geometry at one or more insertion points of a
causal language model and prints ‖μ‖², d_∥, d_2 and d_align with jackknife
confidence intervals, and the misalignment certificates B_exact and B_align for
train/test budgets M and K: B_align at the d_align estimate and, the certificate,
at the lower end of its interval (1, and a note, when that interval reaches 0).
Inputs that would give wrong numbers (a checkpoint that does not match its config,
a tokenizer larger than the embedding, a --seq-len beyond the model's positions,
a --data file that is not UTF-8 text) are refused with one line on stderr, and an
--out that cannot be written is refused before anything is loaded. ``--layer all`` scans every residual block (decoder
layer) in one backward pass per batch and ranks them by d_align: where a block
inserted near zero output would have its training direction carry over to test
data best. With ``--arch`` it measures any ``nn.Module``, as ``dalign rank`` does (:mod:`~dalign_core.cli.rank`).

It also checks the q it measured as ``dalign layers --data`` does (:mod:`~dalign_core.cli.layers`), on up to
``--redundancy-examples`` of its examples (64 by default, every one with ``--thorough-redundancy``), warns above 0.9
and writes the fraction to the CSV (``redundancy``, ``redundant_with``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from dalign_core.cli.options import check_out, check_seq_len_option, local_input_paths, is_local_data
from dalign_core.cli.output import format_value, render_table, with_progress, write_csv
from dalign_core.cli.redundancy_check import (QUICK_EXAMPLES, is_redundant, owner_of, redundancy_by_layer,
                                             redundancy_warning)

__all__ = ["estimate", "format_table", "CSV_COLUMNS"]


def _ci(row: dict, name: str) -> str:
    lo, hi = row.get(f"{name}_lo"), row.get(f"{name}_hi")
    if lo is None or hi is None:
        return "-"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "none (see the note below)"
    return f"[{format_value(lo)}, {format_value(hi)}]"


def _undefined_note(records: list[dict]) -> str:
    """Why an interval is missing: d_par is infinite where mu' Sigma mu is estimated at or below 0."""
    unestimable = [r["layer"] for r in records
                   if not (math.isfinite(r.get("d_par_lo", 0.0)) and math.isfinite(r.get("d_par_hi", 0.0)))]
    if not unestimable:
        return ""
    return ("\nnote: d_par has no interval at " + ", ".join(unestimable) + ": mu' Sigma mu (the noise along the "
            "mean) is estimated at or below 0, so d_par = ||mu||^4 / mu' Sigma mu is unbounded in some jackknife "
            "replicates; d_align is then set by d_2. More examples narrow it.")


def _uncertified(row: dict) -> bool:
    """True when the d_align interval reaches 0 (or is missing): these examples certify nothing."""
    low = row.get("d_align_lo")
    return low is None or not low > 0


def _zero_note(records: list[dict]) -> str:
    """Where q is exactly 0 for every example: d_align is 0 by construction, which more examples do not change."""
    zero = [r["layer"] for r in records if r.get("q_all_zero")]
    if not zero:
        return ""
    return ("\nnote: q is exactly 0 for every example at " + ", ".join(zero[:5]) + (", …" if len(zero) > 5 else "")
            + ": the loss does not change with that layer's output on these examples (nothing after it reaches the "
            "loss, or the loss is flat there), so ||mu||^2, d_par, d_2 and d_align are 0 by construction and certify "
            "nothing; more examples will not change that: capture at another layer, or check the model and data.")


def _sketch_note(records: list[dict]) -> str:
    """A sketch that is no smaller than q: it saves nothing and only approximates what q itself gives exactly."""
    large = [r for r in records if r.get("sketch_dim") and r.get("d") and r["sketch_dim"] >= r["d"]]
    if not large:
        return ""
    r = large[0]
    return (f"\nnote: --sketch-dim {r['sketch_dim']} is not smaller than q's dimension d={r['d']}: the sketch saves "
            "no memory and only approximates the geometry q itself gives; drop --sketch-dim for the exact estimate "
            f"(a sketch pays only for k well below d).")


def _certificate_note(records: list[dict], pct: str) -> str:
    """A warning when a d_align interval reaches 0, so that the B_align estimate is not read as a certificate."""
    weak = [r["layer"] for r in records if _uncertified(r) and not r.get("q_all_zero")]
    if not weak:
        return ""
    n = records[0]["n"]
    where = "" if len(records) == 1 else f" at {len(weak)} of {len(records)} layers ({', '.join(weak[:5])}" + \
        (", …)" if len(weak) > 5 else ")")
    return (f"\nnote: the {pct} interval of d_align reaches 0{where}, so these n={n} examples certify nothing there "
            "(B_align at the interval's lower end is 1) and B_align at the estimate is not a certificate; "
            "use more examples (--examples) for one")


def format_table(records: list[dict], confidence: float) -> str:
    """Human-readable results: a detailed table for one layer, a ranked table for several.

    Besides B_align at the point estimate of d_align, each table shows the certificate
    B_align at the lower end of d_align's interval, and a note says where that
    interval reaches 0 (too wide for any certificate).
    """
    pct = f"{confidence * 100:g}%"
    if len(records) == 1:
        r = records[0]
        header = (f"layer {r['layer']}: n={r['n']} examples, d={r['d']} ({r['reduction']} reduction), "
                  f"{pct} jackknife intervals")
        budgets = f"(M={format_value(r['M'])}, K={format_value(r['K'])})"
        rows = [
            ["||mu||^2", format_value(r["mean_sq"]), _ci(r, "mean_sq")],
            ["d_par", format_value(r["d_par"]), _ci(r, "d_par")],
            ["d_2", format_value(r["d_2"]), _ci(r, "d_2")],
            ["d_align", format_value(r["d_align"]), _ci(r, "d_align")],
            [f"B_exact {budgets}", format_value(r["b_exact"]), ""],
            [f"B_align {budgets}", format_value(r["b_align"]), _ci(r, "b_align")],
            [f"B_align at d_align's {pct} lower end (certificate)", format_value(r["b_align_at_lo"]), ""],
        ]
        table = render_table(["quantity", "estimate", f"{pct} CI"], rows, ["l", "r", "l"])
        return (header + "\n" + table + _zero_note(records) + _certificate_note(records, pct) + _undefined_note(records)
                + _sketch_note(records))
    ranked = sorted(records, key=lambda r: r["rank"])
    rows = [
        [str(r["rank"]), r["layer"], format_value(r["mean_sq"]), format_value(r["d_par"]), format_value(r["d_2"]), format_value(r["d_align"]),
         _ci(r, "d_align"), format_value(r["b_exact"]), format_value(r["b_align"]), format_value(r["b_align_at_lo"])]
        for r in ranked
    ]
    first = ranked[0]
    header = (
        f"{len(records)} insertion points, ranked by d_align (highest first: where an inserted block's training "
        f"direction would carry over to test data best)\n"
        f"n={first['n']} examples, d={first['d']} ({first['reduction']} reduction), {pct} jackknife intervals, "
        f"certificates at M={format_value(first['M'])}, K={format_value(first['K'])}; B_align@lo: the certificate, B_align at "
        f"d_align's {pct} lower end"
    )
    headers = ["rank", "layer", "||mu||^2", "d_par", "d_2", "d_align", f"d_align {pct} CI", "B_exact", "B_align",
               "B_align@lo"]
    table = render_table(headers, rows, ["r", "l", "r", "r", "r", "r", "l", "r", "r", "r"])
    return (header + "\n" + table + _zero_note(ranked) + _certificate_note(ranked, pct) + _undefined_note(ranked)
            + _sketch_note(ranked))


CSV_COLUMNS = [
    "rank", "model", "revision", "layer", "layer_index", "data", "reduction", "seq_len", "n", "d", "M", "K",
    "confidence",
    "mean_sq", "mean_sq_lo", "mean_sq_hi", "mean_sq_se",
    "d_par", "d_par_lo", "d_par_hi", "d_par_se",
    "d_2", "d_2_lo", "d_2_hi", "d_2_se",
    "d_align", "d_align_lo", "d_align_hi", "d_align_se",
    "b_exact", "b_align", "b_align_lo", "b_align_hi", "b_align_at_lo",
    "mean_sq_sq", "directional", "cov_energy", "method", "sketch_dim", "wall_time_s",
    "redundancy", "redundant_with", "q_all_zero",
]


def _b_align_columns(row: dict, M: float, K: float) -> dict:
    """B_align at the d_align estimate and at its interval's ends; ``b_align_at_lo`` is the certificate.

    B_align falls as d_align grows, so ``b_align_lo``/``b_align_hi`` come from d_align's
    upper/lower end; a lower end at 0 gives 1: no certificate. A missing or NaN
    d_align gives NaN.
    """
    from dalign_core.geometry.bounds import b_align

    def at(d_align) -> float:
        if d_align is None or math.isnan(d_align):
            return math.nan
        return b_align(max(d_align, 0.0), M, K)

    at_low = at(row.get("d_align_lo"))
    return {"b_align": at(row["d_align"]), "b_align_lo": at(row.get("d_align_hi")), "b_align_hi": at_low,
            "b_align_at_lo": at_low}


def _block_indices(model) -> dict[str, int]:
    """Position of each residual block (insertion point) in forward order; {} for a model without blocks."""
    from dalign_core.capture.layers import insertion_points
    from dalign_core.capture.refusals import CaptureError

    try:
        return {name: i for i, name in enumerate(insertion_points(model))}
    except CaptureError:
        return {}


def _redundancy_examples(args: argparse.Namespace) -> int:
    """How many examples the redundancy check takes: ``--redundancy-examples``, else every example with
    ``--thorough-redundancy``, else :data:`~dalign_core.cli.redundancy_check.QUICK_EXAMPLES`."""
    thorough = getattr(args, "thorough_redundancy", False)
    if args.redundancy_examples is not None:
        if thorough:
            raise ValueError("--thorough-redundancy checks every example: leave out --redundancy-examples, or give "
                             "only --redundancy-examples N")
        return args.redundancy_examples
    return args.examples if thorough else QUICK_EXAMPLES


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse numeric options out of range, before anything is loaded."""
    if args.examples < 5:
        raise ValueError(f"--examples must be at least 5 (the intervals need n >= 5), got {args.examples}")
    if args.arch is None:
        check_seq_len_option(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.sketch_dim is not None and args.sketch_dim < 1:
        raise ValueError(f"--sketch-dim must be at least 1, got {args.sketch_dim}")
    args.redundancy_examples = _redundancy_examples(args)
    if args.redundancy_examples != 0 and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be 0 (skip the check) or at least 4 (the held-out fit needs "
                         f"them), got {args.redundancy_examples}")
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must lie strictly between 0 and 1, got {args.confidence}")
    for flag, value in (("--m", args.m), ("--k", args.k)):
        if value is not None and not (value >= 1 and math.isfinite(value)):
            raise ValueError(f"{flag} is a number of examples and must be a finite number, at least 1, got {value}")


def estimate(args: argparse.Namespace) -> list[dict]:
    """Run ``dalign estimate``; return one record per layer (also printed and optionally written)."""
    import torch
    from dalign_core.device import resolve_device
    from dalign_core.capture.hooks import accumulate_geometry
    from dalign_core.capture.layers import resolve_layers
    from dalign_core.cli.examples import read_sequences, check_data_file, make_batches
    from dalign_core.cli.loading import (
        check_seq_len,
        check_tokenizer_fits,
        load_model,
        load_tokenizer,
        resolve_model_source,
    )

    _check_numbers(args)
    device = resolve_device(args.device)
    if args.arch is not None:
        return _estimate_arch(args, device)
    source = resolve_model_source(args.model, revision=args.revision)  # fails fast, loads nothing
    data_path = Path(args.data).expanduser() if is_local_data(args.data) else None
    if data_path is not None:
        check_data_file(data_path)
    if args.out is not None:  # before anything is loaded or computed; never over the data, model or tokenizer
        check_out(args.out, local_input_paths(source, data_path, args.tokenizer))
    start = time.perf_counter()

    tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
    model = load_model(source, device=device, dtype=getattr(torch, args.dtype))
    check_tokenizer_fits(tokenizer, model)
    check_seq_len(model, args.seq_len)
    layer_arg = args.layer if args.layer == "all" else [s.strip() for s in args.layer.split(",") if s.strip()]
    modules = resolve_layers(model, layer_arg)  # unknown names fail here, before any data is read
    block_index = _block_indices(model)

    sequences = read_sequences(args, tokenizer, args.examples, data_path)
    if len(sequences) < 5:
        raise ValueError(
            f"{args.data} gives only {len(sequences)} example(s) of up to {args.seq_len} tokens; at least 5 are "
            "needed: use more text or a smaller --seq-len"
        )
    if len(sequences) < args.examples:
        print(f"note: {args.data} holds only {len(sequences)} examples of {args.seq_len} tokens; using all of them",
              file=sys.stderr)
    n = len(sequences)
    batches = make_batches(sequences, args.batch_size, pad_id=0)
    accumulators = accumulate_geometry(
        model, list(modules), batches, examples=n, reduction=args.reduction, sketch_dim=args.sketch_dim,
        progress=not args.quiet, desc=f"capture ({len(modules)} layer{'s' if len(modules) > 1 else ''})",
    )
    owned = {}
    if args.redundancy_examples:  # is the q just measured a trained parameter's gradient?
        owned = redundancy_by_layer(model, list(modules), sequences[:args.redundancy_examples], args.batch_size,
                                     (args.reduction,), progress=not args.quiet)
    return _report_estimate(args, accumulators, owned, block_index, n, args.revision, time.perf_counter() - start)


def _estimate_arch(args: argparse.Namespace, device) -> list[dict]:
    """``dalign estimate --arch``: the model a callable builds, on tensors or an image folder; as :func:`estimate`."""
    import torch
    from dalign_core.capture.hooks import accumulate_geometry
    from dalign_core.capture.layers import resolve_layers
    from dalign_core.capture.redundancy import redundancy_rows
    from dalign_core.cli.examples import arch_batches, arch_examples
    from dalign_core.cli.loading import load_arch

    if args.out is not None:  # never over the state dict or the examples
        check_out(args.out, (("the --model file", Path(args.model)), ("the --data file or folder", Path(args.data))))
    start = time.perf_counter()
    model = load_arch(args, device).to(getattr(torch, args.dtype))
    layer_arg = args.layer if args.layer == "all" else [s.strip() for s in args.layer.split(",") if s.strip()]
    modules = resolve_layers(model, layer_arg)
    block_index = _block_indices(model)
    inputs, targets = arch_examples(args, args.examples)
    if inputs.is_floating_point():
        inputs = inputs.to(getattr(torch, args.dtype))
    n = len(targets)
    if n < 5:
        raise ValueError(f"{args.data} gives only {n} example(s); at least 5 are needed")
    if n < args.examples:
        print(f"note: {args.data} holds only {n} examples; using all of them", file=sys.stderr)
    batches = arch_batches(inputs, targets, args.batch_size)
    accumulators = accumulate_geometry(
        model, list(modules), batches(0, n), examples=n, reduction=args.reduction, sketch_dim=args.sketch_dim,
        progress=not args.quiet, desc=f"capture ({len(modules)} layer{'s' if len(modules) > 1 else ''})",
    )
    owned = {}
    if args.redundancy_examples:
        rows = redundancy_rows(model, list(modules), with_progress(batches(0, min(n, args.redundancy_examples)),
                                                                    "redundancy check", not args.quiet),
                               reductions=(args.reduction,))
        owned = {(row["layer"], row["reduction"]): row for row in rows}
    return _report_estimate(args, accumulators, owned, block_index, n, None, time.perf_counter() - start)


def _report_estimate(args: argparse.Namespace, accumulators: dict, owned: dict, block_index: dict, n: int,
                     revision: str | None, wall: float) -> list[dict]:
    """Rows of ``dalign estimate`` from each layer's accumulator: printed, warned about, written to ``--out``."""
    M = args.m if args.m is not None else n
    K = args.k if args.k is not None else n
    records = []
    for name, accumulator in accumulators.items():
        geometry = accumulator.result(args.confidence)
        row = geometry.to_row()
        row.update(
            model=args.model, revision=revision, layer=name, layer_index=block_index.get(name), data=args.data,
            reduction=args.reduction, seq_len=None if args.arch else args.seq_len, M=M, K=K,
            confidence=args.confidence, b_exact=geometry.b_exact(M, K), wall_time_s=round(wall, 3),
            **_b_align_columns(row, M, K),
        )
        row["q_all_zero"] = accumulator.n > 0 and not bool((accumulator.gram().diagonal() > 0).any())
        check = owned.get((name, args.reduction))
        row.update(redundancy=check["fraction"] if check else None,
                   redundant_with=owner_of(check) if check and is_redundant(check) else None)
        records.append(row)
    ranked = sorted(records, key=lambda r: (-r["d_align"] if not math.isnan(r["d_align"]) else math.inf))
    for rank, row in enumerate(ranked, start=1):
        row["rank"] = rank
    print(format_table(records, args.confidence))
    for row in records:
        check = owned.get((row["layer"], args.reduction))
        if check and is_redundant(check):
            print(redundancy_warning(check), file=sys.stderr)
    if args.out is not None:
        write_csv(args.out, sorted(records, key=lambda row: row["rank"]), CSV_COLUMNS)
        print(f"wrote {args.out}")
    return records
