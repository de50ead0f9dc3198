"""Hostile inputs generated in code, and a runner that measures what they cost.

Each builder writes one file that attacks the loader (issue 9, "bounded loading"): deep
nesting, memo back-reference expansion, huge strings, decompression bombs, special
files, integers that wrap. ``run_analyze`` runs ``snapviz analyze`` on it in a fresh
process under a wall-clock limit and reports exit code, stderr, wall time and the child's
peak RSS (``os.wait4``). An address-space cap keeps a regression from taking the machine
down: it is above the 4 GiB the tests allow, so an unbounded loader still fails them.
Used by tests/unit/test_hostile_load.py and benchmarks/fuzz_loader.py.
"""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paths import ROOT

AS_CAP = 6 << 30  # address-space cap for the child (a safety net, not the bound tested)
RSS_BOUND = 4 << 30  # what the tests allow
TIME_BOUND = 30.0  # seconds


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    maxrss: int  # bytes
    timed_out: bool
    cpu_s: float = 0.0  # the child's user + system CPU seconds (wall time counts other jobs too)

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))


def run_analyze(path: Path, *extra: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Result:
    """``snapviz analyze PATH --json OUT -q`` in a child process, measured."""
    out = Path(tempfile.mkdtemp(prefix="snapviz-hostile-")) / "out.json"
    cmd = [sys.executable, "-m", "snapviz", "analyze", str(path), "--json", str(out), "-q", *extra]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=full_env, cwd=str(out.parent), preexec_fn=_cap)
        timed_out = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                timed_out = True
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        stdout, stderr = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
    rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return Result(p.returncode, stdout, stderr, wall, rss, timed_out, ru.ru_utime + ru.ru_stime)


def digest(path: Path) -> str | None:
    """SHA-256 of a regular file (or of a run folder's regular files), None for anything else
    (FIFOs, devices): what a command must leave as it found it."""
    import hashlib

    p = Path(path)
    if p.is_dir():
        return "|".join(f"{q.name}:{digest(q)}" for q in sorted(p.iterdir()) if not q.is_symlink())
    if p.is_symlink() or not p.is_file():
        return None
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- pickles


def _gz(raw: bytes) -> bytes:
    return gzip.compress(raw, 9)


def _snapshot_with(token: bytes, replacement: bytes, obj: dict) -> bytes:
    """A protocol-2 pickle of ``obj`` with the string ``token`` replaced by raw opcodes."""
    raw = pickle.dumps(obj, protocol=2)
    tok = b"X" + len(token).to_bytes(4, "little") + token
    assert raw.count(tok) == 1
    return raw.replace(tok, replacement)


def _entry(**kw: object) -> dict:
    return {"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 1, **kw}


def deep_tuple(n: int) -> bytes:
    return b"K\x01" + b"\x85" * n  # ((((1,),),),...) n deep


def billion_laughs(levels: int, fanout: int = 10) -> list:
    """A list that holds the list below it ``fanout`` times, ``levels`` deep: the pickler
    memoizes each level once, so the file is small and the tree is fanout**levels."""
    obj: list = [1] * fanout
    for _ in range(levels):
        obj = [obj] * fanout
    return obj


def _trace(n: int) -> list[dict]:
    """``n`` distinct alloc/free pairs: a plain trace, 33 bytes of pickle per entry."""
    return [
        _entry(
            addr=(1 << 20) + 512 * (i // 2), time_us=i, action="alloc" if i % 2 == 0 else "free_completed", frames=[]
        )
        for i in range(2 * n)
    ]


def _segment(blocks: list) -> dict:
    return {
        "device": 0,
        "address": 1 << 20,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "large",
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "blocks": blocks,
    }


def _block(i: int) -> dict:
    return {
        "address": (1 << 20) + 512 * i,
        "size": 512,
        "requested_size": 512,
        "state": "active_allocated",
        "frames": [],
    }


def shared_row_pickles(scale: int) -> dict[str, bytes]:
    """Rows repeated by shared references (issue 26): every reference is 2 bytes of pickle and
    would be one more row of the model. ``scale``: distinct rows each case repeats."""
    trace = _trace(scale // 2)
    entry = _entry()
    ann = {"device": 0, "time_us": 1, "name": "r", "stage": "START"}
    blocks = [_block(i) for i in range(10)]
    return {
        # one trace list held by 8 devices (memo GETs of the same list)
        "shared_trace_8_devices": pickle.dumps({"segments": [], "device_traces": [trace] * 8}, protocol=4),
        # one entry dict repeated through one device's trace
        "same_entry_repeated": pickle.dumps({"segments": [], "device_traces": [[entry] * scale]}, protocol=4),
        # one segment (and its block list) repeated
        "shared_segment_blocks": pickle.dumps(
            {"segments": [_segment(blocks)] * (scale // 10), "device_traces": [trace[:2]]}, protocol=4
        ),
        # one annotation repeated
        "same_annotation_repeated": pickle.dumps(
            {"segments": [], "device_traces": [trace[:2]], "external_annotations": [ann] * scale}, protocol=4
        ),
    }


def many_stages(kind: str, n: int) -> dict:
    """A snapshot of ``n`` alloc/free pairs, each pair its own stage (issue 26): distinct
    ``user_metadata`` names, denoising steps, or START/END annotations of distinct names."""
    ev, ann = [], []
    for i in range(n):
        meta = {"names": f"stage{i}", "steps": f"denoise/{i}"}.get(kind, "")
        a = (1 << 20) + 512 * i
        ev.append(_entry(addr=a, time_us=2 * i, user_metadata=meta, frames=[]))
        ev.append(_entry(addr=a, time_us=2 * i + 1, user_metadata=meta, frames=[], action="free_completed"))
        if kind == "annotations":
            ann += [
                {"device": 0, "time_us": 2 * i, "name": f"range{i}", "stage": "START"},
                {"device": 0, "time_us": 2 * i + 1, "name": f"range{i}", "stage": "END"},
            ]
    return {"segments": [], "device_traces": [ev], **({"external_annotations": ann} if ann else {})}


def distinct_frames(n_frames: int, per_entry: int = 1000, vary: str = "line") -> bytes:
    """A snapshot pickle (protocol 4, the opcodes ``pickle.dumps`` writes, without FRAME) whose trace entries hold
    ``n_frames`` distinct frames, ``per_entry`` to an entry: the worst case for the frame
    interner within the object limit. ``vary="line"``: every frame its own line number (a frame
    is a dict and an int, 2 objects in 19 bytes, the cheapest distinct frame a pickle holds);
    ``"name"``: its own function name too (3 objects, 31 bytes). Written opcode by opcode with
    numpy: ``pickle.dumps`` of 15M frame dicts needs ~4 GB in the writer itself."""
    import numpy as np

    def s(t: bytes) -> bytes:  # SHORT_BINUNICODE + MEMOIZE
        return b"\x8c" + bytes([len(t)]) + t + b"\x94"

    def i32(v: int) -> bytes:
        return b"J" + v.to_bytes(4, "little", signed=True)

    # memo: 0 top dict, 1 'segments', 2 [], 3 'device_traces', 4 outer list, 5 device 0's list,
    # 6 entry 0, 7-13 its keys and 'alloc', 14 its frame list, 15 frame 0, 16-20 frame keys/values
    keys = b"action alloc addr size stream time_us frames".split()
    n_entries = -(-n_frames // per_entry)
    name_w = len(str(n_frames))
    out = [b"\x80\x04}\x94(" + s(b"segments") + b"]\x94" + s(b"device_traces") + b"]\x94]\x94"]
    for e in range(n_entries):
        if e % 1000 == 0 and n_entries - e > 1:
            out.append(b"(")
        k = min(per_entry, n_frames - e * per_entry)
        lines = np.arange(e * per_entry, e * per_entry + k, dtype="<i4")
        if e == 0:
            head = b"}\x94(" + s(keys[0]) + s(keys[1]) + s(keys[2]) + i32(1 << 20) + s(keys[3]) + b"M\x00\x02"
            head += s(keys[4]) + b"K\x00" + s(keys[5]) + i32(0) + s(keys[6]) + b"]\x94"
        else:
            head = b"}\x94(h\x07h\x08h\x09" + i32((1 << 20) + 512 * e) + b"h\x0aM\x00\x02h\x0bK\x00h\x0c"
            head += i32(e) + b"h\x0d]\x94"
        out.append(head + (b"(" if k > 1 else b""))
        first = 0
        if e == 0:  # frame 0 names the keys and values the others fetch from the memo
            name0 = b"f" + b"0" * name_w if vary == "name" else b"f"
            out.append(b"}\x94(" + s(b"name") + s(name0) + s(b"filename") + s(b"x.py") + s(b"line") + i32(0) + b"u")
            first = 1
        if k > first:
            rows = lines[first:]
            if vary == "name":
                w = 3 + 2 + (3 + name_w + 1) + 6 + 5 + 1
                a = np.empty((len(rows), w), np.uint8)
                a[:, 0:3] = np.frombuffer(b"}\x94(", np.uint8)
                a[:, 3:5] = np.frombuffer(b"h\x10", np.uint8)
                a[:, 5:7] = np.frombuffer(b"\x8c" + bytes([name_w + 1]), np.uint8)
                a[:, 7] = ord("f")
                digits = np.char.zfill(rows.astype(str), name_w).astype(f"S{name_w}")
                a[:, 8 : 8 + name_w] = np.frombuffer(digits.tobytes(), np.uint8).reshape(-1, name_w)
                o = 8 + name_w
                a[:, o] = 0x94
                a[:, o + 1 : o + 7] = np.frombuffer(b"h\x12h\x13h\x14", np.uint8)
                o += 7
            else:
                w = 3 + 10 + 5 + 1
                a = np.empty((len(rows), w), np.uint8)
                a[:, 0:13] = np.frombuffer(b"}\x94(h\x10h\x11h\x12h\x13h\x14", np.uint8)
                o = 13
            a[:, o] = ord("J")
            a[:, o + 1 : o + 5] = rows.view(np.uint8).reshape(-1, 4)
            a[:, o + 5] = ord("u")
            out.append(a.tobytes())
        out.append(b"eu" if k > 1 else b"au")
        if n_entries - e == 1 and (e % 1000 == 0):
            out.append(b"a")  # a lone last entry is APPENDed, as pickle does
        elif (e + 1) % 1000 == 0 or e == n_entries - 1:
            out.append(b"e")
    out.append(b"au.")
    return b"".join(out)


def empty_containers(token: bytes, n: int) -> bytes:
    """A list of ``n`` empty dicts (``}``) or lists (``]``): one object per byte of pickle."""
    return b"\x80\x04](" + token * n + b"e."


def pickle_cases(d: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a word the one-line error must contain; '' where exit 0 is right)."""
    c: dict[str, tuple[bytes, str]] = {}
    c["deep_tuple_dict_key_gz"] = (_gz(b"\x80\x02}(" + deep_tuple(200_000) + b"K\x01u."), "nesting depth")
    c["deep_tuple_frozenset_gz"] = (_gz(b"\x80\x04(" + deep_tuple(200_000) + b"\x91."), "nesting depth")
    c["flat_frozenset"] = (b"\x80\x04(K\x01K\x02\x91.", "builds a frozenset")
    c["tuple_dict_key"] = (b"\x80\x02}(K\x01K\x02\x86K\x03u.", "dict key")
    c["deep_tuple_action_gz"] = (
        _gz(_snapshot_with(b"DEEP", deep_tuple(200_000), {"segments": [], "device_traces": [[_entry(action="DEEP")]]})),
        "nesting depth",
    )
    laughs = billion_laughs(30)
    c["billion_laughs_frame_name"] = (
        pickle.dumps(
            {"segments": [], "device_traces": [[_entry(frames=[{"name": laughs, "filename": "x.py", "line": 1}])]]},
            protocol=4,
        ),
        "shared references",
    )
    c["billion_laughs_settings"] = (
        pickle.dumps({"segments": [], "device_traces": [[_entry()]], "allocator_settings": {"x": laughs}}, protocol=2),
        "shared references",
    )
    # The same over the fast-path size: the grammar check passes it (it cannot hurt the
    # unpickler), and the reader never walks it: the name becomes bounded text.
    c["billion_laughs_padded_2MiB"] = (
        pickle.dumps(
            {
                "segments": [],
                "device_traces": [
                    [_entry(frames=[{"name": laughs, "filename": "x.py", "line": 1}])]
                    + [_entry(addr=(1 << 20) + 512 * (i + 1), time_us=i) for i in range(40_000)]
                ],
            },
            protocol=4,
        ),
        "",
    )
    # One name just under the string limit, shared by 2,000 frames of 50 entries (issue 9's
    # "9 KB input"): every per-frame step would hash, copy or print 16 MiB; the loader cuts it.
    big = "x" * ((16 << 20) - 64)
    shared = [{"name": big, "filename": big, "line": i} for i in range(2000)]
    c["name_16MiB_in_2000_frames_xz"] = (
        lzma.compress(
            pickle.dumps(
                {
                    "segments": [],
                    "device_traces": [[_entry(addr=(1 << 20) + 512 * i, time_us=i, frames=shared) for i in range(50)]],
                },
                protocol=4,
            )
        ),
        "",
    )
    c["memo_index_2_31"] = (b"\x80\x02Nr\xff\xff\xff\x7f.", "memo index")
    c["binunicode8_length_2_62"] = (b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b"abc.", "length of one string")
    c["string_32MiB_plain"] = (
        pickle.dumps(
            {
                "segments": [],
                "device_traces": [[_entry(frames=[{"name": "n" * (32 << 20), "filename": "x.py", "line": 1}])]],
            },
            protocol=4,
        ),
        "length of one string",
    )
    c["size_2_63_minus_1"] = (pickle.dumps({"segments": [], "device_traces": [[_entry(size=(1 << 63) - 1)]]}), "2**62")
    c["size_negative"] = (pickle.dumps({"segments": [], "device_traces": [[_entry(size=-512)]]}), "2**62")
    c["addr_2_62"] = (pickle.dumps({"segments": [], "device_traces": [[_entry(addr=1 << 62)]]}), "2**62")
    c["valid_control"] = (
        pickle.dumps({"segments": [], "device_traces": [[_entry(), _entry(action="free_completed")]]}),
        "",
    )
    # issue 26: rows repeated by shared references, on the unpickler's path (under 24 MiB) ...
    for name, data in shared_row_pickles(100_000).items():
        c[name] = (data, "shared references")
    # ... and on the compiled tape's: the 8-device file (25 MiB of pickle, 0.9 MB of xz)
    c["shared_trace_8_devices_25MiB_xz"] = (
        lzma.compress(pickle.dumps({"segments": [], "device_traces": [_trace(375_000)] * 8}, protocol=4), preset=1),
        "shared references",
    )
    # issue 26: 300,000 stage names ran > 180 s, 300,000 steps 47 s, 500,000 annotation names > 180 s;
    # scaled to 50,000 each (linear now: 300,000 names or steps take 18 s): grouped, exit 0
    for kind in ("names", "steps", "annotations"):
        c[f"stage_{kind}_50k"] = (pickle.dumps(many_stages(kind, 50_000), protocol=4), "")
    # distinct stack frames (issue 26): 1M frames took 42 s and 985 MiB on the tape, 9.9 s on the
    # unpickler; past SNAPVIZ_MAX_INPUT_FRAMES they are grouped, exit 0. The unpickler's way (19 MB)
    # and the tape's (28 MB of pickle, over its 24 MiB threshold); the worst case within the object
    # limit (14.9M frames, 270 MiB) is measured in docs/security.md
    c["distinct_frames_1M"] = (distinct_frames(1_000_000), "")
    c["distinct_frames_1500k_xz"] = (lzma.compress(distinct_frames(1_500_000), preset=1), "")
    # one object per byte: 63M empty dicts, 60M empty lists in a few KB of xz
    c["empty_dicts_63M_xz"] = (lzma.compress(empty_containers(b"}", 63_000_000), preset=1), "number of objects")
    c["empty_lists_60M_xz"] = (lzma.compress(empty_containers(b"]", 60_000_000), preset=1), "number of objects")
    out = {}
    for name, (data, word) in c.items():
        p = d / f"{name}.pickle"
        p.write_bytes(data)
        out[name] = (p, word)
    out["gzip_bomb_512MiB"] = (_bomb(d / "bomb.pickle.gz", b"\x80\x04", 512 << 20), "decompressed size")
    out["gzip_string_300MiB"] = (
        _bomb(d / "bigstr.pickle.gz", b"\x80\x04\x8d" + (300 << 20).to_bytes(8, "little"), 300 << 20),
        "decompressed size",
    )
    return out


def _bomb(path: Path, head: bytes, n: int, fill: bytes = b"\x00", tail: bytes = b"") -> Path:
    """``head`` + ``n`` bytes of ``fill`` + ``tail``, gzip level 9 (about 1/1000 the size), streamed."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = fill * (1 << 20)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(n >> 20):
            f.write(z.compress(block))
        f.write(z.compress(tail))
        f.write(z.flush())
    return path


# ----------------------------------------------------------------------------- traces

_MEM = (
    '{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": %d, '
    '"args": {"Addr": %d, "Bytes": %d, "Total Allocated": %d, "Total Reserved": 2097152, "Device Id": 0, "Device Type": 1}}'
)


def memory_events() -> str:
    return ", ".join([_MEM % (10, 1 << 20, 4096, 4096), _MEM % (20, 1 << 20, -4096, 0)])


def trace_cases(d: Path) -> dict[str, tuple[Path, str]]:
    c: dict[str, tuple[bytes, str]] = {}
    n = 20_000_000
    c["deep_array_gz"] = (_gz(b'{"traceEvents": [' + b"[" * n + b"]" * n + b"]}"), "nesting depth")
    k = 65_536
    c["nested_traceEvents_keys_gz"] = (
        _gz(b'{"m": ' + b'{"traceEvents": ' * k + b"1" + b"}" * k + b', "traceEvents": []}'),
        "nesting depth",
    )
    many = ", ".join(['{"traceEvents": 0}'] * 65_536)
    c["many_traceEvents_keys_gz"] = (
        _gz(('{"m": [' + many + '], "traceEvents": [' + memory_events() + "]}").encode()),
        "",
    )
    c["metadata_26KB_first"] = (
        (
            '{"metadata": {'
            + ", ".join(f'"k{i}": "{"v" * 40}"' for i in range(500))
            + '}, "traceEvents": ['
            + memory_events()
            + "]}"
        ).encode(),
        "",
    )
    c["leading_whitespace"] = ((" \n\t" * 40_000 + '{"traceEvents": [' + memory_events() + "]}").encode(), "")
    # issue 26: a trace with 50,000 distinct record_function ranges (grouped, exit 0)
    ranges = ", ".join(
        f'{{"ph": "X", "cat": "user_annotation", "name": "range{i}", "pid": 1, "tid": 1, "ts": {2 * i}, "dur": 1}}'
        for i in range(50_000)
    )
    c["range_names_50k"] = (('{"traceEvents": [' + ranges + ", " + memory_events() + "]}").encode(), "")
    out = {}
    for name, (data, word) in c.items():
        p = d / f"{name}.json"
        p.write_bytes(data)
        out[name] = (p, word)
    out["long_string_200MiB_gz"] = (
        _bomb(d / "longstr.json.gz", b'{"traceEvents": [{"name": "', 200 << 20, b"a", b'"}]}'),
        "length of one string",
    )
    out["gzip_bomb_whitespace"] = (
        _bomb(d / "ws.json.gz", b'{"traceEvents": [', 512 << 20, b" ", b"]}"),
        "decompressed size",
    )
    return out


# ----------------------------------------------------------------------------- special files


def special_cases(d: Path) -> dict[str, tuple[Path, str]]:
    fifo = d / "snapshot.pickle"
    os.mkfifo(fifo)
    tfifo = d / "trace.json"
    os.mkfifo(tfifo)
    run = d / "run"
    run.mkdir()
    os.mkfifo(run / "run.json")
    out = {
        "fifo_pickle": (fifo, "FIFO"),
        "fifo_trace": (tfifo, "FIFO"),
        "dev_zero": (Path("/dev/zero"), "device"),
        "run_json_fifo": (run / "run.json", "FIFO"),
    }
    # issue 26: files of a run folder that are links into /proc (regular files by stat)
    for name, member in (("run_snapshot_proc_mem", "snapshot.pickle"), ("run_trace_proc_mem", "trace.json")):
        rd = d / name
        rd.mkdir()
        (rd / "run.json").write_text('{"schema": "snapviz.run/1"}')
        os.symlink("/proc/self/mem", rd / member)
        out[name] = (rd, "/proc")
    # a valid gzip member followed by 100 MiB of zero padding (sparse: 4 KB on disk)
    pad = d / "padded.pickle.gz"
    gz = gzip.compress(pickle.dumps({"segments": [], "device_traces": [[_entry(), _entry(action="free_completed")]]}))
    with open(pad, "wb") as f:
        f.write(gz)
        f.truncate(len(gz) + (100 << 20))
    out["gzip_zero_padding_100MiB"] = (pad, "")
    return out


BUILDERS: dict[str, Callable[[Path], dict[str, tuple[Path, str]]]] = {
    "pickle": pickle_cases,
    "trace": trace_cases,
    "special": special_cases,
}
