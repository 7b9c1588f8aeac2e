"""A LLaMA decoder that reads a transformers checkpoint folder without importing transformers.

``dalign estimate`` on a small model spends most of its time importing: transformers' model classes pull in
``torch._dynamo`` and ``torch.distributed.tensor`` (about 2.7 s beyond ``import torch`` on the project's machine)
for a forward pass of a few hundred milliseconds. For the most common architecture, a folder whose
``config.json`` names ``LlamaForCausalLM`` with the default rotary embedding, the command builds the model here
instead: the same modules under the same names (``model.layers.3`` is the same insertion point), the weights read
from its safetensors files with ``safetensors`` alone, and the same numbers as transformers' class to float
precision (``tests/test_native_llama.py`` compares logits and captured q on every option read below).

Everything else goes to transformers, unchanged: another architecture, a rotary scaling or partial rotation, an
activation other than SiLU or a tensor-parallel ``pretraining_tp``, weights in another format, or a checkpoint whose
tensors do not fit the config exactly (transformers then reports what is wrong). :func:`native_llama` says which,
in one line. (The fields it does not read, token ids, dropout, initializer range, cache, change nothing in an
eval-mode forward.)
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["unsupported", "native_llama", "LlamaForCausalLM"]

# Fields read here, and the value each unread option must keep for this module to compute what transformers does.
_READ = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
         "attention_bias", "mlp_bias", "rope_theta", "rope_parameters", "rope_scaling")
_DEFAULTS = {"hidden_act": "silu", "pretraining_tp": 1}


def _rope_theta(config: dict) -> float | None:
    """The rotary base of a default rotary embedding (the v5 ``rope_parameters`` or the older top-level
    ``rope_theta``), None for any other rotary type or scaling."""
    params = config.get("rope_parameters")
    if params is None:
        scaling = config.get("rope_scaling") or {}
        params = dict(scaling, rope_theta=config.get("rope_theta", 10000.0)) if isinstance(scaling, dict) else None
    if not isinstance(params, dict):
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta")
    if kind != "default" or set(params) - {"rope_theta", "rope_type", "type"} or \
            not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        return None
    return float(theta)


def unsupported(config: dict) -> str:
    """Why this module would not compute what transformers' ``LlamaForCausalLM`` computes for ``config`` (the
    parsed ``config.json``), or "" when it would."""
    if config.get("architectures") != ["LlamaForCausalLM"] or config.get("model_type") != "llama":
        return f"architecture {config.get('architectures')} (model_type {config.get('model_type')!r})"
    for name, default in _DEFAULTS.items():
        if config.get(name, default) != default:
            return f"{name} = {config[name]!r}"
    if _rope_theta(config) is None:
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        return f"a rotary embedding other than the default: {rope}"
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    if not all(isinstance(config.get(k), int) and config[k] > 0 for k in sizes):
        return "sizes that are not positive integers"
    if config["num_attention_heads"] % (config.get("num_key_value_heads") or config["num_attention_heads"]):
        return "query heads not a multiple of key/value heads"
    return ""


class _Unfilled:
    """Parameters left as allocated: the checkpoint's tensors replace them (filling them first would cost a random
    draw per weight, and building on the meta device imports ``torch._dynamo``, a second)."""

    def reset_parameters(self) -> None:
        pass


class Linear(_Unfilled, nn.Linear):
    pass


class Embedding(_Unfilled, nn.Embedding):
    pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)  # in float32, cast back before the gain: as transformers does


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal self-attention with rotary positions and grouped key/value heads."""

    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, self.heads * self.head_dim, bias=c.attention_bias)
        self.k_proj = Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=c.attention_bias)
        self.v_proj = Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=c.attention_bias)
        self.o_proj = Linear(self.heads * self.head_dim, c.hidden_size, bias=c.attention_bias)
        self.is_causal = True  # read by the capture's check that a next-token loss sees only earlier tokens

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None):
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """One pre-norm residual block: its output is the residual stream, the insertion point capture reads."""

    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)


class LlamaForCausalLM(nn.Module):
    """``LlamaForCausalLM`` of a checkpoint :func:`unsupported` accepts. ``forward(input_ids (b, T) int64,
    attention_mask (b, T) of 0/1 or None, position_ids (b, T) or None: 0 … T − 1)`` returns an output whose
    ``.logits`` are ``(b, T, vocab)``."""

    dalign_task = "causal_lm"
    """What the capture's ``task="auto"`` reads this model as: position t predicts token t + 1."""

    def __init__(self, config: dict):
        super().__init__()
        heads = config["num_attention_heads"]
        self.config = SimpleNamespace(**{**{k: config[k] for k in _READ if k in config}, **dict(
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(config),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=config.get("attention_bias", False), mlp_bias=config.get("mlp_bias", False),
            use_cache=False)})
        self.model = _Body(self.config)
        self.lm_head = Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, use_cache: bool = False):
        x = self.model.embed_tokens(input_ids)
        t = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(t, device=x.device)[None]
        freqs = position_ids[..., None].float() * self.model.inv_freq  # (1 or b, T, head_dim / 2)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        mask = None  # no padding: sdpa's own causal mask
        if attention_mask is not None and not bool(attention_mask.all()):
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            # Keys at padding are hidden; a padding row (which no loss reads) attends to itself rather than to
            # nothing, which would be NaN and poison the backward pass.
            mask = causal & attention_mask.bool()[:, None, None, :] | torch.eye(t, dtype=torch.bool, device=x.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return SimpleNamespace(logits=self.lm_head(self.model.norm(x)))


def _weight_files(folder: Path) -> list[Path] | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def native_llama(folder: str | Path, dtype: torch.dtype = torch.float32) -> tuple[nn.Module | None, str]:
    """(the model in eval mode, "") for a checkpoint folder this module reads; (None, why not) otherwise, for the
    caller to load it with transformers. The weights must be safetensors and fit the config exactly: every tensor
    present with its shape, none left over (``lm_head.weight`` may be absent when tied, and is then the input
    embedding; saved rotary frequencies are recomputed)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, f"config.json unreadable ({err})"
    why = unsupported(config) if isinstance(config, dict) else "config.json is not an object"
    files = _weight_files(folder) if not why else None
    if why or not files:
        return None, why or "no safetensors weights"
    from safetensors.torch import load_file

    model = LlamaForCausalLM(config)
    state = {}
    for file in files:
        state.update(load_file(file))
    for name in [name for name in state if name.endswith("rotary_emb.inv_freq")]:
        del state[name]  # older transformers saved the rotary frequencies; both recompute them from the config
    expected = {name: p.shape for name, p in model.state_dict().items()}
    tied = model.config.tie_word_embeddings and "lm_head.weight" not in state
    if tied:  # a tied head saved anyway is loaded as it is, untied: what transformers 5.24 does
        expected.pop("lm_head.weight")
    shapes = {name: tensor.shape for name, tensor in state.items()}
    if shapes != expected:
        return None, "the weights do not fit the config"
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval(), ""
