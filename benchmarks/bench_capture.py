"""Overhead of one-pass activation-gradient capture + streaming estimation (``make bench``).

For LLaMA-style models (transformers ``LlamaConfig``, SwiGLU FFN ≈ 8N/3, head dim 64)
of widths 128 … 1024, the same batches go through:

* ``bare``        — an ordinary forward + backward of the mean loss (``loss.backward()``,
                    all parameter gradients): the reference pass, ratio 1.
* ``floor``       — the least any capture must do: a forward and a backward *down to the insertion
                    point* (``autograd.grad`` of the mean next-token loss with respect to that
                    layer's output, the loss on the logits as the model returns them: no copy of
                    them, no parameter gradients). ``x floor`` is each method's time over it.
* ``capture``     — :func:`dalign_core.capture.hooks.accumulate_geometry` at one decoder layer:
                    forward, ``autograd.grad`` of the summed per-example losses with respect
                    to that layer's output, streaming Gram update, and the final estimate
                    (with its default determinism check: example 0 of the first batch once more).
* ``capture_unchecked`` — ``capture`` with ``check_determinism=False``: what the check costs.
* ``capture_all`` — the same for every decoder layer in one pass.
* ``loop``        — the obvious alternative: each example alone (batch size 1), same q.
* ``vmap``        — ``torch.func``: ``vmap`` over examples of ``grad`` with respect to an
                    additive perturbation of the layer output (zero), through
                    ``functional_call`` of the whole model. Checked against ``capture``.
* ``backpack``, ``opacus`` — the peers' libraries (BackPACK's ``BatchGrad``, Opacus' ``GradSampleModule``): the
                    per-example gradient of a zero bias added to the layer output, every other parameter
                    frozen (``benchmarks/_peers.py``); checked against ``capture``, skipped (and said so) where
                    the package is not installed (``make bench-env`` installs them into ``.venv-bench``, the
                    benchmarks' venv, never the project's).

``capture / best peer``: the capture (self-check on) over the fastest of ``vmap``, ``backpack`` and ``opacus``
(target <= 1.1x), printed per width and for the capture-ratio case.

Timing: per width one fresh process runs all methods round-robin (a warm-up pass over the first batch,
then ``--repeats`` passes each, each round starting at another method) and reports the best pass, which is the most robust
statistic when other processes share the CPU (the median is in the CSV too).
Memory: each (width, method) runs one pass in its own fresh process (all of its batches: at N = 512 the first batch
alone read 15-25% lower for most methods): on CPU, the growth of
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` over
the value after the model and batches were built (includes allocator slack; torch
tensors are invisible to tracemalloc); on GPU, ``torch.cuda.max_memory_allocated``
minus the memory allocated before the timed passes.

Usage::

    python benchmarks/bench_capture.py --out results/bench            # 7-8 minutes on 2 idle CPU cores
    python benchmarks/bench_capture.py --out results/bench --quick    # widths 128, 256 only, 2 x 8 sequences
    python benchmarks/bench_capture.py --out /tmp/bench --widths 32 256 --methods floor capture capture_unchecked
                                                 # the capture's cost over its floor

Besides the table it prints, per width, capture time over the floor (a forward and a
backward down to the insertion point) for ``capture`` and ``capture_unchecked``, and saves
them as ``capture_over_floor`` in the JSON (``ratio_vs_floor`` in the CSV).

First of all it prints the capture ratio of the issue's setup: capture plus estimation of one
batch of 32 sequences x 128 tokens at one layer of a 4-layer LLaMA of width 256, with the
determinism self-check on, over a bare forward and backward of that batch (target
<= 1.05x; ``--quick``: 8 x 64 tokens at width 128). It is saved as ``capture_ratio`` in the JSON.

Writes ``DIR/bench_capture.csv`` and ``DIR/bench_capture.json`` atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

METHODS = ("bare", "floor", "capture", "capture_unchecked", "capture_all", "loop", "vmap", "backpack", "opacus")
PEER_METHODS = ("vmap", "backpack", "opacus")
PEER_TARGET = 1.1
"""The capture (self-check on) at most this times the fastest peer."""
SELF_CHECK = "self_check"
"""The determinism self-check's work alone: example 0 of the first batch, forward and backward down to the layer
(timed for the capture ratio, not a method of the table)."""
TARGET_RATIO = 1.15
CAPTURE_RATIO_CASE = {"width": 256, "layers": 4, "batches": 1, "batch_size": 32, "seq_len": 128, "repeats": 7}
"""The setup of the capture ratio: one batch of 32 x 128 tokens at one layer of a 4-layer LLaMA of width 256, the best
of 7 passes of each method: the check is 4-9% of this capture and the fastest peer within a few
percent of the unchecked capture, differences that the best of 3 passes did not read apart from the load's."""
CAPTURE_RATIO_QUICK = {"width": 128, "layers": 4, "batches": 1, "batch_size": 8, "seq_len": 64}
CAPTURE_RATIO_TARGET = 1.05
"""Capture plus estimation of that batch, determinism self-check on, at most this times a bare forward+backward."""
PER_WIDTH_CASE = {"batch_size": 16, "batches": 8}
"""The per-width passes: 128 sequences in batches of 16, a ``dalign estimate`` of 128 examples at its default batch
size. The self-check is a fixed cost per capture (example 0 of the first batch once more, about 5 ms at N = 128 on
one thread), so it weighs on a capture in proportion to how little else the capture does: 15-25% of
``PER_WIDTH_QUICK``'s 16 sequences, which is what the per-width passes held until 2026-12-06."""
PER_WIDTH_QUICK = {"batch_size": 8, "batches": 2}


# ---------------------------------------------------------------------------
# Cases (each width timed in one fresh process; memory of each method in its own)


def _build(width: int, layers: int, vocab: int, seq_len: int, batch_size: int, batches: int, device, seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    heads = max(2, width // 64)
    intermediate = int(round(8 * width / 3 / 32)) * 32
    config = transformers.LlamaConfig(
        hidden_size=width, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=max(seq_len, 128),
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).to(device).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    data = [
        {"input_ids": torch.randint(0, vocab, (batch_size, seq_len), generator=generator).to(device)}
        for _ in range(batches)
    ]
    return model, data


def _vmap_rows(model, layer_name: str, batch, torch):
    """q rows by torch.func: vmap over examples of grad w.r.t. a zero perturbation of the layer output."""
    from torch.func import functional_call, grad, vmap

    import torch.nn.functional as F

    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    layer = dict(model.named_modules())[layer_name]
    state = {}

    def add_delta(module, args, output):
        if isinstance(output, tuple):
            return (output[0] + state["delta"], *output[1:])
        return output + state["delta"]

    def loss_one(delta, ids):
        state["delta"] = delta
        out = functional_call(model, (params, buffers), args=(ids.unsqueeze(0),), kwargs={"use_cache": False})
        return F.cross_entropy(out.logits[0, :-1].float(), ids[1:])

    ids = batch["input_ids"]
    b, T = ids.shape
    zeros = torch.zeros(b, T, model.config.hidden_size, device=ids.device, dtype=next(model.parameters()).dtype)
    handle = layer.register_forward_hook(add_delta)
    try:
        grads = vmap(grad(loss_one), in_dims=(0, 0))(zeros, ids)
    finally:
        handle.remove()
    return grads.sum(dim=1)


def _setup(args):
    import torch
    import torch.nn.functional as F

    from dalign_core.geometry.accumulator import GeometryAccumulator
    from dalign_core.capture.gradients import layer_gradients
    from dalign_core.capture.hooks import accumulate_geometry, activation_gradients
    from dalign_core.capture.layers import resolve_layers

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, data = _build(args.width, args.layers, args.vocab, args.seq_len, args.batch_size, args.batches, device,
                         args.seed)
    layer = f"model.layers.{min(1, args.layers - 1)}"

    def bare():
        for batch in data:
            model.zero_grad(set_to_none=True)
            out = model(**batch, use_cache=False)
            loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), batch["input_ids"][:, 1:].flatten())
            loss.backward()
        model.zero_grad(set_to_none=True)

    block = dict(model.named_modules())[layer]
    ignore = torch.full((args.batch_size, 1), -100, dtype=torch.long, device=device)

    def floor():
        seen = []
        handle = block.register_forward_hook(lambda module, inputs, output: seen.append(
            output[0] if isinstance(output, tuple) else output))
        try:
            for batch in data:
                seen.clear()
                out = model(**batch, use_cache=False)
                labels = torch.cat([batch["input_ids"][:, 1:], ignore[:len(batch["input_ids"])]], dim=1)
                loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
                torch.autograd.grad(loss, seen[0])
        finally:
            handle.remove()

    def capture():
        accumulate_geometry(model, layer, data).result()

    def capture_unchecked():
        accumulate_geometry(model, layer, data, check_determinism=False).result()

    def capture_all():
        for acc in accumulate_geometry(model, "all", data).values():
            acc.result()

    modules = resolve_layers(model, layer)
    first = {key: value[:1] for key, value in data[0].items()}

    def self_check():  # what the check adds to a capture that passes it: example 0 recomputed alone
        layer_gradients(model, modules, first, None, "auto", None)

    def loop():
        acc = GeometryAccumulator()
        for batch in data:
            ids = batch["input_ids"]
            for i in range(ids.shape[0]):
                acc.update(activation_gradients(model, layer, {"input_ids": ids[i:i + 1]}, check_determinism=False))
        acc.result()

    def vmap_method():
        acc = GeometryAccumulator()
        for batch in data:
            acc.update(_vmap_rows(model, layer, batch, torch))
        acc.result()

    fns = {"bare": bare, "floor": floor, "capture": capture,
           "capture_unchecked": capture_unchecked, "capture_all": capture_all, "loop": loop, "vmap": vmap_method,
           SELF_CHECK: self_check}
    from _peers import PEERS, missing, peer_rows

    peer_rows_of = {}
    for peer in PEERS:
        if peer in args.methods and not missing(peer):
            peer_rows_of[peer] = peer_rows(peer, model, layer)[0]

            def peer_method(rows=peer_rows_of[peer]):
                acc = GeometryAccumulator()
                for batch in data:
                    acc.update(rows(batch))
                acc.result()

            fns[peer] = peer_method
        elif peer in args.methods:
            fns[peer] = None  # reported as skipped

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    info = {"width": args.width, "layers": args.layers, "capture_layer": layer, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "examples": args.batch_size * args.batches,
            "params": sum(p.numel() for p in model.parameters()), "device": str(device),
            "threads": torch.get_num_threads()}
    info["peer_rows"] = peer_rows_of
    return model, data, layer, {m: fns[m] for m in args.methods}, sync, info


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"


def time_width(args) -> list[dict]:
    """Time every method at one width, interleaved round-robin over the repeats (robust to drifting load)."""
    import torch

    from dalign_core.capture.hooks import activation_gradients

    model, data, layer, fns, sync, info = _setup(args)
    peer_rows_of = info.pop("peer_rows")
    records = {m: {**info, "method": m, "n_layers_captured": args.layers if m == "capture_all" else 1,
                   "status": "ok", "error": "", "times_s": []} for m in fns}
    from _peers import missing

    for peer, fn in fns.items():
        if fn is None:
            records[peer].update(status="skipped", error=missing(peer))
    if peer_rows_of:
        reference = activation_gradients(model, layer, data[0])
        for peer, rows in peer_rows_of.items():
            try:
                got = rows(data[0])
                records[peer]["max_abs_diff_vs_capture"] = float((got - reference).abs().max())
                records[peer]["max_abs_q"] = float(reference.abs().max())
            except Exception as err:  # report, never fake
                records[peer].update(status="failed", error=_error(err))
    if "vmap" in fns:  # correctness first: torch.func must give the same q as the hook
        try:
            reference = activation_gradients(model, layer, data[0])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = _vmap_rows(model, layer, data[0], torch)
            notes = sorted({str(w.message).split(". ")[0][:160] for w in caught})
            records["vmap"]["warnings"] = " | ".join(notes)
            records["vmap"]["max_abs_diff_vs_capture"] = float((got - reference).abs().max())
            records["vmap"]["max_abs_q"] = float(reference.abs().max())
        except Exception as err:  # report, never fake: e.g. torch.func cannot trace the model
            records["vmap"].update(status="failed", error=_error(err))
    methods = list(fns)
    for rep in range(args.repeats + 1):  # pass 0 is a warm-up, of the first batch
        # Each timed round starts the round-robin at another method, spread evenly over the rounds: a pass runs in
        # the memory its predecessor left (at N = 256 the same capture took 0.98x the floor run after it and 1.16x
        # run after torch.func and the per-example loop), so no method keeps one place in the order.
        start = (rep - 1) * len(methods) // args.repeats if rep else 0
        for method in methods[start:] + methods[:start]:
            fn = fns[method]
            if records[method]["status"] != "ok":
                continue
            try:
                with _first_batch_only(data) if rep == 0 else contextlib.nullcontext():
                    sync()
                    start = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # reported once above, not per pass
                        fn()
                    sync()
            except Exception as err:
                records[method].update(status="failed", error=_error(err))
                continue
            if rep:
                records[method]["times_s"].append(time.perf_counter() - start)
    for record in records.values():
        times = record["times_s"]
        record["wall_s"] = min(times) if times else math.nan
        record["wall_s_median"] = statistics.median(times) if times else math.nan
    return list(records.values())


@contextlib.contextmanager
def _first_batch_only(data: list):
    """While it is open, the methods (which iterate ``data`` when called) see only its first batch.

    Every batch has the same shapes, so one batch runs every kernel a pass runs: the warm-up takes one batch instead
    of all of them (at N = 1,024 on a 2-core AVX2 EPYC a whole warm-up pass took 73 s of the width's 425 s).
    """
    kept = data[:]
    del data[1:]
    try:
        yield
    finally:
        data[:] = kept


def memory_case(args) -> dict:
    """Peak extra memory of one pass of ``args.method`` in a fresh process."""
    import resource

    import torch

    model, data, layer, fns, sync, info = _setup(args)
    cuda = info["device"].startswith("cuda")
    if cuda:
        sync()
        base_alloc = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fns[args.method]()
        sync()
    except Exception as err:
        return {"peak_mem_mib": math.nan, "mem_error": _error(err)}
    if cuda:
        return {"peak_mem_mib": (torch.cuda.max_memory_allocated() - base_alloc) / 2**20,
                "mem_method": "torch.cuda.max_memory_allocated during one pass minus memory allocated before it"}
    return {"peak_mem_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024,
            "mem_method": "growth of ru_maxrss (peak RSS) during one pass, in a fresh forked process after the "
                          "model and data were built (tracemalloc cannot see torch's allocations)"}


# ---------------------------------------------------------------------------
# Driver


def _child(fn, case, queue) -> None:
    try:
        queue.put(("ok", fn(case)))
    except BaseException as err:  # noqa: BLE001 - report whatever went wrong to the parent
        queue.put(("failed", _error(err)))


def _run_in_child(fn, case):
    """Run ``fn(case)`` in a fresh process (forked on CPU, so torch/transformers are already imported)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn" if case.device.startswith("cuda") else "fork")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(fn, case, queue))
    process.start()
    try:
        result = queue.get(timeout=3600)
    except Exception:  # the child died without reporting
        result = ("failed", f"worker exited with code {process.exitcode}")
    process.join()
    return result


def _import_what_children_use(args) -> None:
    """Import here, once, what each forked child would otherwise import for itself: building a LLaMA through
    transformers, the peers' set-up and torch._dynamo pull in about 1,700 modules (4.4 s of CPU on a 2-core AVX2
    EPYC), which every child (one per width and one per method's memory) paid again. A one-layer model of width 32
    is set up on one thread (a forked child of a process whose OpenMP pool ran on more threads can hang) and nothing
    of it is timed; spawned children (CUDA) import for themselves."""
    if args.device.startswith("cuda"):
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _setup(argparse.Namespace(**{**vars(args), "width": 32, "layers": 1, "batches": 1, "batch_size": 1,
                                     "seq_len": 8, "vocab": 64, "threads": 0}))
        import torch._dynamo  # noqa: F401 - what a child's first pass would import
    finally:
        torch.set_num_threads(threads)


def capture_ratio(args) -> dict:
    """The capture ratio of :data:`CAPTURE_RATIO_CASE` (``--quick``: :data:`CAPTURE_RATIO_QUICK`), timed in a fresh
    process: best-of-``--repeats`` wall times of ``bare``, ``capture`` (self-check on) and ``capture_unchecked``, and
    capture over bare with and without the check."""
    setup = CAPTURE_RATIO_QUICK if args.quick else CAPTURE_RATIO_CASE
    peers = [m for m in PEER_METHODS if m in args.methods]
    case = argparse.Namespace(**{**vars(args), **setup,
                                 "methods": ["bare", "capture", "capture_unchecked", SELF_CHECK, *peers]})
    status, result = _run_in_child(time_width, case)
    if status != "ok":
        return {**setup, "status": "failed", "error": result}
    wall = {r["method"]: r["wall_s"] for r in result}
    failed = [f"{r['method']}: {r['error']}" for r in result if r["status"] == "failed"]
    skipped = [r["error"] for r in result if r["status"] == "skipped"]
    return {**setup, "status": "failed" if failed else "ok", "error": "; ".join(failed),
            **_versus_peers(wall["capture"], {r["method"]: r for r in result}), "peers_skipped": skipped,
            "bare_s": wall["bare"], "capture_s": wall["capture"], "capture_unchecked_s": wall["capture_unchecked"],
            "ratio": wall["capture"] / wall["bare"], "ratio_unchecked": wall["capture_unchecked"] / wall["bare"],
            "self_check_s": wall[SELF_CHECK], "check_share": wall[SELF_CHECK] / wall["capture"],
            "check_share_by_difference": 1 - wall["capture_unchecked"] / wall["capture"], "target": CAPTURE_RATIO_TARGET,
            "meets_target": bool(wall["capture"] / wall["bare"] <= CAPTURE_RATIO_TARGET)}


def _versus_peers(capture_s: float, by_method: dict) -> dict:
    """The fastest peer that ran (torch.func, BackPACK, Opacus) and the capture's time over it."""
    ran = {m: r["wall_s"] for m, r in by_method.items() if m in PEER_METHODS and r.get("status") == "ok"}
    if not ran:
        return {"best_peer": None, "best_peer_s": math.nan, "capture_over_best_peer": math.nan,
                "meets_peer_target": None}
    best = min(ran, key=ran.get)
    ratio = capture_s / ran[best]
    return {"best_peer": best, "best_peer_s": ran[best], "capture_over_best_peer": ratio,
            "peers_s": ran, "meets_peer_target": bool(ratio <= PEER_TARGET),
            **_paired_rounds(by_method.get("capture", {}).get("times_s", ()), by_method[best].get("times_s", ()))}


def _paired_rounds(capture_times, peer_times) -> dict:
    """The capture's time over the peer's in each round (the methods run one after the other within a round, so a
    round's ratio shares its load): their median and quartiles, printed beside the judged ratio of the best passes
    to show how far the rounds scatter about it. Empty where the two have no rounds in common."""
    ratios = [c / p for c, p in zip(capture_times, peer_times) if p > 0]
    if not ratios:
        return {}
    q25, median, q75 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"paired_rounds": len(ratios), "paired_median": median, "paired_q25": q25, "paired_q75": q75}


def _rounds_text(versus: dict, count: bool = False) -> str:
    """``"; round by round 1.04x (quartiles 0.98-1.10)"`` (``count``: with the number of rounds), or ``""`` where
    :func:`_paired_rounds` found none."""
    if "paired_median" not in versus:
        return ""
    rounds = f", {versus['paired_rounds']} rounds" if count else ""
    return (f"; round by round {versus['paired_median']:.2f}x (quartiles {versus['paired_q25']:.2f}-"
            f"{versus['paired_q75']:.2f}{rounds})")


def peer_target(figure: str, versus: dict) -> dict:
    """The capture's time over the fastest peer's, with every peer's time, as ``benchmarks/summary.py`` prints it."""
    from _bench import target

    peers = ", ".join(f"{m} {t:.3f} s" for m, t in (versus.get("peers_s") or {}).items()) or "no peer ran"
    return target(figure, versus["capture_over_best_peer"], PEER_TARGET, peers=peers + _rounds_text(versus))


def _peer_line(where: str, versus: dict, skipped=()) -> str:
    if versus["best_peer"] is None:
        return f"capture against the peers ({where}): no peer ran" + (f" ({'; '.join(skipped)})" if skipped else "")
    times = ", ".join(f"{m} {t:.3f} s" for m, t in versus["peers_s"].items())
    return (f"capture against the peers ({where}): {versus['capture_over_best_peer']:.2f}x the fastest, "
            f"{versus['best_peer']} ({times}); target <= {PEER_TARGET}x: "
            f"{'meets' if versus['meets_peer_target'] else 'MISSES'} it"
            + _rounds_text(versus, count=True)
            + (f"; {'; '.join(skipped)}" if skipped else ""))


def _capture_ratio_line(ratio: dict) -> str:
    setup = (f"one batch of {ratio['batch_size']} x {ratio['seq_len']} tokens at one layer of a {ratio['layers']}-layer "
             f"LLaMA of width {ratio['width']}")
    if ratio["status"] != "ok":
        return f"capture ratio ({setup}): failed ({ratio['error']})"
    return (f"capture ratio ({setup}; capture + estimation over a bare forward+backward): {ratio['ratio']:.2f}x with "
            f"the determinism self-check ({'meets' if ratio['meets_target'] else 'MISSES'} the target of <= "
            f"{ratio['target']}x), {ratio['ratio_unchecked']:.2f}x without it; bare {ratio['bare_s']:.3f} s, capture "
            f"{ratio['capture_s']:.3f} s, unchecked {ratio['capture_unchecked_s']:.3f} s"
            f"; the self-check's work (example 0 alone) {ratio['self_check_s']:.3f} s: {100 * ratio['check_share']:.1f}% of "
            f"a capture ({100 * ratio['check_share_by_difference']:+.1f}% by the difference of the two timings)")


def _atomic_write(path: Path, text: str) -> None:
    from dalign_core.atomic import atomic_write_text

    atomic_write_text(path, text)


def _fmt(x, spec=".3g"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench", help="output folder")
    parser.add_argument("--widths", type=int, nargs="+", default=None,
                        help="model widths to time (default 128 256 512 1024; --quick: 128 256)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"sequences per batch (default {PER_WIDTH_CASE['batch_size']}, as dalign estimate's; "
                             f"--quick: {PER_WIDTH_QUICK['batch_size']})")
    parser.add_argument("--batches", type=int, default=None,
                        help=f"batches per pass (examples = batches x batch size; default {PER_WIDTH_CASE['batches']}, "
                             f"--quick: {PER_WIDTH_QUICK['batches']})")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes after one warm-up pass (the best is reported, the median is in the CSV)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="widths 128 and 256 only, unless --widths says, and 2 batches of 8 sequences")
    args = parser.parse_args(argv)
    for field, value in (PER_WIDTH_QUICK if args.quick else PER_WIDTH_CASE).items():
        if getattr(args, field) is None:
            setattr(args, field, value)

    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    widths = args.widths or ([128, 256] if args.quick else [128, 256, 512, 1024])
    _import_what_children_use(args)
    records = []
    started = time.perf_counter()
    ratio = capture_ratio(args)
    print(_capture_ratio_line(ratio), flush=True)
    for width in widths:
        t0 = time.perf_counter()
        case = argparse.Namespace(**{**vars(args), "width": width})
        status, result = _run_in_child(time_width, case)
        if status != "ok":
            result = [{"width": width, "method": m, "status": "failed", "error": result, "wall_s": math.nan}
                      for m in args.methods]
        for record in result:
            mem_status, mem = _run_in_child(memory_case, argparse.Namespace(**{**vars(case), "method": record["method"]}))
            record.update(mem if mem_status == "ok" else {"peak_mem_mib": math.nan, "mem_error": mem})
            records.append(record)
        print(f"  width {width:5d}: " + ", ".join(f"{r['method']} {_fmt(r.get('wall_s'), '.3f')} s" for r in result)
              + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)

    # ratios against the bare pass of the same width
    bare = {r["width"]: r.get("wall_s", math.nan) for r in records if r["method"] == "bare"}
    loop = {r["width"]: r.get("wall_s", math.nan) for r in records if r["method"] == "loop"}
    vmap = {r["width"]: r.get("wall_s", math.nan) for r in records if r["method"] == "vmap"}
    floor = {r["width"]: r.get("wall_s", math.nan) for r in records if r["method"] == "floor"}
    for r in records:
        w = r.get("wall_s", math.nan)
        r["ratio_vs_bare"] = w / bare.get(r["width"], math.nan) if bare.get(r["width"]) else math.nan
        r["ratio_vs_floor"] = w / floor.get(r["width"], math.nan) if floor.get(r["width"]) else math.nan
        if r["method"] in ("capture", "capture_all"):
            r["speedup_vs_loop"] = loop.get(r["width"], math.nan) / w if w else math.nan
            r["speedup_vs_vmap"] = vmap.get(r["width"], math.nan) / w if w else math.nan
            r["meets_target"] = bool(r["ratio_vs_bare"] <= TARGET_RATIO) if not math.isnan(r["ratio_vs_bare"]) else None

    header = (f"{'width':>5}  {'method':17}  {'wall s':>8}  {'x bare':>7}  {'x floor':>7}  {'loop/cap':>8}  "
              f"{'vmap/cap':>8}  {'peak MiB':>8}  note")
    lines = [header, "-" * len(header)]
    for r in records:
        note = r.get("error", "") if r.get("status") != "ok" else ""
        if r.get("method") in PEER_METHODS and r.get("status") == "ok":
            note = f"max |q_{r['method']} - q_hook| = {r['max_abs_diff_vs_capture']:.1e} (max |q| {r['max_abs_q']:.1e})"
        if r.get("meets_target") is not None:
            note = ("meets" if r["meets_target"] else "MISSES") + f" target <= {TARGET_RATIO}x bare"
        if "gram_bit_identical_to_capture" in r:
            note = "Gram " + ("bit-identical to" if r["gram_bit_identical_to_capture"] else "DIFFERS from") + " capture's"
        lines.append(
            f"{r['width']:>5}  {r['method']:17}  {_fmt(r.get('wall_s'), '.3f'):>8}  "
            f"{_fmt(r.get('ratio_vs_bare'), '.2f'):>7}  {_fmt(r.get('ratio_vs_floor'), '.2f'):>7}  "
            f"{_fmt(r.get('speedup_vs_loop'), '.2f'):>8}  "
            f"{_fmt(r.get('speedup_vs_vmap'), '.2f'):>8}  {_fmt(r.get('peak_mem_mib'), '.0f'):>8}  {note}"
        )
    table = "\n".join(lines)
    mem_method = next((r.get("mem_method") for r in records if r.get("mem_method")), "")
    print()
    print(f"device {args.device}; {args.layers} decoder layers, {args.batches} batches x {args.batch_size} sequences "
          f"x {args.seq_len} tokens per pass; best of {args.repeats} passes after a warm-up, methods interleaved")
    print("x bare: wall time / bare forward+backward (with parameter gradients) of the same batches; "
          "x floor: wall time / a forward and a backward down to the insertion point (the capture's floor); "
          "loop/cap, vmap/cap: speed-up of the one-pass capture")
    print(f"peak memory: {mem_method}")
    print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs (other processes inflate and scatter CPU timings)")
    print(table)
    captures = [r for r in records if r["method"] == "capture" and r.get("meets_target") is not None]
    if captures:
        worst = max(captures, key=lambda r: r["ratio_vs_bare"])
        verdict = "meets" if all(r["meets_target"] for r in captures) else "does NOT meet"
        print(f"\ncapture at one layer {verdict} the target of <= {TARGET_RATIO}x the bare pass at every width "
              f"(worst {worst['ratio_vs_bare']:.2f}x at width {worst['width']}).")
        print("note: capture differentiates only with respect to the layer output, so it skips the parameter "
              "gradients the bare pass forms; the ratio includes the streaming Gram update and the final estimate.")

    floor_ratios = {}
    for width in widths:
        by_method = {r["method"]: r for r in records if r["width"] == width}
        if "floor" in by_method and "capture" in by_method:
            floor_ratios[width] = {
                "capture": by_method["capture"].get("ratio_vs_floor", math.nan),
                "capture_unchecked": by_method.get("capture_unchecked", {}).get("ratio_vs_floor", math.nan),
            }
    if floor_ratios:
        print("\ncapture time / (forward + backward down to the insertion point) (without the determinism check):")
        for width, by_floor in floor_ratios.items():
            print(f"  width {width:5d}: {_fmt(by_floor['capture'], '.2f')}x "
                  f"({_fmt(by_floor['capture_unchecked'], '.2f')}x)")
    print("\n" + _capture_ratio_line(ratio))
    if ratio.get("status") == "ok":
        print(_peer_line("the capture ratio's case, self-check on", ratio, ratio.get("peers_skipped", ())))
    peer_widths = {}
    for width in widths:
        by_method = {r["method"]: r for r in records if r["width"] == width}
        if "capture" in by_method and by_method["capture"].get("status") == "ok":
            peer_widths[width] = _versus_peers(by_method["capture"]["wall_s"], by_method)
            print(_peer_line(f"width {width}", peer_widths[width]))

    import pandas as pd

    from _bench import target

    targets = []
    if ratio.get("status") == "ok":
        targets.append(target("capture + estimate / bare pass, self-check on", ratio["ratio"], CAPTURE_RATIO_TARGET))
        targets.append(peer_target("capture / fastest peer, self-check on", ratio))
    for width in widths:
        capture = next((r for r in captures if r["width"] == width), None)
        if capture is not None:
            targets.append(target(f"capture / bare pass, N = {width}", capture["ratio_vs_bare"], TARGET_RATIO))
        if width in peer_widths:
            targets.append(peer_target(f"capture / fastest peer, N = {width}", peer_widths[width]))
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "wall_s_all"} for r in records])
    _atomic_write(args.out / "bench_capture.csv", frame.to_csv(index=False))
    meta = {
        "benchmark": "bench_capture", "target_ratio": TARGET_RATIO, "device": args.device,
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "widths": widths, "memory_method": mem_method, "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg(), "total_wall_s": round(time.perf_counter() - started, 1),
        "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "capture_over_floor": {str(width): by_floor for width, by_floor in floor_ratios.items()},
        "capture_ratio": ratio, "capture_over_best_peer": {str(w): v for w, v in peer_widths.items()},
        "records": records, "table": table, "targets": targets,
    }
    _atomic_write(args.out / "bench_capture.json", json.dumps(meta, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out / 'bench_capture.csv'} and {args.out / 'bench_capture.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
