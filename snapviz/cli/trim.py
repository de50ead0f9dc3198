"""``snapviz trim``: a small, still valid snapshot of the part of a run that matters."""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
from typing import Any

import click

from snapviz.cli import outputs
from snapviz.cli.errors import Command
from snapviz.cli.options import CONTEXT_SETTINGS, count, device_option, epilog, quiet_option
from snapviz.errors import InputError
from snapviz.render.output import say
from snapviz.safe_text import printable

PICKLE_PROTOCOL = 4  # builtins only; torch's _memory_viz and every Python 3 read it


def _snapshot_path(path: str) -> str:
    from snapviz.load import SNAPSHOT_NAMES

    if os.path.isdir(path):
        found = next((os.path.join(path, n) for n in SNAPSHOT_NAMES if os.path.isfile(os.path.join(path, n))), None)
        if found is None:
            raise InputError(f"{path}: no snapshot in this directory (trim works on snapshots, not traces)")
        return found
    return path


def encode_snapshot(data: dict[str, Any], out_path: str) -> bytes:
    """Pickled with builtins only; compressed when the name asks for it (.gz, .xz)."""
    raw = pickle.dumps(data, protocol=PICKLE_PROTOCOL)
    if out_path.endswith(".gz"):
        return gzip.compress(raw, mtime=0)
    if out_path.endswith(".xz"):
        return lzma.compress(raw, preset=6)
    return raw


@click.command(cls=Command, epilog=epilog("docs/sharing.md", check=False), context_settings=CONTEXT_SETTINGS)
@click.argument("snapshot", type=str)
@click.option(
    "--stage", metavar="LABEL", help="Keep one stage or step (vae_decode, denoise/3): its first to last event."
)
@click.option(
    "--window",
    metavar="T0:T1",
    help="Keep the events between T0 and T1, seconds since the first event (as the report's time axis).",
)
@click.option(
    "--top",
    "top",
    type=count(0),
    metavar="N",
    help="Keep the history that builds the peak: from the allocation of the oldest of the N largest blocks live at the peak, to the peak.",
)
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="The trimmed snapshot (.pickle; .gz/.xz compress it).",
)
@device_option("CUDA device to keep (default: the one with the highest peak).")
@quiet_option("No summary line.")
def trim(
    snapshot: str, stage: str | None, window: str | None, top: int | None, out: str, device: int | None, quiet: bool
) -> None:
    """Write a smaller snapshot: one window of the history, with its frames, that replays
    exactly like the original over that window (same peak, allocated and reserved).

    The result is a plain snapshot pickle: PyTorch's memory visualizer and snapviz both read
    it, so a bug report can carry 2 MB instead of 400 MB.

    \b
    Examples:
      snapviz trim snapshot.pickle --stage vae_decode -o vae.pickle
      snapviz trim run/ --stage denoise/3 -o step3.pickle.gz
      snapviz trim snapshot.pickle --window 12.5:14 -o small.pickle
      snapviz trim snapshot.pickle --top 10 -o peak.pickle
    """
    from snapviz.analyses.summary import analyze_run
    from snapviz.analyses.trim import trim_snapshot, window_from_stage, window_from_times, window_from_top
    from snapviz.load import Run, _read_run_json, paused_gc
    from snapviz.load.snapshot.builder import snapshot_from_dict
    from snapviz.load.snapshot.safe_pickle import safe_load_pickle
    from snapviz.render.output import write_outputs
    from snapviz.units import fmt_bytes

    if sum(x is not None for x in (stage, window, top)) != 1:
        raise InputError("give exactly one of --stage, --window, --top")
    path = _snapshot_path(snapshot)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")
    outputs.check({"out": out}, [snapshot, path])
    with paused_gc():
        raw = safe_load_pickle(path)
        snap = snapshot_from_dict(raw, source=path)
    if not isinstance(raw, dict) or not raw.get("device_traces"):
        raise InputError(f"{path}: no trace history to trim (only an end state)")
    sidecar = os.path.join(os.path.dirname(path), "run.json")
    run_json = _read_run_json(sidecar) if os.path.isfile(sidecar) else None
    an = analyze_run(
        Run(source=path, label=os.path.basename(path), snapshot=snap, trace=None, run_json=run_json), device=device
    )
    if not len(an.replay.events):
        raise InputError(f"{path}: device {an.device} has no trace history to trim")
    if stage is not None:
        win = window_from_stage(an, stage)
    elif window is not None:
        win = window_from_times(an, window)
    else:
        win = window_from_top(an, int(top or 0))
    data = encode_snapshot(trim_snapshot(raw, an, win), out)
    write_outputs([(out, data)])
    if not quiet:
        alloc = an.replay.events["allocated"].to_numpy()
        before = int(alloc[win.first - 1]) if win.first else an.replay.baseline_allocated
        peak = max(before, int(alloc[win.first : win.last + 1].max()))
        say(
            f"{printable(win.reason)}: kept entries {win.first:,}–{win.last:,} of {len(an.replay.events):,} "
            f"(device {an.device}); peak in the window {fmt_bytes(peak)}\n"
            f"  wrote {printable(out, None)} ({len(data) / 1e6:.2f} MB"
            + ("" if out.endswith((".gz", ".xz")) else "; name it .pickle.xz to compress it")
            + ")"
        )
