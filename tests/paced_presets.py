"""The presets TOML of a paced stand-in (tests/paced_server.py) served as
a preset: one table per stand-in, its pacing in env. Shared by the tests and
the bench scripts that tune or rank stand-ins, so that a change to how a
stand-in is declared is made once."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

PACED = Path(__file__).resolve().parent / "paced_server.py"
# The engine-shaped stand-in (paced_server.engine_shape: slots and gaps from
# max_num_seqs and max_num_batched_tokens), as the tune tests and benches use it.
ENGINE_SHAPED = {"PACED_ENGINE_SHAPED": "1", "PACED_TTFT_MS": "20"}


def paced_preset(name: str, model: Path | str, port: int, env: dict[str, str], **fields: Any) -> str:
    """One [presets.NAME] table extending cpu-demo (the model dir is only for
    preflight: the stand-in ignores it), launched as the paced stand-in with
    `env`; `fields` are more engine fields (max_num_seqs = 2, ...)."""
    env_text = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    more = "".join(f"{k} = {v!r}\n" for k, v in fields.items())
    return textwrap.dedent(f"""
        [presets.{name}]
        extends = "cpu-demo"
        model = "{model}"
        port = {port}
        launcher = ["{sys.executable}", "{PACED}"]
        env = {{ {env_text} }}
    """) + more
