"""The problems a model runs, from its Hugging Face ``config.json`` (``fa-autotune tune
--model``): tune what a workload actually runs rather than a preset's guesses.

Only the config file is read (a path, or a model id already in the local Hugging Face
cache); nothing is downloaded. Heads, KV heads, head dim and dtype come from the config;
sequence lengths and batch sizes from the command line (defaults: a prefill set capped by
the model's context, batch sizes that keep batch * seqlen at a fixed token budget).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FaAutotuneError
from ..spec.problem import MAX_HEAD_DIM, MIN_HEAD_DIM, Problem

DEFAULT_SEQLENS = (1024, 4096, 8192)
TOKEN_BUDGET = 16384  # prefill problems: batch * seqlen, as the llm-prefill presets do
DECODE_BATCHES = (1, 16, 64)  # serving: one token per sequence, these many sequences ...
DECODE_TOKENS = 1 << 20  # ... where their caches hold at most this many tokens in all
_MAX_CONFIG_BYTES = 4 * 1024 * 1024
# Architectures whose attention is not causal (encoders); anything else that names a
# language-model head is a decoder.
_ENCODER_HINTS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                  "ForMultipleChoice")
_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "distilbert", "electra", "albert",
                  "modernbert", "vit", "clip_vision_model", "siglip_vision_model"}


class ModelConfigError(FaAutotuneError):
    """A model config that is missing, unreadable or describes no attention we can tune."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model's config says about its attention."""

    name: str
    path: Path
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str | None  # canonical, None when the config names none
    max_positions: int | None
    causal: bool
    sliding_window: int | None
    softcap: float | None


# ------------------------------------------------------------------ finding the file
def find_config(spec: str) -> Path:
    """``spec`` as a config file: a path to a config.json (or a directory holding one), else
    a model id (``org/name``) in the local Hugging Face cache."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"--model {spec}: the directory has no config.json")
        return path
    if path.is_file():
        return path
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")) or spec.endswith((".json", "/")):
        raise ModelConfigError(f"--model {spec}: no such file, and not a model id like org/name")
    org, name = spec.split("/")
    hub = _hub_dir()
    repo = hub / f"models--{org}--{name}"
    snapshots = repo / "snapshots"
    found = []
    ref = repo / "refs" / "main"
    if ref.is_file():  # the revision the cache calls main, when it knows one
        main = snapshots / ref.read_text().strip() / "config.json"
        if main.is_file():
            return main
    if snapshots.is_dir():
        found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ModelConfigError(f"--model {spec}: not in the local Hugging Face cache ({repo} has no "
                               "snapshots/*/config.json); fa-autotune downloads nothing: download it first "
                               f"(huggingface-cli download {spec} config.json) or pass the path of a config.json")
    return found[-1]  # the newest snapshot


def _hub_dir() -> Path:
    """Where the Hugging Face hub cache is: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub (as huggingface_hub resolves it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


# ------------------------------------------------------------------ reading it
def load_model(spec: str) -> ModelSpec:
    """Read and check the attention shape of the model ``spec`` names."""
    path = find_config(spec)
    try:
        raw = path.read_bytes()[:_MAX_CONFIG_BYTES + 1]
    except OSError as exc:
        raise ModelConfigError(f"--model {path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise ModelConfigError(f"--model {path}: larger than {_MAX_CONFIG_BYTES // 2**20} MiB, not a config.json")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"--model {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"--model {path}: a config.json is a JSON object, got {type(data).__name__}")
    return parse_model(data, path, spec)


def parse_model(data: dict[str, Any], path: Path, name: str | None = None) -> ModelSpec:
    """The attention a config describes (multimodal configs: their ``text_config``)."""
    where = f"--model {path}"
    text = data.get("text_config")
    if "num_attention_heads" not in data and isinstance(text, dict):
        data = {**{k: v for k, v in data.items() if k in ("torch_dtype", "dtype", "architectures")}, **text}
        where += " (text_config)"
    model_type = data.get("model_type")
    heads = data.get("num_attention_heads")
    if heads is None:
        raise ModelConfigError(f"{where}: no num_attention_heads: model_type {model_type!r} "
                               f"({', '.join(data.get('architectures') or []) or 'no architectures'}) describes no "
                               "attention heads fa-autotune can tune (an attention-free or unsupported architecture?)")
    heads = _positive(where, "num_attention_heads", heads)
    if data.get("kv_lora_rank") is not None or data.get("qk_rope_head_dim") is not None:
        raise ModelConfigError(f"{where}: multi-head latent attention (kv_lora_rank / qk_rope_head_dim, as in "
                               "DeepSeek-V2/V3): its Q/K and V head dims differ, which fa_autotune's kernels do not run")
    v_dim = data.get("v_head_dim")
    if v_dim is not None and v_dim != data.get("head_dim", v_dim):
        raise ModelConfigError(f"{where}: v_head_dim {v_dim!r} differs from head_dim {data.get('head_dim')!r}; "
                               "fa_autotune's kernels take one head dim for Q, K and V")
    kv_heads = data.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _positive(where, "num_key_value_heads", kv_heads)
    if heads % kv_heads:
        raise ModelConfigError(f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
                               f"({kv_heads})")
    head_dim = data.get("head_dim")
    if head_dim is None:
        hidden = data.get("hidden_size")
        if hidden is None:
            raise ModelConfigError(f"{where}: neither head_dim nor hidden_size: the head dim is unknown")
        hidden = _positive(where, "hidden_size", hidden)
        if hidden % heads:
            raise ModelConfigError(f"{where}: hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}); "
                                   "give head_dim")
        head_dim = hidden // heads
    head_dim = _positive(where, "head_dim", head_dim)
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ModelConfigError(f"{where}: head_dim {head_dim} is outside what the kernels take "
                               f"({MIN_HEAD_DIM}..{MAX_HEAD_DIM})")
    dtype_name = data.get("torch_dtype", data.get("dtype"))
    dtype = None
    if dtype_name is not None:
        dtype = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}.get(
            str(dtype_name).removeprefix("torch."))
        if dtype is None:
            raise ModelConfigError(f"{where}: torch_dtype {dtype_name!r} is not float16, bfloat16 or float32; "
                                   "pass --dtype")
    max_positions = data.get("max_position_embeddings")
    if max_positions is not None:
        max_positions = _positive(where, "max_position_embeddings", max_positions)
    window = data.get("sliding_window")
    if data.get("use_sliding_window") is False:  # Qwen2 names a window it does not use
        window = None
    if window is not None:
        window = _positive(where, "sliding_window", window)
    softcap = data.get("attn_logit_softcapping")
    if isinstance(softcap, bool) or not (softcap is None or isinstance(softcap, (int, float))):
        raise ModelConfigError(f"{where}: attn_logit_softcapping must be a number or null, got {softcap!r}")
    return ModelSpec(name or str(path), path, heads, kv_heads, head_dim, dtype, max_positions,
                     _is_decoder(data), window, float(softcap) if softcap else None)


def _positive(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def _is_decoder(data: dict[str, Any]) -> bool:
    """Causal self-attention: decoders (any language-model head), not encoders."""
    if data.get("is_encoder_decoder"):
        return False
    archs = [a for a in data.get("architectures") or [] if isinstance(a, str)]
    if any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in archs):
        return True
    if any(a.endswith(_ENCODER_HINTS) for a in archs) or data.get("model_type") in _ENCODER_TYPES:
        return False
    return True


# ------------------------------------------------------------------ the problems
@dataclass(frozen=True)
class Workload:
    """The problems to tune for a model, and what the user should know about them."""

    model: ModelSpec
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]


def model_problems(model: ModelSpec, *, seqlens: list[int] | None = None, batch: int | None = None,
                   dtype: str | None = None, training: bool = False, serving: bool = False, page_size: int = 0,
                   interpreter: bool = False, causal: bool | None = None) -> Workload:
    """Forward (prefill) problems at each sequence length; ``training`` adds their
    backward, ``serving`` KV-cache decode problems (one new token per sequence against each
    length as the cache, ``page_size`` rows per page, 0 contiguous)."""
    notes = []
    if page_size and not serving:
        raise ModelConfigError("--page-size describes the KV cache of --serving problems: add --serving")
    if dtype is None:
        dtype = model.dtype
        if dtype is None:
            dtype = "float16" if interpreter else "bfloat16"
            notes.append(f"the config names no torch_dtype: tuning {dtype} (--dtype sets it)")
        elif dtype == "float32":
            dtype = "float16" if interpreter else "bfloat16"
            notes.append(f"the config's torch_dtype is float32; models run attention in half precision, so "
                         f"{dtype} is tuned{' (bf16 cannot be tuned in the interpreter)' if interpreter else ''} "
                         "(--dtype sets it)")
    causal = model.causal if causal is None else causal
    if not causal:
        notes.append("not a decoder model (encoder attention): tuned without the causal mask")
    if model.sliding_window is not None and causal:
        notes.append(f"the model uses a sliding window of {model.sliding_window} tokens, which fa_autotune's kernels "
                     "do not implement: tuned as full causal attention (what attention() runs for it)")
    if model.softcap is not None:
        notes.append(f"the model caps attention logits (attn_logit_softcapping {model.softcap}), which fa_autotune's "
                     "kernels do not implement: tuned without it")
    if seqlens is None:
        cap = model.max_positions
        seqlens = [n for n in DEFAULT_SEQLENS if cap is None or n <= cap] or [cap]
        if cap is not None and len(seqlens) < len(DEFAULT_SEQLENS):
            notes.append(f"sequence lengths capped by max_position_embeddings ({cap})")
    else:
        too_long = [n for n in seqlens if model.max_positions is not None and n > model.max_positions]
        if too_long:
            notes.append(f"--seqlens {', '.join(map(str, too_long))} exceed the model's max_position_embeddings "
                         f"({model.max_positions}); tuned as asked")
    problems: list[Problem] = []
    for n in seqlens:
        b = batch if batch is not None else max(1, TOKEN_BUDGET // n)
        forward = Problem(b, model.heads, model.kv_heads, n, n, model.head_dim, dtype, causal)
        problems.append(forward)
        if training:
            problems.append(forward.with_kind("bwd"))
    if serving:
        for n in seqlens:
            for b in ([batch] if batch is not None else [b for b in DECODE_BATCHES if b == 1 or b * n <= DECODE_TOKENS]):
                # causal with one new token is full attention; engines pass causal=True (bottom-right)
                problems.append(Problem(b, model.heads, model.kv_heads, 1, n, model.head_dim, dtype, causal,
                                        "bottom_right" if causal else "top_left", kind="decode", page_size=page_size))
    return Workload(model, tuple(dict.fromkeys(problems)), tuple(notes))


def parse_seqlens(text: str) -> list[int]:
    """``--seqlens 1024,4096``: positive integers, each once."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise FaAutotuneError(f"--seqlens takes comma-separated positive integers like 1024,4096, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise FaAutotuneError(f"--seqlens takes comma-separated positive integers like 1024,4096, got {text!r}")
    return list(dict.fromkeys(values))
