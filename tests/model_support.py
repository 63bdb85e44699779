"""A header-only stand-in model for tests that judge real shapes.

It holds only what preflight reads (config.json, tokenizer_config.json and a
safetensors file with the full header but no tensor data), so tests can judge
the real ERNIE-4.5-0.3B shapes without writing 0.7 GB. vLLM cannot serve it.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from ernie_tui import demo_model


def write_header_only_model(directory: str | Path, shape: str = "ernie-4.5-0.3b") -> Path:
    spec = demo_model.SHAPES[shape]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(demo_model._config(spec), indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": spec.max_position_embeddings}))
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "note": "header only, no tensor data"}}
    offset = 0
    for name, dims in demo_model._tensor_shapes(spec):
        n = math.prod(dims) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
    return out
