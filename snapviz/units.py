"""Sizes and percentages: formatting for people and parsing of what people type."""

from __future__ import annotations

import math
import re

from snapviz.errors import InputError

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")
_PCT_RE = re.compile(r"^\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*%?\s*$")
SIZE_HELP = "e.g. 12GiB, 800MiB, 12GB (decimal), '1.5 GiB' or plain bytes"


def fmt_bytes(n: float | int | None) -> str:
    """``1536`` -> ``1.50 KiB`` (binary units; bytes below 1 KiB as whole numbers)."""
    if n is None:
        return "n/a"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"


def fmt_delta(n: float | int) -> str:
    """A signed size: ``+1.00 GiB``, ``-512 B``, ``0 B``."""
    return ("+" if n > 0 else "") + fmt_bytes(n)


def fmt_ratio_pct(r: float | None) -> str:
    """A relative change as `` (+12.5%)``; empty when unknown (NaN or None)."""
    if r is None or r != r:
        return ""
    return f" ({float(r) * 100:+.1f}%)"


def parse_size(text: str | int, what: str = "size") -> int:
    """``12GiB`` -> 12884901888; ``12GB`` is decimal (12e9); plain numbers are bytes.

    Raises :class:`InputError` (exit 2) naming ``what`` on anything else, including the
    ambiguous bare ``G``/``M``/``K``.
    """
    if isinstance(text, bool):
        raise InputError(f"{what}: invalid size {text!r} ({SIZE_HELP})")
    if isinstance(text, int):
        if text < 0:
            raise InputError(f"{what}: a size cannot be negative ({text})")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: invalid size {str(text)!r} ({SIZE_HELP})")
    number, exp, unit = m.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        if unit.lower() in ("k", "m", "g", "t"):
            raise InputError(
                f"{what}: ambiguous unit {unit!r} in {str(text)!r}: "
                f"write {unit.upper()}iB (binary) or {unit.upper()}B (decimal)"
            )
        raise InputError(f"{what}: unknown unit {unit!r} in {str(text)!r} ({SIZE_HELP})")
    mantissa = float(number)
    value = mantissa * _power_of_ten(exp) * factor if mantissa else 0.0  # 0e99999 is 0, not NaN
    if value > 2**62:
        raise InputError(f"{what}: size {str(text)!r} is implausibly large")
    return int(round(value))


def _power_of_ten(exp: str | None) -> float:
    """``10 ** exp`` as a float, computed in constant time however many digits the exponent has
    (``1e99999999GiB`` must not build a hundred-million-digit integer): beyond ±400 it is
    infinity or zero, which the range checks then report."""
    if not exp:
        return 1.0
    digits = exp.lstrip("+-").lstrip("0") or "0"
    e = int(digits) if len(digits) <= 4 else 10_000
    e = -e if exp.startswith("-") else e
    if e > 400:
        return math.inf
    if e < -400:
        return 0.0
    return 10.0**e


def parse_percent(text: str | float, what: str = "percentage") -> float:
    """``5%``, ``5``, ``+2.5%``, ``-1%`` -> percent as a float (5.0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = _PCT_RE.match(str(text))
    if not m:
        raise InputError(f"{what}: invalid percentage {str(text)!r} (e.g. 5% or 0.5%)")
    return float(m.group(1))
