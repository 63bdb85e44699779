"""Ready-made prompts, and prompts of an exact token length.

The long prompt and the burst/capacity workloads need prompts whose token
count is exact for the served model, so they are built with its tokenizer:
its tokenizer.json (LocalTokenizer) or, when that is not on this machine,
the server's /tokenize and /detokenize (ServerTokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ernie_tui.engine_ctl.load.http_client import auth_headers, base_url, resolve_model
from ernie_tui.engine_ctl.load.http_errors import (
    ProbeError,
    ProbeErrorKind,
    ProbeFailure,
    classify_exception,
    error_from_response,
)
from ernie_tui.engine_ctl.tls import tls_context

SHORT_PROMPT = "Explain in two sentences what the KV cache of a large language model is for."
CHINESE_PROMPT = "请用一句话介绍ERNIE系列模型的特点。"
LONG_PROMPT_TOKENS = 1500

# Readable filler for long prompts; whatever of it the tokenizer keeps as
# clean word tokens is cycled to the wanted length.
_FILLER = (
    "the model reads a long prompt and the engine splits it into blocks of the cache so that each "
    "request can share memory with other requests in the same batch while the server keeps the "
    "queue short and the latency low for every question that arrives before the answer is ready "
    "please write a short summary of the story about the river the mountain and the city at night "
    "and explain how the speed of the first token depends on the length of the prompt and the size "
    "of the batch when many requests stream their answers at the same time"
)


# ---------------------------------------------------------------------------
# Prompts of an exact token length

class LocalTokenizer:
    """The served model's own tokenizer.json, via the `tokenizers` library."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        self.path = p
        self._tok = Tokenizer.from_file(str(p))
        self._candidates: dict[int, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        # add_special_tokens=True: vLLM's completions endpoint adds them too
        # (e.g. a BOS), and the server's count is the one that matters.
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def special_ids(self) -> set[int]:
        try:
            return set(self._tok.get_added_tokens_decoder().keys())
        except AttributeError:  # very old tokenizers
            return set()

    def candidate_ids(self, limit: int = 4000) -> list[int]:
        """Ids whose token decodes to a plain word (letters/digits), so built
        prompts read as words and re-tokenize predictably. Kept once found:
        over a 103k-token vocabulary the scan takes ~0.2 s, and every batch
        of prompts a capacity search builds asks for it again."""
        if limit not in self._candidates:
            self._candidates[limit] = self._scan_candidates(limit)
        return list(self._candidates[limit])

    def _scan_candidates(self, limit: int) -> list[int]:
        special = self.special_ids()
        vocab = self._tok.get_vocab(with_added_tokens=False)
        out = []
        for _tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            if i in special:
                continue
            word = self._tok.decode([i], skip_special_tokens=True).strip()
            if len(word) >= 2 and word.isascii() and word.isalnum():
                out.append(i)
                if len(out) >= limit:
                    break
        return out


class ServerTokenizer:
    """vLLM's /tokenize and /detokenize: exact for whatever the server runs,
    for when its tokenizer.json is not on this machine."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        self.url = base_url(url)
        self.model = model
        self._client = httpx.Client(timeout=timeout, headers=auth_headers(api_key), trust_env=False,
                                    verify=tls_context())
        self._candidates: list[int] | None = None

    def _post(self, path: str, body: dict) -> dict:
        try:
            r = self._client.post(self.url + path, json={"model": self.model, **body})
        except httpx.HTTPError as exc:
            raise ProbeFailure(classify_exception(exc, self.url + path)) from exc
        if r.status_code != 200:
            raise ProbeFailure(error_from_response(r.status_code, r.text, self.url + path))
        return r.json()

    def encode(self, text: str) -> list[int]:
        return list(self._post("/tokenize", {"prompt": text, "add_special_tokens": True})["tokens"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._post("/detokenize", {"tokens": list(ids)})["prompt"])

    def candidate_ids(self, limit: int = 4000) -> list[int]:
        # One /tokenize call per filler word: asked once, then kept.
        if self._candidates is None:
            ids = []
            for word in set(_FILLER.split()):
                toks = self.encode(" " + word)
                if len(toks) == 1:  # a whole word that is one token, and no BOS added
                    ids.append(toks[0])
            self._candidates = sorted(set(ids))
        return self._candidates[:limit]

    def close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class BuiltPrompt:
    text: str
    tokens: int  # as the tokenizer counts it (special tokens included)
    target: int

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


class PromptBuilder:
    """Builds prompts of an exact token count for a given tokenizer.

    Start from word tokens (random ones, or a readable filler), decode to
    text, re-encode, and trim or top up until the re-encoded text has exactly
    the target length: decoding and re-encoding is not always an identity
    (merges across word borders, an added BOS), so the count is always taken
    from the re-encoded text, never assumed.
    """

    def __init__(self, tokenizer: Any, seed: int = 0) -> None:
        import random

        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self._pool: list[int] | None = None
        self._overhead: int | None = None

    @property
    def pool(self) -> list[int]:
        if self._pool is None:
            self._pool = self.tokenizer.candidate_ids()
            if not self._pool:
                raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_RESPONSE,
                                              "the tokenizer has no plain word tokens to build prompts from"))
        return self._pool

    @property
    def overhead(self) -> int:
        """Tokens the tokenizer adds to any text (BOS etc.)."""
        if self._overhead is None:
            self._overhead = len(self.tokenizer.encode(""))
        return self._overhead

    def build(self, n_tokens: int, filler: str | None = None, max_rounds: int = 12) -> BuiltPrompt:
        if n_tokens < 1:
            raise ValueError("a prompt needs at least one token")
        want = max(1, n_tokens - self.overhead)
        if filler:
            pool = set(self.pool)
            src = [i for i in self.tokenizer.encode(filler) if i in pool] or self.pool
            ids = [src[k % len(src)] for k in range(want)]
        else:
            ids = [self.rng.choice(self.pool) for _ in range(want)]
        best: BuiltPrompt | None = None
        for _ in range(max_rounds):
            text = self.tokenizer.decode(ids)
            count = len(self.tokenizer.encode(text))
            cand = BuiltPrompt(text, count, n_tokens)
            if best is None or abs(count - n_tokens) < abs(best.tokens - n_tokens):
                best = cand
            if count == n_tokens:
                return cand
            if count > n_tokens:
                drop = count - n_tokens
                ids = ids[: max(1, len(ids) - drop)]
            else:
                ids = ids + [self.rng.choice(self.pool) for _ in range(n_tokens - count)]
        assert best is not None
        return best


def find_tokenizer(model_dir: str | Path | None = None, tokenizer_path: str | Path | None = None,
                   url: str | None = None, model: str | None = None,
                   api_key: str | None = None) -> Any:
    """The best tokenizer we can get: an explicit tokenizer.json or model dir,
    else the server's own (/v1/models `root` if it is a local dir, else the
    /tokenize endpoint). Raises ProbeFailure if none works."""
    for p in (tokenizer_path, model_dir):
        if p:
            path = Path(p).expanduser()
            if path.is_dir():
                path = path / "tokenizer.json"
            if path.is_file():
                return LocalTokenizer(path)
            raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_REQUEST, f"no tokenizer.json at {path}"))
    if url:
        served = resolve_model(url, model, api_key)
        if served.root:
            cand = Path(served.root).expanduser() / "tokenizer.json"
            if cand.is_file():
                return LocalTokenizer(cand)
        return ServerTokenizer(url, served.id, api_key)
    raise ProbeFailure(ProbeError(ProbeErrorKind.BAD_REQUEST,
                                  "no tokenizer: give a model dir, a tokenizer.json or a server URL"))


def long_prompt(tokenizer: Any, n_tokens: int = LONG_PROMPT_TOKENS) -> BuiltPrompt:
    """The ready-made long prompt: readable filler, exactly n_tokens long."""
    return PromptBuilder(tokenizer, seed=0).build(n_tokens, filler=_FILLER)


READY_PROMPTS = ("short", "chinese", "long")


def ready_prompt(name: str, tokenizer: Any = None) -> str:
    """'short', 'chinese' or 'long' (the long one needs the served model's
    tokenizer, see find_tokenizer)."""
    if name == "short":
        return SHORT_PROMPT
    if name == "chinese":
        return CHINESE_PROMPT
    if name == "long":
        if tokenizer is None:
            raise ValueError("the long prompt is built with the served model's tokenizer; pass one")
        return long_prompt(tokenizer).text
    raise ValueError(f"unknown ready-made prompt {name!r}; choose one of {', '.join(READY_PROMPTS)}")
