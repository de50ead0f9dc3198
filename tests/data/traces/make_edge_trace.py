"""Writes edge_cases.json.gz, the hand-made trace used by tests/unit/test_chrome_trace.py.

    python tests/data/traces/make_edge_trace.py

What it covers that a CPU-only torch.profiler run cannot produce:

* ``ts`` already absolute Unix µs (no ``baseTimeNanoseconds``: older traces);
* CUDA ``[memory]`` events on two devices (device 1 has the larger peak) plus CPU ones,
  and one CUDA allocation from another thread (the autograd thread) inside a stage;
* events to ignore: ``gpu_user_annotation`` copies, kernels, flow events, ``B``/``E``
  pairs, ``null`` entries, a nested ``{"traceEvents": ...}`` key before the real one;
* keys after the events array, one of them a nested list;
* SD 1.5-sized fp16 classic attention (``[32, 4096, 4096]`` scores, 1 GiB) next to SDPA,
  and a ``cpu_op`` recorded without shapes.
"""
from __future__ import annotations

import gzip
import json
import os

T0 = 1_796_003_490_000_000.0  # absolute Unix µs
MAIN, AUTOGRAD, PID = 100, 200, 100
GiB = 1 << 30


def mem(ts: float, dev_type: int, dev_id: int, nbytes: int, total: int, reserved: int, tid: int = MAIN,
        addr: int = 0x7F00_0000_0000) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": tid,
            "ts": T0 + ts, "args": {"Total Reserved": reserved, "Total Allocated": total, "Bytes": nbytes,
                                    "Device Id": dev_id, "Device Type": dev_type, "Addr": addr + int(ts),
                                    "finished": False, "Ev Idx": int(ts)}}


def rng(name: str, ts: float, dur: float, cat: str = "user_annotation", tid: int = MAIN, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": T0 + ts, "dur": dur, "args": dict(args)}


def op(name: str, ts: float, dur: float, dims: list | None, types: list | None) -> dict:
    ev = rng(name, ts, dur, cat="cpu_op", **{"External id": int(ts)})
    if dims is not None:
        ev["args"].update({"Input Dims": dims, "Input type": types, "Concrete Inputs": [""] * len(dims)})
    return ev


def events() -> list:
    q = [32, 4096, 40]
    return [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": T0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "ts": T0, "args": {"name": "main"}},
        rng("ProfilerStep#0", 0, 1000),
        rng("text_encode", 10, 90),
        rng("denoise", 100, 700),
        rng("denoise/0", 100, 300),
        rng("denoise/1", 400, 300),
        rng("vae_decode", 800, 150),
        rng("denoise/0", 100, 300, cat="gpu_user_annotation", tid=7),  # GPU-timeline copy
        rng("my_range", 820, 10),                                        # not canonical: dropped
        {"ph": "B", "cat": "user_annotation", "name": "load", "pid": PID, "tid": MAIN, "ts": T0 + 1},
        {"ph": "E", "cat": "user_annotation", "name": "load", "pid": PID, "tid": MAIN, "ts": T0 + 2},
        None,
        # memory: CPU, cuda:0, cuda:1 (reserved grows in 2 MiB segments)
        mem(5, 0, -1, 4096, 4096, 0),
        mem(20, 1, 0, 1000, 1000, 2 << 20),
        mem(30, 1, 1, 5 << 20, 5 << 20, 6 << 20),
        mem(150, 1, 1, GiB, GiB + (5 << 20), GiB + (6 << 20)),            # denoise/0 scores
        mem(250, 1, 1, -GiB, 5 << 20, GiB + (6 << 20)),
        mem(500, 1, 1, 2 << 20, 7 << 20, GiB + (6 << 20), tid=AUTOGRAD),  # other thread, denoise/1
        mem(600, 1, 1, -(2 << 20), 5 << 20, GiB + (6 << 20)),
        mem(850, 1, 0, 3 << 20, (3 << 20) + 1000, 6 << 20),
        mem(900, 0, -1, -4096, 0, 0),
        # attention: classic fp16 (baddbmm -> softmax -> bmm) in denoise/0, SDPA in denoise/1
        op("aten::baddbmm", 140, 20, [[32, 4096, 4096], q, [32, 40, 4096], [], []],
           ["c10::Half", "c10::Half", "c10::Half", "Scalar", "Scalar"]),
        op("aten::softmax", 170, 30, [[32, 4096, 4096], [], []], ["c10::Half", "Scalar", ""]),
        op("aten::_softmax", 171, 28, [[32, 4096, 4096], [], []], ["c10::Half", "Scalar", "Scalar"]),
        op("aten::bmm", 210, 20, [[32, 4096, 4096], q], ["c10::Half", "c10::Half"]),
        op("aten::scaled_dot_product_attention", 450, 40, [[2, 16, 4096, 40]] * 3 + [[], [], []],
           ["c10::Half"] * 3 + ["", "Scalar", "Scalar"]),
        op("aten::_scaled_dot_product_efficient_attention", 452, 36, [[2, 16, 4096, 40]] * 3 + [[], []],
           ["c10::Half"] * 3 + ["", "Scalar"]),
        op("aten::add", 460, 5, None, None),                              # record_shapes off
        rng("unet.py(42): forward", 120, 500, cat="python_function", **{"Python id": 1}),
        {"ph": "X", "cat": "kernel", "name": "fmha_cutlassF_f16", "pid": 0, "tid": 7, "ts": T0 + 455, "dur": 30,
         "args": {"device": 0, "stream": 7, "correlation": 9, "grid": [64, 1, 1]}},
        {"ph": "s", "id": 9, "pid": PID, "tid": MAIN, "ts": T0 + 452, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": T0 + 455, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]


def document() -> str:
    """Keys before and after traceEvents, written as kineto does (raw text, ordered)."""
    before = {"schemaVersion": 1, "otherInfo": {"traceEvents": 3},
              "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}, {"id": 1, "name": "NVIDIA H100"}],
              "with_stack": 1, "profile_memory": 1, "record_shapes": 1, "displayTimeUnit": "ms"}
    head = json.dumps(before, indent=2)[:-2]
    body = ",\n".join(json.dumps(e) for e in events())
    return f'{head},\n  "traceEvents": [\n{body}\n  ],\n  "extra": [1, [2, 3]],\n  "traceName": "edge.json"\n}}\n'


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "edge_cases.json.gz")
    with gzip.GzipFile(out, "wb", mtime=0) as f:  # mtime=0: byte-identical on every run
        f.write(document().encode())
    print(out, os.path.getsize(out), "bytes")
