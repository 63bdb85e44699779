"""The typed shape of one `[presets.NAME]` table (pydantic).

ernie-tui's own keys and the engine arguments whose type we know are fields;
every other key is an engine argument passed through as a flag (the open
remainder: preflight judges those against the installed vLLM's arguments).
Validation is strict: TOML already gives real types, so `block_size = "16"`
or `enable_prefix_caching = 1` is a mistake to report, not to coerce.

`check_table` answers with the first problem and the key path it sits at,
so the loader can name the file, preset, key and line.
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from ernie_tui.presets.model import PresetError, parse_size


def _size(value: int | str) -> int | str:
    """Checks that the size parses; keeps it as written ("64M" stays "64M",
    so a saved preset reads as the user wrote it)."""
    try:
        parse_size(value)
    except PresetError as exc:
        raise PydanticCustomError("size", "{reason}", {"reason": exc.reason}) from None
    return value


def _env_value(value: Any) -> str | int | float:
    # TOML numbers are fine (OMP_NUM_THREADS = 2); true/false, arrays and
    # tables have no one obvious spelling in an environment variable.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PydanticCustomError("env_value", "{reason}",
                                  {"reason": f"environment values are strings or numbers, got {value!r}"})
    return value


PositiveInt = Annotated[int, Field(gt=0)]
Size = Annotated[int | str, AfterValidator(_size)]
NonNegative = Annotated[float, Field(ge=0)]


class PresetTable(BaseModel):
    """One preset table as written (before `extends` is resolved, so every
    field is optional)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    # -- ernie-tui's own keys (model.TOOL_KEYS; a test keeps the two in step) --
    description: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    host: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    extends: str | None = None
    env: dict[str, Annotated[Any, AfterValidator(_env_value)]] | None = None
    launcher: Annotated[list[str], Field(min_length=1)] | None = None
    api_key_env: str | None = None

    # -- engine arguments whose type we know -------------------------------
    block_size: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    tensor_parallel_size: PositiveInt | None = None
    pipeline_parallel_size: PositiveInt | None = None
    data_parallel_size: PositiveInt | None = None
    data_parallel_size_local: Annotated[int, Field(ge=0)] | None = None
    data_parallel_start_rank: Annotated[int, Field(ge=0)] | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    headless: bool | None = None
    distributed_executor_backend: str | None = None
    nnodes: PositiveInt | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    kv_cache_memory_bytes: Size | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    enforce_eager: bool | None = None
    seed: int | None = None
    swap_space: NonNegative | None = None
    cpu_offload_gb: NonNegative | None = None
    quantization: str | None = None
    trust_remote_code: bool | None = None
    disable_log_stats: bool | None = None
    max_logprobs: int | None = None
    tokenizer: str | None = None
    generation_config: str | None = None


_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
_FLAG_VALUE = (str, int, float, bool, list, dict)


def _reason(err: dict[str, Any]) -> str:
    if err["type"] in ("size", "env_value"):
        return err["msg"]
    if err["type"] == "model_type":
        return f"must be a table, got {err['input']!r}"
    msg = err["msg"].removeprefix("Input ").replace("valid dictionary", "table")
    return f"{msg[:1].lower()}{msg[1:]}, got {err['input']!r}"


def _remainder_problem(key: str, value: Any) -> str | None:
    """An engine argument we have no type for: it must still be a vLLM name
    and a value that becomes a flag."""
    if not _SNAKE.match(key):
        hint = key.replace("-", "_").lower()
        return (f"engine arguments are vLLM's names in snake_case ({hint} for --{hint.replace('_', '-')})"
                if _SNAKE.match(hint) else "not an engine argument name (snake_case, as vLLM names them)")
    if isinstance(value, (datetime.date, datetime.time)) or not isinstance(value, _FLAG_VALUE):
        return f"a {type(value).__name__} cannot become a vLLM flag, got {value!r}"
    return None


def _input_path(table: dict[str, Any], loc: tuple[Any, ...]) -> tuple[str, ...]:
    """pydantic's error location as keys of the table itself: it adds union
    members (`('kv_cache_memory_bytes', 'int')`) and list indexes, which name
    no key in the file."""
    path: list[str] = []
    node: Any = table
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            break
        path.append(str(part))
        node = node[part]
    return tuple(path)


# TOML integers are 64-bit: "an integer that cannot be represented losslessly
# must be an error", but tomllib reads any size (max_model_len =
# 99999999999999999999999 would reach vLLM as it is).
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _oversized_int(node: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], str] | None:
    """The first integer outside TOML's 64-bit range, anywhere in `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            found = _oversized_int(value, (*path, str(key)))
            if found:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _oversized_int(value, path)
            if found:
                return found
    elif isinstance(node, int) and not isinstance(node, bool) and not _INT64[0] <= node <= _INT64[1]:
        return path, f"integer out of TOML's 64-bit range, got {node}"
    return None


def check_table(table: Any) -> tuple[tuple[str, ...], str] | None:
    """The first problem in one preset table as (key path, reason), or None.
    An empty key path means the table itself is wrong."""
    if not isinstance(table, dict):
        return (), f"expected a table, got {type(table).__name__} {table!r}"
    oversized = _oversized_int(table, ())
    if oversized:
        return oversized
    try:
        parsed = PresetTable.model_validate(table)
    except ValidationError as exc:
        err = exc.errors()[0]
        return _input_path(table, err["loc"]), _reason(err)
    for key, value in (parsed.model_extra or {}).items():
        reason = _remainder_problem(key, value)
        if reason:
            return (key,), reason
    return None


__all__ = ["PresetTable", "check_table"]
