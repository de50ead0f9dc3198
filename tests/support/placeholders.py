"""What a missing value looks like when it leaks into a report (issue 8: no "None", "-1",
"device None", "event -1", "in before recording" or empty placeholders in any output)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

PLACEHOLDERS = re.compile(r"\bNone\b|\bnan\b|(?<![\w.:/-])-1(?![\d.])|device None|event -1|in before recording|``")

# Values quoted from the input as recorded: stack frames, and allocator_settings (where ''
# means the environment variable was unset).
_QUOTED_KEYS = ("stack", "allocator_settings")


def placeholder_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if PLACEHOLDERS.search(ln)]


def json_strings(obj: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every string of a JSON document with its key path, quoted input values excluded."""
    if isinstance(obj, str):
        yield key, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in _QUOTED_KEYS:
                yield from json_strings(v, f"{key}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from json_strings(v, key)


def placeholder_strings(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """JSON string fields that are empty or hold a placeholder."""
    return [(k, s) for k, s in json_strings(doc) if not s.strip() or PLACEHOLDERS.search(s)]
