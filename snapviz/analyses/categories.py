"""Categories of live memory: weights, activations, attention scores, latents, VAE buffers…

Decided per allocation from its frames and its lifetime (which stages it spans).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from snapviz.analyses.attention import attention_stack_ids
from snapviz.analyses.replay import ReplayResult, live_at
from snapviz.analyses.sites import SiteNamer
from snapviz.analyses.stages import stage_group
from snapviz.model import A_ALLOC, Snapshot

CATEGORIES = ("weights", "attention scores", "activations", "latents & embeddings", "vae buffers",
              "gradients & optimizer", "unknown")
_WEIGHT_FUNCS = frozenset({"_apply", "load_state_dict", "_load_from_state_dict", "to", "cuda", "__init__",
                           "reset_parameters", "load_model_dict_into_meta", "set_module_tensor_to_device",
                           "_load_state_dict_into_model", "from_pretrained", "_materialize", "to_empty",
                           "send_to_device", "pre_forward", "onload_", "_onload_from_memory"})
_OPTIM_FUNCS = frozenset({"step", "_init_group", "zero_grad", "backward", "_single_tensor_adam", "_multi_tensor_adam"})
_LATENT_FUNCS = frozenset({"prepare_latents", "encode_prompt", "_get_t5_prompt_embeds", "_get_clip_prompt_embeds"})


def _stack_name_sets(snap: Snapshot) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fr, sf = snap.frames, snap.stack_frames
    def stacks_with(names: frozenset[str], files: str | None = None) -> np.ndarray:
        m = fr["name"].isin(names)
        if files:
            m &= fr["filename"].str.contains(files, regex=True)
        return np.unique(sf.loc[sf["frame_id"].isin(fr.index[m]), "stack_id"].to_numpy())
    return (stacks_with(_WEIGHT_FUNCS), stacks_with(_OPTIM_FUNCS, r"torch/optim|autograd"),
            stacks_with(_LATENT_FUNCS), attention_stack_ids(snap))


def categorize_allocs(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Category of each alloc row in ``rows``."""
    ev = rep.events
    stack = ev["stack_id"].to_numpy()[rows]
    free_row = ev["free_row"].to_numpy()[rows]
    n = len(ev)
    wstacks, ostacks, lstacks, astacks = _stack_name_sets(snap)
    born = np.array([stage_group(str(s)) for s in labels[rows]], dtype=object)
    end_label = np.array([stage_group(str(labels[min(f, n - 1)])) if f < n else "end" for f in free_row], dtype=object)
    out = np.full(len(rows), "unknown", dtype=object)
    same_stage = (end_label == born)
    out[same_stage & (born != "load")] = "activations"
    out[(born == "vae_decode")] = "vae buffers"
    out[np.isin(stack, lstacks) | ((born == "text_encode") & ~same_stage)] = "latents & embeddings"
    out[(born == "load") | np.isin(stack, wstacks)] = "weights"
    out[np.isin(stack, ostacks)] = "gradients & optimizer"
    out[np.isin(stack, astacks)] = "attention scores"
    return out


def categorize_live(snap: Snapshot, rep: ReplayResult, labels: np.ndarray, row: int, sites: SiteNamer) -> pd.DataFrame:
    """Bytes live at ``row`` by category (the baseline counts as 'before recording')."""
    live = live_at(rep, row)
    rows = live.index.to_numpy()
    cats = categorize_allocs(snap, rep, labels, rows) if len(rows) else np.empty(0, object)
    df = pd.DataFrame({"category": cats, "bytes": live["block_size"].to_numpy()})
    out = df.groupby("category", sort=False)["bytes"].agg(["sum", "size"]).reset_index()
    out.columns = ["category", "bytes", "count"]
    if rep.baseline_allocated:
        out = pd.concat([out, pd.DataFrame([{"category": "before recording", "bytes": rep.baseline_allocated, "count": 0}])])
    return out.sort_values("bytes", ascending=False).reset_index(drop=True)
