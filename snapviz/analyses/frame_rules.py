"""Rules files: stage labels, memory categories, training phases and attention evidence
from stack frames, as data.

Rules live in a JSON data file (``snapviz/rules/diffusers.json``; format in
``docs/rules.md``). Each rule has a ``kind`` and a ``name`` and matches a frame by a
``function`` regex on the bare ``co_name`` (or the C++ symbol) and a ``file`` regex on the
path, both on the same frame. A stack takes the highest-``priority`` rule of a kind that
matches any of its frames; ties go to the rule listed first. Kinds:

* ``stage``: a pipeline stage (:mod:`snapviz.analyses.frame_labels`);
* ``category``: a memory category (:mod:`snapviz.analyses.categories`);
* ``phase``: a generic PyTorch phase (``forward``, ``backward``, ``optimizer``,
  ``zero_grad``), used when no stage rule recognises the program
  (:mod:`snapviz.analyses.phases`);
* ``attention``: evidence of how attention ran: ``fused`` (an SDPA / flash /
  memory-efficient / cuDNN kernel, or a code path that only calls one) and ``softmax``
  (a softmax function: what it consumes may be a score matrix; see
  :mod:`snapviz.analyses.score_evidence`), and what makes such a softmax attention:
  ``qk`` (a matrix product, Q·Kᵀ), ``not-qk`` (a linear layer or matrix-vector product,
  which is not) and ``module`` (attention code: a function or file named for it).

A :class:`RuleSet` is resolved once per analysis (:func:`load_rules`) and passed to every
analysis that needs it; nothing here is cached between calls.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from snapviz.errors import InputError
from snapviz.vocab import RULES_SCHEMA

RULES_MAX_BYTES = 16 << 20  # a rules file is a few KiB; more is not a rules file
KINDS = ("stage", "category", "phase", "attention")
ATTACH = ("self", "previous", "next")
LIFETIMES = ("any", "short", "long")
EVIDENCE = ("fused", "softmax", "qk", "not-qk", "module")  # names of kind "attention" rules
RULE_KEYS = frozenset({"id", "name", "function", "file", "priority", "kind", "attach", "lifetime", "note"})


@dataclass(frozen=True)
class Rule:
    """One rule of a rules file (see docs/rules.md); its regexes are compiled once, here."""

    name: str
    function: str | None
    file: str | None
    priority: int
    kind: str = "stage"
    attach: str = "self"
    lifetime: str = "any"
    id: str | None = None
    function_re: re.Pattern[str] | None = field(init=False, compare=False, repr=False)
    file_re: re.Pattern[str] | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "function_re", re.compile(self.function) if self.function is not None else None)
        object.__setattr__(self, "file_re", re.compile(self.file) if self.file is not None else None)


@dataclass(frozen=True)
class RuleSet:
    """Every rule of one analysis: the built-ins, a user file, or both (``source`` says which)."""

    rules: tuple[Rule, ...]
    source: str

    def of_kind(self, kind: str, name: str | None = None) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == kind and (name is None or r.name == name))


# --- the safe regex subset ---------------------------------------------------------------------

MAX_PATTERN_CHARS = 1000  # one rule regex
MAX_VARIABLE_REPEATS = 4  # quantifiers with a variable count (*, +, ?, {m,n}) in one regex
MAX_RULES = 10_000  # rules in one file


def unsafe_pattern(pattern: str) -> str | None:
    """Why ``pattern`` is outside the rules' regex subset (None: inside).

    Python's ``re`` backtracks: ``^(a+)+$`` on 35 characters takes minutes. The subset refuses
    what makes matching time explode: a quantified part holding another quantifier or an
    alternation (nested quantifiers, ``(a|ab)*``), backreferences, and more than
    :data:`MAX_VARIABLE_REPEATS` variable quantifiers in one regex (each multiplies the work by
    the name's length). Every built-in rule is inside it."""
    import re._constants as c  # type: ignore[import-not-found]
    import re._parser as sre  # type: ignore[import-not-found]

    if len(pattern) > MAX_PATTERN_CHARS:
        return f"is over {MAX_PATTERN_CHARS} characters"
    try:
        tree = sre.parse(pattern)
    except Exception:  # noqa: BLE001 - compiled above; a parser failure is simply not the subset
        return "cannot be checked"
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None))

    def walk(items: Any, under: bool) -> tuple[str | None, int]:
        """(why it is unsafe, most variable quantifiers along one path through ``items``)."""
        total = 0
        for op, av in items:
            why, n = None, 0
            if op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "uses a backreference", 0
            if op in repeats:
                lo, hi, body = av
                if hi != lo and under:
                    return "nests a quantifier inside a quantified part", 0
                why, n = walk(body, under or hi > 1)
                n += hi != lo
            elif op is c.BRANCH:
                if under:
                    return "repeats an alternation", 0
                for alt in av[1]:
                    why, k = walk(alt, under)
                    if why:
                        break
                    n = max(n, k)
            elif op is c.SUBPATTERN:
                why, n = walk(av[-1], under)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                why, n = walk(av[1], under)
            elif op is getattr(c, "ATOMIC_GROUP", None):
                why, n = walk(av, under)
            if why:
                return why, 0
            total += n
        return None, total

    # the parser nests as the pattern does; MAX_PATTERN_CHARS keeps that far below the stack limit
    why, variable = walk(tree, False)
    if why:
        return why
    if variable > MAX_VARIABLE_REPEATS:
        return f"has {variable} variable quantifiers in a row (at most {MAX_VARIABLE_REPEATS})"
    return None


# --- loading ------------------------------------------------------------------------------------


def builtin_rules_text() -> str:
    return resources.files("snapviz").joinpath("rules/diffusers.json").read_text(encoding="utf-8")


def _parse_rule(raw: Any, where: str, i: int) -> Rule:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: rule {i} is not an object")
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise InputError(
            f"{where}: rule {i} has unknown key(s) {', '.join(sorted(unknown))} "
            f"(allowed: {', '.join(sorted(RULE_KEYS))})"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: rule {i} needs a non-empty string 'name' (the stage, category, phase or evidence)")
    kind = raw.get("kind", "stage")
    if kind not in KINDS:
        raise InputError(f"{where}: rule {i} ({name}): 'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "attention" and name not in EVIDENCE:
        raise InputError(
            f"{where}: rule {i} ({name}): attention evidence is one of {', '.join(EVIDENCE)}, not {name!r}"
        )
    attach = raw.get("attach", "self")
    if attach not in ATTACH:
        raise InputError(f"{where}: rule {i} ({name}): 'attach' must be one of {', '.join(ATTACH)}, not {attach!r}")
    lifetime = raw.get("lifetime", "any")
    if lifetime not in LIFETIMES:
        raise InputError(
            f"{where}: rule {i} ({name}): 'lifetime' must be one of {', '.join(LIFETIMES)}, not {lifetime!r}"
        )
    prio = raw.get("priority", 0)
    if isinstance(prio, bool) or not isinstance(prio, (int, float)):
        raise InputError(f"{where}: rule {i} ({name}): 'priority' must be a number")
    pats: dict[str, str | None] = {}
    for key in ("function", "file"):
        pat = raw.get(key)
        if pat is not None:
            if not isinstance(pat, str):
                raise InputError(f"{where}: rule {i} ({name}): '{key}' must be a regular expression string")
            try:
                re.compile(pat)
            except (re.error, RecursionError, OverflowError) as exc:
                raise InputError(f"{where}: rule {i} ({name}): bad '{key}' regex {pat!r}: {exc}") from None
            why = unsafe_pattern(pat)
            if why is not None:
                raise InputError(
                    f"{where}: rule {i} ({name}): '{key}' regex {pat!r} {why}; rules use a subset of regular "
                    "expressions that cannot backtrack catastrophically (docs/rules.md)"
                )
        pats[key] = pat
    if pats["function"] is None and pats["file"] is None:
        raise InputError(f"{where}: rule {i} ({name}): give a 'function' or a 'file' regex (or both)")
    rid = raw.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InputError(f"{where}: rule {i} ({name}): 'id' must be a string")
    return Rule(
        name=name,
        function=pats["function"],
        file=pats["file"],
        priority=int(prio),
        kind=kind,
        attach=attach,
        lifetime=lifetime,
        id=rid,
    )


def parse_rules(data: Any, where: str) -> tuple[list[Rule], bool, set[str]]:
    """Rules of one file, whether it extends the built-ins, and the built-in ids it disables."""
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise InputError(f"{where}: a rules file is a JSON object with a 'rules' list")
    schema = data.get("schema", RULES_SCHEMA)
    if schema != RULES_SCHEMA:
        raise InputError(f"{where}: 'schema' is {schema!r}; this snapviz reads {RULES_SCHEMA} rules files")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list):
        raise InputError(f"{where}: a rules file is a JSON object with a 'rules' list")
    ext = data.get("extends")
    if ext not in (None, "builtin"):
        raise InputError(f"{where}: 'extends' can only be \"builtin\", not {ext!r}")
    disable = data.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(x, str) for x in disable):
        raise InputError(f"{where}: 'disable' must be a list of rule ids")
    if len(raw_rules) > MAX_RULES:
        raise InputError(f"{where}: {len(raw_rules):,} rules; a rules file holds at most {MAX_RULES:,}")
    return [_parse_rule(r, where, i) for i, r in enumerate(raw_rules)], ext == "builtin", set(disable)


def load_rules(path: str | os.PathLike[str] | None = None) -> RuleSet:
    """The built-in rules, or a user file (replacing them, or ``"extends": "builtin"``).

    With ``extends``, a user rule whose ``id`` equals a built-in rule's replaces it and
    ``"disable": [ids]`` drops built-in rules. Raises InputError (exit 2) on a bad file.
    Called once per analysis; the result is passed along, never cached here.
    """
    builtin, _, _ = parse_rules(json.loads(builtin_rules_text()), "built-in rules")
    if path is None:
        return RuleSet(tuple(builtin), "builtin")
    p = os.fspath(path)
    from snapviz.load.opener import read_bounded

    raw = read_bounded(p, RULES_MAX_BYTES, "rules file")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{p}: rules file is not valid JSON ({str(exc).splitlines()[0]})") from None
    user, extends, disable = parse_rules(data, p)
    if not extends:
        return RuleSet(tuple(user), p)
    known = {r.id for r in builtin if r.id}
    missing = sorted(disable - known)
    if missing:
        raise InputError(f"{p}: 'disable' names no built-in rule: {', '.join(missing)}")
    replaced = {r.id for r in user if r.id}
    return RuleSet(tuple([r for r in builtin if r.id not in disable and r.id not in replaced] + user), p)
