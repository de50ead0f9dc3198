"""Attention score matrices (``snapviz.analyses.attention``).

Truth: the synthetic pipelines of ``test_frame_rules`` know every score matrix they
allocate and the bytes of scores live after each trace entry; the hand-built stacks
below mirror the real code of ``get_attention_scores`` (diffusers), transformers'
``eager_attention_forward`` and diffusers' ``_native_math_attention``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_frame_rules import SP, diffusion_run, load_dict

from snapviz.analyses.attention import FUSED, find_attention, guess_score_shape, live_attention_series
from snapviz.analyses.document import Attention
from snapviz.analyses.frame_rules import load_rules
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.score_evidence import score_alloc_mask
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stack_tables import StackTables
from snapviz.analyses.stages import label_events, stage_intervals, stage_table
from snapviz.model import A_ALLOC, Snapshot
from synth import GiB, MiB, Sim


def analyse(
    snap: Snapshot, labels: np.ndarray | None = None, rules: str | None = None, run_json: dict[str, Any] | None = None
) -> tuple[Any, Any, Attention]:
    rep = replay_allocator(snap, 0)
    ev = rep.events
    if labels is None:
        labels = label_events(snap, ev, 0, rules=load_rules(rules), run_json=run_json).labels
    st = stage_table(
        stage_intervals(labels, ev["time_us"].to_numpy()),
        ev["allocated"].to_numpy(),
        ev["reserved"].to_numpy(),
        rep.baseline_allocated,
        rep.baseline_reserved,
    )
    tables = StackTables(snap)
    table, summary = find_attention(snap, rep, labels, st, SiteNamer(snap, tables), load_rules(rules), tables, run_json)
    return rep, table, summary


# --- shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nbytes, run, shape, heads, batch, stage",
    [
        # SD 1.5 512², one image with CFG: 16 = 2 x 8 heads; two images: 32 = 4 x 8 (DESIGN.md: 1 GiB)
        (
            16 * 4096 * 4096 * 2,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 1, "dtype": "fp16"},
            [16, 4096, 4096],
            8,
            2,
            None,
        ),
        (
            GiB,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 2, "dtype": "fp16"},
            [32, 4096, 4096],
            8,
            4,
            "denoise",
        ),
        # the fp32 softmax of the same matrix
        (
            2 * GiB,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 2, "dtype": "fp16"},
            [32, 4096, 4096],
            8,
            4,
            "denoise",
        ),
        # cross-attention against the 77 CLIP tokens
        (
            16 * 4096 * 77 * 2,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 1, "dtype": "fp16"},
            [16, 4096, 77],
            8,
            2,
            "denoise",
        ),
        # SDXL 1024²: attention starts at 64x64 = 4096 tokens with 10 heads
        (
            20 * 4096 * 4096 * 2,
            {"pipeline": "sdxl", "height": 1024, "width": 1024, "batch": 1, "dtype": "fp16"},
            [20, 4096, 4096],
            10,
            2,
            "denoise",
        ),
        # PixArt-Σ 1024²: patch 2 -> 4096 tokens, 16 heads; keys = 300 T5 tokens
        (
            32 * 4096 * 300 * 2,
            {"pipeline": "pixart-sigma", "height": 1024, "width": 1024, "batch": 1, "dtype": "fp16"},
            [32, 4096, 300],
            16,
            2,
            "denoise",
        ),
        # the VAE's mid-block attention: one head, no CFG (the same bytes as [16, 1024, 1024]: the stage decides)
        (
            1 * 4096 * 4096 * 2,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 1, "dtype": "fp16"},
            [1, 4096, 4096],
            1,
            1,
            "vae_decode",
        ),
        (
            1 * 4096 * 4096 * 2,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 1, "dtype": "fp16"},
            [16, 1024, 1024],
            8,
            2,
            "denoise",
        ),
        # CLIP-L in eager mode: [2 x 12, 77, 77]
        (
            24 * 77 * 77 * 2,
            {"pipeline": "sd15", "height": 512, "width": 512, "batch": 1, "dtype": "fp16"},
            [24, 77, 77],
            12,
            2,
            "text_encode",
        ),
    ],
)
def test_guess_score_shape(
    nbytes: int, run: dict[str, Any], shape: list[int], heads: int, batch: int, stage: str | None
) -> None:
    g = guess_score_shape(nbytes, run, stage=stage)
    assert g is not None
    assert (g["shape"], g["heads"], g["batch"]) == (shape, heads, batch)
    itemsize = nbytes // (shape[0] * shape[1] * shape[2])
    assert g["dtype"] == {2: "fp16/bf16", 4: "fp32"}[itemsize]


def test_guess_without_run_still_multiplies_out() -> None:
    for nbytes in (GiB, 16 * 4096 * 77 * 2, 3 * 1024 * 1024 * 2):
        g = guess_score_shape(nbytes, None)
        assert g is not None
        bh, q, k = g["shape"]
        assert bh * q * k * {"fp16/bf16": 2, "fp32": 4}[g["dtype"]] == nbytes
    assert guess_score_shape(12345, None) is None


# --- the pipelines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        dict(pipe="sd15"),
        dict(pipe="sd15", images=2),
        dict(pipe="sdxl"),
        dict(pipe="pixart", steps=3),
        dict(pipe="sd15", offload="sequential"),
    ],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)
def test_classic_attention_count_peak_and_shape(case: dict[str, Any]) -> None:
    pr = diffusion_run(**case)
    snap = load_dict(pr.snapshot_dict(labels=False))
    rep, table, s = analyse(snap)
    assert s.count == len(pr.score_bytes)
    assert sorted(table["requested_bytes"].tolist()) == sorted(pr.score_bytes)
    assert s.peak_live_bytes == pr.score_peak_live
    np.testing.assert_array_equal(live_attention_series(rep, table), pr.score_live_series())
    assert s.materialized and s.implementation_source == "inferred"
    assert "get_attention_scores" in s.implementation
    assert set(table["function"]) == {"get_attention_scores"}
    # with run.json: the guess uses the run's geometry and heads
    _, table, s = analyse(snap, run_json=pr.run)
    d = pr.desc
    n = d.tokens[0]
    b = 2 * pr.run["batch"]
    assert s.largest.shape == [b * d.heads, n, n]
    assert (s.largest.heads, s.largest.batch) == (d.heads, b)
    assert s.largest.bytes == b * d.heads * n * n * 2
    assert s.implementation_source == "run.json" and "classic" in s.implementation


def test_share_of_each_stage_peak() -> None:
    pr = diffusion_run("sd15", images=2)
    snap = load_dict(pr.snapshot_dict())
    labels = pr.truth_labels()
    rep, table, s = analyse(snap, labels, run_json=pr.run)
    truth_live = pr.score_live_series()
    alloc = rep.events["allocated"].to_numpy()
    # independent: per denoise step, the row of the allocator's peak and the scores live then
    for item in s.stages:
        rows = np.flatnonzero(labels == item.stage)
        peak_row = rows[np.argmax(alloc[rows])]
        assert item.live_bytes_at_stage_peak == truth_live[peak_row]
        assert item.share_of_stage_peak == pytest.approx(truth_live[peak_row] / alloc[peak_row])
        assert item.max_live_bytes == truth_live[rows].max()
    stages_with_scores = {x.stage for x in s.stages}
    assert stages_with_scores == {f"denoise/{i}" for i in range(4)}
    grp = {g.stage: g for g in s.stage_groups}
    assert set(grp) == {"denoise"} and 0 < grp["denoise"].share_of_stage_peak < 1


def test_sdpa_run_materializes_nothing() -> None:
    pr = diffusion_run("sd15", attention="sdpa")
    snap = load_dict(pr.snapshot_dict(labels=False))
    _, table, s = analyse(snap)
    assert s.count == 0 and len(table) == 0 and s.peak_live_bytes == 0
    assert s.implementation.startswith(FUSED) and not s.materialized and s.fused
    _, _, s = analyse(snap, run_json=pr.run)
    assert s.implementation_source == "run.json" and "SDPA" in s.implementation


# --- which allocations inside a score function are scores --------------------------------------------


def _one_call(sim: Sim, steps: list[tuple[str, int, list[dict[str, Any]]]], want: list[bool]) -> list[bool]:
    """Allocate (and free, LIFO at the end) each (kind, bytes, frames); record truth."""
    hs = []
    for kind, n, fr in steps:
        hs.append((sim.alloc(n, frames=fr), fr))
        want.append(kind == "score")
    for h, fr in reversed(hs):
        sim.free(h, frames=fr)
    return want


def test_eager_attention_counts_scores_not_the_output() -> None:
    """transformers' eager_attention_forward (CLIP, 77 tokens, 12 heads): QK^T, the mask add,
    the fp32 softmax and its cast are scores; attn @ V and .contiguous() are not, though
    they are almost as large."""
    sim = Sim()
    f = SP + "transformers/models/clip/modeling_clip.py"
    outer = [
        {"name": "forward", "filename": f, "line": 330},
        {
            "name": "encode_prompt",
            "filename": SP + "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py",
            "line": 423,
        },
    ]

    def at(line: int, inner: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        return (inner or []) + [{"name": "eager_attention_forward", "filename": f, "line": line}] + outer

    soft = [{"name": "softmax", "filename": SP + "torch/nn/functional.py", "line": 2140}]
    S = 2 * 12 * 77 * 77 * 2
    want: list[bool] = []
    for _ in range(3):
        _one_call(
            sim,
            [
                ("score", S, at(269)),
                ("score", S, at(269)),
                ("score", S, at(271)),
                ("score", 2 * S, at(272, soft)),
                ("score", S, at(272)),
                ("out", 2 * 77 * 768 * 2, at(275)),
                ("out", 2 * 77 * 768 * 2, at(276)),
            ],
            want,
        )
    snap = load_dict(sim.snapshot(marker=False))
    ev = snap.device_events(0)
    mask = score_alloc_mask(snap, ev, load_rules(), StackTables(snap))
    allocs = ev["action"].to_numpy() == A_ALLOC
    assert list(mask[allocs]) == want


def test_upcast_query_key_are_not_scores() -> None:
    """get_attention_scores with upcast_attention: query.float()/key.float() are [bh, N, d]."""
    sim = Sim()
    gas = SP + "diffusers/models/attention_processor.py"
    outer = [
        {"name": "__call__", "filename": gas, "line": 1155},
        {"name": "forward", "filename": SP + "diffusers/models/unets/unet_2d_condition.py", "line": 1143},
    ]

    def at(line: int) -> list[dict[str, Any]]:
        return [{"name": "get_attention_scores", "filename": gas, "line": line}] + outer

    want: list[bool] = []
    for n in (4096, 1024):
        S = 10 * n * n * 4
        _one_call(
            sim,
            [
                ("q", 10 * n * 64 * 4, at(674)),
                ("k", 10 * n * 64 * 4, at(675)),
                ("score", S, at(679)),
                ("score", S, at(687)),
                ("score", S, at(699)),
            ],
            want,
        )
        _one_call(
            sim,
            [
                ("q", 10 * n * 64 * 4, at(674)),
                ("k", 10 * 77 * 64 * 4, at(675)),
                ("score", 10 * n * 77 * 4, at(687)),
                ("score", 10 * n * 77 * 4, at(699)),
            ],
            want,
        )
    snap = load_dict(sim.snapshot(marker=False))
    ev = snap.device_events(0)
    mask = score_alloc_mask(snap, ev, load_rules(), StackTables(snap))
    assert list(mask[ev["action"].to_numpy() == A_ALLOC]) == want


def test_native_math_attention_single_line_kernel() -> None:
    """Flux with the _native_math backend: every allocation of SDPA's math kernel comes from
    one Python line; the [b, h, N, N] ones are scores, the [b, h, N, d] ones are not."""
    sim = Sim()
    disp = SP + "diffusers/models/attention_dispatch.py"
    fr = [
        {"name": "_native_math_attention", "filename": disp, "line": 3953},
        {"name": "dispatch_attention_fn", "filename": disp, "line": 450},
        {"name": "__call__", "filename": SP + "diffusers/models/transformers/transformer_flux.py", "line": 121},
    ]
    n, h, d = 4608, 24, 128
    want: list[bool] = []
    for _ in range(2):
        _one_call(
            sim,
            [
                ("q", h * n * d * 2, fr),
                ("score", h * n * n * 2, fr),
                ("score", h * n * n * 2, fr),
                ("out", h * n * d * 2, fr),
            ],
            want,
        )
    snap = load_dict(sim.snapshot(marker=False))
    ev = snap.device_events(0)
    assert list(score_alloc_mask(snap, ev, load_rules(), StackTables(snap))[ev["action"].to_numpy() == A_ALLOC]) == want
    _, table, s = analyse(
        snap, run_json={"pipeline": "flux", "height": 1024, "width": 1024, "batch": 1, "dtype": "bf16"}
    )
    assert s.count == 4 and "math" in s.implementation
    assert s.largest.shape == [24, 4608, 4608] and s.largest.heads == 24


def test_user_attention_function(tmp_path: Path) -> None:
    """A custom attention kernel named in a rules file counts as a score site."""
    sim = Sim()
    fr = [
        {"name": "my_attention", "filename": "/home/me/attn.py", "line": 10},
        {"name": "forward", "filename": SP + "diffusers/models/unets/unet_2d_condition.py", "line": 1143},
    ]
    h = sim.alloc(16 * 4096 * 4096 * 2, frames=fr)
    sim.free(h, frames=fr)
    snap = load_dict(sim.snapshot(marker=False))
    _, _, s = analyse(snap)
    assert s.count == 0
    rules = tmp_path / "r.json"
    rules.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "rules": [
                    {"kind": "category", "name": "attention scores", "function": "^my_attention$", "priority": 300}
                ],
            }
        )
    )
    snap = load_dict(sim.snapshot(marker=False))
    _, table, s = analyse(snap, rules=str(rules))
    assert s.count == 1 and list(table["function"]) == ["my_attention"]
    assert s.peak_live_bytes == 16 * 4096 * 4096 * 2 == 512 * MiB
