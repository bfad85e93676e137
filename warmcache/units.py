"""Human sizes, ages and counts: ``--max-size 20G``, ``--older-than 7d``, ``1.4 MiB``, ``1 graph``.

Sizes are binary (``K`` = 1024) because disks and ``du -h`` report them that way;
the suffix may be spelled ``G``, ``GB`` or ``GiB``.
"""

from __future__ import annotations

import re

from warmcache.bounds import MAX_BYTES
from warmcache.errors import UsageError, shown

_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_size(text: str, *, option: str = "size") -> int:
    """``"20G"`` → bytes; a bad value names the option and the value."""
    match = _SIZE_RE.match(text)
    if not match:
        raise UsageError(f"{option}: {shown(text)} is not a size (examples: 500M, 20G, 1.5TiB)")
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    if not size <= MAX_BYTES:  # also inf, from a number of hundreds of digits
        raise UsageError(f"{option}: {shown(text)} is larger than any disk (at most {MAX_BYTES} bytes)")
    return int(size)


def parse_age(text: str, *, option: str = "age") -> float:
    """``"7d"`` → seconds (units s, m, h, d, w)."""
    match = _AGE_RE.match(text)
    if not match:
        raise UsageError(f"{option}: {shown(text)} is not an age (examples: 90m, 12h, 7d, 2w)")
    return float(match.group(1)) * _AGE_UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    """``1468006`` → ``"1.4 MiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_count(count: int, noun: str) -> str:
    """``"1 graph"``, ``"3 graphs"``: a count with its noun, plural unless it is one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_age(seconds: float) -> str:
    """``7200`` → ``"2.0h"``: the largest unit that keeps the number ≥ 1."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``unknown`` when there is no estimate."""
    if seconds is None:
        return "unknown"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
