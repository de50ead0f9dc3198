"""File-derived strings made safe for each sink: bounded length, and escaped for Markdown,
terminals and XML.

Snapshots, traces and run.json files come from strangers; their strings (frame names, stage
labels, allocator settings, run metadata) end up in reports pasted into issues, printed in
terminals and parsed by CI. Every renderer passes such strings through one of these helpers
(docs/security.md, "Escaping"), and :func:`bound` clips every string of a rendered document
once, so a report's size follows the report, not the longest string in the input.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

MAX_TEXT = 300  # characters kept of one file-derived string
MAX_LIST = 1000  # entries kept of one list in a summary document (stages, sites...)

# The one cleaning policy of every sink (:func:`clean`): C0 controls (tab and newline included),
# DEL, C1 controls, the Unicode line separators, every bidirectional control (LRM, RLM, ALM
# U+061C, the embeddings/overrides U+202A-E and the isolates U+2066-9) that reorder or split
# what a terminal or a page shows, and lone surrogates (legal in a pickle or a JSON escape,
# unencodable in UTF-8): all shown as visible escapes, never a reason to refuse a file.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Characters with a meaning in (GitHub-flavoured) Markdown inline text and tables.
# '_' between two word characters (vae_decode) cannot start or end emphasis: left as it is.
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>!|~&]|(?<!\w)_|_(?!\w))")
# XML 1.0 forbids C0 controls other than tab/newline/CR, surrogates, U+FFFE and U+FFFF.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


_CUT = re.compile(r"… \([\d,]+ chars\)$")
_WORD_BACKOFF = 40  # a cut moves back at most this far to end at a space, not mid-word
_SPACE = re.compile(r"\s")


def cut_at(s: str, limit: int) -> int:
    """Where to cut ``s`` to keep at most ``limit`` characters: at the last space of the final
    stretch, so prose never ends mid-word; a string without spaces there (a path, a name) is
    cut at ``limit``."""
    if len(s) <= limit:
        return len(s)
    lo = max(0, limit - _WORD_BACKOFF)
    spaces = [m.start() for m in _SPACE.finditer(s, lo, limit + 1)]
    return spaces[-1] if spaces and spaces[-1] > 0 else limit


def clip(text: Any, limit: int | None = MAX_TEXT) -> str:
    """``text`` as a string of at most ``limit`` characters, or its start (cut between words,
    :func:`cut_at`) and a note of the full length (``None``: no limit). Clipping a clipped
    string changes nothing."""
    s = text if isinstance(text, str) else str(text)
    if limit is None or len(s) <= limit:
        return s
    tail = _CUT.search(s)
    noted = tail is not None and tail.end() == len(s)
    if tail is not None and noted and tail.start() <= limit:
        return s  # already cut to this limit (or less)
    # A string the loader already cut ends with its original length: state that one.
    full = tail.group(0) if tail is not None and noted else f"… ({len(s):,} chars)"
    body = s[: tail.start()] if tail is not None and noted else s
    return f"{body[: cut_at(body, limit)].rstrip()}{full}"


def _visible(m: re.Match[str]) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def clean(text: Any) -> str:
    """``text`` with every control character (ESC, C1, newline, bidi controls, lone surrogates)
    shown as an escape such as ``\\x1b``: the one cleaning policy, applied at every sink.
    Cleaning a cleaned string changes nothing."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_visible, s)


def printable(text: Any, limit: int | None = MAX_TEXT) -> str:
    """One terminal line: clipped, every control character (ESC, C1, newline, bidi) shown as
    an escape such as ``\\x1b`` instead of acting on the terminal."""
    return clean(clip(text, limit))


def short_repr(kind: str, name: Any, *facts: str) -> str:
    """A loaded object's ``repr``: ``<Kind 'name': fact, fact>``, one line of a few hundred
    characters however big the object (``print(run)`` in a REPL must not dump its tables);
    the file-derived name clipped and escaped."""
    body = ", ".join(f for f in facts if f)
    return f"<{kind} {printable(name, 120)!r}{': ' + body if body else ''}>"


def md_text(text: Any, limit: int = MAX_TEXT) -> str:
    """Inline Markdown text (also a table cell) that renders as exactly these characters:
    no HTML, links, images, emphasis or table breaks; control characters shown as escapes."""
    return _MD_SPECIAL.sub(r"\\\1", printable(text, limit))


def md_code(text: Any, limit: int | None = MAX_TEXT) -> str:
    """A Markdown code span showing ``text`` verbatim (backticks inside included), safe in a
    table cell; empty for an empty string."""
    s = printable(text, limit)
    if not s:
        return ""
    run = max((len(r) for r in re.findall("`+", s)), default=0)
    fence = "`" * (run + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    # In a GFM table a '|' ends the cell even inside a code span unless escaped; the table
    # parser removes the backslash before the span is read.
    return f"{fence}{pad}{s.replace('|', chr(92) + '|')}{pad}{fence}"


def xml_text(text: Any, limit: int = MAX_TEXT) -> str:
    """Text that any XML 1.0 parser accepts (ElementTree escapes <, & and quotes itself)."""
    return _XML_ILLEGAL.sub(
        lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}",
        printable(text, limit),
    )


def bound(
    doc: Any,
    warnings: list[str] | None = None,
    limit: int = MAX_TEXT,
    max_list: int | None = MAX_LIST,
    json_numbers: bool = True,
) -> Any:
    """A copy of ``doc`` (dicts, lists, tuples, numpy columns) with every string and
    dict key clipped to ``limit`` and cleaned (:func:`clean`), lists cut to ``max_list`` entries (the cut noted in
    ``warnings``) and, with ``json_numbers``, non-finite floats replaced by None (noted in
    ``warnings``).

    Each distinct string object is clipped once (a name shared by thousands of frames costs
    one cut). The walk is iterative, so a deeply nested run.json cannot overflow the stack.
    """
    clipped: dict[int, str] = {}

    def text(s: str) -> str:
        out = clipped.get(id(s))
        if out is None:
            out = clipped[id(s)] = printable(s, limit)
        return out

    def leaf(v: Any, path: str) -> tuple[bool, Any]:
        if isinstance(v, str):
            return True, text(v)
        if json_numbers and isinstance(v, (float, np.floating)) and not math.isfinite(v):
            if warnings is not None:
                warnings.append(f"{path}: {v} is not a JSON number; written as null")
            return True, None
        if isinstance(v, np.ndarray) and json_numbers:
            return False, v.tolist()
        if isinstance(v, np.ndarray):  # a column: strings clipped, never cut (columns stay aligned)
            if v.dtype.kind not in "OU" or not v.size:
                return True, v
            return True, np.array(
                [text(x) if isinstance(x, str) else x for x in v.tolist()],
                dtype=object if v.dtype.kind == "O" else None,
            )
        if isinstance(v, (dict, list, tuple)):
            return False, v
        return True, v

    ok, root = leaf(doc, "$")
    if ok:
        return root
    result: list[Any] = [None]
    # (container, parent to fill, key in parent, path for messages)
    stack: list[tuple[Any, Any, Any, str]] = [(doc, result, 0, "")]
    tuples: list[tuple[Any, Any]] = []  # (parent, key) of tuples, filled as lists first
    while stack:
        obj, parent, key, path = stack.pop()
        if isinstance(obj, dict):
            new: Any = {}
            items: list[tuple[Any, Any]] = list(obj.items())
        else:
            seq = list(obj)
            if max_list is not None and len(seq) > max_list:
                if warnings is not None:
                    warnings.append(f"{path or 'list'}: {len(seq):,} entries, the first {max_list:,} kept")
                seq = seq[:max_list]
            new = [None] * len(seq)
            items = list(enumerate(seq))
        parent[key] = new
        if isinstance(obj, tuple):
            tuples.append((parent, key))
        for k, v in items:
            nk = text(k) if isinstance(k, str) else k
            # a path for messages only, kept short however deep or long the keys are
            sub = (f"{path}.{clip(nk, 40)}" if isinstance(obj, dict) else f"{path}[{k}]").lstrip(".")[-200:]
            done, nv = leaf(v, sub)
            if done:
                new[nk] = nv
            else:
                if isinstance(new, dict):
                    new[nk] = None
                stack.append((nv, new, nk, sub))
    for parent, key in reversed(tuples):  # children were created after their parents
        parent[key] = tuple(parent[key])
    return result[0]


def bounded_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """A summary/compare document ready for any text sink: :func:`bound`, with what was cut or
    replaced added to its ``warnings`` (so every renderer states it)."""
    notes: list[str] = []
    out = bound(doc, notes)
    if notes:
        out["warnings"] = [*(out.get("warnings") or []), *notes]
    return out
