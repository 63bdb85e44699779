"""Units shared by every district: bytes in GiB, and how people read them.

A leaf: it imports nothing of the project, so logs, launch, load and control
can all use it without an arrow between them.
"""

GiB = 1 << 30


def gib_str(n: float) -> str:
    """Bytes for people: '0.70 GiB'."""
    return f"{n / GiB:.2f} GiB"
