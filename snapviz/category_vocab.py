"""The memory categories: every name, its order and its colour, defined once.

Aligned with PyTorch's own memory profiler (``torch.profiler._memory_profiler.Category``:
PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, INPUT, AUTOGRAD_DETAIL), with this
domain's refinements. Every output (terminal, Markdown, JSON, HTML, PNG, compare) groups the
one ``category`` column of the allocation table (:mod:`snapviz.analyses.categories`) and shows
these names, in this order (bottom of a stack first), in these colours.

A user rule may name a category of its own: it comes after these, in rule order. A per-model
part of a category (``parameter: T5``) sorts and counts with its category.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapviz.vocab import BEFORE_RECORDING


@dataclass(frozen=True)
class Category:
    name: str
    color: str
    pytorch: str | None  # the memory profiler's category this is, or refines (None: none)
    old: tuple[str, ...] = ()  # names snapviz used before (summary documents may hold them)


PARAMETER = "parameter"
FSDP_SHARDED = "FSDP sharded parameters"
FSDP_GATHER = "FSDP all-gather buffers"
AUTOCAST_COPIES = "autocast weight copies"
OPTIMIZER_STATE = "optimizer state"
GRADIENT = "gradient"
DDP_BUCKETS = "DDP gradient buckets"
FSDP_REDUCE = "FSDP reduce-scatter buffers"
INPUT = "input"
LATENTS = "latents & embeddings"
KV_CACHE = "kv cache"
ACTIVATION = "activation"
ATTENTION_SCORES = "attention scores"
VAE_BUFFERS = "vae buffers"
TEMPORARY = "temporary"
AUTOGRAD_DETAIL = "autograd detail"
UNKNOWN = "unknown"

VOCABULARY: tuple[Category, ...] = (
    Category(BEFORE_RECORDING, "#c7c7c7", None),
    Category(PARAMETER, "#7f7f7f", "PARAMETER", ("weights", "parameters")),
    # each rank's shard of the parameters (FSDP2's DTensor shards, FSDP1's flat parameters)
    Category(FSDP_SHARDED, "#c49c94", "PARAMETER", ("FSDP flat parameters",)),
    # the unsharded parameters a rank gathers for one module's forward or backward, and their inputs
    Category(FSDP_GATHER, "#dbdb8d", "PARAMETER"),
    Category(AUTOCAST_COPIES, "#aec7e8", "TEMPORARY", ("autocast weight copies",)),
    Category(OPTIMIZER_STATE, "#8c564b", "OPTIMIZER_STATE", ("optimizer state",)),
    Category(GRADIENT, "#ff7f0e", "GRADIENT", ("gradients",)),
    Category(DDP_BUCKETS, "#ffbb78", "GRADIENT"),
    # the unsharded gradients FSDP reduce-scatters (its sharded output is the gradient)
    Category(FSDP_REDUCE, "#e6550d", "GRADIENT"),
    Category(INPUT, "#c5b0d5", "INPUT"),
    Category(LATENTS, "#9467bd", "INPUT", ("latents & embeddings",)),
    Category(KV_CACHE, "#e377c2", "ACTIVATION"),
    Category(ACTIVATION, "#1f77b4", "ACTIVATION", ("activations", "saved activations")),
    Category(ATTENTION_SCORES, "#d62728", "ACTIVATION", ("attention scores",)),
    Category(VAE_BUFFERS, "#2ca02c", "ACTIVATION", ("vae buffers",)),
    Category(TEMPORARY, "#17becf", "TEMPORARY", ("temporaries",)),
    Category(AUTOGRAD_DETAIL, "#98df8a", "AUTOGRAD_DETAIL"),
    Category(UNKNOWN, "#bcbd22", None, ("other",)),
)
# Stacking order (bottom first): what was there before, what persists across steps, what each
# step adds, what no rule explains.
CATEGORY_ORDER: tuple[str, ...] = tuple(c.name for c in VOCABULARY)
CATEGORY_COLORS: dict[str, str] = {c.name: c.color for c in VOCABULARY}
# What an allocation recorded in the history can be (before recording is the baseline's)
CATEGORIES: tuple[str, ...] = tuple(c for c in CATEGORY_ORDER if c != BEFORE_RECORDING)

# Old name -> its name now (snapviz.summary/1 documents written before the one vocabulary).
# "other" (the old training set's rest) is not mapped: a user rule may name a category "other";
# nor is the old lump "gradients & optimizer" (split now, it cannot be split after the fact).
OLD_NAMES: dict[str, str] = {o: c.name for c in VOCABULARY for o in c.old if o != c.name and o != "other"}

# What training.classify_allocations says -> the vocabulary ("other": it does not decide).
FROM_TRAINING: dict[str, str | None] = {
    "parameters": PARAMETER,
    "gradients": GRADIENT,
    "optimizer state": OPTIMIZER_STATE,
    "saved activations": ACTIVATION,
    "autocast weight copies": AUTOCAST_COPIES,
    "temporaries": TEMPORARY,
    DDP_BUCKETS: DDP_BUCKETS,
    FSDP_SHARDED: FSDP_SHARDED,
    FSDP_GATHER: FSDP_GATHER,
    FSDP_REDUCE: FSDP_REDUCE,
    "other": None,
}


def canonical_category(name: str) -> str:
    """``name`` as the vocabulary says it now: an old name (``weights``, ``weights: T5``,
    ``saved activations``) becomes its new one; any other name is itself."""
    base, sep, part = name.partition(": ")
    if base == BEFORE_RECORDING and sep:
        return f"{base}: {canonical_category(part)}"
    new = OLD_NAMES.get(base, base)
    return f"{new}{sep}{part}"


def category_base(name: str) -> str:
    """The vocabulary category a per-model part counts in: ``parameter: T5`` -> ``parameter``."""
    return name.split(": ", 1)[0]


def order_categories(names: Iterable[str]) -> list[str]:
    """``names`` in stacking order (:data:`CATEGORY_ORDER`), each category's per-model parts
    (``parameter: T5``) right after it, then any other (user rule) category in first-seen order."""
    got = list(dict.fromkeys(str(x) for x in names))
    out: list[str] = []
    for c in CATEGORY_ORDER:
        out += [c] if c in got else []
        out += sorted(x for x in got if x.startswith(c + ": "))
    return out + [c for c in got if c not in out]
