#!/usr/bin/env python
"""A new user's trial of dalign: several hundred cases, each classified, against the bar of issue #39.

The trial builds, in a temporary folder and without network, tiny random-init models (GPT-2, LLaMA and BERT saved
with ``save_pretrained`` beside a byte-level BPE tokenizer trained with ``tokenizers``; a plain MLP, an MLP that
returns ``(features, logits)``, a builder that raises and torchvision's ResNet-18 as ``--arch`` state dicts), text,
tensor and image data files and their damaged variants. It then tries, as a new user would:

* ``dalign estimate``, ``dalign layers`` and ``dalign rank`` with good and bad arguments (``cli-*`` families);
* ``python -m dalign_repro.experiments.<name>`` with a bad value for every config field (``--set``), bad
  ``--config`` files, bad ``--out`` targets, and small runs that must keep earlier results (``exp-*``);
* the API: ``activation_gradients``, ``accumulate_geometry``, ``estimate_geometry``, ``geometry_from_gram`` and
  the bounds, on each model kind, with misuse (``api-*``);
* an engineer's own model (``scripts/user_trial_own_model.py``: families ``own-cli-*`` and
  ``api-own-*``): a ViT, a GRU language model, an MLP in nested containers, a LoRA-wrapped Linear and a
  ``DataParallel`` wrapper against the single-example loop and a brute-force U-statistic; batch keys the forward
  does not take, losses that couple the examples, ``--out`` files that carry a .csv name but hold no table, pipes
  nobody writes to, ``--revision ..``, the model's own exceptions of every type, and the API's checks of inputs,
  targets and grad mode.

Each command case runs in a child process of its own (forked from a parent that has imported torch and
transformers once, so a case costs a fraction of a second; a few run through the real ``dalign`` console script
and ``python -m``) with a timeout. The API cases of one model kind share one child, each case under its own alarm.
Every case ends in one class:

* ``ok``: exit 0 (or a return) and, where a reference exists, the numbers agree with it: q against a plain autograd
  loop over single examples, d_align against ``estimate_geometry`` of those q;
* ``clear error``: a refusal in one line (non-zero exit, no "Traceback" on stderr; from the API a ValueError or
  TypeError raised by dalign_core itself);
* ``raw traceback``: a traceback on stderr, or an exception that is not one of the project's clear errors;
* ``silent wrong``: exit 0 but the numbers disagree with the reference, or a refusal was expected;
* ``data lost``: an input or an earlier result changed or gone;
* ``hang``: the timeout passed.

It prints the counts per class and per family, writes every case to ``--out`` (CSV), and exits 1 unless the bar
of issue #39 holds: 0 silent wrong answers, 0 data lost, 0 hangs, at most 5 raw tracebacks.

    .venv/bin/python scripts/user_trial.py --out user_trial.csv          # the whole trial (~10 min on one core)
    .venv/bin/python scripts/user_trial.py --quick                       # a few cases of every family
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import runpy
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CLASSES = ("ok", "clear error", "raw traceback", "silent wrong", "data lost", "hang")
MAX_RAW_TRACEBACKS = 5
TEXT = (
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate: rough winds do shake the "
    "darling buds of May, and summer's lease hath all too short a date. Sometime too hot the eye of heaven shines, "
    "and often is his gold complexion dimm'd; and every fair from fair sometime declines.\n"
)
POSITIONS = 64  # the tiny language models' position count
RTOL = 2e-3  # float32 agreement of a batched capture with the single-example loop


def READ_ONLY_DIR(*items):  # noqa: N802
    """The cases of a read-only folder, except for root (who may write anywhere: nothing to refuse)."""
    return () if os.geteuid() == 0 else items


# ---------------------------------------------------------------------------------------------------------------
# Cases and outcomes


@dataclasses.dataclass
class Case:
    """One thing a user tries: a command line (``argv`` for ``kind`` cli/exp) or an API call (``kind`` api)."""

    family: str
    name: str
    kind: str  # "cli" (dalign ...), "exp" (python -m dalign_repro.experiments.<module>), "api"
    expect: str  # "ok" or "refuse"
    argv: list[str] = dataclasses.field(default_factory=list)
    module: str = ""
    check: Callable[["Outcome"], str | None] | None = None  # after exit 0: None if right, else what is wrong
    protect: list[Path] = dataclasses.field(default_factory=list)  # earlier results that must survive
    prepare: Callable[[], None] | None = None  # run in the parent before the case (e.g. write an old result)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    exec_: bool = False  # run through the real console script / python -m, not a fork
    timeout: float = 120.0
    api: Callable[[], Any] | None = None  # kind "api": returns None when right, a string saying what is wrong


@dataclasses.dataclass
class Outcome:
    case: Case
    outcome: str = ""
    code: int | None = None
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    detail: str = ""
    stray: str = ""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def classify(out: Outcome, changed: list[str]) -> None:
    """Set ``out.outcome`` from the exit code, stderr, the reference check and the files that changed."""
    case = out.case
    if changed:
        out.outcome, out.detail = "data lost", "changed or gone: " + ", ".join(changed[:4])
        return
    if out.code is None:
        out.outcome, out.detail = "hang", f"no exit within {case.timeout:.0f} s"
        return
    if out.code == 0:
        if case.expect == "refuse":
            out.outcome, out.detail = "silent wrong", "exit 0 where a refusal was expected"
            return
        wrong = None
        if case.check is not None:
            try:
                wrong = case.check(out)
            except Exception as err:  # noqa: BLE001  (a result we cannot read back is a wrong result)
                wrong = f"result unreadable: {type(err).__name__}: {err}"
        out.outcome, out.detail = ("silent wrong", wrong) if wrong else ("ok", "")
        return
    if "Traceback (most recent call last)" in out.stderr:
        out.outcome, out.detail = "raw traceback", _last_line(out.stderr)
        return
    out.outcome = "clear error"
    out.detail = _last_line(out.stderr) or f"exit {out.code} with nothing on stderr"
    if case.expect == "ok":
        out.detail = "refused a valid input: " + out.detail


# ---------------------------------------------------------------------------------------------------------------
# Running a case: a forked child (or a real subprocess) with a timeout


def _snapshot(paths: list[Path]) -> dict[str, tuple]:
    state = {}
    for root in paths:
        if not root.exists():
            state[str(root)] = ("gone",)
            continue
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            info = path.stat()
            state[str(path)] = (info.st_size, info.st_mtime_ns, info.st_ino)
    return state


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(name for name in before if after.get(name) != before[name])


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def _fork_run(body: Callable[[], int], timeout: float, cwd: Path, env: dict[str, str], scratch: Path
              ) -> tuple[int | None, str, str, float]:
    """Run ``body`` in a forked child with stdout/stderr to files; (exit code or None on timeout, out, err, s)."""
    out_path, err_path = scratch / "stdout.txt", scratch / "stderr.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: its own process group (so a timeout kills its workers too), files for its output
        code = 1
        try:
            os.setpgid(0, 0)
            os.chdir(cwd)
            os.environ.update(env)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, out_path), (2, err_path)):
                handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(handle, fd)
            try:
                result = body()
                code = result if isinstance(result, int) else 0
            except SystemExit as exit_:
                if exit_.code is None or isinstance(exit_.code, int):
                    code = exit_.code or 0
                else:
                    print(exit_.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001  (what Python itself would print for an uncaught exception)
                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = started + timeout
    code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() > deadline:
            _kill(pid)
            os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    _kill(pid)  # anything the case left running in its group
    seconds = time.perf_counter() - started
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    return code, read(out_path), read(err_path), seconds


def _exec_run(argv: list[str], timeout: float, cwd: Path, env: dict[str, str]) -> tuple[int | None, str, str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill(proc.pid)
        out, err = proc.communicate()
        code = None
    return code, out, err, time.perf_counter() - started


def _cli_body(argv: list[str]) -> Callable[[], int]:
    def body() -> int:
        from dalign_core.cli.app import main

        sys.argv = ["dalign", *argv]
        return main(argv)
    return body


def _exp_body(module: str, argv: list[str]) -> Callable[[], int]:
    def body() -> int:
        sys.argv = [f"{module}.py", *argv]
        runpy.run_module(f"dalign_repro.experiments.{module}", run_name="__main__", alter_sys=True)
        return 0
    return body


def run_case(case: Case, trial: "Trial") -> Outcome:
    scratch = Path(tempfile.mkdtemp(prefix="case_", dir=trial.scratch))
    cwd = scratch / "cwd"
    cwd.mkdir()
    if case.prepare is not None:
        case.prepare()
    watched = [trial.inputs, *case.protect]
    before = _snapshot(watched)
    env = {**trial.env, **case.env}
    if case.exec_:
        argv = ([str(REPO / ".venv" / "bin" / "dalign"), *case.argv] if case.kind == "cli" else
                [sys.executable, "-m", f"dalign_repro.experiments.{case.module}", *case.argv])
        if case.kind == "cli" and not Path(argv[0]).exists():
            argv = [sys.executable, "-m", "dalign_core", *case.argv]
        code, out, err, seconds = _exec_run(argv, case.timeout, cwd, env)
    else:
        body = _cli_body(case.argv) if case.kind == "cli" else _exp_body(case.module, case.argv)
        code, out, err, seconds = _fork_run(body, case.timeout, cwd, env, scratch)
    outcome = Outcome(case, code=code, stdout=out, stderr=err, seconds=seconds)
    classify(outcome, _changed(before, _snapshot(watched)))
    outcome.stray = " ".join(sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file())[:5])
    shutil.rmtree(scratch, ignore_errors=True)
    return outcome


# ---------------------------------------------------------------------------------------------------------------
# API cases: one child per model kind, each case under an alarm


class _Alarm(BaseException):
    """A case's timeout: a BaseException, so that no ``except Exception`` on the way (the capture's own wrapping of
    a model's errors among them) turns a hang into an answer."""


def _own_clear_error(err: BaseException) -> bool:
    """A ValueError or TypeError raised by dalign_core's own code, with a message: the project's clear errors."""
    if not isinstance(err, (ValueError, TypeError)) or not str(err).strip():
        return False
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "dalign_core" in frames[-1].filename


def _api_group_body(cases: list[Case], results: Path) -> Callable[[], int]:
    def body() -> int:
        def on_alarm(signum, frame):
            raise _Alarm()
        signal.signal(signal.SIGALRM, on_alarm)
        with open(results, "a", encoding="utf-8") as sink:
            for case in cases:
                started = time.perf_counter()
                signal.alarm(int(case.timeout))
                record = {"name": case.name}
                try:
                    wrong = case.api()
                    record.update(status="returned", detail=wrong or "")
                except _Alarm:
                    record.update(status="hang", detail=f"no return within {case.timeout:.0f} s")
                except Exception as err:  # noqa: BLE001
                    clear = _own_clear_error(err)
                    first = (str(err).strip().splitlines() or [""])[0][:300]
                    record.update(status="clear" if clear else "raw",
                                  detail=f"{type(err).__name__}: {first}" +
                                  ("" if clear else f" (raised in {traceback.extract_tb(err.__traceback__)[-1].name})"))
                finally:
                    signal.alarm(0)
                record["seconds"] = time.perf_counter() - started
                sink.write(json.dumps(record) + "\n")
                sink.flush()
        return 0
    return body


def run_api_group(cases: list[Case], trial: "Trial") -> list[Outcome]:
    scratch = Path(tempfile.mkdtemp(prefix="api_", dir=trial.scratch))
    cwd = scratch / "cwd"
    cwd.mkdir()
    results = scratch / "results.jsonl"
    before = _snapshot([trial.inputs])
    timeout = sum(case.timeout for case in cases) + 30
    code, out, err, seconds = _fork_run(_api_group_body(cases, results), timeout, cwd, trial.env, scratch)
    changed = _changed(before, _snapshot([trial.inputs]))
    records = {}
    if results.exists():
        for line in results.read_text().splitlines():
            record = json.loads(line)
            records[record["name"]] = record
    outcomes = []
    for case in cases:
        record = records.get(case.name)
        outcome = Outcome(case, seconds=record["seconds"] if record else 0.0)
        if changed:
            outcome.outcome, outcome.detail = "data lost", ", ".join(changed[:4])
        elif record is None:  # the group died or hung before this case answered
            outcome.outcome = "hang" if code is None else "raw traceback"
            outcome.detail = f"the API child ended (exit {code}) before this case: {_last_line(err)}"
        elif record["status"] == "hang":
            outcome.outcome, outcome.detail = "hang", record["detail"]
        elif record["status"] == "raw":
            outcome.outcome, outcome.detail = "raw traceback", record["detail"]
        elif record["status"] == "clear":
            outcome.outcome = "clear error"
            outcome.detail = ("refused a valid input: " if case.expect == "ok" else "") + record["detail"]
        elif case.expect == "refuse":
            outcome.outcome, outcome.detail = "silent wrong", "returned where a refusal was expected"
        elif record["detail"]:
            outcome.outcome, outcome.detail = "silent wrong", record["detail"]
        else:
            outcome.outcome = "ok"
        outcomes.append(outcome)
    shutil.rmtree(scratch, ignore_errors=True)
    return outcomes


# ---------------------------------------------------------------------------------------------------------------
# The fixtures: tiny models and data files, built once


PLAIN_MODULE = '''
"""Models a user builds with --arch in the trial."""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, inputs=8, width=16, classes=3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, width), nn.Tanh())
        self.block = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.body(x)
        return self.head(h + self.block(h))


class TupleMLP(MLP):
    """Returns (features, logits), as many research models do."""

    def forward(self, x):
        h = self.body(x)
        h = h + self.block(h)
        return h, self.head(h)


def mlp(inputs=8, width=16, classes=3):
    torch.manual_seed(0)
    return MLP(inputs, width, classes)


def tuple_mlp(inputs=8, width=16, classes=3):
    torch.manual_seed(0)
    return TupleMLP(inputs, width, classes)


def raising(**kwargs):
    raise RuntimeError("this builder needs a GPU it does not have")


def not_a_module(**kwargs):
    return {"weights": 1}
'''


class Trial:
    """The fixture folder (``inputs``: every file a case may read and none may change) and the references."""

    def __init__(self, root: Path):
        import torch

        self.root = root
        self.inputs = root / "inputs"
        self.scratch = root / "scratch"
        self.outs = root / "outs"
        for folder in (self.inputs, self.scratch, self.outs):
            folder.mkdir(parents=True, exist_ok=True)
        self.env = {
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "DALIGN_WORKERS": "1", "DALIGN_THREADS": "1", "OMP_NUM_THREADS": "1", "DALIGN_OFFLINE": "1",
            "DALIGN_CACHE": str(root / "cache"), "DALIGN_RESULTS": str(root / "results"),
            "DALIGN_CHECKPOINTS": str(root / "checkpoints"), "HF_HOME": str(root / "hf"),
            "TQDM_DISABLE": "1", "PYTHONPATH": str(self.inputs) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        sys.path.insert(0, str(self.inputs))
        torch.set_num_threads(1)
        self._refs: dict[tuple, Any] = {}
        self._build()

    # -- files --------------------------------------------------------------------------------------------------
    def _build(self) -> None:
        import torch
        import transformers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        transformers.logging.set_verbosity_error()
        inputs = self.inputs
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator([TEXT] * 4, trainer=trainer)
        self.tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                              eos_token="<eos>")
        vocab = len(self.tokenizer)
        self.vocab = vocab
        torch.manual_seed(0)
        configs = {
            "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_embd=32, n_layer=2, n_head=4, vocab_size=vocab, n_positions=POSITIONS, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0)),
            "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=POSITIONS)),
            "bert": transformers.BertForMaskedLM(transformers.BertConfig(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=vocab,
                max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        }
        self.layers = {"gpt2": ["transformer.h.0", "transformer.h.1"], "llama": ["model.layers.0", "model.layers.1"],
                       "bert": ["bert.encoder.layer.0", "bert.encoder.layer.1"]}
        for name, model in configs.items():
            model.eval().save_pretrained(inputs / name)
            self.tokenizer.save_pretrained(inputs / name)
            folder = inputs / f"{name}_truncated"
            shutil.copytree(inputs / name, folder)
            weights = folder / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        mismatch = inputs / "llama_mismatch"
        shutil.copytree(inputs / "llama", mismatch)
        config = json.loads((mismatch / "config.json").read_text())
        config["intermediate_size"] = 48
        (mismatch / "config.json").write_text(json.dumps(config))
        (inputs / "empty_model").mkdir()
        (inputs / "llama_notok").mkdir()
        for item in (inputs / "llama").iterdir():
            if "token" not in item.name and item.name != "special_tokens_map.json":
                shutil.copy(item, inputs / "llama_notok" / item.name)
        # text data
        (inputs / "data.txt").write_text(TEXT * 40, encoding="utf-8")
        (inputs / "lines.txt").write_text("\n".join(s.strip() for s in TEXT.split(",") * 20) + "\n", encoding="utf-8")
        (inputs / "latin1.txt").write_bytes(("caf\u00e9 " + TEXT).encode("latin-1", errors="replace") * 20)
        (inputs / "utf16.txt").write_bytes((TEXT * 20).encode("utf-16"))
        (inputs / "binary.txt").write_bytes(bytes(range(256)) * 40)
        (inputs / "empty.txt").write_text("", encoding="utf-8")
        (inputs / "short.txt").write_text("Shall I\n", encoding="utf-8")
        (inputs / "a_folder").mkdir()
        (inputs / "a_folder" / "x.txt").write_text(TEXT)
        (inputs / "notes.md").write_text("# notes\n")
        (inputs / "old.csv").write_text("a,b\n1,2\n")
        (inputs / "readonly_dir").mkdir()
        (inputs / "readonly_dir").chmod(stat.S_IRUSR | stat.S_IXUSR)
        (inputs / "readonly.csv").write_text("a\n1\n")
        (inputs / "readonly.csv").chmod(stat.S_IRUSR)
        # --arch models and their data
        (inputs / "trialmods.py").write_text(PLAIN_MODULE)
        import importlib

        mods = importlib.import_module("trialmods")
        self.mods = mods
        mlp = mods.mlp()
        torch.save(mlp.state_dict(), inputs / "mlp.pt")
        from safetensors.torch import save_file

        save_file(mlp.state_dict(), str(inputs / "mlp.safetensors"))
        torch.save(mods.tuple_mlp().state_dict(), inputs / "tuple_mlp.pt")
        for suffix in ("pt", "safetensors"):
            whole = (inputs / f"mlp.{suffix}").read_bytes()
            (inputs / f"mlp_truncated.{suffix}").write_bytes(whole[: len(whole) // 2])
        torch.save({"some": "thing"}, inputs / "not_state.pt")
        torch.save(torch.nn.Linear(3, 3).state_dict(), inputs / "other_state.pt")
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(40, 8, generator=generator)
        y = torch.randint(0, 3, (40,), generator=generator)
        self.mlp_data = (x, y)
        torch.save({"inputs": x, "targets": y}, inputs / "mlp_data.pt")
        torch.save((x, y), inputs / "mlp_pair.pt")
        torch.save({"inputs": x}, inputs / "mlp_nokey.pt")
        torch.save({"inputs": x, "targets": y[:30]}, inputs / "mlp_rows.pt")
        torch.save({"inputs": x, "targets": y + 5}, inputs / "mlp_range.pt")
        torch.save({"inputs": x[:0], "targets": y[:0]}, inputs / "mlp_empty.pt")
        torch.save({"inputs": x[:3], "targets": y[:3]}, inputs / "mlp_three.pt")
        nan = x.clone()
        nan[2, 3] = float("nan")
        torch.save({"inputs": nan, "targets": y}, inputs / "mlp_nan.pt")
        torch.save({"inputs": x[:, :5], "targets": y}, inputs / "mlp_width.pt")
        (inputs / "garbage.pt").write_bytes(b"not a torch file at all" * 10)
        import torchvision

        torch.manual_seed(0)
        torch.save(torchvision.models.resnet18(num_classes=4).state_dict(), inputs / "resnet18.pt")
        from PIL import Image

        images = inputs / "images"
        for label in ("cat", "dog"):
            (images / label).mkdir(parents=True)
            for i in range(6):
                pixels = (torch.rand(40, 48, 3, generator=generator) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(images / label / f"{i}.png")
        (inputs / "images_empty" / "cat").mkdir(parents=True)
        broken = inputs / "images_broken"
        shutil.copytree(images, broken)
        (broken / "cat" / "0.png").write_bytes(b"\x89PNG\r\n broken")
        # an experiment's earlier results, which a failing rerun must keep
        self.prior = self.outs / "prior"
        self.own = _own_module().Fixtures(sys.modules[__name__], self)  # the third round's models and files

    def path(self, name: str) -> str:
        return str(self.inputs / name)

    # -- references ---------------------------------------------------------------------------------------------
    def hf_model(self, kind: str, dtype=None):
        import torch
        import transformers

        classes = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
                   "bert": transformers.BertForMaskedLM}
        model = classes[kind].from_pretrained(self.inputs / kind).eval()
        return model.to(dtype) if dtype is not None else model

    def text_sequences(self, seq_len: int, n: int) -> list[list[int]]:
        ids = list(self.tokenizer(TEXT * 40, add_special_tokens=False)["input_ids"])
        return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n)]

    def reference_d_align(self, kind: str, layer: str, seq_len: int, n: int, dtype=None) -> float:
        """d_align of q from a plain autograd loop over single examples (the CLI's windows of --data)."""
        key = (kind, layer, seq_len, n, str(dtype))
        if key not in self._refs:
            import torch

            from dalign_core.geometry.estimators import estimate_geometry

            model = self.hf_model(kind, dtype)
            ids = torch.tensor(self.text_sequences(seq_len, n))
            Q = reference_q(model, layer, [{"input_ids": row[None]} for row in ids], causal_loss)
            self._refs[key] = estimate_geometry(Q).d_align
        return self._refs[key]

    def reference_arch_d_align(self, layer: str, n: int) -> float:
        import torch.nn.functional as F

        from dalign_core.geometry.estimators import estimate_geometry

        model = self.mods.mlp()
        model.load_state_dict(__import__("torch").load(self.inputs / "mlp.pt"))
        x, y = self.mlp_data
        Q = reference_q(model.eval(), layer, [x[i:i + 1] for i in range(n)],
                        lambda out, i: F.cross_entropy(out, y[i:i + 1]), indexed=True)
        return estimate_geometry(Q).d_align


def _own_module():
    """scripts/user_trial_own_model.py (the third round's cases), loaded beside this file."""
    import importlib.util

    name = "user_trial_own_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def causal_loss(output, example):
    import torch.nn.functional as F

    logits = output.logits if hasattr(output, "logits") else output
    ids = example["input_ids"]
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])


def reference_q(model, layer: str, examples: list, loss_of, indexed: bool = False):
    """q_i = d loss_i / d z_i summed over positions, one example at a time with plain autograd: ``(n, d)``."""
    import torch

    module = dict(model.named_modules())[layer]
    rows = []
    for index, example in enumerate(examples):
        store = {}
        handle = module.register_forward_hook(
            lambda m, i, o: store.__setitem__("z", o[0] if isinstance(o, tuple) else o))
        try:
            output = model(**example) if isinstance(example, dict) else model(example)
        finally:
            handle.remove()
        loss = loss_of(output, index if indexed else example)
        (grad,) = torch.autograd.grad(loss, store["z"])
        rows.append(grad.sum(dim=1)[0] if grad.ndim == 3 else grad.reshape(grad.shape[0], -1)[0])
    return torch.stack(rows)


def _close(a, b, rtol: float = RTOL) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(abs(b), 1e-12)


# ---------------------------------------------------------------------------------------------------------------
# The cases


def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def estimate_check(trial: Trial, kind: str, out: Path, layers: list[str], seq_len: int, n: int, dtype=None):
    """After ``dalign estimate --out``: the CSV's d_align of each layer equals the single-example reference."""
    def check(outcome: Outcome) -> str | None:
        rows = {row["layer"]: row for row in _csv_rows(out)}
        for layer in layers:
            if layer not in rows:
                return f"no row for {layer} in {out.name}"
            got = float(rows[layer]["d_align"])
            want = trial.reference_d_align(kind, layer, seq_len, n, dtype)
            if not _close(got, want):
                return f"{layer}: d_align {got:.6g}, the single-example loop gives {want:.6g}"
        return None
    return check


def finite_csv_check(out: Path, column: str):
    def check(outcome: Outcome) -> str | None:
        rows = _csv_rows(out)
        if not rows:
            return f"{out.name} has no rows"
        bad = [row.get("layer") for row in rows if not math.isfinite(float(row[column] or "nan"))]
        return f"{column} not finite for {bad}" if bad else None
    return check


def cli_cases(trial: Trial) -> list[Case]:
    """dalign estimate / layers / rank on GPT-2, LLaMA and BERT folders: good runs checked, bad arguments."""
    p = trial.path
    cases: list[Case] = []
    counter = [0]

    def new_out(suffix: str = ".csv") -> Path:
        counter[0] += 1
        return trial.outs / f"cli_{counter[0]}{suffix}"

    for kind in ("gpt2", "llama"):
        model, layer0, layer1 = p(kind), *trial.layers[kind]
        fam = f"cli-estimate-{kind}"
        base = ["estimate", "--model", model, "--data", p("data.txt"), "--seq-len", "16", "--examples", "12",
                "--batch-size", "5", "--redundancy-examples", "0", "--quiet"]

        def est(name, expect, *extra, layer=layer1, check=None, out=None, **kw):
            argv = [*base, "--layer", layer, *extra] + (["--out", str(out)] if out else [])
            cases.append(Case(fam, name, "cli", expect, argv, check=check, **kw))

        out = new_out()
        est("one layer vs single-example loop", "ok", out=out,
            check=estimate_check(trial, kind, out, [layer1], 16, 12))
        out = new_out()
        est("all layers vs single-example loop", "ok", layer="all", out=out,
            check=estimate_check(trial, kind, out, [layer0, layer1], 16, 12))
        out = new_out()
        est("two layers by name", "ok", layer=f"{layer0},{layer1}", out=out,
            check=estimate_check(trial, kind, out, [layer0, layer1], 16, 12))
        out = new_out()
        est("float64 vs single-example loop", "ok", "--dtype", "float64", out=out,
            check=estimate_check(trial, kind, out, [layer1], 16, 12, dtype=__import__("torch").float64))
        out = new_out()
        est("batch size 1 equals batch 5", "ok", "--batch-size", "1", out=out,
            check=estimate_check(trial, kind, out, [layer1], 16, 12))
        out = new_out()
        est("full reduction", "ok", "--reduction", "full", out=out, check=finite_csv_check(out, "d_align"))
        out = new_out()
        est("sketch 8", "ok", "--sketch-dim", "8", out=out, check=finite_csv_check(out, "d_align"))
        est("lines mode", "ok", "--split-mode", "lines")
        est("with the redundancy check", "ok", "--redundancy-examples", "8")
        est("budgets given", "ok", "--m", "1000", "--k", "500")
        est("seq-len at the position count", "ok", "--seq-len", str(POSITIONS), "--examples", "5")
        out = new_out()
        est("--out over an existing csv", "ok", out=trial.outs / f"replace_{kind}.csv",
            prepare=lambda k=kind: (trial.outs / f"replace_{k}.csv").write_text("old\n1\n"))
        for value in ("0", "1", str(POSITIONS + 1), "100000", "-4"):
            est(f"--seq-len {value}", "refuse", "--seq-len", value)
        for value in ("0", "-1", "3", "abc"):
            est(f"--examples {value}", "refuse", "--examples", value)
        for value in ("0", "-2"):
            est(f"--batch-size {value}", "refuse", "--batch-size", value)
        for value in ("bogus", "model", ",", f"{layer1}.nothing", "transformer.h.9" if kind == "gpt2" else
                      "model.layers.9"):
            est(f"--layer {value!r}", "refuse", layer=value)
        for value in ("0", "1", "1.5", "nan", "-0.5"):
            est(f"--confidence {value}", "refuse", "--confidence", value)
        for flag in ("--m", "--k"):
            for value in ("0", "-5", "nan", "inf"):
                est(f"{flag} {value}", "refuse", flag, value)
        for value in ("0", "-3", "100000"):
            est(f"--sketch-dim {value}", "refuse", "--sketch-dim", value)
        est("--redundancy-examples -1", "refuse", "--redundancy-examples", "-1")
        for name in ("latin1.txt", "utf16.txt", "binary.txt", "empty.txt", "short.txt", "a_folder", "missing.txt"):
            argv = [a if a != p("data.txt") else p(name) for a in base] + ["--layer", layer1]
            cases.append(Case(fam, f"--data {name}", "cli", "refuse", argv))
        for name, target in (("a folder", str(trial.outs)), ("under a file", p("notes.md") + "/x.csv"),
                             *READ_ONLY_DIR(("read-only folder", p("readonly_dir") + "/x.csv")), ("a .md file", p("notes.md")),
                             ("the data file", p("data.txt")), ("the model config", p(kind) + "/config.json"),
                             ("the model weights", p(kind) + "/model.safetensors"),
                             ("a read-only csv", p("readonly.csv")), ("empty", "")):
            est(f"--out {name}", "refuse", "--out", target)
        for name in (f"{kind}_truncated", "llama_mismatch", "empty_model", "notes.md", "missing_model",
                     "nobody-here/no-such-model"):
            target = name if "/" in name else p(name)
            argv = [a if a != model else target for a in base] + ["--layer", layer1]
            cases.append(Case(fam, f"--model {name}", "cli", "refuse", argv))
        for value in ("cuda:7", "tpu", "cuda"):
            est(f"--device {value}", "refuse", "--device", value)
        est("--tokenizer a file", "refuse", "--tokenizer", p("data.txt"))
        est("--tokenizer missing", "refuse", "--tokenizer", "./no_tokenizer_here")
        est("--revision missing", "refuse", "--revision", "step999")
        est("--dtype int8", "refuse", "--dtype", "int8")

        fam = f"cli-layers-{kind}"
        lay = ["layers", "--model", model]
        cases += [
            Case(fam, "plain", "cli", "ok", lay),
            Case(fam, "--all-modules", "cli", "ok", [*lay, "--all-modules"]),
            Case(fam, "with data", "cli", "ok", [*lay, "--data", p("data.txt"), "--seq-len", "16",
                                                  "--redundancy-examples", "8"]),
            Case(fam, "--seq-len 0", "cli", "refuse", [*lay, "--data", p("data.txt"), "--seq-len", "0"]),
            Case(fam, "--seq-len too long", "cli", "refuse", [*lay, "--data", p("data.txt"), "--seq-len", "999"]),
            Case(fam, "--data latin1", "cli", "refuse", [*lay, "--data", p("latin1.txt"), "--seq-len", "16"]),
            Case(fam, "--data empty", "cli", "refuse", [*lay, "--data", p("empty.txt"), "--seq-len", "16"]),
            Case(fam, "--redundancy-examples -1", "cli", "refuse",
                 [*lay, "--data", p("data.txt"), "--seq-len", "16", "--redundancy-examples", "-1"]),
            Case(fam, "truncated model", "cli", "refuse", ["layers", "--model", p(f"{kind}_truncated")]),
            Case(fam, "missing model", "cli", "refuse", ["layers", "--model", p("missing_model")]),
            Case(fam, "offline hub id", "cli", "refuse", ["layers", "--model", "nobody-here/no-such-model"]),
        ]

        fam = f"cli-rank-{kind}"
        rk = ["rank", "--model", model, "--data", p("data.txt"), "--seq-len", "16", "--examples", "16",
              "--batch-size", "8", "--redundancy-examples", "0"]
        out = new_out()
        cases += [
            Case(fam, "default", "cli", "ok", rk),
            Case(fam, "--csv", "cli", "ok", [*rk, "--csv", str(out)], check=finite_csv_check(out, "d_align")),
            Case(fam, "--hidden 8", "cli", "ok", [*rk, "--hidden", "8"]),
            Case(fam, "--budgets 2,4", "cli", "ok", [*rk, "--budgets", "2,4"]),
            Case(fam, "one layer", "cli", "ok", [*rk, "--layer", layer0]),
        ]
        for value in ("0", "-3", "1e8", "abc", "2.5"):
            cases.append(Case(fam, f"--hidden {value}", "cli", "refuse", [*rk, "--hidden", value]))
        for value in ("0", "a", "-4", "0,4"):
            cases.append(Case(fam, f"--budgets {value}", "cli", "refuse", [*rk, "--budgets", value]))
        for name, argv in (("--examples 4", ["--examples", "4"]), ("--seq-len 0", ["--seq-len", "0"]),
                           ("--seq-len 1", ["--seq-len", "1"]), ("--layer bogus", ["--layer", "bogus"]),
                           ("--confidence 2", ["--confidence", "2"]), ("--seed -1", ["--seed", "-1"]),
                           ("--csv over the data", ["--csv", p("data.txt")]),
                           ("--csv over the model config", ["--csv", p(kind) + "/config.json"]),
                           ("--csv a folder", ["--csv", str(trial.outs)]),
                           *READ_ONLY_DIR(("--csv read-only folder", ["--csv", p("readonly_dir") + "/r.csv"]))):
            cases.append(Case(fam, name, "cli", "refuse", [*rk, *argv]))
        cases.append(Case(fam, "--data latin1", "cli", "refuse",
                          [a if a != p("data.txt") else p("latin1.txt") for a in rk]))
        cases.append(Case(fam, "truncated model", "cli", "refuse",
                          [a if a != model else p(f"{kind}_truncated") for a in rk]))

    fam = "cli-bert"
    cases += [
        Case(fam, "estimate on a masked LM", "cli", "refuse",
             ["estimate", "--model", p("bert"), "--layer", "bert.encoder.layer.1", "--data", p("data.txt"),
              "--seq-len", "16", "--examples", "8", "--redundancy-examples", "0", "--quiet"]),
        Case(fam, "estimate all on a masked LM", "cli", "refuse",
             ["estimate", "--model", p("bert"), "--layer", "all", "--data", p("data.txt"), "--seq-len", "16",
              "--examples", "8", "--redundancy-examples", "0", "--quiet"]),
        Case(fam, "rank on a masked LM", "cli", "refuse",
             ["rank", "--model", p("bert"), "--data", p("data.txt"), "--seq-len", "16", "--examples", "16",
              "--redundancy-examples", "0"]),
        Case(fam, "layers (a text model that is not causal)", "cli", "refuse", ["layers", "--model", p("bert")]),
        Case(fam, "layers with data", "cli", "refuse",
             ["layers", "--model", p("bert"), "--data", p("data.txt"), "--seq-len", "16"]),
        Case(fam, "truncated", "cli", "refuse", ["layers", "--model", p("bert_truncated")]),
    ]

    fam = "cli-arch-mlp"
    arch = ["--arch", "trialmods:mlp", "--model", p("mlp.pt")]
    est = ["estimate", *arch, "--data", p("mlp_data.pt"), "--examples", "20", "--batch-size", "6",
           "--redundancy-examples", "0", "--quiet"]
    for name, layer in (("block", "block"), ("body", "body")):
        out = new_out()
        cases.append(Case(fam, f"estimate {name} vs single-example loop", "cli", "ok",
                          [*est, "--layer", layer, "--out", str(out)],
                          check=lambda o, out=out, layer=layer: _arch_check(trial, out, layer, 20)))
    cases += [
        Case(fam, "estimate safetensors", "cli", "ok",
             [a if a != p("mlp.pt") else p("mlp.safetensors") for a in est] + ["--layer", "block"]),
        Case(fam, "estimate pair file", "cli", "ok",
             [a if a != p("mlp_data.pt") else p("mlp_pair.pt") for a in est] + ["--layer", "block"]),
        Case(fam, "estimate all", "cli", "ok", [*est, "--layer", "all"]),
        Case(fam, "estimate with redundancy", "cli", "ok",
             [a if a != "0" else "12" for a in est] + ["--layer", "block"]),
        Case(fam, "layers", "cli", "ok", ["layers", *arch]),
        Case(fam, "layers all modules", "cli", "ok", ["layers", *arch, "--all-modules"]),
        Case(fam, "rank", "cli", "ok", ["rank", *arch, "--data", p("mlp_data.pt"), "--examples", "16",
                                        "--redundancy-examples", "0", "--layer", "block"]),
    ]
    for name, swap in (("truncated .pt", ("mlp.pt", "mlp_truncated.pt")),
                       ("truncated .safetensors", ("mlp.pt", "mlp_truncated.safetensors")),
                       ("missing state dict", ("mlp.pt", "nothing.pt")), ("not a state dict", ("mlp.pt", "not_state.pt")),
                       ("another model's state", ("mlp.pt", "other_state.pt")), ("garbage state", ("mlp.pt", "garbage.pt")),
                       ("data without targets", ("mlp_data.pt", "mlp_nokey.pt")),
                       ("data rows differ", ("mlp_data.pt", "mlp_rows.pt")),
                       ("targets out of range", ("mlp_data.pt", "mlp_range.pt")),
                       ("empty data", ("mlp_data.pt", "mlp_empty.pt")), ("three examples", ("mlp_data.pt", "mlp_three.pt")),
                       ("NaN input", ("mlp_data.pt", "mlp_nan.pt")), ("wrong input width", ("mlp_data.pt", "mlp_width.pt")),
                       ("garbage data", ("mlp_data.pt", "garbage.pt")), ("text data", ("mlp_data.pt", "data.txt")),
                       ("missing data", ("mlp_data.pt", "nothing.pt"))):
        argv = [a if a != p(swap[0]) else p(swap[1]) for a in est] + ["--layer", "block"]
        cases.append(Case(fam, f"estimate {name}", "cli", "refuse", argv))
    for name, arch_argv in (("unknown module", ["--arch", "no_such_module:mlp"]),
                            ("unknown callable", ["--arch", "trialmods:nothing"]),
                            ("no colon", ["--arch", "trialmods"]), ("builder raises", ["--arch", "trialmods:raising"]),
                            ("returns no module", ["--arch", "trialmods:not_a_module"]),
                            ("bad json kwargs", ["--arch-kwargs", "{width: 3}"]),
                            ("kwargs not a dict", ["--arch-kwargs", "[1, 2]"]),
                            ("unknown kwarg", ["--arch-kwargs", '{"depth": 3}']),
                            ("kwargs change the shapes", ["--arch-kwargs", '{"width": 7}'])):
        for command in ("estimate", "layers", "rank"):
            argv = {"estimate": [*est, "--layer", "block"], "layers": ["layers", *arch],
                    "rank": ["rank", *arch, "--data", p("mlp_data.pt"), "--examples", "16",
                             "--redundancy-examples", "0"]}[command]
            argv = list(argv)
            if arch_argv[0] == "--arch":
                argv[argv.index("--arch") + 1] = arch_argv[1]
            else:
                argv += arch_argv
            cases.append(Case(fam, f"{command} --arch {name}", "cli", "refuse", argv))
    cases += [
        Case(fam, "estimate unknown layer", "cli", "refuse", [*est, "--layer", "blocks"]),
        Case(fam, "estimate --out over the state dict", "cli", "refuse", [*est, "--layer", "block", "--out", p("mlp.pt")]),
        Case(fam, "estimate --out over the data", "cli", "refuse",
             [*est, "--layer", "block", "--out", p("mlp_data.pt")]),
        Case(fam, "rank --csv over the data", "cli", "refuse",
             ["rank", *arch, "--data", p("mlp_data.pt"), "--examples", "16", "--csv", p("mlp_data.pt")]),
        Case(fam, "rank --csv over the state dict", "cli", "refuse",
             ["rank", *arch, "--data", p("mlp_data.pt"), "--examples", "16", "--csv", p("mlp.pt")]),
        Case(fam, "rank --hidden 0", "cli", "refuse",
             ["rank", *arch, "--data", p("mlp_data.pt"), "--examples", "16", "--hidden", "0"]),
    ]
    fam = "cli-arch-tuple"
    targ = ["--arch", "trialmods:tuple_mlp", "--model", p("tuple_mlp.pt")]
    cases += [
        Case(fam, "estimate on (features, logits)", "cli", "refuse",
             ["estimate", *targ, "--data", p("mlp_data.pt"), "--examples", "20", "--layer", "block",
              "--redundancy-examples", "0", "--quiet"]),
        Case(fam, "rank on (features, logits)", "cli", "refuse",
             ["rank", *targ, "--data", p("mlp_data.pt"), "--examples", "16", "--redundancy-examples", "0"]),
        Case(fam, "layers", "cli", "ok", ["layers", *targ]),
    ]
    fam = "cli-arch-resnet18"
    rarch = ["--arch", "torchvision.models:resnet18", "--arch-kwargs", '{"num_classes": 4}', "--model", p("resnet18.pt")]
    rest = ["estimate", *rarch, "--data", p("images"), "--image-size", "32", "--examples", "12", "--batch-size", "6",
            "--redundancy-examples", "0", "--quiet"]
    out = new_out()
    cases += [
        Case(fam, "estimate layer1.0", "cli", "ok", [*rest, "--layer", "layer1.0", "--out", str(out)],
             check=finite_csv_check(out, "d_align")),
        Case(fam, "estimate all", "cli", "ok", [*rest, "--layer", "all"]),
        Case(fam, "estimate no normalization", "cli", "ok", [*rest, "--layer", "layer4.1", "--normalize", "none"]),
        Case(fam, "layers", "cli", "ok", ["layers", *rarch]),
        Case(fam, "rank", "cli", "ok", ["rank", *rarch, "--data", p("images"), "--image-size", "32", "--examples", "12",
                                        "--redundancy-examples", "0", "--layer", "layer3.0,layer4.0"]),
        Case(fam, "--image-size 0", "cli", "refuse", [*rest, "--layer", "layer1.0", "--image-size", "0"]),
        Case(fam, "--image-size -5", "cli", "refuse", [*rest, "--layer", "layer1.0", "--image-size", "-5"]),
        Case(fam, "empty image folder", "cli", "refuse",
             [a if a != p("images") else p("images_empty") for a in rest] + ["--layer", "layer1.0"]),
        Case(fam, "a broken image", "cli", "refuse",
             [a if a != p("images") else p("images_broken") for a in rest] + ["--layer", "layer1.0"]),
        Case(fam, "wrong num_classes", "cli", "refuse",
             [a if a != '{"num_classes": 4}' else '{"num_classes": 10}' for a in rest] + ["--layer", "layer1.0"]),
        Case(fam, "--out over the images", "cli", "refuse",
             [*rest, "--layer", "layer1.0", "--out", p("images") + "/cat/0.png"]),
    ]
    fam = "cli-usage"
    cases += [
        Case(fam, "no command", "cli", "refuse", []),
        Case(fam, "--version", "cli", "ok", ["--version"]),
        Case(fam, "estimate without --layer", "cli", "refuse", ["estimate", "--model", p("llama"), "--data",
                                                                 p("data.txt"), "--examples", "8"]),
        Case(fam, "unknown command", "cli", "refuse", ["estimates"]),
        Case(fam, "exec: dalign estimate", "cli", "ok",
             ["estimate", "--model", p("llama"), "--layer", "model.layers.1", "--data", p("data.txt"), "--seq-len",
              "16", "--examples", "8", "--redundancy-examples", "0", "--quiet"], exec_=True),
        Case(fam, "exec: dalign layers truncated", "cli", "refuse", ["layers", "--model", p("llama_truncated")],
             exec_=True),
        Case(fam, "exec: dalign rank --hidden 0", "cli", "refuse",
             ["rank", "--model", p("llama"), "--data", p("data.txt"), "--hidden", "0"], exec_=True),
    ]
    return cases


def _arch_check(trial: Trial, out: Path, layer: str, n: int) -> str | None:
    rows = {row["layer"]: row for row in _csv_rows(out)}
    got = float(rows[layer]["d_align"])
    want = trial.reference_arch_d_align(layer, n)
    return None if _close(got, want) else f"{layer}: d_align {got:.6g}, the single-example loop gives {want:.6g}"


# -- experiments ----------------------------------------------------------------------------------------------

EXPERIMENTS = ("theory", "llama_width", "pythia_width", "resnet_width", "llama_context", "llama_depth",
               "pythia_checkpoints", "interventions", "growth", "claims")
SHARED_SWEEP = "llama_width"  # the sweep fields every width family shares are tried once, on this one

LEGITIMATE = {
    # (field, value) pairs a bad-value sweep would guess wrong: these values mean something
    ("lr_width_exponent", "-1"),  # the learning rate's power of width: a rule, not a count
    ("milestones", "[]"),  # no drops of the learning rate: a constant schedule
    ("retention_step_fractions", "[]"),  # the field's neutral value (no steps stated against training)
    ("optimizer_steps", "[]"),  # no optimizer-step readings (their check takes an empty list by design)
    ("matched_loss_offsets", "[]"),  # no matched-loss levels: the matched-loss readings are skipped
    ("retention_steps", "[]"),  # no fixed retention steps (retention_step_fractions may still give some)
    ("retention_eval_steps", "[]"),  # no grid step measured on E (the steps stated against training still are)
    ("retention_eval_kinds", "[]"),  # no kind measured on E: in-sample retention only
}
"""Judged from the code that reads each field (not run at scale): an empty list skips one measurement."""


def _bad_values(kind: Any) -> list[str]:
    """Values of a config field's type that no experiment should accept (or that are not of the type at all), as
    ``--set`` takes them: TOML values."""
    text = str(kind).replace("typing.", "")
    if text.endswith("| None"):  # an empty list is left out there, as the empty value that read as None once was
        return [value for value in _bad_values(text[: -len(" | None")]) if value != "[]"]
    if text.startswith("tuple[tuple"):
        return ["[[0, 0]]", "[[4]]"]
    if text.startswith("tuple[int, int]"):
        return ["[0, 0]"]
    if text.startswith("tuple[int"):
        return ["[]", "[-1]"]
    if text.startswith("tuple[float"):
        return ["[]", "[nan]"]
    if text.startswith("tuple[str"):  # names of models or revisions are only known where they are read: see RUN_FIELDS
        return ["[]"]
    if text.startswith("int"):
        return ["-1", "abc"]
    if text.startswith("float"):
        return ["nan", "-1"]
    if text.startswith("bool"):
        return ["maybe"]
    return []


STRING_FIELDS = {"device": "tpu9", "lr_fit": "no_such_fit", "dtype": "int3", "autocast_dtype": "float8"}
"""Bad values of text fields a config can judge where it is built (``--print-config`` must refuse them)."""
RUN_FIELDS = {("llama_width", "corpus"): "nosuchscheme:x", ("pythia_width", "architecture"): "transformerz",
              ("resnet_width", "dataset"): "no_such_dataset", ("resnet_width", "insertion_block"): "no_such_block",
              ("resnet_width", "more_datasets"): '["no_such_dataset"]', ("pythia_checkpoints", "text"): '""'}
"""Bad values a config may only find out about when it runs (a corpus, a data set, a name): tried in a smoke run."""


def exp_cases(trial: Trial) -> list[Case]:
    import dataclasses as dc
    import importlib
    import typing

    cases: list[Case] = []
    shared: set[str] = set()
    for name in EXPERIMENTS:
        module = importlib.import_module(f"dalign_repro.experiments.{name}")
        config_cls = module.Config
        hints = typing.get_type_hints(config_cls)
        fields = [f for f in dc.fields(config_cls) if f.name != "profile"]
        if name == SHARED_SWEEP:
            shared = {f.name for f in fields}
        for field in fields:
            if name in ("pythia_width", "resnet_width", "llama_context", "llama_depth") and field.name in shared:
                continue
            kind = hints[field.name]
            if (name, field.name) in RUN_FIELDS:
                value = RUN_FIELDS[name, field.name]
                cases.append(Case(f"exp-set-{name}", f"smoke run with {field.name}={value!r}", "exp", "refuse",
                                  ["--profile", "smoke", "--out", str(trial.outs / f"set_{name}_{field.name}"),
                                   "--set", f"{field.name}={value}"], module=name, timeout=300))
                continue
            values = _bad_values(kind)
            if "str" in str(kind) and "tuple" not in str(kind):
                values = [STRING_FIELDS[field.name]] if field.name in STRING_FIELDS else []
            for value in values:
                if (field.name, value) in LEGITIMATE:
                    continue
                cases.append(Case(f"exp-set-{name}", f"--set {field.name}={value!r}", "exp", "refuse",
                                  ["--profile", "smoke", "--set", f"{field.name}={value}", "--print-config"],
                                  module=name, timeout=60))
        fam = f"exp-args-{name}"
        cases += [
            Case(fam, "--print-config", "exp", "ok", ["--profile", "smoke", "--print-config"], module=name),
            Case(fam, "--set unknown field", "exp", "refuse", ["--set", "no_such_field=1", "--print-config"],
                 module=name),
            Case(fam, "--set without =", "exp", "refuse", ["--set", "seed", "--print-config"], module=name),
            Case(fam, "--seed -1", "exp", "refuse", ["--seed", "-1", "--print-config"], module=name),
            Case(fam, "--profile bogus", "exp", "refuse", ["--profile", "bogus", "--print-config"], module=name),
        ]
    # --config files
    configs = trial.inputs / "configs"
    configs.mkdir(exist_ok=True)
    (configs / "list.yaml").write_text("- 1\n- 2\n")
    (configs / "broken.yaml").write_text("steps: [1, 2\n")
    (configs / "unknown.yaml").write_text("no_such_field: 3\n")
    (configs / "badtype.yaml").write_text("trials: many\n")
    (configs / "bad_value.yaml").write_text("trials: 0\n")
    (configs / "latin1.yaml").write_bytes("trials: 2 # caf\u00e9\n".encode("latin-1"))
    (configs / "empty.yaml").write_text("")
    for name, expect in (("list.yaml", "refuse"), ("broken.yaml", "refuse"), ("unknown.yaml", "refuse"),
                         ("badtype.yaml", "refuse"), ("bad_value.yaml", "refuse"), ("latin1.yaml", "refuse"),
                         ("empty.yaml", "ok"), ("missing.yaml", "refuse")):
        cases.append(Case("exp-config", f"theory --config {name}", "exp", expect,
                          ["--profile", "smoke", "--config", str(configs / name), "--print-config"], module="theory"))
    cases.append(Case("exp-config", "llama_width --config a folder", "exp", "refuse",
                      ["--config", str(configs), "--print-config"], module="llama_width"))
    # --out targets, before any work
    for name in ("theory", "llama_width", "interventions"):
        for label, target in (("an existing file", trial.path("notes.md")), ("under a file", trial.path("notes.md") + "/r"),
                              *READ_ONLY_DIR(("a read-only folder", trial.path("readonly_dir") + "/r")), ("empty", "")):
            cases.append(Case("exp-out", f"{name} --out {label}", "exp", "refuse",
                              ["--profile", "smoke", "--out", target], module=name, timeout=90))
        cases.append(Case("exp-out", f"{name} --checkpoints a file", "exp", "refuse",
                          ["--profile", "smoke", "--out", str(trial.outs / f"ck_{name}"), "--checkpoints",
                           trial.path("notes.md")], module=name, timeout=90))
    # runs that must keep or check earlier results
    prior = trial.prior
    cases += exp_run_cases(trial, prior)
    return cases


def _write_prior(trial: Trial, folder: Path) -> None:
    """Theory's smoke tables in ``folder`` (computed once, copied)."""
    source = trial.outs / "theory_source"
    if not source.exists():
        code, _, err, _ = _fork_run(_exp_body("theory", ["--profile", "smoke", "--out", str(source)]), 300,
                                    trial.scratch, trial.env, trial.scratch)
        if code != 0:
            raise RuntimeError(f"theory at smoke did not run: {_last_line(err)}")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)


def exp_run_cases(trial: Trial, prior: Path) -> list[Case]:
    cases = []
    fam = "exp-run"

    def keep(folder):
        return lambda: _write_prior(trial, folder)

    folder = trial.outs / "run_bad_snrs"
    cases.append(Case(fam, "theory --set snrs=-1 over earlier results", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(folder), "--set", "snrs=-1", "--force"], module="theory",
                      prepare=keep(folder), protect=[folder], timeout=120))
    folder = trial.outs / "run_trials0"
    cases.append(Case(fam, "theory --set trials=0 --force over earlier results", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(folder), "--set", "trials=0", "--force"], module="theory",
                      prepare=keep(folder), protect=[folder], timeout=120))
    folder = trial.outs / "run_corpus"
    missing = Path(trial.path("no_such_folder"))  # inside the trial's folder: the trial writes nowhere else
    cases.append(Case(fam, "llama_width corpus=dir:<a missing folder>", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(folder), "--set", f"corpus=dir:{missing / 'corpus'}"],
                      module="llama_width", timeout=180))
    cases.append(Case(fam, "llama_width corpus=hf: offline", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(trial.outs / "run_hf"), "--set",
                       "corpus=hf:nobody-here/no-such-dataset"], module="llama_width", timeout=180))
    cases.append(Case(fam, "resnet_width data_root=<a missing folder> with CIFAR-10, offline", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(trial.outs / "run_root"), "--set", "dataset=cifar10",
                       "--set", f"data_root={missing / 'data'}"], module="resnet_width", timeout=180))
    cases.append(Case(fam, "pythia_checkpoints models_dir is a file", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(trial.outs / "run_models_dir"), "--set",
                       f"models_dir={trial.path('notes.md')}"], module="pythia_checkpoints", timeout=180))
    latin = trial.inputs / "latin_corpus"
    latin.mkdir(exist_ok=True)
    (latin / "a.txt").write_bytes(("caf\u00e9 " + TEXT).encode("latin-1") * 50)
    cases.append(Case(fam, "llama_width corpus of latin-1 text", "exp", "refuse",
                      ["--profile", "smoke", "--out", str(trial.outs / "run_latin"), "--set", f"corpus=dir:{latin}"],
                      module="llama_width", timeout=180))
    # a truncated table must not be reused
    folder = trial.outs / "run_truncated"

    def truncate(folder=folder):
        _write_prior(trial, folder)
        table = folder / "theory_estimators.csv"
        table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])

    def recomputed(outcome: Outcome, folder=folder) -> str | None:
        import hashlib

        if "reusing" in outcome.stderr:
            return "the up-to-date check reused a truncated table"
        record = json.loads((folder / "theory_estimators.json").read_text())
        digest = hashlib.sha256((folder / "theory_estimators.csv").read_bytes()).hexdigest()
        text = json.dumps(record)
        return None if digest in text else "the table does not match the sha256 its provenance records"
    cases.append(Case(fam, "theory rerun over a truncated table", "exp", "ok",
                      ["--profile", "smoke", "--out", str(folder)], module="theory", prepare=truncate,
                      check=recomputed, timeout=180))
    # two experiments with changed configs into one --out keep both records
    folder = trial.outs / "run_overrides"

    def both_recorded(outcome: Outcome, folder=folder) -> str | None:
        record = json.loads((folder / "overrides.json").read_text())
        names = sorted(record.get("experiments", {}))
        return None if names == ["claims", "theory"] or "theory" in names and "__main__" not in names else \
            f"overrides.json records {names}"
    cases.append(Case(fam, "theory with --set into --out (exec, python -m)", "exp", "ok",
                      ["--profile", "smoke", "--out", str(folder), "--set", "trials=3"], module="theory",
                      check=both_recorded, exec_=True, timeout=240))
    # writes only where told: nothing in the working folder
    folder = trial.outs / "run_where"

    def nothing_stray(outcome: Outcome) -> str | None:
        return None
    cases.append(Case(fam, "theory --out writes nothing else", "exp", "ok",
                      ["--profile", "smoke", "--out", str(folder), "--set", "trials=2"], module="theory",
                      check=nothing_stray, timeout=180))
    cases.append(Case(fam, "exec: theory --set trials=0", "exp", "refuse",
                      ["--profile", "smoke", "--set", "trials=0", "--print-config"], module="theory", exec_=True))
    cases.append(Case(fam, "paper profile on this machine", "exp", "refuse",
                      ["--profile", "paper", "--out", str(trial.outs / "run_paper")], module="llama_width",
                      timeout=180))
    return cases


# -- API ------------------------------------------------------------------------------------------------------


def _q_check(Q, want, what: str = "q") -> str | None:
    import torch

    got = Q.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, the single-example loop {tuple(want.shape)}"
    err = ((got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-30)).max().item()
    return None if err <= RTOL else f"{what} is {err:.1%} off the single-example loop (worst row)"


def api_cases(trial: Trial) -> dict[str, list[Case]]:
    """API cases grouped by model kind (one child per group)."""
    import torch
    import torch.nn.functional as F

    from dalign_core import accumulate_geometry, activation_gradients, estimate_geometry
    from dalign_core.geometry.ustatistics import geometry_from_gram

    groups: dict[str, list[Case]] = {}

    def add(group, name, expect, fn, timeout=60):
        groups.setdefault(group, []).append(Case(f"api-{group}", name, "api", expect, api=fn, timeout=timeout))

    for kind in ("gpt2", "llama"):
        layer0, layer1 = trial.layers[kind]
        generator = torch.Generator().manual_seed(2)
        ids = torch.randint(2, trial.vocab, (4, 12), generator=generator)

        def model(kind=kind, dtype=None):
            return trial.hf_model(kind, dtype)

        def singles(rows):
            return [{"input_ids": row[None]} for row in rows]

        def right_padded(ids=ids, kind=kind, layer=layer1):
            lengths = [12, 9, 7, 12]
            padded = ids.clone()
            mask = torch.ones_like(ids)
            for i, n in enumerate(lengths):
                padded[i, n:] = 0
                mask[i, n:] = 0
            m = model(kind)
            Q = activation_gradients(m, layer, {"input_ids": padded, "attention_mask": mask})
            want = reference_q(m, layer, [{"input_ids": ids[i:i + 1, :n]} for i, n in enumerate(lengths)], causal_loss)
            return _q_check(Q, want)

        def left_padded(ids=ids, kind=kind, layer=layer1):
            lengths = [12, 9, 7, 12]
            padded = torch.zeros_like(ids)
            mask = torch.zeros_like(ids)
            for i, n in enumerate(lengths):
                padded[i, 12 - n:] = ids[i, :n]
                mask[i, 12 - n:] = 1
            m = model(kind)
            Q = activation_gradients(m, layer, {"input_ids": padded, "attention_mask": mask})
            want = reference_q(m, layer, [{"input_ids": ids[i:i + 1, :n]} for i, n in enumerate(lengths)], causal_loss)
            return _q_check(Q, want)

        def plain(ids=ids, kind=kind, layer=layer0, as_tensor=False, dtype=None):
            m = model(kind, dtype)
            Q = activation_gradients(m, layer, ids if as_tensor else {"input_ids": ids})
            return _q_check(Q, reference_q(m, layer, singles(ids), causal_loss))

        def all_layers(ids=ids, kind=kind):
            m = model(kind)
            rows = activation_gradients(m, "all", {"input_ids": ids})
            for layer in trial.layers[kind]:
                wrong = _q_check(rows[layer], reference_q(m, layer, singles(ids), causal_loss), layer)
                if wrong:
                    return wrong
            return None

        def ignored_labels(ids=ids, kind=kind, layer=layer1):
            labels = ids.clone()
            labels[:, :4] = -100
            m = model(kind)
            Q = activation_gradients(m, layer, {"input_ids": ids, "labels": labels})

            def loss(out, example):
                return F.cross_entropy(out.logits[0, :-1], example["labels"][0, 1:], ignore_index=-100)
            want = reference_q(m, layer, [{"input_ids": ids[i:i + 1], "labels": labels[i:i + 1]} for i in range(4)],
                               lambda out, ex: loss(out, ex))
            return _q_check(Q, want)

        def streamed(ids=ids, kind=kind, layer=layer1, generator_batches=False):
            more = torch.randint(2, trial.vocab, (8, 12), generator=torch.Generator().manual_seed(3))
            m = model(kind)
            batches = [{"input_ids": more[i:i + 3]} for i in range(0, 8, 3)]
            acc = accumulate_geometry(m, layer, (b for b in batches) if generator_batches else batches)
            want = estimate_geometry(reference_q(m, layer, singles(more), causal_loss)).d_align
            got = acc.result().d_align
            return None if _close(got, want) else f"d_align {got:.6g}, estimate_geometry of the loop's q {want:.6g}"

        g = kind
        add(g, "right-padded batch vs single examples", "ok", right_padded)
        add(g, "left-padded batch vs single examples", "ok", left_padded)
        add(g, "input_ids mapping vs single examples", "ok", plain)
        add(g, "a tensor of ids vs single examples", "ok", lambda: plain(as_tensor=True))
        add(g, "float64 model vs single examples", "ok", lambda: plain(dtype=torch.float64))
        add(g, "layer all vs single examples", "ok", all_layers)
        add(g, "labels with -100 vs single examples", "ok", ignored_labels)
        add(g, "accumulate_geometry vs estimate_geometry", "ok", streamed)
        add(g, "accumulate_geometry over a generator", "ok", lambda: streamed(generator_batches=True))
        too_long = torch.randint(2, trial.vocab, (2, POSITIONS + 8))
        add(g, "a sequence longer than the positions", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": too_long}))
        add(g, "a mask of the wrong shape", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "attention_mask": torch.ones(4, 13)}))
        add(g, "a 1-D mask", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "attention_mask": torch.ones(12)}))
        add(g, "an empty batch", "refuse", lambda: activation_gradients(model(), layer1, {"input_ids": ids[:0]}))
        add(g, "sequences of one token", "refuse", lambda: activation_gradients(model(), layer1, {"input_ids": ids[:, :1]}))
        add(g, "float input_ids", "refuse", lambda: activation_gradients(model(), layer1, {"input_ids": ids.float()}))
        add(g, "ids beyond the vocabulary", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids + 10_000}))
        add(g, "negative ids", "refuse", lambda: activation_gradients(model(), layer1, {"input_ids": -ids}))
        add(g, "unknown layer", "refuse", lambda: activation_gradients(model(), "no.such.layer", {"input_ids": ids}))
        add(g, "layer given as an int", "refuse", lambda: activation_gradients(model(), 1, {"input_ids": ids}))
        add(g, "reduction bogus", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids}, reduction="mean"))
        add(g, "task bogus", "refuse", lambda: activation_gradients(model(), layer1, {"input_ids": ids}, task="lm"))
        add(g, "labels of the wrong shape", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "labels": ids[:, :5]}))
        add(g, "labels given twice", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "labels": ids}, ids))
        add(g, "all labels ignored", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "labels": torch.full_like(ids, -100)}))
        add(g, "an all-padding row", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids, "attention_mask":
                                                           torch.cat([torch.zeros(1, 12), torch.ones(3, 12)]).long()}))
        add(g, "a list of ids, not a tensor", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids.tolist()}))
        add(g, "masked_lm task on a causal LM without labels", "refuse",
            lambda: activation_gradients(model(), layer1, {"input_ids": ids}, task="masked_lm"))

        def nan_weight(kind=kind):
            m = model(kind)
            with torch.no_grad():
                next(p for n, p in m.named_parameters() if "embed" in n or "wte" in n)[3:].fill_(float("nan"))
            return activation_gradients(m, layer1, {"input_ids": ids})
        add(g, "NaN weights", "refuse", nan_weight)

        def dropout_train(kind=kind):
            import transformers

            m = model(kind)
            m.config.attention_dropout = 0.5
            for module in m.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.5
                if hasattr(module, "attention_dropout"):
                    module.attention_dropout = 0.5
            return activation_gradients(m.train(), layer1, {"input_ids": ids})
        add(g, "active dropout (train mode)", "refuse", dropout_train)
        add(g, "accumulate_geometry with no batches", "refuse", lambda: accumulate_geometry(model(), layer1, []).result())
        add(g, "accumulate_geometry examples=0", "refuse",
            lambda: accumulate_geometry(model(), layer1, [{"input_ids": ids}], examples=0))
        add(g, "accumulate_geometry sketch_dim=0", "refuse",
            lambda: accumulate_geometry(model(), layer1, [{"input_ids": ids}], sketch_dim=0))
        add(g, "accumulate_geometry of 4 examples (too few)", "refuse",
            lambda: accumulate_geometry(model(), layer1, [{"input_ids": ids[:3]}]).result())
        add(g, "accumulate_geometry of one dict, not a list", "refuse",
            lambda: accumulate_geometry(model(), layer1, {"input_ids": ids}).result())

    # BERT: masked LM, bidirectional
    g = "bert"
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(2, trial.vocab, (4, 12), generator=generator)
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]
    layer = "bert.encoder.layer.1"

    def bert():
        return trial.hf_model("bert")

    def masked(task="auto"):
        m = bert()
        Q = activation_gradients(m, layer, {"input_ids": ids, "labels": labels}, task=task)
        want = reference_q(m, layer, [{"input_ids": ids[i:i + 1], "labels": labels[i:i + 1]} for i in range(4)],
                           lambda out, ex: F.cross_entropy(out.logits[0], ex["labels"][0], ignore_index=-100))
        return _q_check(Q, want)

    def token_classifier():
        import transformers

        torch.manual_seed(0)
        m = transformers.BertForTokenClassification(transformers.BertConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=trial.vocab,
            max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            num_labels=5)).eval()
        tags = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(5))
        tags[:, 0] = -100
        Q = activation_gradients(m, layer, {"input_ids": ids, "labels": tags})
        want = reference_q(m, layer, [{"input_ids": ids[i:i + 1], "labels": tags[i:i + 1]} for i in range(4)],
                           lambda out, ex: F.cross_entropy(out.logits[0], ex["labels"][0], ignore_index=-100))
        return _q_check(Q, want)

    add(g, "masked-LM labels vs single examples", "ok", masked)
    add(g, "masked-LM labels, task named", "ok", lambda: masked("masked_lm"))
    add(g, "token classification vs single examples", "ok", token_classifier)
    add(g, "masked LM without labels", "refuse", lambda: activation_gradients(bert(), layer, {"input_ids": ids}))
    add(g, "a next-token loss on a bidirectional model", "refuse",
        lambda: activation_gradients(bert(), layer, {"input_ids": ids}, task="causal_lm"))
    add(g, "left-padded masked LM", "refuse",
        lambda: activation_gradients(bert(), layer, {"input_ids": ids, "labels": labels, "attention_mask":
                                                     torch.cat([torch.zeros(4, 2), torch.ones(4, 10)], 1).long()}))
    add(g, "labels out of the vocabulary", "refuse",
        lambda: activation_gradients(bert(), layer, {"input_ids": ids, "labels": labels.clamp_min(0) + 10_000}))
    add(g, "too long for the positions", "refuse",
        lambda: activation_gradients(bert(), layer, {"input_ids": torch.randint(2, 50, (2, POSITIONS + 5)),
                                                     "labels": torch.randint(2, 50, (2, POSITIONS + 5))}))
    add(g, "mask of the wrong shape", "refuse",
        lambda: activation_gradients(bert(), layer, {"input_ids": ids, "labels": labels,
                                                     "attention_mask": torch.ones(4, 3)}))

    # plain modules
    g = "plain"
    x, y = trial.mlp_data

    def mlp():
        m = trial.mods.mlp()
        m.load_state_dict(torch.load(trial.inputs / "mlp.pt"))
        return m.eval()

    def classifier(layer="block", n=10, batch=(x[:10], y[:10])):
        m = mlp()
        Q = activation_gradients(m, layer, batch[0], batch[1])
        want = reference_q(m, layer, [x[i:i + 1] for i in range(n)], lambda out, i: F.cross_entropy(out, y[i:i + 1]),
                           indexed=True)
        return _q_check(Q, want)

    def tuple_model(index):
        m = trial.mods.tuple_mlp().eval()
        Q = activation_gradients(m, "block", x[:10], y[:10], logits_index=index)
        want = reference_q(m, "block", [x[i:i + 1] for i in range(10)],
                           lambda out, i: F.cross_entropy(out[1], y[i:i + 1]), indexed=True)
        return _q_check(Q, want)

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(20, 8)
            self.block = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, tokens):
            h = self.embed(tokens)
            return self.head(h + torch.tanh(self.block(h)))

    tokens = torch.randint(0, 20, (5, 6), generator=torch.Generator().manual_seed(6))
    tags = torch.randint(0, 4, (5, 6), generator=torch.Generator().manual_seed(7))

    def tagger(task):
        m = Tagger().eval()
        Q = activation_gradients(m, "block", tokens, tags, task=task)
        want = reference_q(m, "block", [tokens[i:i + 1] for i in range(5)],
                           lambda out, i: F.cross_entropy(out[0], tags[i]), indexed=True)
        return _q_check(Q, want)

    def with_module(extra, train=True):
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), extra, torch.nn.Linear(16, 3))
        m.train(train)
        return activation_gradients(m, "0", x[:10], y[:10])

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, v):
            return self.head(self.block(self.block(v)))

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(8, 8)
            self.spare = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, v):
            return self.head(self.block(v))

    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, v):
            h = self.block(v)
            h.mul_(2.0)
            return self.head(h)

    class Coupled(torch.nn.Module):  # mixes the examples of a batch: q_i would not be example i's
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(8, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, v):
            h = self.block(v)
            return self.head(h - h.mean(dim=0, keepdim=True))

    def streamed_mlp():
        m = mlp()
        batches = [(x[i:i + 7], y[i:i + 7]) for i in range(0, 28, 7)]
        got = accumulate_geometry(m, "block", batches).result().d_align
        want = estimate_geometry(reference_q(m, "block", [x[i:i + 1] for i in range(28)],
                                             lambda out, i: F.cross_entropy(out, y[i:i + 1]), indexed=True)).d_align
        return None if _close(got, want) else f"d_align {got:.6g}, estimate_geometry of the loop's q {want:.6g}"

    from torchvision.ops import StochasticDepth

    add(g, "classifier vs single examples", "ok", classifier)
    add(g, "classifier, first layer", "ok", lambda: classifier("body"))
    add(g, "classifier, a pair as the batch", "ok", lambda: classifier())
    add(g, "accumulate_geometry vs estimate_geometry", "ok", streamed_mlp)
    add(g, "(features, logits) with logits_index=1", "ok", lambda: tuple_model(1))
    add(g, "(features, logits) without logits_index", "refuse", lambda: tuple_model(None))
    add(g, "logits_index out of range", "refuse", lambda: tuple_model(5))
    add(g, "3-D logits, task named", "ok", lambda: tagger("token_classification"))
    add(g, "3-D logits, task auto", "refuse", lambda: tagger("auto"))
    add(g, "BatchNorm in train mode", "refuse", lambda: with_module(torch.nn.BatchNorm1d(16)))
    add(g, "BatchNorm in eval mode", "ok", lambda: _shape_only(with_module(torch.nn.BatchNorm1d(16), train=False)))
    add(g, "Dropout in train mode", "refuse", lambda: with_module(torch.nn.Dropout(0.3)))
    add(g, "StochasticDepth in train mode", "refuse", lambda: with_module(StochasticDepth(0.3, "row")))
    add(g, "StochasticDepth in eval mode", "ok", lambda: _shape_only(with_module(StochasticDepth(0.3, "row"), False)))
    add(g, "a layer that runs twice", "refuse", lambda: activation_gradients(Twice(), "block", x[:10, :8], y[:10]))
    add(g, "a layer that never runs", "refuse", lambda: activation_gradients(Unused(), "spare", x[:10, :8], y[:10]))
    add(g, "in-place op on the layer output", "refuse",
        lambda: activation_gradients(InPlace(), "block", x[:10, :8], y[:10]))
    add(g, "a forward that couples the examples", "refuse",
        lambda: activation_gradients(Coupled(), "block", x[:10, :8], y[:10]))
    add(g, "no targets for a classifier", "refuse", lambda: activation_gradients(mlp(), "block", x[:10]))
    add(g, "targets out of range", "refuse", lambda: activation_gradients(mlp(), "block", x[:10], y[:10] + 3))
    add(g, "targets of another length", "refuse", lambda: activation_gradients(mlp(), "block", x[:10], y[:7]))
    add(g, "an empty batch", "refuse", lambda: activation_gradients(mlp(), "block", x[:0], y[:0]))
    add(g, "inputs of the wrong width", "refuse", lambda: activation_gradients(mlp(), "block", x[:10, :5], y[:10]))
    add(g, "NaN inputs", "refuse",
        lambda: activation_gradients(mlp(), "block", torch.full((4, 8), float("nan")), y[:4]))
    add(g, "not a module", "refuse", lambda: activation_gradients(lambda v: v, "block", x[:10], y[:10]))
    add(g, "a numpy batch", "refuse", lambda: activation_gradients(mlp(), "block", x[:10].numpy(), y[:10]))
    add(g, "check_determinism='yes'", "refuse",
        lambda: activation_gradients(mlp(), "block", x[:10], y[:10], check_determinism="yes"))
    add(g, "a compiled model", "refuse", lambda: activation_gradients(torch.compile(mlp()), "block", x[:10], y[:10]))

    # geometry
    g = "geometry"
    rng = torch.Generator().manual_seed(8)
    Q = torch.randn(30, 12, generator=rng, dtype=torch.float64) + 0.5

    def gram_agrees():
        a, b = estimate_geometry(Q), geometry_from_gram(Q @ Q.T)
        return None if _close(a.d_align, b.d_align, 1e-9) else f"{a.d_align} vs {b.d_align}"

    def scale_free():
        a, b = estimate_geometry(Q), estimate_geometry(Q * 1e-30)
        return None if _close(a.d_align, b.d_align, 1e-9) else f"{a.d_align} vs {b.d_align} at scale 1e-30"

    def brute_force():
        import itertools

        n = Q.shape[0]
        pairs = [(i, j) for i, j in itertools.permutations(range(n), 2)]
        mean_sq = sum(float(Q[i] @ Q[j]) for i, j in pairs) / len(pairs)
        got = estimate_geometry(Q).mean_sq
        return None if _close(got, mean_sq, 1e-9) else f"mean_sq {got} vs brute force {mean_sq}"

    def streamed_vs_one_shot():
        from dalign_core import GeometryAccumulator

        acc = GeometryAccumulator()
        for i in range(0, 30, 7):
            acc.update(Q[i:i + 7])
        a, b = acc.result().d_align, estimate_geometry(Q).d_align
        return None if _close(a, b, 1e-9) else f"{a} vs {b}"

    bad_gram = (Q @ Q.T).clone()
    bad_gram[0, 1] += 5.0
    nan_gram = (Q @ Q.T).clone()
    nan_gram[2, 2] = float("nan")
    nan_q = Q.clone()
    nan_q[3, 3] = float("nan")
    add(g, "estimate_geometry equals geometry_from_gram", "ok", gram_agrees)
    add(g, "estimate_geometry is scale-free", "ok", scale_free)
    add(g, "mean_sq equals the brute-force U-statistic", "ok", brute_force)
    add(g, "streamed equals one-shot", "ok", streamed_vs_one_shot)
    add(g, "numpy rows", "ok", lambda: None if _close(estimate_geometry(Q.numpy()).d_align,
                                                     estimate_geometry(Q).d_align, 1e-12) else "numpy differs")
    add(g, "non-symmetric Gram", "refuse", lambda: geometry_from_gram(bad_gram))
    add(g, "NaN in the Gram", "refuse", lambda: geometry_from_gram(nan_gram))
    add(g, "non-square Gram", "refuse", lambda: geometry_from_gram((Q @ Q.T)[:, :5]))
    add(g, "Gram of 3 examples", "refuse", lambda: geometry_from_gram((Q @ Q.T)[:3, :3]))
    add(g, "complex Gram", "refuse", lambda: geometry_from_gram((Q @ Q.T).to(torch.complex128)))
    add(g, "NaN in Q", "refuse", lambda: estimate_geometry(nan_q))
    add(g, "inf in Q", "refuse", lambda: estimate_geometry(Q * float("inf")))
    add(g, "3 rows", "refuse", lambda: estimate_geometry(Q[:3]))
    add(g, "no rows", "refuse", lambda: estimate_geometry(Q[:0]))
    add(g, "a 1-D Q", "refuse", lambda: estimate_geometry(Q[0]))
    add(g, "a 3-D Q", "refuse", lambda: estimate_geometry(Q.reshape(5, 6, 12)))
    add(g, "strings", "refuse", lambda: estimate_geometry([["a", "b"]] * 5))
    add(g, "sketch_dim 0", "refuse", lambda: estimate_geometry(Q, sketch_dim=0))
    add(g, "sketch_dim beyond d", "refuse", lambda: estimate_geometry(Q, sketch_dim=100))
    add(g, "sketch_dim 2.5", "refuse", lambda: estimate_geometry(Q, sketch_dim=2.5))
    add(g, "confidence 0", "refuse", lambda: estimate_geometry(Q, confidence=0))
    add(g, "confidence 1.5", "refuse", lambda: estimate_geometry(Q, confidence=1.5))
    add(g, "identical rows", "ok", lambda: _finite_or_explained(estimate_geometry(Q[:1].repeat(6, 1))))

    from dalign_core import b_align, effective_dims

    mu = torch.ones(4, dtype=torch.float64)
    add(g, "effective_dims of a non-symmetric sigma", "refuse",
        lambda: effective_dims(mu, torch.tensor([[1.0, 2.0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])))
    add(g, "effective_dims of an indefinite sigma", "refuse", lambda: effective_dims(mu, -torch.eye(4)))
    add(g, "effective_dims of a sigma of another size", "refuse", lambda: effective_dims(mu, torch.eye(3)))
    add(g, "b_align of a negative d_align", "refuse", lambda: b_align(-1.0, 10, 10))
    add(g, "b_align with M=0", "refuse", lambda: b_align(2.0, 0, 10))
    add(g, "b_align of NaN", "refuse", lambda: b_align(float("nan"), 10, 10))
    _own_module().api_cases(sys.modules[__name__], trial, trial.own, add)
    return groups


def _shape_only(Q) -> str | None:
    return None if Q.ndim == 2 and bool(Q.isfinite().all()) else f"q of shape {tuple(Q.shape)} with non-finite entries"


def _finite_or_explained(geometry) -> str | None:
    interval = geometry.intervals.get("d_align")
    if math.isnan(geometry.d_align) or (interval is not None and interval.lo <= geometry.d_align <= interval.hi):
        return None
    return f"d_align {geometry.d_align} outside its interval {interval}"


# ---------------------------------------------------------------------------------------------------------------
# The trial


def select(cases: list[Case], quick: bool, families: list[str] | None) -> list[Case]:
    if families:
        cases = [c for c in cases if any(c.family.startswith(f) for f in families)]
    if quick:  # the first two and the last case of each family: a few of every kind, fast
        by: dict[str, list[Case]] = {}
        for case in cases:
            by.setdefault(case.family, []).append(case)
        cases = [c for group in by.values() for c in (group[:2] + group[-1:] if len(group) > 2 else group)
                 if not c.exec_]
    return cases


def summarize(outcomes: list[Outcome]) -> tuple[str, bool]:
    counts = {name: sum(o.outcome == name for o in outcomes) for name in CLASSES}
    families = sorted({o.case.family for o in outcomes})
    width = max([len(f) for f in families] + [6])
    lines = [f"{'family':<{width}}  {'cases':>5}  " + "  ".join(f"{c:>13}" for c in CLASSES)]
    for family in families:
        mine = [o for o in outcomes if o.case.family == family]
        lines.append(f"{family:<{width}}  {len(mine):>5}  " +
                     "  ".join(f"{sum(o.outcome == c for o in mine):>13}" for c in CLASSES))
    lines.append(f"{'all':<{width}}  {len(outcomes):>5}  " + "  ".join(f"{counts[c]:>13}" for c in CLASSES))
    met = (counts["silent wrong"] == 0 and counts["data lost"] == 0 and counts["hang"] == 0
           and counts["raw traceback"] <= MAX_RAW_TRACEBACKS)
    lines.append(f"issue #39's bar (0 silent wrong, 0 data lost, 0 hangs, <= {MAX_RAW_TRACEBACKS} raw tracebacks): "
                 + ("met" if met else "NOT met"))
    bad = [o for o in outcomes if o.outcome in ("raw traceback", "silent wrong", "data lost", "hang")]
    if bad:
        lines.append("")
        lines.append("cases below the bar:")
        lines += [f"  [{o.outcome}] {o.case.family} / {o.case.name}: {o.detail}" for o in bad]
    return "\n".join(lines), met


def write_csv(path: Path, outcomes: list[Outcome]) -> None:
    from dalign_core.atomic import atomic_write_text

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["family", "case", "kind", "expect", "outcome", "exit_code", "seconds", "detail",
                     "stray_files", "argv"])
    for o in outcomes:
        c = o.case
        writer.writerow([c.family, c.name, c.kind + ("-exec" if c.exec_ else ""), c.expect, o.outcome, o.code,
                         f"{o.seconds:.2f}", o.detail, o.stray,
                         " ".join(c.argv) if c.kind != "exp" else f"-m dalign_repro.experiments.{c.module} " +
                         " ".join(c.argv)])
    atomic_write_text(path, buffer.getvalue())


def run_trial(root: Path, quick: bool = False, families: list[str] | None = None, verbose: bool = True
              ) -> list[Outcome]:
    trial = Trial(root)
    own = _own_module().cli_cases(sys.modules[__name__], trial, trial.own)
    command_cases = select(cli_cases(trial) + own + exp_cases(trial), quick, families)
    groups = api_cases(trial)
    api_selected = select([c for group in groups.values() for c in group], quick, families)
    chosen = {id(c) for c in api_selected}
    outcomes: list[Outcome] = []
    total = len(command_cases) + len(api_selected)
    started = time.perf_counter()
    for case in command_cases:
        outcome = run_case(case, trial)
        outcomes.append(outcome)
        if verbose:
            print(f"[{len(outcomes)}/{total} {time.perf_counter() - started:5.0f} s] {outcome.outcome:<13} "
                  f"{case.family} / {case.name}" + (f": {outcome.detail}" if outcome.outcome != "ok" and
                                                     outcome.outcome != "clear error" else ""),
                  file=sys.stderr, flush=True)
    for name, group in groups.items():
        mine = [c for c in group if id(c) in chosen]
        if not mine:
            continue
        for outcome in run_api_group(mine, trial):
            outcomes.append(outcome)
            if verbose:
                print(f"[{len(outcomes)}/{total} {time.perf_counter() - started:5.0f} s] {outcome.outcome:<13} "
                      f"{outcome.case.family} / {outcome.case.name}" +
                      (f": {outcome.detail}" if outcome.outcome not in ("ok", "clear error") else ""),
                      file=sys.stderr, flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write every case and its outcome to this CSV")
    parser.add_argument("--quick", action="store_true", help="a few cases of every family (about a minute)")
    parser.add_argument("--family", action="append", default=None,
                        help="only the families whose name starts with this (repeatable), e.g. cli-rank, api-")
    parser.add_argument("--keep", type=Path, default=None, help="build the fixtures in this folder and keep them")
    parser.add_argument("--quiet", action="store_true", help="no line per case")
    args = parser.parse_args(argv)
    for name, value in (("TQDM_DISABLE", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
        os.environ.setdefault(name, value)
    root = args.keep or Path(tempfile.mkdtemp(prefix="dalign_user_trial_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        outcomes = run_trial(root, quick=args.quick, families=args.family, verbose=not args.quiet)
    finally:
        if args.keep is None:
            for folder in (root / "inputs" / "readonly_dir",):
                if folder.exists():
                    folder.chmod(0o755)
            shutil.rmtree(root, ignore_errors=True)
    table, met = summarize(outcomes)
    print(table)
    if args.out is not None:
        write_csv(args.out, outcomes)
        print(f"wrote {args.out}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
