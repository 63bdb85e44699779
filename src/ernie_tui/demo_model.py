"""Write a random-weight stand-in with the ERNIE-4.5 dense architecture.

There is no model hub here, so the project makes its own checkpoint:
`Ernie4_5ForCausalLM` (model_type `ernie4_5`) with random 16-bit weights and a
word-level tokenizer, where N space-separated vocabulary words are exactly N
tokens (no BOS is added). That makes prompt lengths in bursts exact.

Weights are written straight into the safetensors format (an 8-byte header
length, a JSON header, raw little-endian tensors) so neither torch nor
transformers is needed to make one; numpy draws the numbers.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ernie_tui import paths

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, as ERNIE-4.5 has pad 0, bos 1, eos 2

# Plain words so a demo prompt reads like English; the rest of a large
# vocabulary is filled with 'w<N>' tokens.
_BASE_WORDS = """
the of and to in is was for on that with as by at from his her it an are were be this which or
have has had not but what all when there can who been one more if will would their them so no
out up into about than then some could other time may only new these two over such after first
also any how our well way even because most through where much before down should those each
model engine server token cache block memory length prompt request batch latency throughput
speed graph kernel layer head value key query attention page size limit queue stream answer
question reason explain write short long story river mountain city light night day morning
please tell me about series features describe summary one sentence language large small fast
slow good better best simple clear hello world test probe load burst warm cold start stop ready
""".split()


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "bfloat16"  # the checkpoint's and config's dtype: "bfloat16" or "float16"

    def parameter_count(self) -> int:
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        mlp = 3 * h * i
        per_layer = q + kv + o + mlp + 2 * h
        return self.vocab_size * h + layers * per_layer + h  # tied embeddings: no lm_head


SHAPES = {
    # Serves on vLLM's CPU backend in seconds: head_dim 32 (16 dies at the
    # first request on CPU attention), 2 layers. float16, not bfloat16: vLLM's
    # CPU build picks its AMX attention kernels for bf16 wherever the CPU flags
    # AMX, and in a VM that flags AMX without letting a worker use it (a
    # Firecracker guest, 2026-12-07) the worker dies of SIGILL at the first
    # request. fp16 takes the plain vector kernels everywhere and keeps the
    # 2-byte sizes every KV figure is computed from.
    "tiny": ModelShape("tiny", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       vocab_size=1024, max_position_embeddings=4096, dtype="float16"),
    # The real ERNIE-4.5-0.3B-PT shapes: 360,748,032 parameters.
    "ernie-4.5-0.3b": ModelShape("ernie-4.5-0.3b", hidden_size=1024, intermediate_size=3072,
                                 num_hidden_layers=18, num_attention_heads=16, num_key_value_heads=2,
                                 head_dim=128, vocab_size=103424, max_position_embeddings=131072),
}


def vocabulary(size: int) -> list[str]:
    words = list(SPECIAL_TOKENS)
    seen = set(words)
    for w in _BASE_WORDS:
        if w not in seen and len(words) < size:
            words.append(w)
            seen.add(w)
    n = 0
    while len(words) < size:
        words.append(f"w{n}")
        n += 1
    return words


def prompt_words(n: int, seed: int = 0) -> str:
    """N words of the stand-in vocabulary, space separated: exactly N tokens."""
    rng = np.random.default_rng(seed)
    words = [w for w in vocabulary(len(SPECIAL_TOKENS) + len(_BASE_WORDS)) if w not in SPECIAL_TOKENS]
    return " ".join(words[i] for i in rng.integers(0, len(words), size=n))


def _config(shape: ModelShape) -> dict:
    return {
        "architectures": ["Ernie4_5ForCausalLM"],
        "model_type": "ernie4_5",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "use_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": shape.dtype,
        "dtype": shape.dtype,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "initializer_range": 0.02,
    }


def _tensor_shapes(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    h, i = shape.hidden_size, shape.intermediate_size
    q_out = shape.num_attention_heads * shape.head_dim
    kv_out = shape.num_key_value_heads * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.vocab_size, h))]
    for n in range(shape.num_hidden_layers):
        p = f"model.layers.{n}"
        out += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (q_out, h)),
            (f"{p}.self_attn.k_proj.weight", (kv_out, h)),
            (f"{p}.self_attn.v_proj.weight", (kv_out, h)),
            (f"{p}.self_attn.o_proj.weight", (h, q_out)),
            (f"{p}.mlp.gate_proj.weight", (i, h)),
            (f"{p}.mlp.up_proj.weight", (i, h)),
            (f"{p}.mlp.down_proj.weight", (h, i)),
        ]
    out.append(("model.norm.weight", (h,)))
    return out


def _bf16_bytes(values: np.ndarray) -> bytes:
    # bf16 is the top half of an IEEE float32 (round-to-nearest-even on the cut).
    f32 = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = (f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def _f16_bytes(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f4").astype("<f2").tobytes()


def _write_safetensors(path: Path, shape: ModelShape, seed: int) -> int:
    rng = np.random.default_rng(seed)
    tensors = _tensor_shapes(shape)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    tag, to_bytes = ("F16", _f16_bytes) if shape.dtype == "float16" else ("BF16", _bf16_bytes)
    offset = 0
    for name, dims in tensors:
        nbytes = int(np.prod(dims)) * 2
        header[name] = {"dtype": tag, "shape": list(dims), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    count = 0
    with open(path, "wb", opener=paths.private_opener) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dims in tensors:
            n = int(np.prod(dims))
            count += n
            if name.endswith("norm.weight"):
                values = np.ones(n, dtype=np.float32)
            else:
                # Chunked so the 0.3B shape never holds more than ~64 MB of floats.
                step = 1 << 24
                for start in range(0, n, step):
                    m = min(step, n - start)
                    f.write(to_bytes(rng.standard_normal(m, dtype=np.float32) * 0.02))
                continue
            f.write(to_bytes(values))
    return count


def _tokenizer_json(words: list[str]) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        # WordPiece's decoder joins tokens with spaces, so text round-trips.
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "<unk>"},
    }


CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _write_text(path: Path, text: str) -> None:
    """A model file, 0600 like every file ernie-tui writes (paths.private_opener)."""
    with open(path, "w", encoding="utf-8", opener=paths.private_opener) as f:
        f.write(text)


def written_as(directory: str | Path, shape: str = "tiny") -> bool:
    """Whether DIRECTORY holds a model of SHAPE as this version writes it: every
    file there and the config's dtype the shape's (an older tiny model was
    bf16, which dies on some CPUs; see SHAPES)."""
    d = Path(directory)
    if not all((d / n).is_file() for n in ("config.json", "tokenizer.json", "tokenizer_config.json",
                                            "model.safetensors")):
        return False
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("torch_dtype") == SHAPES[shape].dtype


def shared_tiny_model() -> Path:
    """The tiny model the tests and benches share (written once, a few MB),
    kept under ~/.cache so vLLM's torch.compile cache for it is reused across
    runs. Under "f16/": apart from the bf16 one older versions wrote, so two
    versions tested on one box do not rewrite each other's model; the folder's
    own name stays "tiny-ernie", the name vLLM serves it under."""
    target = Path.home() / ".cache" / "ernie-tui-tests" / "f16" / "tiny-ernie"
    if not written_as(target, "tiny"):
        # Each file lands whole (os.replace) and one seed makes the same bytes,
        # so two processes writing it at once leave one good set.
        write_demo_model(target, "tiny", seed=0)
    return target


def write_demo_model(directory: str | Path, shape: str = "tiny", seed: int = 0) -> dict:
    """Write config, weights and tokenizer into DIRECTORY; return a summary."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    spec = SHAPES[shape]
    out = paths.private_dir(directory)  # folders it makes are 0700, as every other ernie-tui writes
    words = vocabulary(spec.vocab_size)
    # Write into a temp dir beside the target, then move files in, so a
    # half-written model is never served.
    with tempfile.TemporaryDirectory(dir=out, prefix=".writing-") as tmp:
        t = Path(tmp)
        _write_text(t / "config.json", json.dumps(_config(spec), indent=2))
        _write_text(t / "generation_config.json", json.dumps(
            {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, indent=2))
        _write_text(t / "tokenizer.json", json.dumps(_tokenizer_json(words), ensure_ascii=False))
        _write_text(t / "tokenizer_config.json", json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "add_bos_token": False, "add_eos_token": False,
            "model_max_length": spec.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }, indent=2))
        _write_text(t / "special_tokens_map.json", json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))
        params = _write_safetensors(t / "model.safetensors", spec, seed)
        for f in t.iterdir():
            os.replace(f, out / f.name)
    summary = {"path": str(out), **asdict(spec), "parameters": params}
    return summary
