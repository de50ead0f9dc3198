"""Attribution of Flux.1 and SD 3.5 snapshots from stack frames alone.

As in tests/unit/test_frame_rules.py, a pipeline call is played through the reference allocator
(tests/support/synth.py) with the frames the installed sources produce — diffusers 0.42.1
``pipeline_flux.py`` / ``transformer_flux.py`` (double-stream ``FluxTransformerBlock``,
single-stream ``FluxSingleTransformerBlock``, ``FluxAttnProcessor`` -> ``dispatch_attention_fn`` ->
``_native_attention``, ``FluxPosEmbed`` -> ``get_1d_rotary_pos_embed``), ``pipeline_stable_diffusion_3.py``
/ ``transformer_sd3.py`` (``JointTransformerBlock`` in ``attention.py``, ``JointAttnProcessor2_0``
calling SDPA), transformers 5 ``modeling_t5.py`` (``T5Attention`` -> ``sdpa_attention_forward`` or
``eager_attention_forward``, blocks called through ``GradientCheckpointingLayer.__call__``) and
``modeling_clip.py`` — labelled the way the collectors label a run, with models built directly on the
device. The labels are then stripped and the frames alone must give back the stages, the attention
verdict and the categories (weights by model, rotary embeddings, latents).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from test_attention import analyse
from test_frame_rules import MODULE, NO_GRAD, group_peaks, load_dict, stack

from snapviz.analyses.attention import FUSED
from snapviz.analyses.categories import allocation_table
from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.stages import stage_group
from snapviz.category_vocab import canonical_category
from snapviz.model import A_ALLOC
from synth import MiB, Sim

D = "diffusers/models/"
FLUX_T = D + "transformers/transformer_flux.py"
SD3_T = D + "transformers/transformer_sd3.py"
DISPATCH = D + "attention_dispatch.py"
T5 = "transformers/models/t5/modeling_t5.py"
CLIP = "transformers/models/clip/modeling_clip.py"
COLLECT = "/work/snapviz/collectors/pipelines.py"
USER = "<module>@/home/me/run_flux.py:{}"


@dataclass
class Played:
    sim: Sim
    stages: list[dict[str, Any]] = field(default_factory=list)  # allocator truth per stage
    cats: dict[int, str] = field(default_factory=dict)  # trace index -> what it is
    scores: int = 0  # score matrices allocated

    def truth_labels(self) -> np.ndarray:
        return np.array([e["user_metadata"] for e in self.sim.snapshot(marker=False)["device_traces"][0]], dtype=object)

    def stripped(self) -> Any:
        d = self.sim.snapshot(marker=False, annotations=False)
        for e in d["device_traces"][0]:
            e["user_metadata"] = ""
        return load_dict(d)


def play(
    pipe: str = "flux",
    *,
    steps: int = 3,
    t5: bool = True,
    attention: str = "sdpa",
    t5_attention: str = "sdpa",
    t5_direct: bool = False,
) -> Played:
    """One call of a small-geometry Flux (no CFG) or SD 3.5 (CFG) pipeline, labelled as the collectors do.

    ``t5_direct``: the script runs the T5 encoder itself (``pipe.text_encoder_2(ids)``, prompt
    embeddings passed in), so no pipeline frame is above the T5 frames."""
    flux = pipe == "flux"
    sim = Sim(seed=1)
    pr = Played(sim)
    cur: list[str | None] = [None]
    trace = sim.devices[0].trace

    def mark(label: str | None) -> None:
        if cur[0] is not None:
            pr.stages.append({"name": cur[0], "peak_allocated_bytes": sim.peak_allocated()})
        sim.set_label(label or "")
        sim.reset_peak()
        cur[0] = label

    def alloc(n: int, frames: tuple[str, ...], cat: str = "") -> Any:
        h = sim.alloc(n, frames=stack(*frames))
        if cat:
            pr.cats[len(trace) - 1] = cat
        return h

    def free(h: Any, frames: tuple[str, ...]) -> None:
        sim.free(h, frames=stack(*frames))

    pfile = (
        "diffusers/pipelines/flux/pipeline_flux.py"
        if flux
        else "diffusers/pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py"
    )
    call = (f"__call__@{pfile}:901", *NO_GRAD, USER.format(20))
    B = 1 if flux else 2  # Flux.1-dev is guidance-distilled: no CFG batch
    tokens, text_len, heads = 1024, 512 if flux else 333, 24

    # --- load: every model built directly on the device (collectors/pipelines.py)
    mark("load")
    built = ("inner_init@diffusers/configuration_utils.py:700", f"build_pipeline@{COLLECT}:260", USER.format(10))
    weights = []
    for i in range(12):
        weights.append(
            alloc(
                40 * MiB + 512 * i,
                (
                    "__init__@torch/nn/modules/linear.py:106",
                    f"__init__@{FLUX_T if flux else D + 'attention.py'}:430",
                    f"<listcomp>@{FLUX_T if flux else SD3_T}:645",
                    f"__init__@{FLUX_T if flux else SD3_T}:645",
                    *built,
                ),
                "weights: transformer",
            )
        )
    if t5:
        for i in range(6):
            weights.append(
                alloc(
                    30 * MiB + 512 * i,
                    (
                        "__init__@torch/nn/modules/linear.py:106",
                        f"__init__@{T5}:100",
                        f"__init__@{T5}:130",
                        f"__init__@{T5}:445",
                        f"__init__@{T5}:650",
                        f"__init__@{T5}:1090",
                        f"_t5@{COLLECT}:170",
                        USER.format(10),
                    ),
                    "weights: T5",
                )
            )
    for _ in range(4):
        weights.append(
            alloc(
                5 * MiB,
                (
                    "__init__@torch/nn/modules/sparse.py:170",
                    f"__init__@{CLIP}:230",
                    f"__init__@{CLIP}:490",
                    f"_clip@{COLLECT}:150",
                    USER.format(10),
                ),
                "weights: CLIP",
            )
        )
    for _ in range(3):
        weights.append(
            alloc(
                3 * MiB,
                (
                    "__init__@torch/nn/modules/conv.py:520",
                    f"__init__@{D}resnet.py:300",
                    f"__init__@{D}unets/unet_2d_blocks.py:2600",
                    f"get_up_block@{D}unets/unet_2d_blocks.py:180",
                    f"__init__@{D}autoencoders/vae.py:250",
                    f"__init__@{D}autoencoders/autoencoder_kl.py:100",
                    *built,
                ),
                "weights: VAE",
            )
        )

    # --- text encoding (CLIP, then T5 or SD 3.5's zeros without it)
    mark("text_encode")
    enc = (f"encode_prompt@{pfile}:330", *call)
    embeds = []
    for _ in range(1 if flux else 2):  # SD 3.5: CLIP-L and CLIP-G
        clip = (f"_get_clip_prompt_embeds@{pfile}:290", *enc)
        layer = (
            f"forward@{CLIP}:370",
            "__call__@transformers/modeling_layers.py:93",
            f"forward@{CLIP}:470",
            f"forward@{CLIP}:520",
            "wrapper@transformers/utils/generic.py:900",
            *MODULE,
            *clip,
        )
        for _ in range(3):
            h = alloc(B * 77 * 768 * 2, (f"forward@{CLIP}:350", *MODULE, *layer), "activations")
            o = alloc(
                B * 77 * 768 * 2,
                (
                    "sdpa_attention_forward@transformers/integrations/sdpa_attention.py:96",
                    f"forward@{CLIP}:321",
                    *MODULE,
                    *layer,
                ),
                "activations",
            )
            free(h, layer)
            free(o, layer)
        embeds.append(alloc(B * 77 * 768 * 2, clip, "latents & embeddings"))
    t5f = (USER.format(15),) if t5_direct else (f"_get_t5_prompt_embeds@{pfile}:240", *enc)
    if t5:
        stackf = (f"forward@{T5}:720", *MODULE, f"forward@{T5}:1130", *MODULE, *t5f)
        block = (f"forward@{T5}:470", "__call__@transformers/modeling_layers.py:93", *stackf)
        attn = (f"forward@{T5}:356", *MODULE, f"forward@{T5}:395", *MODULE, *block)
        bias = alloc(
            64 * text_len * text_len * 2,
            (f"compute_bias@{T5}:270", f"forward@{T5}:340", *MODULE, f"forward@{T5}:395", *MODULE, *block),
            "activations",
        )
        for _ in range(3):
            h = alloc(
                B * text_len * 4096 * 2,
                (f"forward@{T5}:110", *MODULE, f"forward@{T5}:140", *MODULE, *block),
                "activations",
            )
            if t5_attention == "eager":  # eager_attention_forward: matmul * scaling, + bias, softmax
                S = B * 64 * text_len * text_len * 2
                e = alloc(S, (f"eager_attention_forward@{T5}:160", *attn), "attention scores")
                b = alloc(S, (f"eager_attention_forward@{T5}:163", *attn), "attention scores")
                free(e, (f"eager_attention_forward@{T5}:163", *attn))
                p = alloc(
                    S,
                    ("softmax@torch/nn/functional.py:2140", f"eager_attention_forward@{T5}:168", *attn),
                    "attention scores",
                )
                free(b, (f"eager_attention_forward@{T5}:168", *attn))
                o = alloc(B * text_len * 4096 * 2, (f"eager_attention_forward@{T5}:171", *attn), "activations")
                free(p, attn)
                pr.scores += 3
            else:
                o = alloc(
                    B * text_len * 4096 * 2,
                    ("sdpa_attention_forward@transformers/integrations/sdpa_attention.py:96", *attn),
                    "activations",
                )
            free(h, block)
            free(o, block)
        free(bias, stackf)
        # the encoder's last hidden state (T5Stack's final layer norm), kept as the prompt embedding
        embeds.append(
            alloc(
                B * text_len * 4096 * 2,
                (f"forward@{T5}:745", *MODULE, *stackf[2:]) if t5_direct else t5f,
                "latents & embeddings",
            )
        )
    else:  # SD 3.5 without T5: zeros of the T5 embedding's shape
        embeds.append(alloc(B * text_len * 4096 * 2, t5f, "latents & embeddings"))
    lat = B * 16 * 64 * 64 * 2
    noise = alloc(
        lat,
        ("randn_tensor@diffusers/utils/torch_utils.py:170", f"prepare_latents@{pfile}:570", *call),
        "latents & embeddings",
    )
    if flux:
        latents = alloc(
            lat, (f"_pack_latents@{pfile}:525", f"prepare_latents@{pfile}:575", *call), "latents & embeddings"
        )
        free(noise, call)
        ids = alloc(
            tokens * 3 * 2,
            (f"_prepare_latent_image_ids@{pfile}:515", f"prepare_latents@{pfile}:578", *call),
            "latents & embeddings",
        )
    else:
        latents = noise
    ts = alloc(
        8 * steps,
        (
            "set_timesteps@diffusers/schedulers/scheduling_flow_match_euler_discrete.py:300",
            f"retrieve_timesteps@{pfile}:120",
            *call,
        ),
        "latents & embeddings",
    )

    # --- denoising
    per_tok = B * (tokens + text_len) * 3072 * 2
    S = B * heads * (tokens + text_len) ** 2 * 2
    for i in range(steps):
        lmi = alloc(B * lat, (f"__call__@{pfile}:1050", *NO_GRAD, USER.format(20))) if not flux else None
        mark(f"denoise/{i}")
        den = (f"forward@{FLUX_T if flux else SD3_T}:735", *MODULE, "wrapper@diffusers/utils/peft_utils.py:323", *call)
        temb = alloc(B * 3072 * 2, (f"forward@{D}embeddings.py:1600", *MODULE, *den), "activations")
        rope: list[Any] = []
        if flux:
            pos = (f"forward@{FLUX_T}:512", *MODULE, *den)
            tmp = [
                alloc(
                    (tokens + text_len) * 64 * 8,
                    (f"get_1d_rotary_pos_embed@{D}embeddings.py:1150", *pos),
                    "rotary embeddings",
                )
                for _ in range(3)
            ]
            rope = [
                alloc((tokens + text_len) * 128 * 4, (f"forward@{FLUX_T}:521", *MODULE, *den), "activations")
                for _ in range(2)
            ]
            for h in tmp:
                free(h, pos)
        blocks = (
            [(f"forward@{FLUX_T}:460", "forward@" + FLUX_T + ":350")] * 2
            + [(f"forward@{FLUX_T}:400", "forward@" + FLUX_T + ":350")] * 2
            if flux
            else [(f"forward@{D}attention.py:700", f"forward@{D}attention_processor.py:560")] * 3
        )
        for blk, attn_fwd in blocks:
            b = (blk, *MODULE, *den)
            proc = (
                (f"__call__@{FLUX_T}:121" if flux else f"__call__@{D}attention_processor.py:1484"),
                attn_fwd,
                *MODULE,
                *b,
            )
            q = alloc(
                per_tok,
                (f"_get_projections@{FLUX_T}:50", f"_get_qkv_projections@{FLUX_T}:72", *proc[:1], *proc[1:])
                if flux
                else proc,
                "activations",
            )
            if flux:
                r = alloc(2 * per_tok, (f"apply_rotary_emb@{D}embeddings.py:1210", *proc), "activations")
                free(r, proc)
            if attention == "math":  # the materializing dispatch backend
                mf = (f"_native_math_attention@{DISPATCH}:3953", f"dispatch_attention_fn@{DISPATCH}:450", *proc)
                sc = alloc(S, mf, "attention scores")
                pb = alloc(S, mf, "attention scores")
                free(sc, mf)
                o = alloc(per_tok, mf, "activations")
                free(pb, mf)
                pr.scores += 2
            elif flux:
                o = alloc(
                    per_tok,
                    (f"_native_attention@{DISPATCH}:3760", f"dispatch_attention_fn@{DISPATCH}:450", *proc),
                    "activations",
                )
            else:
                o = alloc(per_tok, proc, "activations")
            free(q, b)
            free(o, b)
        out = alloc(B * lat, (f"forward@{FLUX_T if flux else SD3_T}:790", *MODULE, *den), "activations")
        for h in rope:
            free(h, den)
        free(temb, den)
        if lmi is not None:
            free(lmi, call)
        sched = (
            "step@diffusers/schedulers/scheduling_flow_match_euler_discrete.py:480",
            f"__call__@{pfile}:933",
            *NO_GRAD,
            USER.format(20),
        )
        # Flux unpacks the last step's latents and drops them within that step: short-lived, so
        # activations by the scheduler-state rule (which counts long-lived scheduler outputs only)
        new = alloc(lat, sched, "activations" if flux and i == steps - 1 else "latents & embeddings")
        free(out, sched)
        free(latents, sched)
        latents = new

    # --- VAE decode
    if flux:
        un = alloc(
            lat,
            (f"_unpack_latents@{pfile}:540", f"__call__@{pfile}:961", *NO_GRAD, USER.format(20)),
            "latents & embeddings",
        )
        free(latents, call)
        latents = un
    scaled = alloc(lat, (f"__call__@{pfile}:963", *NO_GRAD, USER.format(20)), "latents & embeddings")
    mark("vae_decode")
    dec = (
        f"forward@{D}autoencoders/vae.py:300",
        *MODULE,
        f"_decode@{D}autoencoders/autoencoder_kl.py:206",
        f"decode@{D}autoencoders/autoencoder_kl.py:235",
        "wrapper@diffusers/utils/accelerate_utils.py:49",
        *call,
    )
    bufs = [
        alloc(B * 128 * 512 * 512 * 2 // (4**k), (f"forward@{D}resnet.py:370", *MODULE, *dec), "vae buffers")
        for k in range(3)
    ]
    image = alloc(3 * 512 * 512 * 2, dec, "vae buffers")
    for h in bufs:
        free(h, dec)
    free(scaled, call)
    post = ("postprocess@diffusers/image_processor.py:300", *call)
    img = alloc(3 * 512 * 512 * 4, post, "vae buffers")
    free(image, post)
    for h in embeds + [ts] + ([ids] if flux else []):
        free(h, (USER.format(20),))
    mark("other")
    mine = alloc(4096, (USER.format(21),))  # the user's own code after the call
    for h in (latents, img, mine):
        free(h, (USER.format(22),))
    mark(None)
    return pr


CASES = [
    dict(pipe="flux"),
    dict(pipe="flux", attention="math"),
    dict(pipe="flux", t5_attention="eager"),
    dict(pipe="flux", t5_direct=True),
    dict(pipe="sd3"),
    dict(pipe="sd3", t5=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_stages_from_frames_alone(case: dict[str, Any]) -> None:
    pr = play(**case)
    truth = pr.truth_labels()
    snap = pr.stripped()
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    wrong = np.flatnonzero(labels != truth)
    assert not len(wrong), [(int(i), truth[i], labels[i]) for i in wrong[:5]]
    steps = sorted({s for s in labels if str(s).startswith("denoise/")})
    assert steps == [f"denoise/{i}" for i in range(3)]
    got = group_peaks(rep, labels)
    for s in pr.stages:
        g = stage_group(s["name"])
        assert got[g] >= s["peak_allocated_bytes"] * 0.97
    truth_groups: dict[str, int] = {}
    for s in pr.stages:
        truth_groups[stage_group(s["name"])] = max(
            truth_groups.get(stage_group(s["name"]), 0), s["peak_allocated_bytes"]
        )
    for g, peak in truth_groups.items():
        assert abs(got[g] - peak) <= 0.03 * peak, (g, got[g], peak)


@pytest.mark.parametrize(
    "case, verdict, functions",
    [
        (dict(pipe="flux"), FUSED, {}),
        (dict(pipe="sd3"), FUSED, {}),
        (dict(pipe="flux", attention="math"), "materialized", {"_native_math_attention": 3 * 4 * 2}),
        (dict(pipe="flux", t5_attention="eager"), "materialized", {"eager_attention_forward": 3 * 3}),
    ],
)
def test_attention_verdict_from_frames(case: dict[str, Any], verdict: str, functions: dict[str, int]) -> None:
    pr = play(**case)
    _, table, summary = analyse(pr.stripped())
    assert summary.implementation.startswith(verdict), summary.implementation
    assert summary.count == pr.scores and summary.functions == functions
    if verdict == FUSED:
        assert summary.fused_evidence
    else:
        rows = {int(r) for r in table["row"]}
        assert rows == {i for i, c in pr.cats.items() if c == "attention scores"}
        stage = "text_encode" if "t5_attention" in case else "denoise"
        assert {stage_group(s) for s in table["stage"]} == {stage}


@pytest.mark.parametrize(
    "case",
    [dict(pipe="flux"), dict(pipe="sd3"), dict(pipe="flux", attention="math")],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)
def test_categories_weights_by_model_rotary_latents(case: dict[str, Any]) -> None:
    pr = play(**case)
    snap = pr.stripped()
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    ev = rep.events
    rows = np.flatnonzero(ev["action"].to_numpy() == A_ALLOC)
    t = allocation_table(snap, rep, labels)
    assert t["row"].tolist() == rows.tolist()
    got = dict(zip(rows.tolist(), t["category"].astype(str).tolist(), strict=True))
    checked = {
        "parameter: transformer",
        "parameter: T5",
        "parameter: CLIP",
        "parameter: VAE",
        "rotary embeddings",
        "latents & embeddings",
        "attention scores",
    }
    # the builder tags with the names snapviz used before the one vocabulary
    truth = {i: canonical_category(c) for i, c in pr.cats.items()}
    wrong = [(i, c, got[i]) for i, c in truth.items() if c in checked and got[i] != c]
    assert not wrong, wrong[:5]
    seen = {c for c in truth.values() if c in checked}
    assert {
        "parameter: transformer",
        "parameter: T5",
        "parameter: CLIP",
        "parameter: VAE",
        "latents & embeddings",
    } <= seen
    assert ("rotary embeddings" in seen) == (case["pipe"] == "flux")
