"""Number formatting shared by the renderers."""
from __future__ import annotations


def fmt_bytes(n: float | int | None) -> str:
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
    return ("+" if n > 0 else "") + fmt_bytes(n)

