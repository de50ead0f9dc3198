"""Training loops written as a user writes them (not our collectors), recorded as samples.

    python sample_snapshots/record_user_train.py --model gpt2 --out DIR [--labels main-thread]
        [--seq-lens 512,1024,256] [--alloc-conf CONF] [--memory-fraction F]
    python sample_snapshots/record_user_train.py --model mlp --out DIR

``gpt2``: transformers ``GPT2LMHeadModel(GPT2Config(...))`` with random weights, AdamW, bf16
autocast, one optimizer step per sequence length in ``--seq-lens`` (varying lengths fragment
the cache). ``mlp``: a plain ``nn.Module`` (a small conv net and an MLP head) with SGD and
momentum, fp32. ``--labels main-thread`` labels the phases with
``torch.cuda.memory._set_memory_metadata("forward/<step>")`` etc. on the main thread only, as
users label: allocations made by autograd's own thread during backward stay unlabelled.

``--alloc-conf`` sets ``PYTORCH_CUDA_ALLOC_CONF`` before torch starts CUDA; ``--memory-fraction``
caps the allocator (``set_per_process_memory_fraction``). An out-of-memory error is caught: the
snapshot (history up to the failure) and run.json (``status: oom``, the request) are still
written. Writes ``DIR/run.json`` and ``DIR/snapshot.pickle`` (history ``stacks="python"``,
``context="all"``, one million entries); run.json's ``phases[]`` hold the allocator's own peak
per phase (``load``, ``forward/<i>``, ``backward/<i>``, ``optimizer/<i>``, ``zero_grad/<i>``,
``other``), with parameter, gradient and optimizer-state bytes measured on the tensors.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["gpt2", "mlp"], default="gpt2")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--labels", choices=["none", "main-thread"], default="none")
    ap.add_argument(
        "--seq-lens",
        default="512,1024,256,768,1024,384,896,640",
        help="gpt2: one optimizer step per length (comma-separated)",
    )
    ap.add_argument("--steps", type=int, default=3, help="mlp: optimizer steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--alloc-conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF for this run")
    ap.add_argument(
        "--memory-fraction", type=float, default=None, help="torch.cuda.set_per_process_memory_fraction (a cap)"
    )
    ap.add_argument("--max-entries", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def gpt2_model(a: argparse.Namespace) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_positions=1024, vocab_size=50257)
    return GPT2LMHeadModel(cfg)


def mlp_model() -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(8),
        nn.Flatten(),
        nn.Linear(256 * 8 * 8, 4096),
        nn.ReLU(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, 1000),
    )


def main() -> int:
    a = parse()
    if a.alloc_conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = a.alloc_conf  # before torch starts CUDA
    import record_sidecar as rs
    import torch

    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    a.out.mkdir(parents=True, exist_ok=True)
    model = gpt2_model(a) if a.model == "gpt2" else mlp_model()  # built on the CPU
    seq_lens = [int(x) for x in a.seq_lens.split(",")] if a.model == "gpt2" else []
    steps = len(seq_lens) if a.model == "gpt2" else a.steps

    cap = rs.set_cap(device, a.memory_fraction)
    watch = rs.OomWatch()
    record_start = rs.now_us()
    history = rs.start_history(device, a.max_entries)
    ph = rs.Phases(device, label=a.labels == "main-thread")
    status, oom, grads, state = "ok", None, 0, {}
    amp = device.type == "cuda" and a.model == "gpt2"
    try:
        ph.mark("load")
        model.to(device).train()
        if a.model == "gpt2":
            opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        for step in range(steps):
            ph.mark(f"forward/{step}", step=step)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                if a.model == "gpt2":
                    ids = torch.randint(0, 50257, (a.batch, seq_lens[step]), device=device)
                    loss = model(input_ids=ids, labels=ids).loss
                else:
                    x = torch.randn(a.batch * 16, 3, 128, 128, device=device)
                    y = torch.randint(0, 1000, (a.batch * 16,), device=device)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
            ph.mark(f"backward/{step}", step=step)
            loss.backward()
            ph.mark(f"optimizer/{step}", step=step)
            opt.step()
            if step == steps - 1:  # measured on the tensors, before zero_grad frees the grads
                grads = rs.tensor_bytes(p.grad for p in model.parameters())
                state = rs.optimizer_state_bytes(opt)
            ph.mark(f"zero_grad/{step}", step=step)
            opt.zero_grad(set_to_none=True)
            del loss
        ph.mark("other")
        ph.mark(None)
        snap = rs.dump_snapshot(a.out / "snapshot.pickle")
    except torch.OutOfMemoryError as err:
        status = "oom"
        oom = watch.record(err, ph.current)
        snap = rs.dump_snapshot(a.out / "snapshot.pickle")  # history up to the failure
        if ph.current is not None:
            ph.current["oom"] = True
        ph.mark(None)
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(enabled=None)
    params = list(model.parameters())
    info = rs.sidecar(
        device,
        phases=ph.rows,
        labelled=a.labels == "main-thread",
        cap=cap,
        history=history,
        status=status,
        record_start_us=record_start,
        pipeline=a.model,
        mode="train",
        program="user",
        size="custom",
        techniques=(["amp-bf16", "adamw"] if a.model == "gpt2" else ["fp32", "sgd-momentum"]),
        height=None,
        width=None,
        steps=steps,
        batch=a.batch,
        dtype="float32",
        seed=a.seed,
        model={"layers": a.layers, "embd": a.embd, "heads": a.heads, "seq_lens": seq_lens}
        if a.model == "gpt2"
        else {"kind": "conv+mlp", "input": [a.batch * 16, 3, 128, 128]},
        train={
            "optimizer": "adamw" if a.model == "gpt2" else "sgd-momentum",
            "precision": "amp-bf16" if amp else "fp32",
            "params": {"trainable": sum(p.numel() for p in params), "trainable_bytes": rs.tensor_bytes(params)},
            "gradient_bytes": grads,
            "optimizer_state_bytes": state,
            "labels": a.labels,
        },
        oom=oom,
        files=["snapshot.pickle"] if snap else [],
    )
    rs.write_json(a.out / "run.json", info)
    print(f"{a.out}: {status} peak allocated {(info['allocator'] or {}).get('max_memory_allocated')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
