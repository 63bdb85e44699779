"""Ready-made traffic shapes, beside the captured ones: chat, long-document
Q&A and batch summarisation.

Where the numbers come from, honestly: only the chat shape's max_tokens
(512) is taken from a source, the Chainlit chat page the articles this
tool grew from served (max_tokens 512, temperature 0.7). Every other figure
here is an assumption: round numbers chosen to give each shape its
character (short prompts and long-tailed answers that stop at EOS; long
prompts and short answers; mid-length prompts and answers that run long,
sent in a batch), not measured on anyone's traffic. Each profile's notes
say so; a captured profile is the better answer whenever one can be had.
"""

from __future__ import annotations

from pathlib import Path

from ernie_tui.engine_ctl.load.traffic import Arrivals, LengthDist, Prefix, Source, TrafficError, TrafficProfile

ASSUMED = "the figures are assumptions chosen for the shape, not measurements (see docs/guide/traffic.md)"


def _dist(*pairs: tuple[float, float]) -> LengthDist:
    return LengthDist(points=list(pairs), exact=True)


def _chat() -> TrafficProfile:
    return TrafficProfile(
        name="chat",
        description="a chat page: a shared system prompt, short user turns, answers that stop at EOS",
        prompt_tokens=_dist((0.0, 160), (0.1, 180), (0.5, 260), (0.9, 520), (0.99, 1100), (1.0, 1500)),
        output_tokens=_dist((0.0, 8), (0.1, 40), (0.5, 170), (0.9, 420), (0.99, 512), (1.0, 512)),
        max_tokens=_dist((0.0, 512), (1.0, 512)),
        eos_share=0.9,
        arrivals=Arrivals(rate_per_s=1.0, cv=1.5),
        prefix=Prefix(share=1.0, tokens=150),
        source=Source(kind="built-in"),
        notes=["max_tokens 512 is the articles' Chainlit page's setting; " + ASSUMED])


def _long_doc_qa() -> TrafficProfile:
    return TrafficProfile(
        name="long-doc-qa",
        description="questions on long documents: long prompts, several questions a document, short answers",
        prompt_tokens=_dist((0.0, 1500), (0.1, 2000), (0.5, 4000), (0.9, 7000), (0.99, 7800), (1.0, 8000)),
        output_tokens=_dist((0.0, 10), (0.1, 30), (0.5, 100), (0.9, 300), (0.99, 500), (1.0, 512)),
        max_tokens=_dist((0.0, 512), (1.0, 512)),
        eos_share=0.95,
        arrivals=Arrivals(rate_per_s=0.3, cv=1.2),
        prefix=Prefix(share=0.6, tokens=1400),
        source=Source(kind="built-in"),
        notes=["needs max_model_len >= 8,512 (the longest prompt plus max_tokens); " + ASSUMED])


def _batch_summarise() -> TrafficProfile:
    return TrafficProfile(
        name="batch-summarise",
        description="a batch job summarising documents: one instruction prefix, answers that run long, "
                    "sent in bursts",
        prompt_tokens=_dist((0.0, 500), (0.1, 800), (0.5, 1500), (0.9, 2600), (0.99, 3000), (1.0, 3000)),
        output_tokens=_dist((0.0, 100), (0.1, 180), (0.5, 300), (0.9, 420), (0.99, 460), (1.0, 460)),
        max_tokens=_dist((0.0, 460), (1.0, 460)),
        eos_share=0.5,
        arrivals=Arrivals(rate_per_s=2.0, cv=3.0),
        prefix=Prefix(share=1.0, tokens=40),
        source=Source(kind="built-in"),
        notes=["a gap CV of 3 stands for jobs that submit many documents at once; " + ASSUMED])


_MAKERS = {"chat": _chat, "long-doc-qa": _long_doc_qa, "batch-summarise": _batch_summarise}
BUILT_IN = tuple(_MAKERS)


def built_in(name: str) -> TrafficProfile:
    try:
        return _MAKERS[name]()
    except KeyError:
        raise ValueError(f"no built-in traffic {name!r}; choose one of {', '.join(BUILT_IN)}") from None


def load_profile(ref: str | Path) -> TrafficProfile:
    """A profile file, or the name of a built-in one."""
    p = Path(ref).expanduser()
    if not p.is_file() and str(ref) in BUILT_IN:
        return built_in(str(ref))
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        names = ", ".join(BUILT_IN)
        raise TrafficError(f"cannot read the traffic profile {p}: {exc.strerror or exc} (built-in ones: "
                           f"{names})") from exc
    try:
        return TrafficProfile.from_json(text)
    except TrafficError as exc:
        raise TrafficError(f"{p}: {exc}") from exc
