"""DDP, FSDP1 or FSDP2 training, one snapshot per rank, laid out as torchtitan lays them out.

    python sample_snapshots/record_ddp_ranks.py --out DIR [--world-size 4] [--iterations 4]
        [--seq-lens 256,512,768,1024] [--device cuda] [--backend gloo|nccl] [--parallel ddp|fsdp1|fsdp2]

``--parallel fsdp2`` shards every GPT-2 block and then the root with ``fully_shard``
(``torch.distributed.fsdp``, torch >= 2.6) under a bf16 ``MixedPrecisionPolicy`` (fp32
reductions) instead of wrapping the model in DDP. NCCL needs one GPU per rank (it refuses two
ranks on one device), so on a one-GPU machine it runs with ``--world-size 1``: a real NCCL
communicator, FSDP2's all-gather and reduce-scatter buffers and DDP's buckets, one rank.

``--parallel fsdp1`` wraps the model in FSDP1's ``FullyShardedDataParallel`` instead: every GPT-2
block its own unit (``ModuleWrapPolicy`` on the block class), the rest in the root's, flat
parameters (``use_orig_params=False``: AdamW steps each rank's shard of the flat parameters),
``MixedPrecision`` bf16 parameters with fp32 reductions. FSDP1 runs one rank as ``NO_SHARD``
(it switches to it for a world size of 1): no all-gather, an all-reduce of the gradients.

Each rank is a process (``torch.multiprocessing.spawn``) training a transformers GPT-2 (random
weights) under ``DistributedDataParallel`` with bf16 autocast and AdamW. gloo, unlike NCCL, lets
several ranks share one GPU: every rank runs on ``cuda:<rank % device_count>``. Rank ``r`` trains
on sequences of ``seq_lens[r]`` tokens, so the ranks' memory differs. After the last iteration
``N`` each rank writes, as torchtitan does (``memory_snapshot/iteration_N/``):

* ``rank<r>_memory_snapshot.pickle``: ``_dump_snapshot`` (history ``stacks="python"``,
  ``context="all"``; the committed sample holds it xz-compressed, preset 9, as ``.pickle.xz``);
* ``rank<r>_run.json``: that rank's allocator figures (schema ``snapviz.run/1``, with ``rank``,
  ``world_size``, ``backend``; per-phase peaks in ``phases[]``).

No labels are set: the program is as a user writes it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--seq-lens", default="256,512,768,1024", help="one per rank (cycled)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp1", "fsdp2"))
    return ap.parse_args()


def _local(t: Any) -> Any:
    """A DTensor's local shard (FSDP2 parameters, gradients and state), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _fsdp1_doc(fsdp: Any, block: str) -> dict[str, Any]:
    """FSDP1's settings as it applied them (it runs one rank as ``NO_SHARD``) and its flat
    parameters: ``params`` counts their local shards, alignment padding included, and
    ``unpadded_numel`` the model's own parameters."""
    flat = [m._flat_param for m in fsdp.fsdp_modules(fsdp) if m._flat_param is not None]
    return {
        "api": "FullyShardedDataParallel",
        "sharding_strategy": fsdp.sharding_strategy.name,
        "use_orig_params": False,
        "auto_wrap": block,
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
        "flat_parameters": len(flat),
        "unpadded_numel": sum(int(p._unpadded_unsharded_size.numel()) for p in flat),
    }


def rank_main(rank: int, a: argparse.Namespace) -> None:
    import record_sidecar as rs
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group(a.backend, rank=rank, world_size=a.world_size)
    cuda = a.device == "cuda"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    lens = [int(x) for x in a.seq_lens.split(",")]
    seq = lens[rank % len(lens)]
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_positions=1024, vocab_size=50257)
    )
    torch.manual_seed(1000 + rank)
    record_start = rs.now_us()
    history = rs.start_history(device)
    ph = rs.Phases(device)
    ph.mark("load")
    model.to(device).train()
    if a.parallel == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=mp)
        ddp = fully_shard(model, mp_policy=mp)
    elif a.parallel == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        block_cls = type(model.transformer.h[0])  # GPT2Block
        ddp = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({block_cls}),
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            device_id=device,
            use_orig_params=False,
        )
    else:
        ddp = DDP(model, device_ids=[device.index] if cuda else None)
    fsdp = (
        {"reshard_after_forward": True, "param_dtype": "bfloat16", "reduce_dtype": "float32"}
        if a.parallel == "fsdp2"
        else _fsdp1_doc(ddp, block_cls.__name__)
        if a.parallel == "fsdp1"
        else None
    )
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    grads: int = 0
    state: dict[str, int] = {}
    for it in range(a.iterations):
        ph.mark(f"forward/{it}", step=it)
        ids = torch.randint(0, 50257, (a.batch, seq), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda and a.parallel == "ddp"):
            loss = ddp(input_ids=ids, labels=ids).loss
        ph.mark(f"backward/{it}", step=it)
        loss.backward()  # gradients all-reduced bucket by bucket through gloo
        ph.mark(f"optimizer/{it}", step=it)
        opt.step()
        if it == a.iterations - 1:
            grads = rs.tensor_bytes(_local(p.grad) for p in model.parameters() if p.grad is not None)
            state = rs.optimizer_state_bytes(opt)
        ph.mark(f"zero_grad/{it}", step=it)
        opt.zero_grad(set_to_none=True)
        del loss
    ph.mark("other")
    ph.mark(None)
    folder = a.out / "memory_snapshot" / f"iteration_{a.iterations}"
    folder.mkdir(parents=True, exist_ok=True)
    snap = rs.dump_snapshot(folder / f"rank{rank}_memory_snapshot.pickle")
    if cuda:
        torch.cuda.memory._record_memory_history(enabled=None)
    params = [_local(p) for p in model.parameters()]  # FSDP1: the flat parameters' local shards
    info: dict[str, Any] = rs.sidecar(
        device,
        phases=ph.rows,
        labelled=False,
        cap=None,
        history=history,
        status="ok",
        record_start_us=record_start,
        pipeline="gpt2",
        mode="train",
        program="user",
        size="custom",
        techniques=["amp-bf16", "adamw", a.parallel],
        height=None,
        width=None,
        steps=a.iterations,
        batch=a.batch,
        dtype="float32",
        seed=0,
        rank=rank,
        world_size=a.world_size,
        backend=a.backend,
        parallel=a.parallel,
        iteration=a.iterations,
        model={"layers": a.layers, "embd": a.embd, "heads": a.heads, "seq_len": seq},
        train={
            "optimizer": "adamw",
            "precision": (
                "fp32" if not cuda else "amp-bf16" if a.parallel == "ddp" else f"{a.parallel}-bf16-params-fp32-reduce"
            ),
            "params": {"trainable": sum(p.numel() for p in params), "trainable_bytes": rs.tensor_bytes(params)},
            "gradient_bytes": grads,
            "optimizer_state_bytes": state,
            **({"ddp_bucket_cap_mb": 25} if fsdp is None else {"fsdp": fsdp}),
        },
        files=[snap.name] if snap else [],
    )
    rs.write_json(folder / f"rank{rank}_run.json", info)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: seq {seq} peak allocated {(info['allocator'] or {}).get('max_memory_allocated')}", flush=True)


def main() -> int:
    a = parse()
    import torch.multiprocessing as mp

    a.out.mkdir(parents=True, exist_ok=True)
    mp.spawn(rank_main, args=(a,), nprocs=a.world_size, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
