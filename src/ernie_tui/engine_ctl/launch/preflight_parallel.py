"""Preflight checks for data parallelism, headless nodes and the Ray executor.

Rules from vLLM 0.32's EngineArgs.create_engine_config, ParallelConfig and
`vllm serve` (vllm/engine/arg_utils.py, vllm/config/parallel.py,
vllm/entrypoints/cli/serve.py), each with the preset change that fixes it:

- data_parallel_size_local may not exceed data_parallel_size (vLLM: "must
  be <= data_parallel_size");
- tp x pp x dp-local must fit the GPUs visible on this node (vLLM starts
  dp-local engines of tp x pp ranks here); with the Ray executor the Ray
  cluster's GPUs count, so then it is only a warning;
- a `headless` node needs data_parallel_address (where the head is), a
  data_parallel_start_rank past the head's own engines, and `vllm serve`
  as its launcher (`python -m vllm.entrypoints.openai.api_server` parses
  --headless but starts an API server anyway);
- the head of a multi-node DP server binds data_parallel_rpc_port on
  data_parallel_address: the address must be this machine's and the port
  free; a headless node must be able to reach it (a warning: the head may
  simply not be up yet);
- api_server_count > 1 needs `vllm serve` as its launcher too (the module
  parses it and starts one API server);
- the Ray executor needs `ray` importable in the launcher's Python (found
  with importlib's find_spec in a short subprocess, never imported here).

These run as part of preflight.CHECKS; they take its CheckContext (preflight_check.py).
"""

from __future__ import annotations

import socket
import subprocess

from ernie_tui.engine_ctl.launch.parallel_layout import ParallelLayout, layout_of
from ernie_tui.engine_ctl.launch.ports import bind_exposure, next_free_port, port_is_free
from ernie_tui.engine_ctl.launch.preflight_check import CheckContext, launcher_python
from ernie_tui.engine_ctl.logs import ErrorKind

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
REACH_TIMEOUT_S = 1.0
FIND_SPEC_TIMEOUT_S = 15.0

_FIND_SPEC_CODE = ("import importlib.util, sys\n"
                   "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) is not None else 3)\n")


def module_available(python: str, module: str, env: dict[str, str] | None = None,
                     timeout: float = FIND_SPEC_TIMEOUT_S) -> bool | None:
    """Whether `python` (with the launch environment) finds top-level `module`,
    without importing it anywhere. None when it could not be asked."""
    try:
        out = subprocess.run([python, "-c", _FIND_SPEC_CODE, module], capture_output=True, timeout=timeout,
                             env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode in (0, 3):
        return out.returncode == 0
    return None


def _resolves(host: str) -> bool:
    try:
        return bool(socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


def _reachable(host: str, port: int, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """None when a TCP connection to host:port opens, else why not."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def _launcher_is_api_server_module(c: CheckContext) -> bool:
    launcher = c.preset.launcher
    return launcher is None or any(API_SERVER_MODULE in str(part) for part in launcher)


def check_data_parallel(c: CheckContext) -> None:
    lay = layout_of(c.preset)
    if lay.dp_local_set and lay.dp_local > lay.dp:
        c.add(ErrorKind.OTHER, "error",
              f"data_parallel_size_local {lay.dp_local} is more than data_parallel_size {lay.dp} (the engines "
              f"on this node are a share of all {lay.dp}); vLLM refuses with 'data_parallel_size_local "
              f"({lay.dp_local}) must be <= data_parallel_size ({lay.dp})'",
              {"data_parallel_size_local": lay.dp})
        return
    _check_gpus_here(c, lay)
    if lay.headless:
        _check_headless(c, lay)
    elif lay.remote_engines and lay.address is None and lay.nnodes == 1:
        c.add(ErrorKind.OTHER, "error",
              f"data_parallel_size_local {lay.dp_local} of {lay.dp}: the other engines run on other nodes and "
              "reach this head at data_parallel_address, which is unset (vLLM then uses 127.0.0.1, out of "
              "their reach); set it to this node's IP address")
    elif lay.remote_engines:
        _check_head(c, lay)


def _check_gpus_here(c: CheckContext, lay: ParallelLayout) -> None:
    if c.machine.platform != "cuda":
        return
    n = c.machine.gpu_count
    need = lay.gpus_here
    if need <= n:
        return
    if lay.uses_ray:
        c.add(ErrorKind.OTHER, "warning",
              f"{lay.describe()} needs {need} GPUs and this node has {n} visible; with the Ray executor the "
              f"Ray cluster's GPUs count, so check that `ray status` lists at least {need} GPUs before starting")
        return
    if lay.nnodes == 1 and lay.world_per_engine > n:
        return  # check_tp_vs_gpus already said it for one engine
    fix = None
    if lay.nnodes == 1 and lay.world_per_engine <= n:
        fit = max(1, n // lay.world_per_engine)
        fix = {"data_parallel_size_local": fit} if lay.dp_local_set else {"data_parallel_size": fit}
    where = " on this node" if (lay.dp_local < lay.dp or lay.nnodes > 1) else ""
    c.add(ErrorKind.TP_EXCEEDS_GPUS, "error",
          f"{lay.describe()} needs {need} GPUs{where} but {n} {'is' if n == 1 else 'are'} visible "
          f"(CUDA_VISIBLE_DEVICES and NVML); vLLM fails to place its engines ('World size ... is larger than "
          f"the number of available GPUs')", fix)


def _check_headless(c: CheckContext, lay: ParallelLayout) -> None:
    if _launcher_is_api_server_module(c):
        c.add(ErrorKind.OTHER, "error",
              f"headless = true with `python -m {API_SERVER_MODULE}` as the launcher: that module accepts "
              "--headless but starts an API server and engines of its own anyway; only `vllm serve` runs "
              "headless engines. Set launcher = [\"/path/to/venv/bin/vllm\", \"serve\"]")
    if lay.address is None:
        c.add(ErrorKind.OTHER, "error",
              "headless = true runs engines for a head node elsewhere, but no data_parallel_address says where "
              "the head is; set data_parallel_address to the head node's IP address (and "
              "data_parallel_rpc_port to the head's, default 29550)")
        return
    if lay.dp_start_rank is None and lay.dp_local < lay.dp:
        first = lay.dp - lay.dp_local
        c.add(ErrorKind.OTHER, "error",
              f"headless with data_parallel_size_local {lay.dp_local} of {lay.dp} but no data_parallel_start_rank: "
              f"this node's engines would take ranks 0-{lay.dp_local - 1}, the head's own, and the handshake "
              f"fails; with two nodes the head holds ranks 0-{first - 1}, so start at {first}",
              {"data_parallel_start_rank": first})
    if not _resolves(lay.address):
        c.add(ErrorKind.OTHER, "error",
              f"data_parallel_address {lay.address} does not resolve here (DNS or /etc/hosts); use the head "
              "node's IP address")
        return
    why = _reachable(lay.address, lay.rpc_port)
    if why is not None:
        c.add(ErrorKind.OTHER, "warning",
              f"nothing answers at the head's {lay.address}:{lay.rpc_port} (data_parallel_address:"
              f"data_parallel_rpc_port) yet: {why}. Start the head first, or check the address, the port and "
              "any firewall between the nodes")


def _check_head(c: CheckContext, lay: ParallelLayout) -> None:
    """This node is the head of a DP server with engines elsewhere: it binds
    data_parallel_rpc_port on data_parallel_address for them."""
    address = lay.address or ""
    if not _resolves(address):
        c.add(ErrorKind.OTHER, "error",
              f"data_parallel_address {address} does not resolve here (DNS or /etc/hosts); on the head it is "
              "this node's own IP address, the one the other nodes reach it at")
        return
    exposure = bind_exposure(address)
    if exposure.scope == "none":
        c.add(ErrorKind.OTHER, "error",
              f"data_parallel_address {address} is not an address of this machine: the head binds its RPC "
              f"port ({lay.rpc_port}) there for the other nodes' engines; on the head use this node's own IP "
              "address (or start the headless preset on that machine instead)")
        return
    if exposure.scope == "loopback":
        c.add(ErrorKind.OTHER, "warning",
              f"data_parallel_address {address} is loopback: engines on other nodes cannot reach the head "
              "there; use this node's network address")
    free, why = port_is_free(address, lay.rpc_port)
    if not free:
        nxt = next_free_port(address, lay.rpc_port)
        c.add(ErrorKind.PORT_IN_USE, "error",
              f"data_parallel_rpc_port {lay.rpc_port} on {address} is {why} (another server's engines?); the "
              "head binds it for the other nodes' engines and fails with 'Address already in use'; the headless "
              "nodes must use the same port", {"data_parallel_rpc_port": nxt} if nxt else None)


def check_api_servers(c: CheckContext) -> None:
    """api_server_count > 1 under the module launcher: it parses the flag and
    starts one API server all the same (vLLM 0.26 and 0.32); only `vllm serve`
    runs N of them. A warning, not an error: the server starts, with one."""
    n = c.preset.get("api_server_count")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 1 or not _launcher_is_api_server_module(c):
        return
    c.add(ErrorKind.OTHER, "warning",
          f"api_server_count = {n} with `python -m {API_SERVER_MODULE}` as the launcher: that module accepts "
          f"--api-server-count but starts one API server whatever the count; only `vllm serve` runs {n}. "
          "Set launcher = [\"/path/to/venv/bin/vllm\", \"serve\"]. (More API servers help where the API server "
          "is the process held at a core, not the engine core: a capacity search says which)")


def check_ray(c: CheckContext) -> None:
    lay = layout_of(c.preset)
    if not lay.uses_ray:
        return
    python = launcher_python(c.preset)
    found = module_available(python, "ray", env=dict(c.env))
    key = "distributed_executor_backend" if lay.backend == "ray" else "data_parallel_backend"
    if found is None:
        c.add(ErrorKind.OTHER, "warning",
              f"{key} = \"ray\": could not ask {python} (the launcher's Python) whether Ray is installed")
    elif not found:
        fix_words = ("leave the key out to use vLLM's own multiprocessing executor on one node"
                     if key == "distributed_executor_backend" else "leave the key out for the mp backend")
        c.add(ErrorKind.MISSING_MODULE, "error",
              f"{key} = \"ray\" needs Ray in the launcher's Python ({python}), and `import ray` finds nothing "
              f"there; vLLM stops with 'Failed to import Ray'. Install it there (pip install ray), or {fix_words}",
              {key: None})


def checks() -> list:
    return [("data_parallel", check_data_parallel), ("api_servers", check_api_servers), ("ray", check_ray)]


__all__ = ["check_api_servers", "check_data_parallel", "check_ray", "module_available", "checks"]
