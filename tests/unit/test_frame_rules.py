"""Stage labels from stack frames (``snapviz.analyses.frame_rules``).

The truth comes from outside the code under test: a diffusion pipeline is played through
``tests/support/synth.py`` (the reference allocator) with the frames diffusers really produces
(shared/reference/diffusers.md §5), labelled the way the collectors label a run (a
label at ``__call__`` start, at each denoiser forward pre-hook, at ``vae.decode``, after
the call) and with the allocator's own per-stage peaks taken after ``reset_peak()`` at
each boundary. The labels are then stripped and the frames alone must give them back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paths import ROOT
from snapviz.analyses.frame_labels import label_from_frames
from snapviz.analyses.frame_rules import load_rules
from snapviz.analyses.replay import replay_allocator
from snapviz.analyses.stages import label_events, stage_group
from snapviz.errors import InputError
from snapviz.load import Run
from snapviz.load.snapshot.builder import snapshot_from_dict
from snapviz.model import A_ALLOC, A_FREE_DONE, A_FREE_REQ, Snapshot
from synth import MiB, Sim

SP = "/opt/conda/lib/python3.11/site-packages/"
_STACKS: dict[tuple[Any, ...], list[dict[str, Any]]] = {}


def stack(*specs: str, cpp: bool = False) -> list[dict[str, Any]]:
    """Frames innermost first from ``"name@path:line"``; one shared list per distinct stack,
    as c10 dedups tracebacks. ``cpp``: interleave C++ frames as ``stacks="all"`` does."""
    key = (specs, cpp)
    hit = _STACKS.get(key)
    if hit is not None:
        return hit
    out = []
    for s in specs:
        name, rest = s.split("@", 1)
        path, line = rest.rsplit(":", 1)
        out.append({"name": name, "filename": path if path.startswith("/") else SP + path, "line": int(line)})
    if cpp:
        out.insert(
            0,
            {
                "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                "filename": "??",
                "line": 0,
            },
        )
        out.insert(1, {"name": "at::native::empty_cuda", "filename": "EmptyTensor.cpp", "line": 0})
        out.insert(len(out) // 2, {"name": "_PyEval_EvalFrameDefault", "filename": "", "line": 0})
        out.append({"name": "_start", "filename": "??", "line": 0})
    _STACKS[key] = out
    return out


MODULE = ("_call_impl@torch/nn/modules/module.py:1784", "_wrapped_call_impl@torch/nn/modules/module.py:1773")
NO_GRAD = ("decorate_context@torch/utils/_contextlib.py:120",)


@dataclass
class PipeDesc:
    name: str
    call: str  # the pipeline file
    text: tuple[str, ...]  # frames of one text-encoder layer, inner first (below encode_prompt)
    denoiser: str  # the denoiser's top-level forward frame
    block: tuple[str, ...]  # frames between an attention block and the denoiser forward
    scheduler: str
    heads: int
    tokens: tuple[int, ...]  # self-attention sequence lengths per level with attention
    text_len: int
    height: int
    weights: tuple[int, int, int]  # text encoder, denoiser, VAE bytes
    upcast_vae: bool = False


PIPES = {
    "sd15": PipeDesc(
        "sd15",
        "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py",
        (
            "forward@transformers/models/clip/modeling_clip.py:400",
            *MODULE,
            "forward@transformers/models/clip/modeling_clip.py:560",
            "wrapper@transformers/utils/output_capturing.py:50",
            "wrapper@transformers/utils/generic.py:900",
        ),
        "forward@diffusers/models/unets/unet_2d_condition.py:1143",
        (
            "forward@diffusers/models/attention.py:1005",
            *MODULE,
            "forward@diffusers/models/transformers/transformer_2d.py:427",
            *MODULE,
            "forward@diffusers/models/unets/unet_2d_blocks.py:1270",
            *MODULE,
        ),
        "step@diffusers/schedulers/scheduling_ddim.py:400",
        8,
        (4096, 1024, 256, 64),
        77,
        512,
        (246 * MiB, 1720 * MiB, 167 * MiB),
    ),
    "sdxl": PipeDesc(
        "sdxl",
        "diffusers/pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py",
        (
            "forward@transformers/models/clip/modeling_clip.py:400",
            *MODULE,
            "forward@transformers/models/clip/modeling_clip.py:560",
            "wrapper@transformers/utils/generic.py:900",
        ),
        "forward@diffusers/models/unets/unet_2d_condition.py:1143",
        (
            "forward@diffusers/models/attention.py:1005",
            *MODULE,
            "forward@diffusers/models/transformers/transformer_2d.py:427",
            *MODULE,
            "forward@diffusers/models/unets/unet_2d_blocks.py:1270",
            *MODULE,
        ),
        "step@diffusers/schedulers/scheduling_euler_discrete.py:620",
        10,
        (4096, 1024),
        77,
        1024,
        (1600 * MiB, 5000 * MiB, 160 * MiB),
        upcast_vae=True,
    ),
    "pixart": PipeDesc(
        "pixart",
        "diffusers/pipelines/pixart_alpha/pipeline_pixart_sigma.py",
        (
            "forward@transformers/models/t5/modeling_t5.py:300",
            *MODULE,
            "forward@transformers/models/t5/modeling_t5.py:700",
            *MODULE,
            "forward@transformers/models/t5/modeling_t5.py:1200",
        ),
        "forward@diffusers/models/transformers/pixart_transformer_2d.py:330",
        ("forward@diffusers/models/attention.py:1005", *MODULE),
        "step@diffusers/schedulers/scheduling_dpmsolver_multistep.py:1100",
        16,
        (4096,),
        300,
        1024,
        (9000 * MiB, 1200 * MiB, 160 * MiB),
    ),
}


@dataclass
class PipelineRun:
    sim: Sim
    desc: PipeDesc
    stages: list[dict[str, Any]] = field(default_factory=list)  # run.json-style allocator truth
    run: dict[str, Any] = field(default_factory=dict)
    score_bytes: list[int] = field(default_factory=list)  # every score matrix allocated
    score_peak_live: int = 0
    alloc_categories: list[tuple[int, str]] = field(default_factory=list)  # (trace index, what it is)
    score_live: list[tuple[int, int]] = field(default_factory=list)  # (trace index, score bytes live after it)

    def score_live_series(self) -> np.ndarray:
        n = len(self.sim.devices[0].trace)
        out = np.zeros(n, np.int64)
        for (i, v), nxt in zip(self.score_live, [j for j, _ in self.score_live[1:]] + [n]):
            out[i:nxt] = v
        return out

    def snapshot_dict(self, *, labels: bool = True, frameless_frees: bool = False) -> dict[str, Any]:
        d = self.sim.snapshot(marker=False, annotations=labels)
        if not labels:
            for tr in d["device_traces"]:
                for e in tr:
                    e["user_metadata"] = ""
        if frameless_frees:  # context="alloc": frees carry no stack at all
            for tr in d["device_traces"]:
                for e in tr:
                    if e["action"].startswith("free"):
                        e.pop("frames", None)
        return d

    def truth_labels(self) -> np.ndarray:
        d = self.sim.snapshot(marker=False)
        return np.array([e["user_metadata"] for e in d["device_traces"][0]], dtype=object)

    def group_truth(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            g = stage_group(s["name"])
            out[g] = max(out.get(g, 0), s["peak_allocated_bytes"])
        return out


def diffusion_run(
    pipe: str = "sd15",
    *,
    steps: int = 4,
    images: int = 1,
    attention: str = "classic",
    offload: str | None = None,
    cpp: bool = False,
    context: str = "all",
    seed: int = 0,
) -> PipelineRun:
    """Play one labelled pipeline call through the reference allocator."""
    desc = PIPES[pipe]
    sim = Sim(seed=seed, context=context)
    pr = PipelineRun(sim, desc)
    cur: list[str | None] = [None]

    def mark(label: str | None) -> None:  # collectors.recorder.Recorder.mark
        if cur[0] is not None:
            pr.stages.append({"name": cur[0], "peak_allocated_bytes": sim.peak_allocated()})
        sim.set_label(label or "")
        sim.reset_peak()
        cur[0] = label

    def S(*specs: str) -> list[dict[str, Any]]:
        return stack(*specs, cpp=cpp)

    user = "<module>@/home/me/run_pipeline.py:{}"
    call = (f"__call__@{desc.call}:962", *NO_GRAD, user.format(30))
    B = images * 2  # classifier-free guidance doubles the batch
    dt = 2  # fp16

    trace = sim.devices[0].trace
    live_sc: dict[int, int] = {}

    def alloc(n: int, st: list[dict[str, Any]], cat: str) -> Any:
        """``cat``: what the allocation is, as a person reading the pipeline would say."""
        h = sim.alloc(n, frames=st)
        pr.alloc_categories.append((len(trace) - 1, cat))
        if cat == "attention scores":
            live_sc[id(h)] = h.block_size
            pr.score_live.append((len(trace) - 1, sum(live_sc.values())))
        return h

    def free(h: Any, st: list[dict[str, Any]]) -> None:
        sim.free(h, frames=st)
        if live_sc.pop(id(h), None) is not None:  # allocated bytes drop at free_requested
            at = next(i for i in range(len(trace) - 1, -1, -1) if trace[i].action == "free_requested")
            pr.score_live.append((at, sum(live_sc.values())))

    # --- load: pipe.to("cuda") (or, with offload, nothing on the GPU yet)
    mark("load")
    to_frames = S(
        "_apply@torch/nn/modules/module.py:942",
        "_apply@torch/nn/modules/module.py:915",
        "to@torch/nn/modules/module.py:1355",
        "to@diffusers/pipelines/pipeline_utils.py:541",
        user.format(25),
    )
    weights: dict[str, list[Any]] = {"text": [], "den": [], "vae": []}

    def load_weights(kind: str, total: int, st: list[dict[str, Any]], parts: int) -> None:
        for i in range(parts):
            weights[kind].append(alloc(total // parts + 512 * (i % 3), st, "weights"))

    def drop_weights(kind: str, st: list[dict[str, Any]]) -> None:
        for h in weights[kind]:
            free(h, st)
        weights[kind].clear()

    te_b, den_b, vae_b = desc.weights
    if offload is None:
        load_weights("text", te_b, to_frames, 12)
        load_weights("den", den_b, to_frames, 30)
        load_weights("vae", vae_b, to_frames, 8)
    else:
        small = alloc(
            4096,
            S(
                "_apply@torch/nn/modules/module.py:942",
                "to@torch/nn/modules/module.py:1355",
                "enable_model_cpu_offload@diffusers/pipelines/pipeline_utils.py:1200",
                user.format(26),
            ),
            "weights",
        )
        free(small, S("enable_model_cpu_offload@diffusers/pipelines/pipeline_utils.py:1210", user.format(26)))
    onload = (
        "send_to_device@accelerate/utils/operations.py:180",
        "pre_forward@accelerate/hooks.py:360",
        "new_forward@accelerate/hooks.py:170",
        *MODULE,
    )
    offload_fr = (
        "offload@accelerate/hooks.py:720",
        "pre_forward@accelerate/hooks.py:730",
        "new_forward@accelerate/hooks.py:170",
        *MODULE,
    )

    # --- __call__: text encoding
    mark("text_encode")
    ids = alloc(B * desc.text_len * 8, S(f"encode_prompt@{desc.call}:423", *call), "activations")
    enc = (f"encode_prompt@{desc.call}:423", *call)
    if offload == "model":
        load_weights("text", te_b, S(*onload, *desc.text[-1:], *enc), 12)
    embeds = []
    for which in range(2):  # prompt, negative prompt
        acts = []
        for layer in range(6):
            if offload == "sequential":
                w = alloc(te_b // 12, S(*onload, *desc.text, *enc), "weights")
            h = alloc(images * desc.text_len * 4096 * dt, S(*desc.text, *enc), "activations")
            acts.append(h)
            if layer % 2 and offload != "sequential":
                a = alloc(
                    images * 12 * desc.text_len * 64 * dt,
                    S("sdpa_attention_forward@transformers/integrations/sdpa_attention.py:96", *desc.text, *enc),
                    "activations",
                )
                free(a, S(*desc.text, *enc))
            if offload == "sequential":
                free(
                    w,
                    S(
                        "post_forward@accelerate/hooks.py:400",
                        "new_forward@accelerate/hooks.py:175",
                        *MODULE,
                        *desc.text,
                        *enc,
                    ),
                )
        # per-prompt embeddings, concatenated and dropped before the text stage ends: temporaries
        embeds.append(alloc(images * desc.text_len * 768 * dt, S(*desc.text[-1:], *enc), "activations"))
        for h in acts:
            free(h, S(*desc.text, *enc))
    free(ids, S(f"encode_prompt@{desc.call}:440", *call))
    cat = alloc(B * desc.text_len * 768 * dt, S(*call), "latents & embeddings")
    for h in embeds:
        free(h, S(*call))
    ts = alloc(
        8 * steps,
        S("set_timesteps@diffusers/schedulers/scheduling_ddim.py:330", f"retrieve_timesteps@{desc.call}:140", *call),
        "latents & embeddings",
    )
    lat_elems = images * 4 * (desc.height // 8) ** 2
    latents = alloc(
        lat_elems * dt,
        S("randn_tensor@diffusers/utils/torch_utils.py:170", f"prepare_latents@{desc.call}:800", *call),
        "latents & embeddings",
    )

    # --- denoising loop
    for i in range(steps):
        lmi = alloc(
            2 * lat_elems * dt,
            S(f"__call__@{desc.call}:1030", *NO_GRAD, user.format(30)),  # torch.cat([latents]*2)
            "latents & embeddings",
        )
        mark(f"denoise/{i}")  # the denoiser's forward pre-hook
        den = (desc.denoiser, *MODULE, "wrapper@diffusers/utils/peft_utils.py:323", *call)
        if offload == "model" and i == 0:
            drop_weights("text", S(*offload_fr, *call))
            load_weights("den", den_b, S(*onload, *call), 30)
        temb = alloc(
            B * 1280 * dt,
            S(
                "forward@diffusers/models/embeddings.py:760",
                *MODULE,
                den[0].replace("forward@", "get_time_embed@").replace(":1143", ":900"),
                *den,
            ),
            "activations",
        )
        keep = []
        for lvl, n in enumerate(desc.tokens):
            ch = 320 * (2**lvl)
            if offload == "sequential":
                w = alloc(den_b // (2 * len(desc.tokens)), S(*onload, *desc.block[-3:], *den), "weights")
            h = alloc(
                B * ch * n * dt,
                S("forward@diffusers/models/resnet.py:370", *MODULE, *desc.block[-3:], *den),
                "activations",
            )
            keep.append(h)
            for q_len, k_len in ((n, n), (n, desc.text_len)):
                ap = (
                    "__call__@diffusers/models/attention_processor.py:1155",
                    "forward@diffusers/models/attention_processor.py:607",
                    *MODULE,
                    *desc.block,
                    *den,
                )
                if attention == "classic":
                    gas = "get_attention_scores@diffusers/models/attention_processor.py:{}"
                    size = B * desc.heads * q_len * k_len * dt
                    e = alloc(size, S(gas.format(679), *ap), "attention scores")
                    sc = alloc(size, S(gas.format(687), *ap), "attention scores")
                    free(e, S(gas.format(694), *ap))
                    pr_ = alloc(size, S(gas.format(699), *ap), "attention scores")
                    free(sc, S(gas.format(700), *ap))
                    pr.score_bytes += [size, size, size]
                    out = alloc(
                        B * q_len * ch * dt,
                        S("__call__@diffusers/models/attention_processor.py:1156", *ap[1:]),
                        "activations",
                    )
                    free(pr_, S("__call__@diffusers/models/attention_processor.py:1157", *ap[1:]))
                else:
                    out = alloc(
                        B * q_len * ch * dt,
                        S("__call__@diffusers/models/attention_processor.py:2767", *ap[1:]),
                        "activations",
                    )
                free(out, S(*desc.block, *den))
            if offload == "sequential":
                free(
                    w,
                    S(
                        "post_forward@accelerate/hooks.py:400",
                        "new_forward@accelerate/hooks.py:175",
                        *MODULE,
                        *desc.block[-3:],
                        *den,
                    ),
                )
        noise = alloc(2 * lat_elems * dt, S(desc.denoiser.replace(":1143", ":1300"), *MODULE, *den[1:]), "activations")
        for h in keep:
            free(h, S(*den))
        free(temb, S(*den))
        free(lmi, S(*call))
        # classifier-free guidance combine, in __call__
        g = alloc(lat_elems * dt, S(f"__call__@{desc.call}:1050", *NO_GRAD, user.format(30)), "activations")
        free(noise, S(f"__call__@{desc.call}:1051", *NO_GRAD, user.format(30)))
        sched = (desc.scheduler, f"__call__@{desc.call}:1060", *NO_GRAD, user.format(30))
        tmp = alloc(lat_elems * 4, S(*sched), "activations")
        new_lat = alloc(lat_elems * dt, S(*sched), "latents & embeddings")
        free(tmp, S(*sched))
        free(g, S(*sched))
        free(latents, S(f"__call__@{desc.call}:1061", *NO_GRAD, user.format(30)))
        latents = new_lat
    scaled = alloc(
        lat_elems * dt,
        S(f"__call__@{desc.call}:1080", *NO_GRAD, user.format(30)),  # latents / scaling
        "latents & embeddings",
    )

    # --- VAE decode
    dec = (
        "decode@diffusers/models/autoencoders/autoencoder_kl.py:235",
        "wrapper@diffusers/utils/accelerate_utils.py:49",
        *call,
    )
    if desc.upcast_vae:
        mark("vae_decode")  # the collector patches upcast_vae
        up = (
            "_apply@torch/nn/modules/module.py:942",
            "to@torch/nn/modules/module.py:1355",
            "to@diffusers/models/modeling_utils.py:1400",
            f"upcast_vae@{desc.call}:755",
            *call,
        )
        old = weights["vae"] or []
        if offload is None:
            weights["vae"] = []
            load_weights("vae", 2 * vae_b, S(*up), 8)
            for h in old:
                free(h, S(*up))
    else:
        mark("vae_decode")
    if offload == "model":
        drop_weights(
            "den",
            S(
                *offload_fr[:1],
                "pre_forward@accelerate/hooks.py:730",
                "wrapper@diffusers/utils/accelerate_utils.py:46",
                *call,
            ),
        )
        load_weights("vae", vae_b, S(*onload[:2], "wrapper@diffusers/utils/accelerate_utils.py:46", *call), 8)
    hw = desc.height**2
    bufs = []
    vae_fwd = (
        "forward@diffusers/models/autoencoders/vae.py:300",
        *MODULE,
        "_decode@diffusers/models/autoencoders/autoencoder_kl.py:206",
        *dec,
    )
    for k, ch in enumerate((512, 512, 256, 128)):
        n = images * ch * hw // (4 ** (3 - k)) * dt if k < 3 else images * ch * hw * dt
        h = alloc(
            n,
            S(
                "forward@diffusers/models/resnet.py:370",
                *MODULE,
                "forward@diffusers/models/unets/unet_2d_blocks.py:2700",
                *MODULE,
                *vae_fwd,
            ),
            "vae buffers",
        )
        h2 = alloc(
            n,
            S(
                "forward@diffusers/models/resnet.py:380",
                *MODULE,
                "forward@diffusers/models/unets/unet_2d_blocks.py:2700",
                *MODULE,
                *vae_fwd,
            ),
            "vae buffers",
        )
        free(h, S(*vae_fwd))
        bufs.append(h2)
    image = alloc(images * 3 * hw * dt, S(*vae_fwd), "vae buffers")
    for h in bufs:
        free(h, S(*vae_fwd))
    free(scaled, S(*call))
    post = ("denormalize@diffusers/image_processor.py:220", "postprocess@diffusers/image_processor.py:300", *call)
    img2 = alloc(images * 3 * hw * 4, S(*post), "vae buffers")
    free(image, S(*post))
    if desc.upcast_vae and offload is None:
        back = (
            "_apply@torch/nn/modules/module.py:942",
            "to@torch/nn/modules/module.py:1355",
            "to@diffusers/models/modeling_utils.py:1400",
            f"__call__@{desc.call}:1294",
            *NO_GRAD,
            user.format(30),
        )
        old = weights["vae"]
        weights["vae"] = []
        load_weights("vae", vae_b, S(*back), 8)
        for h in old:
            free(h, S(*back))
    if offload == "model":
        drop_weights(
            "vae",
            S(
                "offload@accelerate/hooks.py:720",
                "maybe_free_model_hooks@diffusers/pipelines/pipeline_utils.py:1300",
                *call,
            ),
        )
    # __call__ returns: its locals die in the caller's frame, still inside the call's stage
    free(cat, S(user.format(30)))
    free(ts, S(user.format(30)))
    mark("other")
    mine = alloc(4096, S(user.format(33)), "unknown")  # the user's own code after the call
    free(latents, S(user.format(34)))
    free(img2, S(user.format(34)))
    free(mine, S(user.format(34)))
    mark(None)
    pr.score_peak_live = max((v for _, v in pr.score_live), default=0)
    pr.run = {
        "schema": "snapviz.run/1",
        "pipeline": pipe if pipe != "pixart" else "pixart-sigma",
        "height": desc.height,
        "width": desc.height,
        "batch": images,
        "steps": steps,
        "dtype": "fp16",
        "techniques": ["fp16", attention] + ([f"{offload}-offload"] if offload else []),
        "stages": pr.stages,
    }
    return pr


def load_dict(d: dict[str, Any]) -> Snapshot:
    return snapshot_from_dict(d, source="<synthetic>")


def frames_labels(pr: PipelineRun, **kw: Any) -> tuple[Snapshot, Any, np.ndarray]:
    snap = load_dict(pr.snapshot_dict(labels=False, **kw))
    rep = replay_allocator(snap, 0)
    labels = label_from_frames(snap, rep.events)
    assert labels is not None
    return snap, rep, labels


def group_peaks(rep: Any, labels: np.ndarray) -> dict[str, int]:
    from snapviz.analyses.stages import stage_intervals, stage_table

    ev = rep.events
    st = stage_table(
        stage_intervals(labels, ev["time_us"].to_numpy()),
        ev["allocated"].to_numpy(),
        ev["reserved"].to_numpy(),
        rep.baseline_allocated,
        rep.baseline_reserved,
    )
    return st.groupby("group")["peak_allocated_bytes"].max().to_dict()


# --- the rules file -------------------------------------------------------------------------------


def test_builtin_rules_are_valid_package_data() -> None:
    rs = load_rules()
    ids = [r.id for r in rs.rules]
    assert len(ids) == len(set(ids)) and all(ids)
    assert {r.name for r in rs.of_kind("stage")} >= {"load", "text_encode", "denoise", "vae_decode"}
    assert "attention scores" in {r.name for r in rs.of_kind("category")}
    for r in rs.rules:
        assert r.function_re is not None or r.file_re is not None


@pytest.mark.parametrize(
    "frame, expected",
    [
        (("encode_prompt", "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py"), "text_encode"),
        (("_get_t5_prompt_embeds", "diffusers/pipelines/flux/pipeline_flux.py"), "text_encode"),
        (("forward", "diffusers/models/unets/unet_2d_condition.py"), "denoise"),
        (("forward", "diffusers/models/transformers/transformer_flux.py"), "denoise"),
        (("forward", "diffusers/models/unets/unet_2d_blocks.py"), None),  # also inside the VAE
        (("forward", "transformers/models/t5/modeling_t5.py"), "text_encode"),  # a text encoder, never a denoiser
        (("forward", "transformers/models/clip/modeling_clip.py"), "text_encode"),
        (("forward", "transformers/models/llama/modeling_llama.py"), None),  # other HF models: no pipeline stage
        (("forward", "diffusers/models/transformers/transformer_sd3.py"), "denoise"),
        (
            ("_prepare_latent_image_ids", "diffusers/pipelines/flux/pipeline_flux.py"),
            None,
        ),  # attach previous: no stage of its own
        (("tiled_decode", "diffusers/models/autoencoders/autoencoder_kl.py"), "vae_decode"),
        (("decode", "diffusers/models/autoencoders/autoencoder_tiny.py"), "vae_decode"),
        (("forward", "diffusers/models/autoencoders/vae.py"), "vae_decode"),
        (("load_state_dict", "torch/nn/modules/module.py"), "load"),
        (("_apply", "torch/nn/modules/module.py"), "load"),
    ],
)
def test_single_frame_rules(frame: tuple[str, str], expected: str | None) -> None:
    """Each rule's regexes against a single real frame (stack = that frame + a user script)."""
    name, path = frame
    st = [
        {"name": name, "filename": SP + path, "line": 10},
        {"name": "<module>", "filename": "/home/me/x.py", "line": 1},
    ]
    sim = Sim()
    h = sim.alloc(1 << 20, frames=st)
    sim.free(h, frames=st)
    snap = load_dict(sim.snapshot(marker=False))
    got = label_events(snap, snap.device_events(0), 0)
    if expected is None:  # unmatched: no pipeline stage, no PyTorch phase, and nothing guessed
        assert got.source == "none" and set(got.labels) == {"unlabelled"}
    else:
        assert stage_group(got.labels[0]) == expected
        assert got.source == ("phases" if expected == "load" else "frames")


# --- labels against the collectors' labels -----------------------------------------------------------

CASES = [
    dict(pipe="sd15"),
    dict(pipe="sd15", attention="sdpa", images=2),
    dict(pipe="sdxl"),
    dict(pipe="pixart", steps=3),
    dict(pipe="sd15", offload="model"),
    dict(pipe="sdxl", offload="model"),
    dict(pipe="sd15", offload="sequential"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_frames_reproduce_collector_labels(case: dict[str, Any]) -> None:
    pr = diffusion_run(**case)
    truth = pr.truth_labels()
    snap, rep, labels = frames_labels(pr)
    assert len(labels) == len(truth)
    wrong = np.flatnonzero(labels != truth)
    assert not len(wrong), [(int(i), truth[i], labels[i]) for i in wrong[:5]]
    # every denoising step, once each
    steps = sorted({s for s in labels if str(s).startswith("denoise/")}, key=lambda s: int(s.split("/")[1]))
    assert steps == [s["name"] for s in pr.stages if s["name"].startswith("denoise/")]
    # stage peaks against the allocator's own per-stage peaks
    got = group_peaks(rep, labels)
    for g, peak in pr.group_truth().items():
        assert abs(got[g] - peak) <= 0.03 * peak, (g, got[g], peak)


def test_cpp_frames_and_frameless_frees() -> None:
    """stacks="all" interleaves C++ frames; context="alloc" leaves frees without frames:
    neither changes a stage (frameless events inherit the previous event's label)."""
    pr = diffusion_run("sd15", cpp=True)
    truth = pr.truth_labels()
    _, _, labels = frames_labels(pr, frameless_frees=True)
    is_free = np.array([e["action"].startswith("free") for e in pr.sim.snapshot(marker=False)["device_traces"][0]])
    # Frees at a stage boundary inherit the previous event's stage; allocations are exact.
    assert (labels[~is_free] == truth[~is_free]).all()
    assert (labels == truth).mean() > 0.97
    steps = {s for s in labels if s.startswith("denoise/")}
    assert len(steps) == 4


def test_two_calls_restart_step_numbers() -> None:
    pr1 = diffusion_run("sd15", steps=2)
    snap, rep, labels = frames_labels(pr1)
    # second pipeline call in the same process: same frames again
    d = pr1.snapshot_dict(labels=False)
    tr = d["device_traces"][0]
    t_end = tr[-1]["time_us"]
    pr2 = diffusion_run("sd15", steps=3, seed=1)
    tr2 = pr2.snapshot_dict(labels=False)["device_traces"][0]
    for e in tr2:
        e = dict(e)
        e["time_us"] = e["time_us"] - tr2[0]["time_us"] + t_end + 10
        e["addr"] = e["addr"] + (1 << 44) if "addr" in e else e.get("addr")
        tr.append(e)
    d["segments"] = []
    snap = load_dict(d)
    joined = label_from_frames(snap, snap.device_events(0))
    assert joined is not None
    seq = [s for i, s in enumerate(joined) if s.startswith("denoise/") and (i == 0 or joined[i - 1] != s)]
    assert seq == ["denoise/0", "denoise/1", "denoise/0", "denoise/1", "denoise/2"]


def test_devices_share_one_timeline() -> None:
    """device_map="balanced": the text encoder on cuda:1, the UNet and VAE on cuda:0. The
    prompt embeddings die on cuda:1 when the call returns, after the decode on cuda:0:
    they belong to vae_decode, which cuda:1 alone never sees."""
    sim = Sim(devices=2)
    call = [
        {
            "name": "__call__",
            "filename": SP + "diffusers/pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py",
            "line": 1000,
        },
        {"name": "<module>", "filename": "/home/me/run.py", "line": 5},
    ]
    enc = [
        {"name": "forward", "filename": SP + "transformers/models/clip/modeling_clip.py", "line": 400},
        {
            "name": "encode_prompt",
            "filename": SP + "diffusers/pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py",
            "line": 405,
        },
    ] + call
    den = [{"name": "forward", "filename": SP + "diffusers/models/unets/unet_2d_condition.py", "line": 1143}] + call
    dec = [{"name": "decode", "filename": SP + "diffusers/models/autoencoders/autoencoder_kl.py", "line": 235}] + call
    ret = [{"name": "<module>", "filename": "/home/me/run.py", "line": 5}]
    want: dict[int, list[str]] = {0: [], 1: []}

    def a(dev: int, fr: Any, label: str) -> Any:
        want[dev].append(label)
        return sim.alloc(MiB, device=dev, frames=fr)

    def f(h: Any, fr: Any, label: str) -> None:
        want[h.device] += [label, label]
        sim.free(h, frames=fr)

    emb = a(1, enc, "text_encode")
    t = a(1, enc, "text_encode")
    f(t, enc, "text_encode")
    for i in range(2):
        x = a(0, den, f"denoise/{i}")
        f(x, den, f"denoise/{i}")
        y = a(0, call, f"denoise/{i}")  # the scheduler / CFG in __call__: joins the step
        f(y, call, f"denoise/{i}")
    img = a(0, dec, "vae_decode")
    f(emb, ret, "vae_decode")
    f(img, ret, "vae_decode")
    snap = load_dict(sim.snapshot(marker=False))
    for dev in (0, 1):
        ev = snap.device_events(dev)
        labels = label_from_frames(snap, ev)
        assert labels is not None
        acts = ev["action"].to_numpy()
        keep = np.isin(acts, [A_ALLOC, A_FREE_REQ, A_FREE_DONE])
        assert list(labels[keep]) == want[dev], dev


def test_no_frames_gives_none() -> None:
    pr = diffusion_run("sd15", steps=1)
    d = pr.snapshot_dict(labels=False)
    for e in d["device_traces"][0]:
        e.pop("frames", None)
    snap = load_dict(d)
    assert label_from_frames(snap, snap.device_events(0)) is None


def test_analyze_run_falls_back_to_frames() -> None:
    from snapviz.analyses.pipeline import summary_of
    from snapviz.analyses.summary import analyze_run

    pr = diffusion_run("sd15", steps=3)
    snap = load_dict(pr.snapshot_dict(labels=False))
    an = analyze_run(Run(source="<synthetic>", label="x", snapshot=snap, trace=None, run_json=None))
    doc = summary_of(an)
    assert doc["stage_source"] == "frames"
    names = [s["name"] for s in doc["stages"]]
    assert names[:2] == ["load", "text_encode"] and "vae_decode" in names
    den = next(s for s in doc["stages"] if s["name"] == "denoise")
    assert [st["name"] for st in den["steps"]] == ["denoise/0", "denoise/1", "denoise/2"]


# --- user rules -----------------------------------------------------------------------------------


def custom_loop_snapshot() -> tuple[dict[str, Any], np.ndarray]:
    """A hand-written pipeline: ``my_pipeline.py:denoise_loop`` calls ``my_model.py:forward``
    and ``update``; returns the snapshot and the labels docs/rules.md promises with the
    extension rules of ``test_user_rules_extend_builtin``."""
    sim = Sim()
    user = {"name": "<module>", "filename": "/home/me/app.py", "line": 9}
    loop = {"name": "denoise_loop", "filename": "/home/me/my_pipeline.py", "line": 40}
    fwd = [{"name": "forward", "filename": "/home/me/my_model.py", "line": 12}, loop, user]
    step = [{"name": "update", "filename": "/home/me/my_pipeline.py", "line": 55}, loop, user]
    load = [{"name": "_apply", "filename": SP + "torch/nn/modules/module.py", "line": 942}, user]
    sim.set_label("load")
    sim.alloc(100 * MiB, frames=load)
    sim.set_label("denoise/0")  # loop set-up before the first model call joins the first step
    lat = sim.alloc(MiB, frames=[loop, user])
    for i in range(3):
        sim.set_label(f"denoise/{i}")
        a = sim.alloc(8 * MiB, frames=fwd)
        b = sim.alloc(8 * MiB, frames=fwd)
        sim.free(a, frames=fwd)
        o = sim.alloc(MiB, frames=fwd)
        sim.free(b, frames=fwd)
        n = sim.alloc(MiB, frames=step)  # the loop's own update joins the step before it
        sim.free(o, frames=step)
        sim.free(lat, frames=step)
        lat = n
    d = sim.snapshot(marker=False)
    truth = np.array([e["user_metadata"] for e in d["device_traces"][0]], dtype=object)
    for e in d["device_traces"][0]:
        e["user_metadata"] = ""
    return d, truth


def test_user_rules_extend_builtin(tmp_path: Path) -> None:
    d, truth = custom_loop_snapshot()
    snap = load_dict(d)
    # The built-in rules do not know this program: no stage labels from them, and the
    # generic phases say only what they know (the weights' .to() is load), not "load" for all.
    assert label_from_frames(snap, snap.device_events(0)) is None
    builtin = label_events(snap, snap.device_events(0), 0)
    assert builtin.source == "phases"
    np.testing.assert_array_equal(builtin.labels, np.where(truth == "load", "load", "unlabelled"))
    rules = tmp_path / "my_rules.json"
    rules.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "rules": [
                    {"name": "denoise", "function": "^forward$", "file": "my_model\\.py$", "priority": 100},
                    {
                        "name": "denoise",
                        "function": "^denoise_loop$",
                        "file": "my_pipeline\\.py$",
                        "priority": 50,
                        "attach": "previous",
                    },
                ],
            }
        )
    )
    snap = load_dict(d)
    labels = label_from_frames(snap, snap.device_events(0), load_rules(str(rules)))
    assert labels is not None
    np.testing.assert_array_equal(labels, truth)


def test_user_rules_replace_and_disable(tmp_path: Path) -> None:
    d, _ = custom_loop_snapshot()
    only = tmp_path / "only.json"
    only.write_text(
        json.dumps({"rules": [{"name": "denoise", "function": "^forward$", "file": "my_model\\.py$", "priority": 1}]})
    )
    rs = load_rules(str(only))
    assert len(rs.rules) == 1  # no "extends": the built-ins are gone
    snap = load_dict(d)
    labels = label_from_frames(snap, snap.device_events(0), load_rules(str(only)))
    assert labels is not None and labels[0] == "load"  # _apply no longer means load, but it is before the pipeline
    dis = tmp_path / "dis.json"
    dis.write_text(json.dumps({"extends": "builtin", "disable": ["module-move"], "rules": []}))
    assert "module-move" not in {r.id for r in load_rules(str(dis)).rules}
    rep = tmp_path / "rep.json"
    rep.write_text(
        json.dumps(
            {
                "extends": "builtin",
                "rules": [{"id": "text-encode", "name": "text_encode", "function": "^embed_text$", "priority": 120}],
            }
        )
    )
    got = [r for r in load_rules(str(rep)).rules if r.id == "text-encode"]
    assert len(got) == 1 and got[0].function == "^embed_text$"


def test_docs_example_rules_file_loads(tmp_path: Path) -> None:
    """The example in docs/rules.md is a valid rules file that extends the built-ins."""
    doc = (ROOT / "docs" / "rules.md").read_text()
    block = doc.split("```json", 1)[1].split("```", 1)[0]
    p = tmp_path / "example.json"
    p.write_text(block)
    rs = load_rules(str(p))
    assert len(rs.rules) == len(load_rules().rules) + len(json.loads(block)["rules"])


@pytest.mark.parametrize(
    "content, msg",
    [
        ("{not json", "not valid JSON"),
        ('{"rules": [{"name": "denoise"}]}', "give a 'function' or a 'file'"),
        ('{"rules": [{"name": "denoise", "function": "("}]}', "bad 'function' regex"),
        ('{"rules": [{"name": "x", "function": "a", "attach": "later"}]}', "'attach' must be"),
        ('{"rules": [{"name": "x", "function": "a", "kind": "phase-ish"}]}', "'kind' must be"),
        ('{"rules": [{"name": "x", "function": "a", "kind": "attention"}]}', "attention evidence is"),
        ('{"schema": "snapviz.rules/2", "rules": []}', "'schema' is 'snapviz.rules/2'"),
        ('{"extends": "builtin", "disable": ["nope"], "rules": []}', "names no built-in rule"),
        ('{"rules": [{"name": "x", "function": "a", "prio": 3}]}', "unknown key"),
    ],
)
def test_bad_rules_file_is_input_error(tmp_path: Path, content: str, msg: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(InputError, match=msg):
        load_rules(str(p))


# --- the real samples (recorded by the collectors) -------------------------------------------------

SAMPLES = ROOT / "sample_snapshots"


def _sample_dirs() -> list[Path]:
    """The inference samples: training phases from frames alone are not built yet (issue 11
    item 3); the training samples are checked with their labels in test_train_samples.py."""
    if not SAMPLES.is_dir():
        return []
    return sorted(
        p
        for p in SAMPLES.iterdir()
        if (p / "run.json").is_file()
        and any((p / n).is_file() for n in ("snapshot.pickle.xz", "snapshot.pickle.gz", "snapshot.pickle"))
        and json.loads((p / "run.json").read_text()).get("mode") != "train"
    )


@pytest.mark.skipif(not _sample_dirs(), reason="no recorded samples in sample_snapshots/ yet")
@pytest.mark.parametrize("sample", _sample_dirs() or [None], ids=lambda p: p.name if p else "none")
def test_real_samples_without_labels(sample: Path | None) -> None:
    """Strip user_metadata and annotations, drop run.json: frames alone must find every
    denoising step and give text_encode / denoise / vae_decode peaks within 3% of the
    allocator's own per-stage peaks (grouped by the name before '/', max over intervals),
    on every device of the run."""
    from snapviz.analyses.summary import analyze_run
    from snapviz.load import load

    assert sample is not None
    truth_run = json.loads((sample / "run.json").read_text())
    run = load(str(sample))
    snap = run.snapshot
    assert snap is not None
    snap.events["metadata_id"] = 0
    snap.annotations = snap.annotations.iloc[0:0]
    main = analyze_run(Run(source=str(sample), label=sample.name, snapshot=snap, trace=None, run_json=None)).device
    want_steps = sorted({s["name"] for s in truth_run.get("stages") or [] if s["name"].startswith("denoise/")})
    for device in snap.devices:
        an = analyze_run(
            Run(source=str(sample), label=sample.name, snapshot=snap, trace=None, run_json=None),
            device=device,
            stage_source="auto",
        )
        assert an.labels.source == "frames"
        truth: dict[str, int] = {}
        for s in truth_run.get("stages") or []:
            per_dev = {p.get("device"): p.get("peak_allocated_bytes") for p in s.get("per_device") or []}
            peak = per_dev.get(device, s.get("peak_allocated_bytes") if device == main else None)
            if peak is None:
                continue
            g = stage_group(s["name"])
            truth[g] = max(truth.get(g, 0), int(peak))
        got = an.stage_groups().set_index("name")["peak_allocated_bytes"].to_dict()
        for g in ("text_encode", "denoise", "vae_decode"):
            if g in truth and (device == main or g in got):
                assert g in got, (device, g, sorted(got))
                assert abs(got[g] - truth[g]) <= 0.03 * truth[g], (device, g, got[g], truth[g])
        if device == main:
            have_steps = sorted({str(s) for s in an.labels.labels if str(s).startswith("denoise/")})
            assert have_steps == want_steps


# ----------------------------------------------------------------------------- hostile rules files (issue 26)


@pytest.mark.parametrize(
    "pattern,why",
    [
        ("^(a+)+$", "nests a quantifier"),
        ("(a*)*b", "nests a quantifier"),
        ("(\\w+\\s?)*$", "nests a quantifier"),
        ("^(ab|a)*c$", "repeats an alternation"),
        ("(x)\\1", "backreference"),
        ("a*b*c*d*e*f", "variable quantifiers"),
        ("x" * 1001, "over 1000 characters"),
    ],
)
def test_patterns_that_backtrack_catastrophically_are_refused(tmp_path: Path, pattern: str, why: str) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": [{"name": "load", "function": pattern}]}))
    with pytest.raises(InputError, match=why) as info:
        load_rules(path)
    assert "docs/rules.md" in str(info.value) or "over 1000" in str(info.value)


def test_every_builtin_pattern_is_in_the_safe_subset() -> None:
    from snapviz.analyses.frame_rules import unsafe_pattern

    rules = load_rules().rules
    assert rules and all(unsafe_pattern(p) is None for r in rules for p in (r.function, r.file) if p)


def test_many_rules_times_many_frames_is_bounded(tmp_path: Path) -> None:
    """10,000 rules against 10,000 distinct frame names: done, or stopped by the named limit,
    well inside 30 s (before: minutes)."""
    import os
    import pickle
    import subprocess
    import sys
    import time

    trace = [
        {
            "action": "alloc",
            "addr": 512 * i,
            "size": 512,
            "frames": [{"name": f"fn_{i}_{'a' * 20}", "filename": f"/m/f{i}.py", "line": 1}],
        }
        for i in range(10_000)
    ]
    (tmp_path / "s.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    rules = [{"name": f"s{i}", "function": f"^fn_{i}_a+$"} for i in range(10_000)]
    (tmp_path / "r.json").write_text(json.dumps({"rules": rules}))
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "snapviz", "analyze", "s.pickle", "--rules", "r.json", "-q", "--json", "o.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert time.monotonic() - t0 < 30
    assert p.returncode in (0, 2) and "Traceback" not in p.stderr, p.stderr
    if p.returncode == 2:
        assert "SNAPVIZ_MAX_INPUT_RULE_MATCHES" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
