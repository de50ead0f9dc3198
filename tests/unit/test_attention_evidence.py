"""A softmax is attention's only with attention evidence (issue 21, item 5).

Truth is what the synthetic program does, written here with the frames torch records
(stacks="all": the unwinder, the allocator, the ATen op, then Python): which allocations
are Q·K^T score matrices and which softmax inputs are something else. Two programs:

* a hand-written ``probs = self.softmax(q @ k.transpose(-2, -1) * scale)`` in a plain
  ``forward`` of the user's model, ``self.softmax`` an ``nn.Softmax`` (so the frame that
  calls F.softmax is torch's ``activation.py``), or ``torch.softmax`` (no Python frame at
  all): no attention name anywhere, the scores live at the peak;
* a GNN's node scores, ``torch.softmax(h @ w, 0)`` with ``h @ w`` a matrix-vector product
  (``at::_ops::mv``), and a classifier's logits from ``nn.Linear``: softmaxes, not attention.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_frame_rules import SP, load_dict

from snapviz.analyses.frame_rules import load_rules
from snapviz.analyses.pipeline import summary_of
from snapviz.analyses.summary import analyze_run
from snapviz.load import Run
from synth import MiB, Sim

USER = "/home/me/net.py"
UNWIND = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
        "filename": "CUDACachingAllocator.cpp",
        "line": 0,
    },
]
CALL = [
    {"name": "_call_impl", "filename": SP + "torch/nn/modules/module.py", "line": 1750},
    {"name": "_wrapped_call_impl", "filename": SP + "torch/nn/modules/module.py", "line": 1739},
]
MAIN = [
    {"name": "train", "filename": "/home/me/train.py", "line": 20},
    {"name": "<module>", "filename": "/home/me/train.py", "line": 50},
]


def _stack(ops: list[str], py: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        *UNWIND,
        *({"name": f"at::_ops::{op}::call(at::Tensor const&)", "filename": "", "line": 0} for op in ops),
        *py,
    ]


def _at(line: int, fn: str = "forward", inner: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [*(inner or []), {"name": fn, "filename": USER, "line": line}, *CALL, *MAIN]


F_SOFTMAX = {"name": "softmax", "filename": SP + "torch/nn/functional.py", "line": 2140}
NN_SOFTMAX = [F_SOFTMAX, {"name": "forward", "filename": SP + "torch/nn/modules/activation.py", "line": 1670}, *CALL]


def _analyse(sim: Sim) -> tuple[Any, dict[str, Any]]:
    an = analyze_run(
        Run(source="<synthetic>", label="x", snapshot=load_dict(sim.snapshot(marker=False)), trace=None, run_json=None),
        rules=load_rules(),
    )
    return an, summary_of(an)


@pytest.mark.parametrize("softmax", ["nn.Softmax", "torch.softmax"])
def test_hand_written_qk_softmax_is_found(softmax: str) -> None:
    B, H, L, D = 2, 8, 1024, 64
    score = B * H * L * L * 2  # fp16 [B, H, L, L]: 32 MiB
    sim = Sim()
    weights = sim.alloc(256 * MiB, frames=_stack(["empty"], _at(10, "__init__")))
    scores_live_at_peak = 0
    for _layer in range(2):
        q = sim.alloc(B * H * L * D * 2, frames=_stack(["linear", "matmul", "mm"], _at(40)))
        k = sim.alloc(B * H * L * D * 2, frames=_stack(["linear", "matmul", "mm"], _at(41)))
        s = sim.alloc(score, frames=_stack(["matmul", "bmm"], _at(43)))  # q @ k.transpose(-2, -1)
        s2 = sim.alloc(score, frames=_stack(["mul_Tensor"], _at(43)))  # * scale
        sim.free(s, frames=_at(43))
        if softmax == "nn.Softmax":
            p = sim.alloc(score, frames=_stack(["softmax_int", "_softmax"], _at(44, inner=NN_SOFTMAX)))
        else:
            p = sim.alloc(score, frames=_stack(["softmax_int", "_softmax"], _at(44)))
        o = sim.alloc(B * H * L * D * 2, frames=_stack(["matmul", "bmm"], _at(45)))  # probs @ v: not scores
        scores_live_at_peak = 2 * score
        peak = sim.peak_allocated(0)
        sim.free(s2, frames=_at(46))
        for h in (q, k, p, o):
            sim.free(h, frames=_at(46))
    an, doc = _analyse(sim)
    att = doc["attention"]
    assert att["materialized"] and att["count"] == 2 * 3  # per layer: q@k^T, its scaled copy, the softmax
    assert set(an.attention["requested_bytes"].tolist()) == {score}
    assert att["implementation"] == "materialized: softmax over a matmul in forward"
    assert doc["peak"]["allocated_bytes"] == peak
    cats = {c["category"]: c["bytes"] for c in doc["categories"]}
    assert cats["attention scores"] == scores_live_at_peak  # the scaled scores and the probabilities
    assert any("scaled_dot_product_attention" in a["how"] for a in doc["advice"])
    assert not weights.freed


def test_gnn_node_scores_and_logits_are_not_attention() -> None:
    """codeloc's GNN: ``update_nodes`` softmaxes a matrix-vector product over its nodes
    (130,220 B); a classifier softmaxes nn.Linear logits of the same size."""
    n_nodes = 32555
    node = n_nodes * 4
    sim = Sim()
    feats = sim.alloc(512 * MiB, frames=_stack(["empty"], _at(10, "__init__")))
    for _ in range(3):
        h = sim.alloc(n_nodes * 1024 * 4, frames=_stack(["linear", "matmul", "mm"], _at(195, "update_nodes")))
        e = sim.alloc(node, frames=_stack(["matmul", "mv"], _at(198, "update_nodes")))  # h @ w: [N]
        a = sim.alloc(node, frames=_stack(["softmax_int", "_softmax"], _at(199, "update_nodes", [F_SOFTMAX])))
        logits = sim.alloc(node, frames=_stack(["linear", "addmm"], _at(230, "classify")))  # nn.Linear
        probs = sim.alloc(node, frames=_stack(["softmax_int", "_softmax"], _at(231, "classify", NN_SOFTMAX)))
        for x in (h, e, a, logits, probs):
            sim.free(x, frames=_at(240))
    an, doc = _analyse(sim)
    att = doc["attention"]
    assert att["count"] == 0 and not att["materialized"] and len(an.attention) == 0
    assert att["implementation"] == "not determined"
    assert "attention scores" not in {c["category"] for c in doc["categories"]}
    assert not any("attention" in a["technique"] or "scaled_dot_product" in a["how"] for a in doc["advice"])
    assert not feats.freed


@pytest.mark.parametrize(
    "ops, verdict",
    [
        (
            ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention"],
            "fused (SDPA/flash): 1 call(s)",
        ),
        (["vllm::unified_attention_with_output"], "fused (vLLM paged attention): 1 call(s)"),
        (["flash_attn::_flash_attn_forward"], "fused (flash-attn): 1 call(s)"),
        (["xformers::efficient_attention_forward_cutlass"], "fused (xFormers): 1 call(s)"),
        (["aiter::mha_fwd"], "fused (ROCm aiter/CK): 1 call(s)"),
        (["aten::relu"], "not determined"),
    ],
)
def test_fused_kernels_are_named_for_what_they_are(ops: list[str], verdict: str, tmp_path: Any) -> None:
    """A trace's fused attention op: SDPA's are "SDPA/flash"; vLLM's paged attention,
    flash-attn, xFormers and ROCm aiter/CK kernels are not called SDPA."""
    import json

    from snapviz.analyses import trace_ops
    from snapviz.analyses.trace_attention import attention_verdict
    from snapviz.load.trace.chrome_trace import load_chrome_trace

    t0 = 1_700_000_000_000_000
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": n,
            "pid": 1,
            "tid": 1,
            "ts": t0 + i,
            "dur": 100 - 2 * i,
            "args": {"Input Dims": [[1, 8, 128, 64], [1, 8, 128, 64], [1, 8, 128, 64]]},
        }
        for i, n in enumerate(ops)
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    att = attention_verdict(trace_ops.attention_ops(load_chrome_trace(str(p))))
    assert att.implementation.startswith(verdict), att


@pytest.mark.parametrize(
    "frame, verdict",
    [
        ({"name": "_scaled_dot_product_flash_attention", "filename": "", "line": 0}, "fused (SDPA/flash)"),
        (
            {
                "name": "paged_attention_forward",
                "filename": SP + "transformers/integrations/flash_paged.py",
                "line": 30,
            },
            "fused (paged attention)",
        ),
        (
            {"name": "flash_attn_func", "filename": SP + "flash_attn/flash_attn_interface.py", "line": 800},
            "fused (flash-attn)",
        ),
    ],
)
def test_fused_frames_are_named_for_what_they_are(frame: dict[str, Any], verdict: str) -> None:
    sim = Sim()
    h = sim.alloc(8 * MiB, frames=[frame, *_at(50)])
    sim.free(h, frames=_at(51))
    _, doc = _analyse(sim)
    assert doc["attention"]["implementation"].startswith(verdict + ":"), doc["attention"]
    assert doc["attention"]["fused"] and doc["attention"]["count"] == 0
