"""The matrix's grammar: which technique combinations (variants) run, named how, in what order.

``technique_names`` and ``screen_variants`` import ``collectors.techniques`` (and so torch)
when called; the rest is plain data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The standard toolbox per pipeline (docs/design.md "what to do"). On CPU, fp16 becomes fp32
# (CPU has no usable fp16 kernels here) and CUDA-only variants are skipped with the reason.
DEFAULT_VARIANTS: dict[str, tuple[str, ...]] = {
    "sdxl": (
        "fp32",
        "fp16",
        "fp16,classic",
        "fp16,vae-slicing",
        "fp16,vae-tiling",
        "fp16,tiny-vae",
        "fp16,model-offload",
        "fp16,sequential-offload",
        "bf16",
    ),
    "sd15": (
        "fp32",
        "fp16",
        "fp16,classic",
        "fp16,sliced",
        "fp16,vae-slicing",
        "fp16,vae-tiling",
        "fp16,tiny-vae",
        "fp16,model-offload",
        "fp16,sequential-offload",
        "bf16",
    ),
    "pixart-sigma": ("fp16", "bf16", "fp16,vae-tiling", "fp16,model-offload", "fp16,staged,int8,nf4-text-encoder"),
}
DEFAULT_BASELINE = "fp16"

# Dispatch heaviest first so that with --jobs N the slow variants do not form the tail
# (longest-processing-time-first); results are reported in ranking order anyway.
_SLOW = ("sequential-offload", "group-offload", "staged", "model-offload", "fp32", "nf4-text-encoder")


class MatrixError(ValueError):
    """A bad matrix option (unknown technique, unknown baseline...): one line, exit 2."""


@dataclass(frozen=True)
class Variant:
    label: str  # "fp16+vae-tiling": techniques joined by "+"
    techniques: tuple[str, ...]


def parse_variant(text: str, known: Iterable[str] | None = None, aliases: dict[str, str] | None = None) -> Variant:
    """``"fp16,vae-tiling"`` (or ``"fp16+vae-tiling"``) -> Variant; names checked when ``known``."""
    aliases = aliases or {}
    known_set = set(known) if known is not None else None
    names: list[str] = []
    for part in re.split(r"[,+]", str(text)):
        part = part.strip().lower()
        if not part:
            continue
        name = aliases.get(part, part)
        if known_set is not None and name not in known_set:
            raise MatrixError(
                f"--variant {text!r}: unknown technique {part!r}; choose from: {', '.join(sorted(known_set))}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise MatrixError(f"--variant {text!r}: names no technique")
    return Variant("+".join(names), tuple(names))


def technique_names() -> tuple[tuple[str, ...], dict[str, str]]:
    """Known technique names and aliases (imports collectors.techniques, hence torch)."""
    from collectors.techniques import ALIASES, ALL

    return tuple(ALL), dict(ALIASES)


def default_variants(pipeline: str, device: str) -> tuple[list[Variant], list[str]]:
    """The default set for ``pipeline`` on ``device`` and the notes that explain changes."""
    raw = list(DEFAULT_VARIANTS[pipeline])
    notes: list[str] = []
    if device == "cpu":
        swapped = [",".join("fp32" if t == "fp16" else t for t in v.split(",")) for v in raw]
        if swapped != raw:
            notes.append("fp16 is CUDA-only here, so on CPU the default fp16 variants run in fp32")
        raw = swapped
    out: list[Variant] = []
    for text in raw:
        v = parse_variant(text)
        if v.label not in [x.label for x in out]:
            out.append(v)
    return out, notes


def screen_variants(
    variants: Sequence[Variant], *, device: str, pipeline: str
) -> tuple[list[Variant], list[dict[str, str]]]:
    """Split ``variants`` into runnable ones and skipped ones (with the collector's own reason).

    Used for the default set only: a variant the user asked for always runs, and a refusal
    is recorded as that variant's result.
    """
    from collectors.techniques import TechniqueError, plan

    keep: list[Variant] = []
    skipped: list[dict[str, str]] = []
    for v in variants:
        try:
            plan(list(v.techniques), device=device, pipeline=pipeline, num_gpus=1)
        except TechniqueError as err:
            skipped.append({"label": v.label, "reason": str(err)})
        else:
            keep.append(v)
    return keep, skipped


def dispatch_order(variants: Sequence[Variant]) -> list[Variant]:
    def weight(v: Variant) -> int:
        return min((i for i, s in enumerate(_SLOW) if s in v.techniques), default=len(_SLOW))

    return sorted(variants, key=weight)


def run_dir_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9+._-]", "_", label)
