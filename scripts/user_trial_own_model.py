"""The trial's third round: an engineer's own model, checked against independent references.

New model kinds (torchvision's ViT, a GRU language model, an MLP in nested containers, a LoRA-wrapped Linear, a
``DataParallel`` wrapper, a model whose block never reaches the loss, models that raise in their forward) and the
classes the issue names: batch keys the model's forward does not take, losses that couple the examples, ``--out``
files checked by content, ``--data`` and other inputs that are not regular files (pipes nobody writes to),
``--revision`` climbing out of ``--model``, the model's own exceptions in one line, the API's checks of inputs,
targets and grad mode before the forward pass, ``rank --quiet``, an all-zero q and a sketch no smaller than d.

Every case that returns numbers is checked against references that share no code with the capture: q against
a plain autograd loop over single examples (``user_trial.reference_q``), and the moments and d_align against a
brute-force U-statistic over distinct index tuples of the Gram matrix (:func:`brute_force_geometry`), not the
project's estimator.

Imported by ``scripts/user_trial.py`` (``ut``: that module, for its ``Case`` and references).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from pathlib import Path
from typing import Callable

MOMENT_RTOL = 2e-3  # the moments of the capture's q against the brute-force U-statistic of the loop's q
D_ALIGN_RTOL = 1e-2

OWN_MODULE = '''
"""The engineer's own models of the trial's third round."""
import torch
from torch import nn


class Patches(nn.Module):
    def __init__(self, size=8):
        super().__init__()
        self.size = size
        self.proj = nn.Linear(size * size, 16)

    def forward(self, x):
        assert x.shape[-1] == self.size, f"Input image size ({x.shape[-1]}) doesn't match model ({self.size})."
        return self.proj(x.flatten(1))


class Patchy(nn.Module):
    """A ViT-like classifier of (batch, 1, size, size) images, asserting their size as timm's models do."""

    def __init__(self, size=8, classes=3, fail=""):
        super().__init__()
        self.patches = Patches(size)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(16, classes)
        self.fail = fail

    def forward(self, x):
        h = self.patches(x)
        if self.fail == "key":
            {"cls": h}["cls_token"]
        if self.fail == "index":
            h = h[:, 99]
        if self.fail == "type":
            h = h + "1"
        if self.fail == "zero":
            h = h / 0 if isinstance(h, int) else h + (1 // 0)
        if self.fail == "value":
            raise ValueError("the model's own ValueError")
        if self.fail == "not_implemented":
            raise NotImplementedError("this head is not implemented")
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class Deaf(Patchy):
    """blocks.1's output is multiplied by 0 before the head: q there is exactly 0."""

    def forward(self, x):
        h = self.patches(x)
        h = h + self.blocks[0](h)
        return self.head(h + 0.0 * self.blocks[1](h))


def patchy(**kwargs):
    torch.manual_seed(0)
    return Patchy(**kwargs)


def deaf(**kwargs):
    torch.manual_seed(0)
    return Deaf(**kwargs)


class Nested(nn.Module):
    """An MLP whose blocks sit in containers within containers."""

    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleDict({"low": nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh())]),
                                     "high": nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
                                                            nn.Sequential(nn.Linear(8, 8), nn.Tanh())])})
        self.embed = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        for stage in ("low", "high"):
            for block in self.stages[stage]:
                h = h + block(h)
        return self.head(h)


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update, as peft wraps one."""

    def __init__(self, base, rank=2):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.1)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))


class LoRAMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.block = LoRALinear(nn.Linear(8, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.body(x)
        return self.head(h + torch.tanh(self.block(h)))


class GRULM(nn.Module):
    """A GRU language model: (batch, T) token ids to (batch, T, vocabulary) next-token logits."""

    def __init__(self, vocab=40, width=16, batch_first=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, batch_first=batch_first)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.embed(ids)
        out, _ = self.rnn(h if self.rnn.batch_first else h.transpose(0, 1))
        return self.head(out if self.rnn.batch_first else out.transpose(0, 1))


class Keyed(nn.Module):
    """A classifier that takes its features by keyword and swallows other keywords, as many research models do."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, features, weights=None, **kwargs):
        h = torch.tanh(self.block(features if weights is None else features * weights))
        return self.head(h)
'''


def brute_force_geometry(Q) -> dict[str, float]:
    """The U-statistics of ``Q`` (n, d) by brute force over distinct index tuples of its Gram matrix (float64).

    ``mean_sq`` = mean of q_i.q_j (i != j); ``mean_sq_sq`` = mean of (q_i.q_j)(q_k.q_l) (i, j, k, l distinct);
    ``directional`` = mean of (q_i.q_j)(q_j.q_k) (distinct) minus ``mean_sq_sq``; ``cov_energy`` = mean of
    (q_i.q_j)^2 (i != j) - 2 mean of (q_i.q_j)(q_j.q_k) + ``mean_sq_sq``: each an unbiased estimate of ||mu||^2,
    ||mu||^4, mu'Sigma mu and tr(Sigma^2). d_par, d_2 and d_align as the paper defines them from the three (a
    non-positive signal gives 0, a non-positive noise term inf). Written from the definitions, for n <= 24."""
    import numpy as np

    G = np.asarray(Q, dtype=np.float64) @ np.asarray(Q, dtype=np.float64).T
    n = G.shape[0]
    pairs = [(i, j) for i, j in itertools.permutations(range(n), 2)]
    s1 = sum(G[i, j] for i, j in pairs) / len(pairs)
    t2 = sum(G[i, j] ** 2 for i, j in pairs) / len(pairs)
    triples = list(itertools.permutations(range(n), 3))
    t3 = sum(G[i, j] * G[j, k] for i, j, k in triples) / len(triples)
    quads = list(itertools.permutations(range(n), 4))
    t4 = sum(G[i, j] * G[k, l] for i, j, k, l in quads) / len(quads)
    directional, cov_energy = t3 - t4, t2 - 2 * t3 + t4

    def ratio(noise: float) -> float:
        if t4 <= 0:
            return 0.0
        return t4 / noise if noise > 0 else math.inf

    d_par, d_2 = ratio(directional), ratio(cov_energy)
    return {"mean_sq": s1, "mean_sq_sq": t4, "directional": directional, "cov_energy": cov_energy,
            "d_par": d_par, "d_2": d_2, "d_align": min(d_par, d_2)}


def geometry_check(Q_captured, Q_reference) -> str | None:
    """The project's estimate from the captured q against the brute-force U-statistic of the loop's q."""
    from dalign_core.geometry.estimators import estimate_geometry

    got = estimate_geometry(Q_captured.double())
    want = brute_force_geometry(Q_reference.double().numpy())
    scale = max(abs(want["mean_sq_sq"]), abs(want["cov_energy"]), 1e-300)
    for name in ("mean_sq_sq", "directional", "cov_energy"):
        if abs(getattr(got, name) - want[name]) > MOMENT_RTOL * scale:
            return f"{name} {getattr(got, name):.6g}, the brute-force U-statistic {want[name]:.6g}"
    if abs(got.mean_sq - want["mean_sq"]) > MOMENT_RTOL * max(abs(want["mean_sq"]), math.sqrt(scale)):
        return f"mean_sq {got.mean_sq:.6g}, the brute-force U-statistic {want['mean_sq']:.6g}"
    a, b = got.d_align, want["d_align"]
    if not (a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= D_ALIGN_RTOL * max(abs(b), 1e-12))):
        return f"d_align {a:.6g}, the brute-force U-statistic {b:.6g}"
    return None


class Fixtures:
    """The third round's files in the trial's inputs folder, and its model builders."""

    def __init__(self, ut, trial):
        import importlib
        import sys

        import torch

        self.ut, self.trial = ut, trial
        inputs = trial.inputs
        (inputs / "ownmods.py").write_text(OWN_MODULE)
        if str(inputs) not in sys.path:
            sys.path.insert(0, str(inputs))
        self.mods = importlib.import_module("ownmods")
        torch.save(self.mods.patchy().state_dict(), inputs / "patchy.pt")
        torch.save(self.mods.deaf().state_dict(), inputs / "deaf.pt")
        import torchvision

        torch.manual_seed(0)
        torch.save(torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                                        hidden_dim=16, mlp_dim=32, num_classes=2).state_dict(),
                   inputs / "vit.pt")
        generator = torch.Generator().manual_seed(11)
        self.images = torch.randn(16, 1, 8, 8, generator=generator)
        self.labels = torch.randint(0, 3, (16,), generator=generator)
        torch.save({"inputs": self.images, "targets": self.labels}, inputs / "patches8.pt")
        torch.save({"inputs": torch.randn(16, 1, 6, 6, generator=generator), "targets": self.labels},
                   inputs / "patches6.pt")
        self.x = torch.randn(12, 6, generator=generator)
        self.y = torch.randint(0, 3, (12,), generator=generator)
        # --out files that carry a .csv name but are not tables
        (inputs / "binary_notes.csv").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
        (inputs / "latin1_notes.csv").write_bytes("caf\u00e9,1\n".encode("latin-1") * 4)
        (inputs / "nul_notes.csv").write_bytes(b"a,b\n1,\x002\n")
        # inputs that are not regular files
        self.pipes = inputs / "pipes"
        self.pipes.mkdir(exist_ok=True)
        self.fifo_ok = hasattr(os, "mkfifo")
        if self.fifo_ok:
            for name in ("silent.txt", "silent.pt", "silent_model.pt", "written.txt"):
                os.mkfifo(self.pipes / name)
            folder = inputs / "gpt2_fifo_tokenizer"
            folder.mkdir()
            for item in (inputs / "gpt2").iterdir():
                if item.is_file() and item.name != "tokenizer.json":
                    (folder / item.name).write_bytes(item.read_bytes())
            os.mkfifo(folder / "tokenizer.json")
            folder = inputs / "gpt2_fifo_config"
            folder.mkdir()
            for item in (inputs / "gpt2").iterdir():
                if item.is_file() and item.name != "config.json":
                    (folder / item.name).write_bytes(item.read_bytes())
            os.mkfifo(folder / "config.json")
            images = inputs / "images_fifo"
            (images / "cat").mkdir(parents=True)
            (images / "dog").mkdir(parents=True)
            for label in ("cat", "dog"):
                for i in range(3):
                    (images / label / f"{i}.png").write_bytes((inputs / "images" / label / f"{i}.png").read_bytes())
            os.mkfifo(images / "cat" / "9.png")
        revisions = inputs / "revisions"
        (revisions / "step1").mkdir(parents=True)
        for item in (inputs / "gpt2").iterdir():
            if item.is_file():
                (revisions / "step1" / item.name).write_bytes(item.read_bytes())

    def write_pipe_later(self, name: str, text: str) -> Callable[[], None]:
        """A ``prepare``: a daemon thread that opens the pipe for writing (blocking until a reader opens it) and
        writes ``text``, so the case's reader gets it."""
        path = self.pipes / name

        def start() -> None:
            def write() -> None:
                try:
                    with open(path, "w", encoding="utf-8") as handle:
                        handle.write(text)
                except OSError:
                    pass
            threading.Thread(target=write, daemon=True).start()
        return start


# -- command-line cases ---------------------------------------------------------------------------------------


def _csv_d_align(ut, out: Path, layer: str) -> float:
    rows = {row["layer"]: row for row in ut._csv_rows(out)}
    return float(rows[layer]["d_align"])


def cli_cases(ut, trial, fx: Fixtures) -> list:
    Case, p = ut.Case, trial.path
    cases = []
    counter = [0]

    def new_out() -> Path:
        counter[0] += 1
        return trial.outs / f"own_{counter[0]}.csv"

    gpt = ["estimate", "--model", p("gpt2"), "--layer", "transformer.h.1", "--data", p("data.txt"), "--seq-len", "16",
           "--examples", "8", "--batch-size", "4", "--redundancy-examples", "0", "--quiet"]

    def with_data(argv, data):
        return [a if a != p("data.txt") else data for a in argv]

    fam = "own-cli-out"
    for name in ("binary_notes.csv", "latin1_notes.csv", "nul_notes.csv"):
        cases.append(Case(fam, f"--out {name} (not CSV text)", "cli", "refuse", [*gpt, "--out", p(name)]))
        cases.append(Case(fam, f"rank --csv {name}", "cli", "refuse",
                          ["rank", "--model", p("gpt2"), "--data", p("data.txt"), "--seq-len", "16", "--examples", "8",
                           "--redundancy-examples", "0", "--csv", p(name)]))
    out = trial.outs / "own_text.csv"
    cases.append(Case(fam, "--out over a CSV text file is replaced", "cli", "ok", [*gpt, "--out", str(out)],
                      prepare=lambda out=out: out.write_text("layer,d_align\nx,1\n"),
                      check=lambda o, out=out: None if "transformer.h.1" in out.read_text() else
                      "the CSV was not replaced"))
    empty = trial.outs / "own_empty.csv"
    cases.append(Case(fam, "--out over an empty .csv", "cli", "ok", [*gpt, "--out", str(empty)],
                      prepare=lambda: empty.write_text(""),
                      check=lambda o: None if "d_align" in empty.read_text() else "nothing written"))
    fam = "own-cli-streams"
    slow = {"DALIGN_DATA_TIMEOUT": "2"}
    if fx.fifo_ok:
        cases += [
            Case(fam, "--data a pipe nobody writes to", "cli", "refuse", with_data(gpt, str(fx.pipes / "silent.txt")),
                 env=slow, timeout=60),
            Case(fam, "layers --data a pipe nobody writes to", "cli", "refuse",
                 ["layers", "--model", p("gpt2"), "--data", str(fx.pipes / "silent.txt"), "--seq-len", "16"],
                 env=slow, timeout=60),
            Case(fam, "rank --data a pipe nobody writes to", "cli", "refuse",
                 ["rank", "--model", p("gpt2"), "--data", str(fx.pipes / "silent.txt"), "--seq-len", "16",
                  "--examples", "8", "--redundancy-examples", "0"], env=slow, timeout=60),
            Case(fam, "--data a pipe that is written, vs the loop", "cli", "ok",
                 [*with_data(gpt, str(fx.pipes / "written.txt")), "--out", str(trial.outs / "own_pipe.csv")],
                 prepare=fx.write_pipe_later("written.txt", ut.TEXT * 40), env=slow, timeout=60,
                 check=ut.estimate_check(trial, "gpt2", trial.outs / "own_pipe.csv", ["transformer.h.1"], 16, 8)),
            Case(fam, "--data /dev/zero (endless NUL bytes)", "cli", "refuse", with_data(gpt, "/dev/zero"), env=slow),
            Case(fam, "--arch --data a pipe", "cli", "refuse",
                 ["estimate", "--arch", "ownmods:patchy", "--model", p("patchy.pt"), "--data",
                  str(fx.pipes / "silent.pt"), "--layer", "blocks.0", "--examples", "8", "--quiet"], timeout=60),
            Case(fam, "--arch --model a pipe", "cli", "refuse",
                 ["estimate", "--arch", "ownmods:patchy", "--model", str(fx.pipes / "silent_model.pt"), "--data",
                  p("patches8.pt"), "--layer", "blocks.0", "--examples", "8", "--quiet"], timeout=60),
            Case(fam, "a pipe as the model folder's tokenizer.json", "cli", "refuse",
                 [a if a != p("gpt2") else p("gpt2_fifo_tokenizer") for a in gpt], timeout=60),
            Case(fam, "a pipe as the model folder's config.json", "cli", "refuse",
                 [a if a != p("gpt2") else p("gpt2_fifo_config") for a in gpt], timeout=60),
            Case(fam, "--tokenizer a folder holding a pipe", "cli", "refuse",
                 [*gpt, "--tokenizer", p("gpt2_fifo_tokenizer")], timeout=60),
            Case(fam, "an image folder holding a pipe", "cli", "refuse",
                 ["estimate", "--arch", "torchvision.models:resnet18", "--arch-kwargs", '{"num_classes": 4}',
                  "--model", p("resnet18.pt"), "--data", p("images_fifo"), "--image-size", "32", "--examples", "12",
                  "--layer", "layer1.0", "--redundancy-examples", "0", "--quiet"], timeout=60),
        ]
    cases.append(Case(fam, "--data /dev/null (a device with nothing in it)", "cli", "refuse",
                      with_data(gpt, "/dev/null"), env=slow))
    fam = "own-cli-revision"
    base = [a if a != p("gpt2") else p("revisions") for a in gpt]
    for revision in ("..", "../gpt2", "../../", "/tmp", ".", "step1/..", "step1/../../gpt2"):
        cases.append(Case(fam, f"--revision {revision!r}", "cli", "refuse", [*base, "--revision", revision]))
    out = new_out()
    cases.append(Case(fam, "--revision step1 vs the loop", "cli", "ok", [*base, "--revision", "step1", "--out", str(out)],
                      check=ut.estimate_check(trial, "gpt2", out, ["transformer.h.1"], 16, 8)))
    fam = "own-cli-arch-errors"
    arch = ["estimate", "--arch", "ownmods:patchy", "--model", p("patchy.pt"), "--data", p("patches8.pt"),
            "--examples", "12", "--batch-size", "5", "--redundancy-examples", "0", "--quiet", "--layer", "blocks.1"]
    rank_arch = ["rank", "--arch", "ownmods:patchy", "--model", p("patchy.pt"), "--data", p("patches8.pt"),
                 "--examples", "12", "--redundancy-examples", "0", "--layer", "blocks.0,blocks.1"]
    cases.append(Case(fam, "estimate images of another size (AssertionError)", "cli", "refuse",
                      [a if a != p("patches8.pt") else p("patches6.pt") for a in arch]))
    cases.append(Case(fam, "rank images of another size (AssertionError)", "cli", "refuse",
                      [a if a != p("patches8.pt") else p("patches6.pt") for a in rank_arch]))
    cases.append(Case(fam, "layers --data images of another size", "cli", "refuse",
                      ["layers", "--arch", "ownmods:patchy", "--model", p("patchy.pt"), "--data", p("patches6.pt")]))
    for fail in ("key", "index", "type", "zero", "value", "not_implemented"):
        for command, argv in (("estimate", arch), ("rank", rank_arch)):
            cases.append(Case(fam, f"{command}: the model raises ({fail})", "cli", "refuse",
                              [*argv, "--arch-kwargs", f'{{"fail": "{fail}"}}']))
    cases.append(Case(fam, "ViT (torchvision) given --image-size 64 for a 32-pixel model", "cli", "refuse",
                      ["estimate", "--arch", "torchvision.models:VisionTransformer", "--arch-kwargs",
                       '{"image_size": 32, "patch_size": 16, "num_layers": 1, "num_heads": 2, "hidden_dim": 16, '
                       '"mlp_dim": 32, "num_classes": 2}', "--model", p("vit.pt"), "--data", p("images"),
                       "--image-size", "64", "--examples", "8", "--layer", "all", "--redundancy-examples", "0",
                       "--quiet"]))
    fam = "own-cli-arch"
    for layer in ("blocks.0", "blocks.1"):
        out = new_out()
        cases.append(Case(fam, f"estimate {layer} vs the loop and the brute-force U-statistic", "cli", "ok",
                          [*[a if a != "blocks.1" else layer for a in arch], "--out", str(out)],
                          check=lambda o, out=out, layer=layer: _patchy_check(ut, fx, out, layer)))
    out = new_out()
    cases.append(Case(fam, "an all-zero q is said in words", "cli", "ok",
                      [*[{p("patchy.pt"): p("deaf.pt"), "ownmods:patchy": "ownmods:deaf"}.get(a, a) for a in arch],
                       "--out", str(out)],
                      check=lambda o, out=out: _zero_check(ut, o, out)))
    cases.append(Case(fam, "a sketch of d dimensions is said in words", "cli", "ok", [*arch, "--sketch-dim", "16"],
                      check=lambda o: None if "is not smaller than q's dimension d=16" in o.stdout else
                      "no note on a sketch of d dimensions"))
    cases.append(Case(fam, "rank --quiet", "cli", "ok", [*rank_arch, "--quiet", "--redundancy-examples", "8"],
                      check=lambda o: None if "recommended by d_align" in o.stdout else "no recommendation"))
    cases.append(Case(fam, "layers --quiet with data", "cli", "ok",
                      ["layers", "--arch", "ownmods:patchy", "--model", p("patchy.pt"), "--data", p("patches8.pt"),
                       "--quiet"]))
    cases.append(Case(fam, "rank --quiet on a causal LM", "cli", "ok",
                      ["rank", "--model", p("gpt2"), "--data", p("data.txt"), "--seq-len", "16", "--examples", "8",
                       "--redundancy-examples", "4", "--quiet"]))
    return cases


def _patchy_check(ut, fx: Fixtures, out: Path, layer: str) -> str | None:
    import torch
    import torch.nn.functional as F

    model = fx.mods.patchy()
    model.load_state_dict(torch.load(fx.trial.inputs / "patchy.pt"))
    model.eval()
    Q = ut.reference_q(model, layer, [fx.images[i:i + 1] for i in range(12)],
                       lambda o, i: F.cross_entropy(o, fx.labels[i:i + 1]), indexed=True)
    want = brute_force_geometry(Q.double().numpy())["d_align"]
    got = _csv_d_align(ut, out, layer)
    return None if abs(got - want) <= D_ALIGN_RTOL * max(abs(want), 1e-12) else \
        f"d_align {got:.6g}, the brute-force U-statistic of the loop's q {want:.6g}"


def _zero_check(ut, outcome, out: Path) -> str | None:
    if "q is exactly 0 for every example at blocks.1" not in outcome.stdout:
        return "the all-zero q is not said in words"
    rows = ut._csv_rows(out)
    return None if rows[0]["q_all_zero"] == "True" and float(rows[0]["d_align"]) == 0 else \
        f"q_all_zero {rows[0].get('q_all_zero')!r}, d_align {rows[0]['d_align']}"


# -- API cases ------------------------------------------------------------------------------------------------


def api_cases(ut, trial, fx: Fixtures, add: Callable[..., None]) -> None:
    """Cases of the API, added with ``add(group, name, expect, fn)`` (groups of the ``own-`` families)."""
    import torch
    import torch.nn.functional as F

    from dalign_core import accumulate_geometry, activation_gradients

    x, y = fx.x, fx.y
    ids = torch.randint(2, trial.vocab, (4, 12), generator=torch.Generator().manual_seed(12))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 9:] = 0

    def causal_masked(kind, layer, key="attention_mask"):
        model = trial.hf_model(kind)
        Q = activation_gradients(model, layer, {"input_ids": ids, key: mask})
        lengths = mask.sum(1).tolist()
        want = ut.reference_q(model, layer, [{"input_ids": ids[i:i + 1, :n]} for i, n in enumerate(lengths)],
                              ut.causal_loss)
        return ut._q_check(Q, want)

    # batch keys
    g = "own-keys"
    for kind in ("gpt2", "llama"):
        layer = trial.layers[kind][1]
        for typo in ("atention_mask", "attn_mask", "attention_masks", "input_id", "positon_ids"):
            batch = {"input_ids": ids, typo: mask if "pos" not in typo else torch.arange(12)[None].repeat(4, 1)}
            add(g, f"{kind}: the key {typo!r}", "refuse",
                lambda kind=kind, layer=layer, batch=batch: activation_gradients(trial.hf_model(kind), layer, batch))
        add(g, f"{kind}: attention_mask spelt right vs the loop", "ok",
            lambda kind=kind, layer=layer: causal_masked(kind, layer))
    keyed = fx.mods.Keyed

    def keyed_ok():
        torch.manual_seed(0)
        model = keyed().eval()
        Q = activation_gradients(model, "block", {"features": x}, y)
        want = ut.reference_q(model, "block", [x[i:i + 1] for i in range(12)],
                              lambda o, i: F.cross_entropy(o, y[i:i + 1]), indexed=True)
        return ut._q_check(Q, want) or geometry_check(Q, want)
    add(g, "keyword model: features vs the loop", "ok", keyed_ok)
    add(g, "keyword model: 'weight' for 'weights'", "refuse",
        lambda: activation_gradients(keyed().eval(), "block", {"features": x, "weight": torch.ones_like(x)}, y))
    add(g, "keyword model: 'feature' for 'features'", "refuse",
        lambda: activation_gradients(keyed().eval(), "block", {"feature": x}, y))
    add(g, "keyword model: a key that is not a string", "refuse",
        lambda: activation_gradients(keyed().eval(), "block", {"features": x, 0: x}, y))

    def parallel(batch_key="features"):
        torch.manual_seed(0)
        inner = keyed().eval()
        model = torch.nn.DataParallel(inner.to("cuda" if torch.cuda.is_available() else "cpu"))
        Q = activation_gradients(model, "module.block", {batch_key: x}, y)
        inner.cpu()
        want = ut.reference_q(inner, "block", [x[i:i + 1] for i in range(12)],
                              lambda o, i: F.cross_entropy(o, y[i:i + 1]), indexed=True)
        return ut._q_check(Q.cpu(), want)
    add(g, "DataParallel vs the loop", "ok", parallel)
    add(g, "DataParallel with a misspelt key", "refuse", lambda: parallel("featurs"))

    # losses that couple the examples
    g = "own-losses"
    mlp = trial.mods.mlp
    xs, ys = trial.mlp_data

    def plain_mlp():
        model = mlp()
        model.load_state_dict(torch.load(trial.inputs / "mlp.pt"))
        return model.eval()

    coupled = {
        "l - l.mean()": lambda o, t: (l := F.cross_entropy(o, t, reduction="none")) - l.mean(),
        "l / l.sum()": lambda o, t: (l := F.cross_entropy(o, t, reduction="none")) / l.sum(),
        "l / l.max()": lambda o, t: (l := F.cross_entropy(o, t, reduction="none")) / l.max(),
        "logits centred over the batch": lambda o, t: F.cross_entropy(o - o.mean(0), t, reduction="none"),
        "softmax over the batch axis": lambda o, t: -torch.log_softmax(o, dim=0).gather(1, t[:, None])[:, 0],
        "batch-normalised logits": lambda o, t: F.cross_entropy((o - o.mean(0)) / (o.std(0) + 1e-5), t,
                                                                 reduction="none"),
        "a rolled row": lambda o, t: F.cross_entropy(o.roll(1, 0), t, reduction="none"),
        "l + l.mean()": lambda o, t: (l := F.cross_entropy(o, t, reduction="none")) + l.mean(),
    }
    for name, loss_fn in coupled.items():
        add(g, f"coupled loss: {name}", "refuse",
            lambda loss_fn=loss_fn: activation_gradients(plain_mlp(), "block", xs[:10], ys[:10], loss_fn=loss_fn))

    def separable(loss_fn, per_example):
        model = plain_mlp()
        Q = activation_gradients(model, "block", xs[:12], ys[:12], loss_fn=loss_fn)
        want = ut.reference_q(model, "block", [xs[i:i + 1] for i in range(12)],
                              lambda o, i: per_example(o, ys[i:i + 1])[0], indexed=True)
        return ut._q_check(Q, want) or geometry_check(Q, want)

    smooth = lambda o, t: F.cross_entropy(o, t, reduction="none", label_smoothing=0.1)  # noqa: E731

    def focal(o, t):
        logp = torch.log_softmax(o, 1).gather(1, t[:, None])[:, 0]
        return -((1 - logp.exp()) ** 2) * logp

    def squared(o, t):
        return ((torch.softmax(o, 1) - F.one_hot(t, o.shape[1]).to(o.dtype)) ** 2).sum(1)
    for name, loss_fn in (("label smoothing", smooth), ("focal loss", focal), ("squared error on softmax", squared),
                          ("cross-entropy, reduction none", lambda o, t: F.cross_entropy(o, t, reduction="none"))):
        add(g, f"separable loss: {name} vs the loop", "ok", lambda loss_fn=loss_fn: separable(loss_fn, loss_fn))
    for name, loss_fn in (("a Python float", lambda o, t: 1.0), ("the mean (a scalar)", lambda o, t: F.cross_entropy(o, t)),
                          ("(batch, 1)", lambda o, t: F.cross_entropy(o, t, reduction="none")[:, None]),
                          ("integer losses", lambda o, t: t), ("a list", lambda o, t: [1.0] * len(t)),
                          ("it raises", lambda o, t: o.no_such_attribute)):
        add(g, f"loss_fn returns {name}" if name != "it raises" else "loss_fn raises", "refuse",
            lambda loss_fn=loss_fn: activation_gradients(plain_mlp(), "block", xs[:10], ys[:10], loss_fn=loss_fn))

    # inputs, targets and grad mode, before the forward pass
    g = "own-inputs"

    def mlp_ref(Q, inputs=None):
        model = plain_mlp()
        inputs = xs[:10] if inputs is None else inputs
        want = ut.reference_q(model, "block", [inputs[i:i + 1] for i in range(10)],
                              lambda o, i: F.cross_entropy(o, ys[i:i + 1]), indexed=True)
        return ut._q_check(Q, want)

    def in_mode(context):
        with context():
            Q = activation_gradients(plain_mlp(), "block", xs[:10], ys[:10])
        return mlp_ref(Q)  # the loop outside the context, with gradients

    add(g, "called under torch.no_grad() vs the loop", "ok", lambda: in_mode(torch.no_grad))
    add(g, "called with grad disabled vs the loop", "ok", lambda: in_mode(lambda: torch.set_grad_enabled(False)))
    add(g, "called inside torch.inference_mode()", "refuse", lambda: in_mode(torch.inference_mode))

    def inference_inputs():
        with torch.inference_mode():
            made = xs[:10].clone()
        return mlp_ref(activation_gradients(plain_mlp(), "block", made, ys[:10]))
    add(g, "inputs made in inference mode vs the loop", "ok", inference_inputs)

    def meta_model():
        with torch.device("meta"):
            model = mlp()
        return activation_gradients(model, "block", xs[:10], ys[:10])
    add(g, "a model on the meta device", "refuse", meta_model)

    def inference_model():
        with torch.inference_mode():
            model = mlp()
        return activation_gradients(model, "block", xs[:10], ys[:10])
    add(g, "a model built in inference mode", "refuse", inference_model)

    def soft_labels():
        model = plain_mlp()
        soft = torch.softmax(torch.randn(10, 3, generator=torch.Generator().manual_seed(13)), 1)
        Q = activation_gradients(model, "block", xs[:10], soft)
        want = ut.reference_q(model, "block", [xs[i:i + 1] for i in range(10)],
                              lambda o, i: F.cross_entropy(o, soft[i:i + 1]), indexed=True)
        return ut._q_check(Q, want)
    add(g, "class probabilities vs the loop", "ok", soft_labels)
    add(g, "int32 class labels vs the loop", "ok",
        lambda: mlp_ref(activation_gradients(plain_mlp(), "block", xs[:10], ys[:10].int())))
    add(g, "float16 inputs to a float32 model vs the loop", "ok",
        lambda: mlp_ref(activation_gradients(plain_mlp(), "block", xs[:10].half(), ys[:10]), xs[:10].half().float()))
    add(g, "inputs that require grad vs the loop", "ok",
        lambda: mlp_ref(activation_gradients(plain_mlp(), "block", xs[:10].clone().requires_grad_(), ys[:10])))
    for name, targets in (("targets (batch, 1)", ys[:10, None]), ("float labels (batch,)", ys[:10].float()),
                          ("bool targets", ys[:10] > 0), ("targets (batch, 3) integers", ys[:10, None].repeat(1, 3)),
                          ("probabilities of 4 classes for 3", torch.full((10, 4), 0.25)),
                          ("a list of labels", ys[:10].tolist()), ("complex targets", ys[:10].to(torch.complex64))):
        add(g, f"classifier given {name}", "refuse",
            lambda targets=targets: activation_gradients(plain_mlp(), "block", xs[:10], targets))
    for name, inputs in (("integer features", xs[:10].long()), ("features of width 5", xs[:10, :5]),
                         ("images (batch, 1, 8, 8)", torch.randn(10, 1, 8, 8)), ("complex features", xs[:10].to(torch.complex64)),
                         ("an empty mapping", {})):
        add(g, f"MLP given {name}", "refuse",
            lambda inputs=inputs: activation_gradients(plain_mlp(), "block", inputs, ys[:10]))
    add(g, "task classification on per-token logits", "refuse",
        lambda: activation_gradients(trial.hf_model("gpt2"), trial.layers["gpt2"][1], {"input_ids": ids}, ids[:, 0],
                                     task="classification"))
    for kind in ("gpt2", "llama"):
        layer = trial.layers[kind][1]
        add(g, f"{kind}: 1-D input_ids (no batch axis)", "refuse",
            lambda kind=kind, layer=layer: activation_gradients(trial.hf_model(kind), layer, {"input_ids": ids[0]}))
        add(g, f"{kind}: 3-D input_ids", "refuse",
            lambda kind=kind, layer=layer: activation_gradients(trial.hf_model(kind), layer, {"input_ids": ids[None]}))
        add(g, f"{kind}: position_ids beyond the positions", "refuse",
            lambda kind=kind, layer=layer: activation_gradients(
                trial.hf_model(kind), layer, {"input_ids": ids, "position_ids": torch.arange(60, 72)[None].repeat(4, 1)}))
        add(g, f"{kind}: float position_ids", "refuse",
            lambda kind=kind, layer=layer: activation_gradients(
                trial.hf_model(kind), layer, {"input_ids": ids, "position_ids": torch.zeros(4, 12)}))

        def positions(kind=kind, layer=layer):
            model = trial.hf_model(kind)
            Q = activation_gradients(model, layer, {"input_ids": ids, "position_ids": torch.arange(12)[None].repeat(4, 1)})
            return ut._q_check(Q, ut.reference_q(model, layer, [{"input_ids": r[None]} for r in ids], ut.causal_loss))
        add(g, f"{kind}: position_ids 0..T-1 vs the loop", "ok", positions)
    add(g, "bert: token_type_ids of another shape", "refuse",
        lambda: activation_gradients(trial.hf_model("bert"), "bert.encoder.layer.1",
                                     {"input_ids": ids, "labels": ids, "token_type_ids": torch.zeros(4, 5).long()}))

    # the engineer's own model kinds, against the loop and the brute-force U-statistic
    g = "own-models"

    def check_kind(model, layer, inputs, loss_of, batch_targets=None, task="auto", examples=None):
        Q = activation_gradients(model, layer, inputs, batch_targets, task=task)
        want = ut.reference_q(model, layer, examples, loss_of, indexed=True)
        return ut._q_check(Q, want) or geometry_check(Q, want)

    import torchvision

    def vit(layer):
        torch.manual_seed(0)
        model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2,
                                                     hidden_dim=16, mlp_dim=32, num_classes=3).eval()
        images = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(14))
        return check_kind(model, layer, images, lambda o, i: F.cross_entropy(o, ys[i:i + 1]), ys[:10],
                          examples=[images[i:i + 1] for i in range(10)])
    for layer in ("encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1", "encoder.ln"):
        add(g, f"ViT {layer} vs the loop and the U-statistic", "ok", lambda layer=layer: vit(layer))

    def vit_blocks():
        from dalign_core.capture.layers import insertion_points

        torch.manual_seed(0)
        model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2,
                                                     hidden_dim=16, mlp_dim=32, num_classes=3)
        points = insertion_points(model)
        want = ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]
        return None if points == want else f"insertion points {points}, the encoder blocks are {want}"
    add(g, "ViT: the insertion points are its encoder blocks", "ok", vit_blocks)
    add(g, "ViT given images of another size", "refuse",
        lambda: activation_gradients(torchvision.models.VisionTransformer(
            image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3).eval(),
            "encoder.layers.encoder_layer_0", torch.randn(4, 3, 32, 32), ys[:4]))
    tokens = torch.randint(0, 40, (8, 10), generator=torch.Generator().manual_seed(15))

    def gru(layer):
        torch.manual_seed(0)
        model = fx.mods.GRULM().eval()
        return check_kind(model, layer, tokens, lambda o, i: F.cross_entropy(o[0, :-1], tokens[i, 1:]), task="causal_lm",
                          examples=[tokens[i:i + 1] for i in range(8)])
    add(g, "GRU LM: the embedding vs the loop and the U-statistic", "ok", lambda: gru("embed"))
    add(g, "GRU LM: task auto on per-token logits", "refuse",
        lambda: activation_gradients(fx.mods.GRULM().eval(), "embed", tokens))
    add(g, "GRU LM built sequence-first", "refuse",
        lambda: activation_gradients(fx.mods.GRULM(batch_first=False).eval(), "rnn", tokens, task="causal_lm"))

    def nested(layer):
        torch.manual_seed(0)
        model = fx.mods.Nested().eval()
        return check_kind(model, layer, x, lambda o, i: F.cross_entropy(o, y[i:i + 1]), y,
                          examples=[x[i:i + 1] for i in range(12)])
    for layer in ("stages.low.0", "stages.high.0", "stages.high.1"):
        add(g, f"nested containers {layer} vs the loop and the U-statistic", "ok", lambda layer=layer: nested(layer))

    def nested_all():
        torch.manual_seed(0)
        model = fx.mods.Nested().eval()
        rows = activation_gradients(model, "all", x, y)
        for layer, Q in rows.items():
            want = ut.reference_q(model, layer, [x[i:i + 1] for i in range(12)],
                                  lambda o, i: F.cross_entropy(o, y[i:i + 1]), indexed=True)
            wrong = ut._q_check(Q, want, layer)
            if wrong:
                return wrong
        return None if len(rows) == 3 else f"'all' found {sorted(rows)}"
    add(g, "nested containers: layer all vs the loop", "ok", nested_all)

    def lora(layer):
        torch.manual_seed(0)
        model = fx.mods.LoRAMLP().eval()
        return check_kind(model, layer, x, lambda o, i: F.cross_entropy(o, y[i:i + 1]), y,
                          examples=[x[i:i + 1] for i in range(12)])
    for layer in ("block", "block.base", "block.lora_b"):
        add(g, f"LoRA-wrapped Linear {layer} vs the loop and the U-statistic", "ok", lambda layer=layer: lora(layer))

    def streamed_vit():
        torch.manual_seed(0)
        model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2,
                                                     hidden_dim=16, mlp_dim=32, num_classes=3).eval()
        images = torch.randn(12, 3, 16, 16, generator=torch.Generator().manual_seed(16))
        layer = "encoder.layers.encoder_layer_0"
        labels = ys[:12]
        got = accumulate_geometry(model, layer, [(images[i:i + 5], labels[i:i + 5]) for i in range(0, 12, 5)]).result()
        Q = ut.reference_q(model, layer, [images[i:i + 1] for i in range(12)],
                           lambda o, i: F.cross_entropy(o, ys[i:i + 1]), indexed=True)
        want = brute_force_geometry(Q.double().numpy())["d_align"]
        return None if abs(got.d_align - want) <= D_ALIGN_RTOL * max(abs(want), 1e-12) else \
            f"d_align {got.d_align:.6g}, the brute-force U-statistic {want:.6g}"
    add(g, "ViT streamed in batches of 5 vs the U-statistic", "ok", streamed_vit)

    # the estimator itself against the brute-force U-statistic, on q of several shapes
    g = "own-geometry"
    generator = torch.Generator().manual_seed(17)
    samples = {
        "Gaussian, mean along one axis": torch.randn(12, 6, generator=generator, dtype=torch.float64) + torch.eye(6)[0],
        "heavy tails (t, 3 dof)": torch.distributions.StudentT(3.0).sample((12, 8)).double() + 0.7,
        "rank one plus noise": torch.randn(14, 1, generator=generator, dtype=torch.float64) @
        torch.ones(1, 5, dtype=torch.float64) + 0.1 * torch.randn(14, 5, generator=generator, dtype=torch.float64) + 1,
        "sparse rows": (torch.rand(12, 10, generator=generator, dtype=torch.float64) > 0.7).double() * 3.0,
        "five rows (the fewest)": torch.randn(5, 4, generator=generator, dtype=torch.float64) + 2.0,
        "scaled by 1e-20": (torch.randn(10, 6, generator=generator, dtype=torch.float64) + 1.0) * 1e-20,
        "float32 rows": torch.randn(12, 6, generator=generator) + 0.5,
        "d = 1": torch.randn(12, 1, generator=generator, dtype=torch.float64) + 0.8,
        "a wide q (d = 300)": torch.randn(10, 300, generator=generator, dtype=torch.float64) * 0.1 + 0.05,
        "zero mean": torch.randn(12, 6, generator=generator, dtype=torch.float64),
    }
    for name, Q in samples.items():
        add(g, f"estimate_geometry vs the brute-force U-statistic: {name}", "ok",
            lambda Q=Q: geometry_check(Q, Q))
