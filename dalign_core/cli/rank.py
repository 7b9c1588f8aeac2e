"""``dalign rank``: a model's insertion points in the order of each predictor of where to grow.

``dalign rank --model MODEL --data DATA`` orders the insertion points by each predictor of
where to grow (the reproduction's growth study, through :data:`EVIDENCE_GROUP`): d_align, d_∥, d_2, ‖μ‖², μ_Mᵀg_K and B_align at
``--budgets``, and the plain baseline, the norm of the gradient of a zero-output block
inserted there; each with its interval, and the redundancy warning above 0.9. The first
half of the examples gives the train mean and the block gradient, the second half the
geometry and the held-out mean. Besides a causal LM folder and text, it takes any
``nn.Module`` built by ``--arch module:callable`` (``--arch torchvision.models:resnet18``,
``--arch-kwargs '{"num_classes": 10}'``) with ``--model`` a state dict (``.pt`` or
``.safetensors``) and ``--data`` a ``.pt`` file of ``{"inputs": …, "targets": …}`` or an image folder.
``--csv`` writes every number.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from dalign_core.cli.options import check_out, check_seq_len_option, local_input_paths, is_local_data
from dalign_core.cli.output import clip_left, render_table, with_progress, write_csv
from dalign_core.cli.redundancy_check import is_redundant, owner_of, redundancy_warning

__all__ = ["rank", "format_ranking"]


RANK_LABELS = {"d_align": "d_align", "d_par": "d_par", "d_2": "d_2", "mean_sq": "||mu||^2", "grad_norm": "|grad|"}


def _rank_label(name: str) -> str:
    if name.startswith("alignment_"):
        return f"mu.g@{name.split('_')[1]}"
    if name.startswith("b_align_"):
        return f"B_align@{name.split('_')[2]}"
    return RANK_LABELS.get(name, name)


EVIDENCE_GROUP = "dalign.rank_evidence"
"""The entry-point group of functions ``() -> str | None`` that say what a study says of d_align as a guide to where
to grow. The reproduction package registers its growth study's reading there; the core never imports it."""


def _growth_evidence() -> str:
    """One sentence on how well d_align guides growth, from the first registered :data:`EVIDENCE_GROUP` function
    that has results to read (the reproduction's growth study, where it is installed in a checkout with results)."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=EVIDENCE_GROUP), key=lambda e: e.name):
        try:
            sentence = entry.load()()
        except Exception as error:  # a broken plug-in must not break the ranking it only annotates
            return f"the evidence plug-in {entry.name!r} failed ({type(error).__name__}: {error})."
        if sentence:
            return sentence
    return "no growth results of this project were found here: nothing says how well d_align guides growth."


def _order_text(rows: list[dict], name: str, index: dict) -> str:
    """The points by predictor ``name``, best first, "=" between exact ties and ">" otherwise."""
    ranked = sorted(rows, key=lambda r: r[f"rank_{name}"])
    text = str(index[ranked[0]["layer"]])
    for before, after in zip(ranked, ranked[1:]):
        tie = before[name] == after[name] or (math.isnan(before[name]) and math.isnan(after[name]))
        text += (" = " if tie else " > ") + str(index[after["layer"]])
    return text


def _points_table(rows: list[dict], owned: dict, width: int) -> str:
    """The points by number, with each one's redundancy (``*`` above the threshold), names clipped to ``width``."""
    legend = []
    for i, row in enumerate(rows):
        check = owned.get(row["layer"])
        legend.append([str(i), row["layer"], f"{check['fraction']:.2f}" if check else "-",
                       "*" if check and is_redundant(check) else ""])
    used = max(4, *(len(r[1]) for r in legend))
    for r in legend:
        r[1] = clip_left(r[1], min(used, width - 16))
    return render_table(["#", "layer", "red.", ""], legend, ["r", "l", "r", "l"])


def _with_interval(row: dict, name: str) -> str:
    """Predictor ``name`` of ``row`` as ``value ± half-width`` (the value alone where it has no interval)."""
    lo, hi = row[f"{name}_lo"], row[f"{name}_hi"]
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return f"{row[name]:.3g}"
    return f"{row[name]:.3g} ± {(hi - lo) / 2:.2g}"


def _values_table(rows: list[dict], names: list[str]) -> str:
    """The main predictors of each point with their intervals: d_align, ‖μ‖², the first alignment, |grad|."""
    alignment = next(name for name in names if name.startswith("alignment_"))
    shown = [("d_align", "d_align"), ("mean_sq", "||mu||^2"), (alignment, _rank_label(alignment)),
             ("grad_norm", "|grad|")]
    return render_table(["#"] + [label for _, label in shown],
                        [[str(i)] + [_with_interval(row, name) for name, _ in shown] for i, row in enumerate(rows)],
                        ["r"] + ["r"] * len(shown))


def _recommendation(rows: list[dict], index: dict) -> str:
    """The point d_align puts first, and the points whose d_align interval overlaps its own."""
    top = min(rows, key=lambda r: r["rank_d_align"])
    lo, hi = top.get("d_align_lo"), top.get("d_align_hi")
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        overlap = "its d_align has no interval here, so no other point is ruled out"
    else:
        close = [index[r["layer"]] for r in rows if r is not top and r.get("d_align_lo") is not None
                 and not math.isnan(r["d_align_lo"]) and r["d_align_lo"] <= hi and r["d_align_hi"] >= lo]
        overlap = (f"the d_align intervals of {', '.join(f'#{i}' for i in sorted(close))} overlap it: the data do "
                   "not tell those points apart" if close else "no other point's d_align interval overlaps it")
    return f"recommended by d_align: #{index[top['layer']]} ({top['layer']}); {overlap}."


def _orders(rows: list[dict], names: list[str], index: dict, width: int) -> list[str]:
    """Each predictor's order of the points, wrapped to ``width``; those identical to d_align's named once."""
    import textwrap

    lines = ["order by each predictor (best first, by #; =: a tie; B_align: lowest first):"]
    reference = _order_text(rows, "d_align", index)
    same = []
    for name in names:
        text = _order_text(rows, name, index)
        if name != "d_align" and text == reference:
            same.append(_rank_label(name))
            continue
        label = f"{_rank_label(name):<11} "
        parts = textwrap.wrap(text, width=width - len(label), break_on_hyphens=False)
        lines += [(label if k == 0 else " " * len(label)) + part for k, part in enumerate(parts)]
    if same:
        lines += textwrap.wrap(f"same order as d_align: {', '.join(same)}", width)
    return lines


def format_ranking(rows: list[dict], names: list[str], owned: dict, n: int, reduction: str, confidence: float,
                   width: int = 80, evidence: str | None = None) -> str:
    """The ``dalign rank`` report: the points (with redundancy), the main predictors with intervals, the recommended
    point (d_align's first) and those whose d_align interval overlaps it, each predictor's order (exact ties as "=";
    an order identical to d_align's named once, not repeated), and ``evidence``: what the project's growth results
    say of d_align as a guide (default: :func:`_growth_evidence`)."""
    import textwrap

    from dalign_core.capture.redundancy import REDUNDANT

    pct = f"{confidence * 100:g}%"
    half = n // 2
    header = (f"{len(rows)} insertion points, n={n} examples ({half} train: the train mean and the block gradient; "
              f"{n - half} held out: the geometry and the held-out mean), {reduction} q, {pct} intervals. "
              f"red.: the share of q that trained parameters' gradients already own (above {REDUNDANT}: *).")
    index = {row["layer"]: i for i, row in enumerate(rows)}
    evidence = _growth_evidence() if evidence is None else evidence
    return ("\n".join(textwrap.wrap(header, width)) + "\n" + _points_table(rows, owned, width) + "\n\n"
            + _values_table(rows, names) + "\n\n"
            + "\n".join(textwrap.wrap(_recommendation(rows, index), width)) + "\n"
            + "\n".join(_orders(rows, names, index, width)) + "\n\n"
            + "\n".join(textwrap.wrap(evidence, width)))


def _check_rank_args(args: argparse.Namespace) -> None:
    """Refuse ``dalign rank``'s counts and levels that cannot work, before anything is loaded."""
    if args.examples < 8:
        raise ValueError(f"--examples must be at least 8 (two halves of at least 4), got {args.examples}")
    if args.redundancy_examples != 0 and args.redundancy_examples < 4:
        raise ValueError(f"--redundancy-examples must be 0 (skip) or at least 4, got {args.redundancy_examples}")
    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must lie strictly between 0 and 1, got {args.confidence}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.arch is None:
        check_seq_len_option(args)


def _arch_inputs(args: argparse.Namespace, device) -> tuple:
    """``--arch``: the model a callable builds (weights from ``--model``) and its examples: ``(model, n,
    batches(lo, hi))``, where ``batches`` cuts examples ``lo:hi`` into batches of ``--batch-size``."""
    from dalign_core.cli.examples import arch_batches, arch_examples
    from dalign_core.cli.loading import load_arch

    if args.csv is not None:  # never over the state dict or the tensors it reads
        check_out(args.csv, (("the --model file", Path(args.model)), ("the --data file", Path(args.data))),
                  flag="--csv")
    model = load_arch(args, device)
    inputs, targets = arch_examples(args, args.examples)
    return model, len(targets), arch_batches(inputs, targets, args.batch_size)


def _lm_inputs(args: argparse.Namespace, device) -> tuple:
    """A causal LM folder (or hub name) and text: ``(model, n, batches(lo, hi))`` of tokenized sequences."""
    from dalign_core.cli.examples import check_data_file, make_batches, read_sequences
    from dalign_core.cli.loading import (check_seq_len, check_tokenizer_fits, load_model, load_tokenizer,
                                         resolve_model_source)

    source = resolve_model_source(args.model, revision=args.revision)
    data_path = Path(args.data).expanduser() if is_local_data(args.data) else None
    if data_path is not None:
        check_data_file(data_path)
    if args.csv is not None:  # before anything is loaded; never over the data, model or tokenizer
        check_out(args.csv, local_input_paths(source, data_path, args.tokenizer), flag="--csv")
    tokenizer = load_tokenizer(args.tokenizer if args.tokenizer else source)
    model = load_model(source, device=device)
    check_tokenizer_fits(tokenizer, model)
    check_seq_len(model, args.seq_len)
    sequences = read_sequences(args, tokenizer, args.examples, data_path)

    def batches(lo: int, hi: int) -> list:
        return make_batches(sequences[lo:hi], args.batch_size, pad_id=0)

    return model, len(sequences), batches


def _budgets(text: str | None, n: int) -> list[int]:
    """``--budgets`` (whole numbers separated by commas; default a quarter of the train half and all of it),
    each within [2, the smaller half of ``n``]."""
    half = n // 2
    try:
        budgets = (sorted({int(b) for b in text.split(",") if b.strip()}) if text else
                   sorted({max(2, half // 4), half}))
    except ValueError as err:
        raise ValueError(f"--budgets must be whole numbers separated by commas, got {text!r}") from err
    if not budgets or budgets[0] < 2 or budgets[-1] > min(half, n - half):
        raise ValueError(f"--budgets {budgets} must lie in [2, {min(half, n - half)}] (half of the {n} examples)")
    return budgets


def _annotate(rows: list[dict], args: argparse.Namespace, n: int, owned: dict, block_index: dict) -> None:
    """Add to each point's row the run's settings, its block index and its redundancy (and owner, if redundant)."""
    for row in rows:
        check = owned.get(row["layer"])
        row.update(model=args.model, data=args.data, n=n, reduction=args.reduction, confidence=args.confidence,
                   layer_index=block_index.get(row["layer"]),
                   redundancy=check["fraction"] if check else None,
                   redundant_with=owner_of(check) if check and is_redundant(check) else None)


def rank(args: argparse.Namespace) -> list[dict]:
    """Run ``dalign rank``; return one record per insertion point (also printed and optionally written)."""
    from dalign_core.device import resolve_device
    from dalign_core.growth import predicting as growth
    from dalign_core.capture.layers import insertion_points, resolve_layers
    from dalign_core.capture.redundancy import redundancy_rows

    _check_rank_args(args)
    device = resolve_device(args.device)
    model, n, batches = (_arch_inputs if args.arch is not None else _lm_inputs)(args, device)
    if n < 8:
        raise ValueError(f"{args.data} gives only {n} example(s); at least 8 are needed (two halves of 4)")
    layers = list(resolve_layers(model, args.layer if args.layer == "all" else
                                 [s.strip() for s in args.layer.split(",") if s.strip()]))
    if len(layers) < 2:
        print("note: one insertion point: there is nothing to order", file=sys.stderr)
    half, budgets = n // 2, _budgets(args.budgets, n)
    measured = growth.predictors(model, layers, batches(half, n), batches(0, half), reduction=args.reduction,
                                 budgets=budgets, hidden=args.hidden, block_seed=args.seed,
                                 confidence=args.confidence, random_key=args.seed)
    names = [name for name in growth.predictor_names(budgets) if name != "random"]
    rows = growth.point_rows(measured, names)
    owned = {}
    if args.redundancy_examples:
        checked = redundancy_rows(model, layers, with_progress(batches(0, min(n, args.redundancy_examples)),
                                                               "redundancy check", not getattr(args, "quiet", False)),
                                  reductions=(args.reduction,))
        owned = {row["layer"]: row for row in checked}
    _annotate(rows, args, n, owned, {name: i for i, name in enumerate(insertion_points(model))}
              if args.layer == "all" else {})
    print(format_ranking(rows, names, owned, n, args.reduction, args.confidence))
    for layer in layers:
        check = owned.get(layer)
        if check and is_redundant(check):
            print(redundancy_warning(check), file=sys.stderr)
    if args.csv is not None:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")
    return rows
