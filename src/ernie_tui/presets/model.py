"""The preset model: what one `[presets.NAME]` table means.

A preset holds vLLM engine arguments (snake_case, exactly as vLLM names them,
turned into `--kebab-case` flags) and a few keys of our own that say how and
where to launch the server.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ernie_tui import paths


class PresetError(Exception):
    """A preset file or preset that cannot be used; the message is for humans.

    Where it is known, the error says where: `file`, `line`, `preset`, `key`;
    str() puts them first, as compilers do: `FILE:LINE: preset 'a', key 'k': why`.
    """

    def __init__(self, reason: str, *, file: str | None = None, line: int | None = None,
                 preset: str | None = None, key: str | None = None):
        self.reason = reason
        self.file, self.line, self.preset, self.key = file, line, preset, key
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        about = []
        if self.preset is not None:
            about.append(f"preset {self.preset!r}")
        if self.key is not None:
            about.append(f"key {self.key!r}")
        return where + (", ".join(about) + ": " if about else "") + self.reason


# Keys that belong to ernie-tui rather than to vLLM (typed in schema.py,
# which a test keeps in step with this set; preflight imports it from here).
TOOL_KEYS = frozenset(
    {"description", "model", "served_model_name", "host", "port", "extends", "env", "launcher", "api_key_env"}
)

DEFAULT_MODULE_LAUNCHER = ["-m", "vllm.entrypoints.openai.api_server"]

# The dashboard polls /metrics every second (and /health while starting);
# uvicorn's access log would write a line for each, ~86 k lines a day that
# bury the engine's own (issue #18, 1). Unless a preset says otherwise, a
# server we start leaves exactly these two paths out of its access log, so a
# real client's requests are still logged. A preset that sets
# `disable_access_log_for_endpoints` (e.g. "" to log everything) or
# `disable_uvicorn_access_log` decides for itself. vLLM 0.26 and 0.32 take it.
OWN_POLL_PATHS = ("/metrics", "/health")
ACCESS_LOG_KEYS = ("disable_access_log_for_endpoints", "disable_uvicorn_access_log")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: int | str) -> int:
    """'64M' -> 67108864. Binary units, as vLLM's own parser treats K/M/G."""
    if isinstance(value, bool):
        raise PresetError(f"expected a size like 64M or 1G, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise PresetError(f"size must not be negative, got {value}")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise PresetError(f"expected a size like 64M or 1G, got {value!r}")
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * _SIZE_MULT[unit])


def format_size(n: int) -> str:
    """Bytes as the shortest exact '64M' / '1G' string parse_size reads back."""
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % mult == 0 and n >= mult:
            return f"{n // mult}{unit}"
    return str(n)


def flag_for(key: str) -> str:
    return "--" + key.replace("_", "-")


def engine_arg_flags(engine_args: dict[str, Any]) -> list[str]:
    """Engine arguments as vLLM command-line flags, in the preset's order."""
    argv: list[str] = []
    for key, value in engine_args.items():
        flag = flag_for(key)
        if key == "kv_cache_memory_bytes":
            value = parse_size(value)
        if isinstance(value, bool):
            # vLLM's boolean flags are BooleanOptionalAction: --x / --no-x.
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            argv.append(flag)
            argv.extend(str(v) for v in value)
        elif isinstance(value, dict):
            import json

            argv.extend([flag, json.dumps(value, separators=(",", ":"))])
        else:
            argv.extend([flag, str(value)])
    return argv


def expand_path(value: str) -> str:
    """'{data_dir}' and '~' in model paths, so built-ins need no absolute path."""
    value = value.replace("{data_dir}", str(paths.data_dir()))
    return os.path.expanduser(value)


@dataclass(frozen=True)
class LaunchSpec:
    """Exactly what gets executed: argv (no shell, ever) and the environment
    additions. Secrets (the API key) travel only in env, never in argv."""

    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    model: str
    served_model_name: str
    secret_env_keys: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        host = connect_host(self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def display_env(self) -> dict[str, str]:
        """env with secrets masked, for showing to a person."""
        return {k: ("***" if k in self.secret_env_keys else v) for k, v in self.env.items()}


def connect_host(bind_host: str) -> str:
    """Where a client reaches a server bound to `bind_host`: an address that
    binds every interface ("0.0.0.0", "0", "::0", "") is reached on loopback;
    anything else, numeric or a name, as written."""
    text = bind_host.strip().strip("[]")
    if not text:
        return "127.0.0.1"
    try:  # numeric forms only: a name is never "every interface" by spelling
        info = socket.getaddrinfo(text, None, flags=socket.AI_NUMERICHOST)[0]
    except (OSError, UnicodeError):
        return text
    ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
    if ip.is_unspecified:
        return "127.0.0.1" if ip.version == 4 else "::1"
    return text


@dataclass(frozen=True)
class Preset:
    name: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    env: dict[str, str] = field(default_factory=dict)
    launcher: list[str] | None = None
    api_key_env: str | None = None
    source: str = "built-in"

    # -- accessors -------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.engine_args.get(key, default)

    @property
    def block_size(self) -> int | None:
        return self.engine_args.get("block_size")

    @property
    def max_model_len(self) -> int | None:
        return self.engine_args.get("max_model_len")

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.engine_args.get("tensor_parallel_size", 1))

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        v = self.engine_args.get("kv_cache_memory_bytes")
        return None if v is None else parse_size(v)

    def key_args(self) -> str:
        """A short one-line summary for tables: 'block 16, len 4096, util 0.9'."""
        short = {
            "block_size": "block",
            "max_model_len": "len",
            "tensor_parallel_size": "tp",
            "pipeline_parallel_size": "pp",
            "data_parallel_size": "dp",
            "data_parallel_size_local": "dp-local",
            "distributed_executor_backend": "executor",
            "gpu_memory_utilization": "util",
            "kv_cache_memory_bytes": "kv",
            "enable_prefix_caching": "prefix",
            "max_num_seqs": "seqs",
        }
        parts = []
        for key, label in short.items():
            if key in self.engine_args:
                value = self.engine_args[key]
                if isinstance(value, bool):
                    value = "on" if value else "off"
                parts.append(f"{label} {value}")
        return ", ".join(parts)

    def with_changes(self, name: str | None = None, **engine_changes: Any) -> "Preset":
        """A copy with engine args changed; a value of None removes the key."""
        args = dict(self.engine_args)
        for key, value in engine_changes.items():
            if value is None:
                args.pop(key, None)
            else:
                args[key] = value
        return replace(self, name=name or self.name, engine_args=args)

    # -- launching ------------------------------------------------------
    def resolve_model(self, model_override: str | None = None) -> str:
        model = model_override or self.model or os.environ.get("ERNIE_TUI_MODEL")
        if not model:
            raise PresetError(
                f"preset {self.name!r} names no model: pass --model DIR, set ERNIE_TUI_MODEL, "
                "or add `model = \"...\"` to the preset"
            )
        return expand_path(model)

    def launch_spec(self, model_override: str | None = None, port_override: int | None = None) -> LaunchSpec:
        model = self.resolve_model(model_override)
        served = self.served_model_name or Path(model.rstrip("/")).name or "model"
        port = port_override or self.port
        if self.launcher:
            prefix = [expand_path(str(p)) for p in self.launcher]
        else:
            python = os.environ.get("ERNIE_TUI_VLLM_PYTHON") or sys.executable
            prefix = [python, *DEFAULT_MODULE_LAUNCHER]
        argv = [
            *prefix,
            "--model", model,
            "--served-model-name", served,
            "--host", self.host,
            "--port", str(port),
            *self._access_log_default(),
            *engine_arg_flags(self.engine_args),
        ]
        env = {k: str(v) for k, v in self.env.items()}
        secret: tuple[str, ...] = ()
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if key:
                # vLLM reads VLLM_API_KEY itself; passing it by environment keeps
                # the key out of `ps` output and out of llm.log's arg dump.
                env["VLLM_API_KEY"] = key
                secret = ("VLLM_API_KEY",)
        return LaunchSpec(argv=argv, env=env, host=self.host, port=port, model=model,
                          served_model_name=served, secret_env_keys=secret)

    def _access_log_default(self) -> list[str]:
        if any(key in self.engine_args for key in ACCESS_LOG_KEYS):
            return []
        return [flag_for(ACCESS_LOG_KEYS[0]), ",".join(OWN_POLL_PATHS)]

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None
