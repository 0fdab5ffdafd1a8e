"""Memory sizes: every GiB in the product is 1024**3 bytes (vLLM's own unit for its KV cache
variable and its memory checks), and figures shown are rounded the same way."""

from __future__ import annotations

GIB = 1024**3


def gib(size_bytes: int) -> float:
    """`size_bytes` in GiB, rounded to 2 places (as `detect` and the plan show them)."""
    return round(size_bytes / GIB, 2)
