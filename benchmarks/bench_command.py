"""What ``dalign estimate`` costs beyond its work: start-up, loading and the redundancy check (``make bench``).

On a small model saved to a temporary folder (a LLaMA of width ``--width``, ``--layers`` decoder layers, random
weights, a byte-level BPE tokenizer saved as ``save_pretrained`` writes it, ``--examples`` examples of ``--seq-len``
tokens of seeded random words), it times, methods interleaved over ``--repeats`` rounds after a warm-up, best kept:

* ``import torch`` in a fresh interpreter;
* the in-process work: the capture and estimate at one layer (``accumulate_geometry`` and ``.result()``) of the
  examples the command reads, and the redundancy check the command runs by default (and ``--thorough-redundancy``);
* ``python -m dalign_core estimate`` with its defaults, with ``--redundancy-examples 0`` and with
  ``--thorough-redundancy``, each in a fresh interpreter.

The thorough check and its command have no target and are timed once, in the first round.

It prints the breakdown: the command's own cost (command − import torch − work) against the target of
1.5 s + a third of the work, and the redundancy check's share of a default command (target ≤ 25%), measured both
as the in-process check over the command and as the difference of the commands with and without it. Then where the
command's own time goes: each package's import time beyond torch (``python -X importtime``, one run).

Timing: torch runs on ``--threads`` threads (``OMP_NUM_THREADS`` for the commands; default 1). On a loaded machine
every figure stretches; the ratios are what to read.

Usage::

    python benchmarks/bench_command.py                    # LLaMA N=128, 2 layers, 256 x 64 tokens
    python benchmarks/bench_command.py --quick            # 32 examples, one round, no warm-up

Writes ``DIR/bench_command.csv`` and ``DIR/bench_command.json`` atomically.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # ahead of site-packages, where a peer ships a `benchmarks` too (benchmarks/__init__.py)

TARGET_FIXED_S = 1.5
TARGET_WORK_SHARE = 1 / 3
"""The command may cost at most import torch + work + TARGET_FIXED_S + TARGET_WORK_SHARE x work."""
TARGET_REDUNDANCY_SHARE = 0.25
"""The default redundancy check: at most this share of a default ``dalign estimate``."""
LAYER = "model.layers.0"
ONCE = ("check_thorough", "command_thorough")
"""Timed in the first round only: the thorough check's figures have no target, and take a third of a round."""


def make_checkpoint(folder: Path, width: int, layers: int, examples: int, seq_len: int, seed: int) -> Path:
    """A LLaMA checkpoint with its tokenizer in ``folder`` and ``folder/text.txt``: enough words for the examples."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(2000)]
    text = " ".join(rng.choice(words) for _ in range(examples * seq_len * 2))
    (folder / "text.txt").write_text(text, encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=2048, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    model_dir = folder / "model"
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    wrapped.save_pretrained(model_dir)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=width, intermediate_size=int(round(8 * width / 3 / 32)) * 32, num_hidden_layers=layers,
        num_attention_heads=max(1, width // 64), num_key_value_heads=max(1, width // 64), vocab_size=len(wrapped),
        max_position_embeddings=max(128, seq_len))
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    return model_dir


def _env(threads: int) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _timed(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} … failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return seconds


def command(model_dir: Path, text: Path, examples: int, seq_len: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dalign_core", "estimate", "--model", str(model_dir), "--layer", LAYER, "--data",
            str(text), "--examples", str(examples), "--seq-len", str(seq_len), "--quiet", "--device", "cpu", *extra]


def in_process(model_dir: Path, text: Path, examples: int, seq_len: int, threads: int):
    """Functions timing the command's work in this process: capture + estimate, the default and thorough checks."""
    import torch

    from dalign_core.capture.hooks import accumulate_geometry
    from dalign_core.cli.examples import make_batches, read_text_examples
    from dalign_core.cli.loading import load_model, load_tokenizer, resolve_model_source
    from dalign_core.cli.redundancy_check import QUICK_EXAMPLES, redundancy_by_layer

    torch.set_num_threads(threads)
    source = resolve_model_source(str(model_dir))
    model = load_model(source)
    sequences = read_text_examples(text, load_tokenizer(source), examples, seq_len)
    batch_size = 16  # the command's default

    def work():
        accumulate_geometry(model, [LAYER], make_batches(sequences, batch_size), examples=len(sequences))[LAYER].result()

    def check(count):
        return lambda: redundancy_by_layer(model, [LAYER], sequences[:count], batch_size, ("shared",), progress=False)

    return {"work": work, "check_default": check(min(QUICK_EXAMPLES, len(sequences))),
            "check_thorough": check(len(sequences))}


def import_breakdown(argv: list[str], env: dict, top: int = 8) -> list[tuple[str, float]]:
    """The top-level imports of one run of ``argv`` under ``-X importtime`` and their cumulative seconds, torch's
    share left out of those that load it first (largest first)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    rows, torch_s = [], 0.0
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( +)(\S+)", line)
        if not match:
            continue
        seconds, depth, name = int(match.group(1)) / 1e6, len(match.group(2)), match.group(3)
        if name == "torch":
            torch_s = seconds
        if depth == 1:
            rows.append([name, seconds])
    for row in rows:  # the first top-level import that pulled torch in carries its time: take it out
        if row[1] >= torch_s > 0:
            row[1] -= torch_s
            torch_s = 0.0
            break
    return sorted(((name, round(s, 3)) for name, s in rows), key=lambda r: -r[1])[:top]


def measure(width: int, layers: int, examples: int, seq_len: int, repeats: int, threads: int, seed: int,
            thorough: bool = True, imports: bool = True, warmup: bool = True) -> tuple[dict, list]:
    """The record of one setup (see the module docstring) and, with ``imports``, the import breakdown; ``warmup``:
    a first round that is not timed (without it the first round's caches are cold: a quick look only)."""
    env = _env(threads)
    with tempfile.TemporaryDirectory(prefix="bench_command_") as tmp:
        model_dir = make_checkpoint(Path(tmp), width, layers, examples, seq_len, seed)
        text = Path(tmp) / "text.txt"
        fns = in_process(model_dir, text, examples, seq_len, threads)
        if not thorough:
            del fns["check_thorough"]
        fns["import_torch"] = lambda: _timed([sys.executable, "-c", "import torch"], env)
        variants = [("command", ()), ("command_no_check", ("--redundancy-examples", "0"))]
        if thorough:
            variants.append(("command_thorough", ("--thorough-redundancy",)))
        for name, extra in variants:
            fns[name] = (lambda extra: lambda: _timed(command(model_dir, text, examples, seq_len, *extra), env))(extra)
        best = {name: float("inf") for name in fns}
        for round_ in range(0 if warmup else 1, repeats + 1):  # round 0 warms up
            for name, fn in fns.items():
                if name in ONCE and round_ != 1:
                    continue
                start = time.perf_counter()
                fn()
                if round_:
                    best[name] = min(best[name], time.perf_counter() - start)
            print(f"  round {round_}: " + ", ".join(f"{k} {v:.2f} s" for k, v in best.items() if v < float("inf")),
                  flush=True)
        breakdown = import_breakdown(command(model_dir, text, examples, seq_len), env) if imports else []
    torch_s, work, cmd = best["import_torch"], best["work"], best["command"]
    own = cmd - torch_s - work
    allowed = TARGET_FIXED_S + TARGET_WORK_SHARE * work
    share_in_process = best["check_default"] / cmd
    share_by_difference = 1 - best["command_no_check"] / cmd
    record = dict(width=width, layers=layers, examples=examples, seq_len=seq_len, threads=threads, layer=LAYER,
                  import_torch_s=torch_s, work_s=work, command_s=cmd, own_s=own, allowed_own_s=allowed,
                  meets_start_target=bool(own <= allowed), command_no_check_s=best["command_no_check"],
                  check_default_s=best["check_default"], redundancy_share=share_in_process,
                  redundancy_share_by_difference=share_by_difference,
                  meets_redundancy_target=bool(max(share_in_process, share_by_difference) <= TARGET_REDUNDANCY_SHARE),
                  loadavg=os.getloadavg()[0])
    if thorough:
        record.update(command_thorough_s=best["command_thorough"], check_thorough_s=best["check_thorough"],
                      thorough_share=best["check_thorough"] / best["command_thorough"])
    return record, breakdown


def redundancy_target(record: dict) -> dict:
    """The default redundancy check's share of a default ``dalign estimate`` beside its target (the larger of its
    two readings: in-process over the command, and the difference of the commands with and without it)."""
    from _bench import target

    share = max(record["redundancy_share"], record["redundancy_share_by_difference"])
    return target("redundancy check's share of dalign estimate", share, TARGET_REDUNDANCY_SHARE, unit="%")


def share_lines(record: dict) -> list[str]:
    """The redundancy check's share of a default command, as both benchmarks print it."""
    lines = [f"  redundancy check by default: {record['check_default_s']:.2f} s in-process, "
             f"{100 * record['redundancy_share']:.0f}% of the command ({100 * record['redundancy_share_by_difference']:.0f}% "
             f"by the difference with --redundancy-examples 0: {record['command_no_check_s']:.2f} s against "
             f"{record['command_s']:.2f} s); target <= {100 * TARGET_REDUNDANCY_SHARE:.0f}%: "
             f"{'meets' if record['meets_redundancy_target'] else 'MISSES'} it"]
    if "thorough_share" in record:
        lines.append(f"  --thorough-redundancy: {record['check_thorough_s']:.2f} s in-process, the command "
                     f"{record['command_thorough_s']:.2f} s ({100 * record['thorough_share']:.0f}% of it; one round)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("BENCH_OUT") or REPO / "results" / "bench"))
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up (best kept)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="32 examples, one round, no warm-up, no --thorough-redundancy run")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.repeats = 32, 1
    started = time.perf_counter()
    from _bench import save, target

    record, imports = measure(args.width, args.layers, args.examples, args.seq_len, args.repeats, args.threads,
                              args.seed, thorough=not args.quick, warmup=not args.quick)
    print(f"\ndalign estimate on a {args.layers}-layer LLaMA of width {args.width}, {args.examples} examples of "
          f"{args.seq_len} tokens, {args.threads} thread(s), best of {args.repeats}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  import torch {record['import_torch_s']:.2f} s + work (capture + estimate in-process) "
          f"{record['work_s']:.2f} s + the command's own {record['own_s']:.2f} s = the command {record['command_s']:.2f} s")
    print(f"  own cost {record['own_s']:.2f} s against the target of {TARGET_FIXED_S} s + work/3 = "
          f"{record['allowed_own_s']:.2f} s: {'meets' if record['meets_start_target'] else 'MISSES'} it "
          f"({record['own_s'] / record['allowed_own_s']:.1f}x the allowance)")
    print("\n".join(share_lines(record)))
    print("  where the own cost goes, imports beyond torch (one -X importtime run, cumulative s): "
          + ", ".join(f"{name} {seconds:.2f}" for name, seconds in imports))
    save(args.out, "bench_command", [record], started, imports=imports, repeats=args.repeats,
         limits={"fixed_s": TARGET_FIXED_S, "work_share": TARGET_WORK_SHARE,
                 "redundancy_share": TARGET_REDUNDANCY_SHARE},
         targets=[target("dalign estimate's own cost (command - import torch - work)", record["own_s"],
                         record["allowed_own_s"], unit="s",
                         peers=f"import torch {record['import_torch_s']:.2f} s, work {record['work_s']:.2f} s"),
                  redundancy_target(record)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
