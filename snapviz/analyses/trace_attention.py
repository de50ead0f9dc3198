"""Attention in a profiler trace: score matrices from op shapes, fused kernels from op names.

A score matrix is a ``bmm``/``baddbmm`` output that a ``softmax`` consumes next on the same
thread (its shape is exact: the trace records input shapes); SDPA's math backend builds one
inside. Fused attention is an SDPA op that did not run the math backend, or a fused kernel
of ATen, vLLM, flash-attn, xFormers or ROCm aiter/CK, each named for what it is
(:func:`snapviz.analyses.attention.fused_label`). Neither: "not determined".
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.attention import FUSED, NOT_DETERMINED, fused_label
from snapviz.analyses.document import TraceAttention, TraceScoreMatrix
from snapviz.load.trace.chrome_trace import ChromeTrace

# torch.profiler "Input type" strings (c10 scalar type names) -> bytes per element.
ITEMSIZE: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}

_SCORE_OPS = ("aten::baddbmm", "aten::bmm")
_SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
_SDPA_MATH = "aten::_scaled_dot_product_attention_math"  # also ..._math_for_mps
# Fused attention kernels outside SDPA's dispatcher op: ATen's own, vLLM's, flash-attn, xFormers.
_FUSED_KERNELS = re.compile(
    r"(^aten::_(flash|efficient)_attention_forward$|^vllm::\w*attention|flash_attn|"
    r"paged_attention|^xformers|fmha|^aiter::\w*(mha|attn|attention))"
)


def _is_sdpa(name: str) -> bool:
    return (
        name == "aten::scaled_dot_product_attention"
        or name.startswith("aten::_scaled_dot_product_")
        or _FUSED_KERNELS.search(name) is not None
    )


def _is_attention(name: str) -> bool:
    return name in _SCORE_OPS or name in _SOFTMAX_OPS or _is_sdpa(name)


def _parse_json_list(text: str) -> list[Any]:
    if not text:
        return []
    try:
        val = json.loads(text)
    except ValueError:
        return []
    return val if isinstance(val, list) else []


def _dims3(shape: Any) -> tuple[int, int, int] | None:
    """A tensor shape flattened to (batch, rows, cols); None if not a >= 2-D int shape."""
    if not isinstance(shape, list) or len(shape) < 2 or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1, shape[-2], shape[-1]


def _score_shape(name: str, shapes: list[Any]) -> tuple[int, int, int] | None:
    """(B, M, N) of the scores an op computes or would compute.

    baddbmm(self, b1[B,M,K], b2[B,K,N]) and bmm(a[B,M,K], b[B,K,N]) output [B,M,N];
    softmax's is its input; SDPA(q[...,L,E], k[...,S,E]) implies [prod(...), L, S],
    the matrix a classic implementation would allocate and the fused kernel does not.
    """
    if name == "aten::baddbmm" and len(shapes) >= 3:
        a, b = _dims3(shapes[1]), _dims3(shapes[2])
        return (a[0], a[1], b[2]) if a and b else None
    if name == "aten::bmm" and len(shapes) >= 2:
        a, b = _dims3(shapes[0]), _dims3(shapes[1])
        return (a[0], a[1], b[2]) if a and b else None
    if name in _SOFTMAX_OPS and shapes:
        return _dims3(shapes[0])
    if _is_sdpa(name) and _FUSED_KERNELS.search(name) is None and len(shapes) >= 2:  # [..., L, E] layouts only
        q, k = _dims3(shapes[0]), _dims3(shapes[1])
        return (q[0], q[1], k[1]) if q and k else None
    return None


def _nested(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """True for ops inside another listed op of the same thread (``_softmax`` in ``softmax``)."""
    nested = np.zeros(len(start), bool)
    order = np.lexsort((-end, start, tid))  # by tid, start, longer first
    open_end, open_tid = -np.inf, None
    for i in order:  # attention ops are few (thousands): a plain sweep is clear and fast
        if tid[i] == open_tid and end[i] <= open_end:
            nested[i] = True
        else:
            open_end, open_tid = end[i], tid[i]
    return nested


def attention_op_table(trace: ChromeTrace) -> pd.DataFrame:
    """Attention-related ``cpu_op`` events with shapes and score sizes.

    Rows: ``aten::baddbmm``, ``aten::bmm``, ``aten::softmax``/``aten::_softmax``,
    ``aten::scaled_dot_product_attention`` and ``aten::_scaled_dot_product_*``, in
    time order. Columns: ``name``, ``start_us``, ``end_us``, ``tid``, ``shapes``
    (list of input dims), ``dtype`` (``Input type`` of the first input), ``itemsize``,
    ``score_shape`` ((B, M, N), see below), ``score_bytes`` (B·M·N·itemsize),
    ``materializes_scores``, ``nested`` (inside another listed op of the same thread,
    e.g. ``_softmax`` in ``softmax``).

    ``score_shape`` is the output of baddbmm/bmm, the input of softmax, and for SDPA the
    matrix a classic implementation would materialize (so ``score_bytes`` is what the
    fused kernel saved). ``materializes_scores`` is True for a non-nested baddbmm/bmm
    whose output is attention scores — the next listed op on its thread is a softmax
    over that shape — and for that softmax. SDPA materializes
    only when it ran the unfused math backend (``_scaled_dot_product_attention_math``
    under it); the fused kernels (flash, efficient, cuDNN, CPU flash) never do. Sum
    ``score_bytes`` over ``materializes_scores`` rows only.
    """
    ops = trace.ops
    cols = [
        "name",
        "start_us",
        "end_us",
        "tid",
        "shapes",
        "dtype",
        "itemsize",
        "score_shape",
        "score_bytes",
        "materializes_scores",
        "nested",
    ]
    names_cat = pd.Index(ops["name"].cat.categories).astype(str) if len(ops) else pd.Index([])
    wanted = np.array([_is_attention(n) for n in names_cat], dtype=bool)
    if not len(ops) or not wanted.any():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    sel = ops[wanted[ops["name"].cat.codes.to_numpy()]]
    # By thread, then time, outer op first on equal start: an op's children follow it.
    sel = sel.iloc[np.lexsort((-sel["end_us"].to_numpy(), sel["start_us"].to_numpy(), sel["tid"].to_numpy()))]
    n = len(sel)
    names = names_cat.to_numpy()[sel["name"].cat.codes.to_numpy()].astype(object)
    # Parse each distinct dims / types JSON text once.
    dims_cat = sel["input_dims"].cat
    dims_parsed = [_parse_json_list(str(s)) for s in dims_cat.categories]
    shapes = [dims_parsed[c] if c >= 0 else [] for c in dims_cat.codes.to_numpy()]
    types_cat = sel["input_types"].cat
    first_type = [(_parse_json_list(str(s)) or [""])[0] for s in types_cat.categories]
    dtype = np.array([first_type[c] if c >= 0 else "" for c in types_cat.codes.to_numpy()], dtype=object)
    itemsize = np.array([ITEMSIZE.get(str(d), 0) for d in dtype], dtype=np.int64)

    start, end, tid = sel["start_us"].to_numpy(), sel["end_us"].to_numpy(), sel["tid"].to_numpy()
    nested = _nested(start, end, tid)
    score = [_score_shape(nm, sh) for nm, sh in zip(names, shapes, strict=True)]
    numel = np.array([s[0] * s[1] * s[2] if s else 0 for s in score], dtype=np.int64)
    score_bytes = numel * itemsize

    # Classify along each thread's sequence of non-nested listed ops (rows are sorted by tid, start).
    materializes = np.zeros(n, bool)
    top = np.flatnonzero(~nested)
    for j, i in enumerate(top):
        nm, s = names[i], score[i]
        if _is_sdpa(nm):
            # The math backend is SDPA unfused: it builds the full score matrix inside.
            kids = names[i + 1 : top[j + 1] if j + 1 < len(top) else n]
            materializes[i] = s is not None and any(str(k).startswith(_SDPA_MATH) for k in kids)
            continue
        if nm not in _SCORE_OPS or s is None:
            continue
        # Scores are what a softmax consumes: a product with no softmax over it (probs @ V,
        # any other batched matmul) is not evidence of attention.
        nxt = top[j + 1] if j + 1 < len(top) and tid[top[j + 1]] == tid[i] else None
        if nxt is not None and names[nxt] in _SOFTMAX_OPS and score[nxt] == s:
            materializes[i] = materializes[nxt] = True

    out = pd.DataFrame(
        {
            "name": names,
            "start_us": start,
            "end_us": end,
            "tid": tid,
            "shapes": pd.Series(shapes, dtype=object).to_numpy(),
            "dtype": dtype,
            "itemsize": itemsize,
            "score_shape": pd.Series(score, dtype=object).to_numpy(),
            "score_bytes": score_bytes,
            "materializes_scores": materializes,
            "nested": nested,
        }
    )
    return out.sort_values(["start_us", "end_us"], ascending=[True, False], kind="stable").reset_index(drop=True)[cols]


def attention_verdict(ops: pd.DataFrame) -> TraceAttention:
    """The ``attention`` section of a trace summary from :func:`attention_ops`: score matrices
    with their exact shapes, fused SDPA calls, and the verdict. "fused" needs an SDPA or
    fused-kernel op that did not run the math backend; no attention op at all is "not
    determined" (the model may have none, or compute it in ops not listed)."""
    none = TraceAttention(
        count=0,
        peak_live_bytes=0,
        largest=TraceScoreMatrix(bytes=0, shape=None),
        source="trace ops",
        sdpa_calls=0,
        fused_calls=0,
        implementation=NOT_DETERMINED,
    )
    if not len(ops):
        return none
    top = ops[~ops["nested"].to_numpy(bool)]
    mat = ops[ops["materializes_scores"].to_numpy(bool)]
    fused = top[[_is_sdpa(str(n)) for n in top["name"]] & ~top["materializes_scores"].to_numpy(bool)]
    largest, peak_live = none.largest, 0
    if len(mat):
        i = int(np.argmax(mat["score_bytes"].to_numpy()))
        row = mat.iloc[i]
        dtype, stage = row.get("dtype"), row.get("stage")
        largest = TraceScoreMatrix(
            bytes=int(row["score_bytes"]),
            shape=[int(x) for x in row["score_shape"]] if row["score_shape"] is not None else None,
            dtype=str(dtype) if isinstance(dtype, str) else None,
            op=str(row["name"]),
            stage=str(stage) if isinstance(stage, str) else None,
        )
        peak_live = int(mat["score_bytes"].max())  # a lower bound: ops do not say lifetimes
    names = sorted({str(n) for n in fused["name"]})[:3]
    return replace(
        none,
        count=int(len(mat)),
        peak_live_bytes=peak_live,
        largest=largest,
        # calls of PyTorch's SDPA ops that ran fused
        sdpa_calls=int(sum(fused_label([str(n)]) == FUSED for n in fused["name"])),
        # every fused attention call: SDPA, vLLM, flash-attn, xFormers, aiter/CK
        fused_calls=int(len(fused)),
        implementation="materialized (baddbmm/bmm + softmax)"
        if len(mat)
        else f"{fused_label(names)}: {len(fused)} call(s) of {', '.join(names)}"
        if len(fused)
        else NOT_DETERMINED,
    )
