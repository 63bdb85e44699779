"""The KV block rules live once, in engine_ctl/launch/estimate.py.

The KV a request needs, (ceil(len / block) + 1) x block x bytes per token,
vLLM's default block size (16 on CUDA, 128 on CPU) and the block size a fix
proposes (16 on CUDA, 32 on CPU) are read by preflight, estimate and
diagnose; a second copy of any of them in src/ fails here.
"""

import re
from pathlib import Path

from ernie_tui.engine_ctl.launch.estimate import (
    block_size_fix,
    default_block_size,
    kv_blocks_needed,
    kv_bytes_needed,
)

SRC = Path(__file__).resolve().parent.parent / "src" / "ernie_tui"
HOME = SRC / "engine_ctl" / "launch" / "estimate.py"

# (what, pattern, copies allowed in estimate.py)
RULES = [
    ("the default block sizes", r'\{\s*"cuda":\s*16,\s*"cpu":\s*128\s*\}', 1),
    ("the block sizes the backends take", r'\{\s*"cuda":\s*16,\s*"cpu":\s*32\s*\}', 1),
    ("a block size chosen by platform inline", r"\b16\s+if\s+[\w.]*plat\w*\s*==\s*\"cuda\"\s+else\s+(?:128|32)\b", 0),
    ("the null block added to a block count", r"\)\s*\+\s*1\s*\)?\s*\*\s*[\w.]*block", 0),
    ("ceil division by the block size written inline", r"-\s*\(\s*-\s*[\w.]+\s*//\s*[\w.]*block", 0),
    ("a block count with the null block", r"cdiv\([^()]*block[\w.]*\)\s*\+\s*1\b", 1),
]


def _hits(pattern: str) -> dict[Path, int]:
    found = {}
    for path in SRC.rglob("*.py"):
        n = len(re.findall(pattern, path.read_text()))
        if n:
            found[path] = n
    return found


def test_each_kv_rule_is_written_once():
    problems = []
    for what, pattern, at_home in RULES:
        hits = _hits(pattern)
        elsewhere = {p.relative_to(SRC.parent): n for p, n in hits.items() if p != HOME}
        if elsewhere:
            problems.append(f"{what} written again in {elsewhere}: use estimate.py's")
        if hits.get(HOME, 0) != at_home:
            problems.append(f"{what}: estimate.py has {hits.get(HOME, 0)} copies, expected {at_home}")
    assert not problems, "\n".join(problems)


def test_the_patterns_see_the_copies_they_forbid():
    copies = [
        'block = preset.block_size or (16 if platform == "cuda" else 128)',
        "need = (-(-est.max_model_len // est.block_size) + 1) * est.block_size * est.kv_bytes_per_token",
        "need = (requests * cdiv(est.max_model_len, est.block_size) + 1) * est.block_size * b",
        '{"block_size": 16 if plat == "cuda" else 32}',
        'BLOCK = {"cuda": 16, "cpu": 32}',
    ]
    for text in copies:
        assert any(re.search(pattern, text) for _, pattern, _ in RULES), text


def test_the_rules():
    assert default_block_size("cuda") == 16 and default_block_size("cpu") == 128
    assert block_size_fix("cuda") == 16 and block_size_fix("cpu") == 32
    # 4096 tokens in blocks of 16: 256 blocks, plus the null block
    assert kv_blocks_needed(4096, 16) == 257
    assert kv_bytes_needed(4096, 16, 1024) == 257 * 16 * 1024
    assert kv_bytes_needed(4097, 16, 2, requests=8) == (8 * 257 + 1) * 16 * 2
