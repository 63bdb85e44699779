"""What a model directory says about its shape, without loading it.

Preflight needs a handful of numbers: layers, attention and KV heads, head
size, the longest context the config allows, the serving dtype, and how many
bytes the weights take. All of them come from `config.json` (plus
`tokenizer_config.json`, which vLLM also consults for the length limit) and
from the *headers* of the `*.safetensors` files: each file starts with an
8-byte little-endian header length and a JSON header listing every tensor's
dtype and shape. We read those bytes and nothing else, so this works in
milliseconds on a 100 GB checkpoint and on a header-only stand-in.

The rules mirror vLLM's own (vllm/transformers_utils/model_arch_config_convertor.py
and vllm/config/model.py) so preflight disagrees with vLLM as rarely as possible.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ModelInfoError(ValueError):
    """The model directory cannot be read; the message says what is missing."""


# Bytes per element for the dtypes that appear in safetensors headers and configs.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}

DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float64": 8, "double": 8,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1,
    "int8": 1, "uint8": 1,
}

# vLLM takes the smallest of these config keys as the derived max length
# (ModelArchConfigConvertorBase.derive_max_model_len_and_key).
_MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
    "model_max_length", "max_target_positions", "max_sequence_length",
    "max_seq_length", "seq_len",
)
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                 "num_attention_groups")
# RoPE types whose max_position_embeddings is already the scaled length.
_ROPE_NO_SCALE = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
_DEFAULT_MAX_LEN = 2048  # what vLLM assumes when the config names no length at all


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architectures: tuple[str, ...]
    model_type: str | None
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None
    vocab_size: int | None
    max_position_embeddings: int | None  # the raw config value, if any
    derived_max_model_len: int  # the limit vLLM enforces on --max-model-len
    derived_max_len_key: str  # which key set that limit (for messages)
    config_dtype: str  # "bfloat16", "float16", "float32"...
    tie_word_embeddings: bool
    parameter_count: int  # from safetensors headers; 0 when there are none
    checkpoint_bytes: int  # tensor bytes as stored on disk
    checkpoint_dtypes: dict[str, int] = field(default_factory=dict)  # "BF16" -> parameters
    safetensors_files: tuple[str, ...] = ()
    num_experts: int | None = None
    rope_scaling_factor: float = 1.0

    @property
    def serving_dtype(self) -> str:
        """The dtype vLLM runs with under `--dtype auto`: the config's, except
        that float32 checkpoints are downcast to bfloat16 (vLLM logs
        'Downcasting torch.float32 to torch.bfloat16')."""
        return "bfloat16" if self.config_dtype in ("float32", "float") else self.config_dtype

    def weight_bytes(self, dtype: str | None = None) -> int:
        """Weight bytes once loaded in `dtype` (default: the serving dtype).
        Quantized or mixed checkpoints keep their stored size."""
        dtype = dtype or self.serving_dtype
        if not self.parameter_count:
            return self.checkpoint_bytes
        float_params = sum(n for d, n in self.checkpoint_dtypes.items() if d in ("F32", "F16", "BF16", "F64"))
        other_bytes = self.checkpoint_bytes - sum(
            n * SAFETENSORS_DTYPE_BYTES[d] for d, n in self.checkpoint_dtypes.items()
            if d in ("F32", "F16", "BF16", "F64"))
        return int(float_params * dtype_bytes(dtype) + other_bytes)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["architectures"] = list(self.architectures)
        d["safetensors_files"] = list(self.safetensors_files)
        return d


def dtype_bytes(dtype: str) -> float:
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ModelInfoError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[key]


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte length + JSON), never the data."""
    path = Path(path)
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise ModelInfoError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw_len)
        # Real headers are kilobytes to a few MB; a huge value means garbage.
        if n > 100 * 1024 * 1024:
            raise ModelInfoError(f"{path}: safetensors header length {n} is implausible")
        raw = f.read(n)
    if len(raw) != n:
        raise ModelInfoError(f"{path}: safetensors header is truncated")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelInfoError(f"{path}: safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ModelInfoError(f"{path}: safetensors header is not a JSON object")
    return header


def _tensor_stats(header: dict[str, Any]) -> tuple[int, int, dict[str, int]]:
    params = nbytes = 0
    by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        n = math.prod(int(x) for x in info.get("shape", []))
        dtype = str(info.get("dtype", "")).upper()
        offsets = info.get("data_offsets")
        if offsets and len(offsets) == 2:
            size = int(offsets[1]) - int(offsets[0])
        else:
            size = int(n * SAFETENSORS_DTYPE_BYTES.get(dtype, 2))
        params += n
        nbytes += size
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
    return params, nbytes, by_dtype


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs nest the language model; vLLM reads hf_text_config.
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and "num_hidden_layers" in sub:
            merged = dict(cfg)
            merged.update(sub)
            return merged
    return cfg


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _rope_factor(cfg: dict[str, Any]) -> float:
    factor = 1.0
    for key in ("rope_scaling", "rope_parameters"):
        rp = cfg.get(key)
        if not isinstance(rp, dict):
            continue
        rope_type = rp.get("rope_type") or rp.get("type") or "default"
        if rope_type not in _ROPE_NO_SCALE and rp.get("factor") is not None:
            factor = float(rp["factor"])
    return factor


def read_model_info(model_dir: str | Path) -> ModelInfo:
    """Read config.json (+ tokenizer_config.json) and safetensors headers."""
    d = Path(model_dir).expanduser()
    if not d.is_dir():
        raise ModelInfoError(f"{d}: no such model directory (preflight reads config.json there; "
                             "a hub id cannot be checked offline)")
    raw_cfg = _read_config(d)
    cfg = _text_config(raw_cfg)
    heads, layers, hidden = _shape(cfg, d / "config.json")
    kv_heads = int(_first(cfg, _KV_HEAD_KEYS) or heads)
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size_per_head") or hidden // heads
    head_dim = int(head_dim)
    derived, key_used = _derived_max_len(cfg, d)
    factor = _rope_factor(cfg)
    derived_len = int(derived * factor)

    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").lower().removeprefix("torch.")

    files = sorted(d.glob("*.safetensors"))
    params, nbytes, by_dtype = _checkpoint_stats(files)

    experts = _first(cfg, ("num_experts", "moe_num_experts", "num_local_experts", "n_routed_experts"))
    if isinstance(experts, list):  # ERNIE-4.5 MoE writes [text, vision]
        experts = experts[0] if experts else None

    return ModelInfo(
        path=str(d),
        architectures=tuple(raw_cfg.get("architectures") or ()),
        model_type=raw_cfg.get("model_type"),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size"),
        vocab_size=cfg.get("vocab_size"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        derived_max_model_len=derived_len,
        derived_max_len_key=key_used,
        config_dtype=dtype,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        parameter_count=params,
        checkpoint_bytes=nbytes,
        checkpoint_dtypes=by_dtype,
        safetensors_files=tuple(f.name for f in files),
        num_experts=int(experts) if isinstance(experts, (int, float)) and experts else None,
        rope_scaling_factor=factor,
    )


def _read_config(d: Path) -> dict[str, Any]:
    """config.json, a JSON object; ModelInfoError in plain words otherwise."""
    cfg_path = d / "config.json"
    try:
        raw_cfg = json.loads(cfg_path.read_text("utf-8"))
    except FileNotFoundError:
        raise ModelInfoError(f"{d}: no config.json") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelInfoError(f"{cfg_path}: cannot read: {exc}") from None
    if not isinstance(raw_cfg, dict):
        raise ModelInfoError(f"{cfg_path}: not a JSON object")
    return raw_cfg


def _shape(cfg: dict[str, Any], cfg_path: Path) -> tuple[int, int, int]:
    """(attention heads, layers, hidden size), each required."""
    try:
        heads = int(_first(cfg, ("num_attention_heads", "n_head", "num_heads")) or 0)
        layers = int(_first(cfg, ("num_hidden_layers", "n_layer", "num_layers")) or 0)
        hidden = int(_first(cfg, ("hidden_size", "n_embd", "d_model")) or 0)
    except (TypeError, ValueError):
        raise ModelInfoError(f"{cfg_path}: layer/head/hidden sizes are not integers") from None
    if not (heads and layers and hidden):
        raise ModelInfoError(f"{cfg_path}: missing num_attention_heads, num_hidden_layers or hidden_size")
    return heads, layers, hidden


def _derived_max_len(cfg: dict[str, Any], d: Path) -> tuple[float, str]:
    """Derived max length before RoPE scaling, as vLLM computes it: the
    smallest length key, the tokenizer's model_max_length if smaller; and
    which key it came from."""
    derived: float = math.inf
    key_used = "none"
    for key in _MAX_LEN_KEYS:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < derived:
            derived, key_used = value, key
    tok_cfg_path = d / "tokenizer_config.json"
    if tok_cfg_path.is_file():
        try:
            tok_max = json.loads(tok_cfg_path.read_text("utf-8")).get("model_max_length")
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            tok_max = None
        if isinstance(tok_max, (int, float)) and not isinstance(tok_max, bool) and tok_max < derived:
            derived, key_used = tok_max, "tokenizer model_max_length"
    if derived == math.inf:
        derived, key_used = _DEFAULT_MAX_LEN, "vLLM's default (no length key in config.json)"
    return derived, key_used


def _checkpoint_stats(files: list[Path]) -> tuple[int, int, dict[str, int]]:
    """(parameters, bytes, bytes by dtype) over the safetensors files' headers."""
    params = nbytes = 0
    by_dtype: dict[str, int] = {}
    for f in files:
        p, b, bd = _tensor_stats(read_safetensors_header(f))
        params += p
        nbytes += b
        for k, v in bd.items():
            by_dtype[k] = by_dtype.get(k, 0) + v
    return params, nbytes, by_dtype
