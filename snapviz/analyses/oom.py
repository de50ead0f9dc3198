"""Why did it OOM: the failed request, the allocator's state at that moment, and the verdict.

A run holds an OOM when its trace has an ``oom`` entry (the allocator gave up: the entry
carries the requested bytes, the stream, ``device_free`` and the request's frames) or when
the collectors' ``run.json`` records one (``oom``: device, requested bytes, stage). The
state at that moment is the replay's: allocated and reserved after the entry before it,
and the free blocks of the segments mapped then (free neighbours of one segment merge, so a
free block is a gap between the non-free blocks of a segment). The cap is the run's memory
limit (``run.json: memory_limit_bytes``), else ``device_free`` plus reserved (what the
allocator could still have mapped), else not known.

Verdicts (docs/design.md, "Machine-readable summary"):

* ``out of memory``: allocated + request > cap. Nothing could have made it fit but holding
  less: ``bytes_short`` is what live memory would have to shrink by.
* ``fragmented``: the request fits under the cap beside what was allocated, but no single
  free piece was large enough (the largest free cached block, and the cap minus reserved for
  a new segment, are both smaller): the memory was there, not in one piece.
* ``not determined``: the cap is not known and the cached free memory does not settle it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from snapviz.analyses.document import AnyAdvice, LiveCategory, LiveSite, Oom, OomSimulation, Shrink, SimulatedAdvice
from snapviz.analyses.replay import ReplayResult, live_at
from snapviz.analyses.sites import SiteNamer
from snapviz.model import (
    A_ALLOC,
    A_FREE,
    A_FREE_DONE,
    A_FREE_REQ,
    A_OOM,
    A_SEG_ALLOC,
    A_SEG_FREE,
    A_SEG_MAP,
    A_SEG_UNMAP,
    Snapshot,
)
from snapviz.units import fmt_bytes

OUT_OF_MEMORY = "out of memory"
FRAGMENTED = "fragmented"
NOT_DETERMINED = "not determined"
SMALL_REQUEST = 1 << 20  # requests up to 1 MiB are served from the small pool
SMALL_SEGMENT = 2 << 20  # the small pool's segments
LIVE_ROWS = 5


def oom_rows(rep: ReplayResult) -> np.ndarray:
    """Rows of the device's ``oom`` trace entries."""
    ev = rep.events
    return np.flatnonzero(ev["action"].to_numpy() == A_OOM) if len(ev) else np.empty(0, np.int64)


def explained_oom(rep: ReplayResult, rows: np.ndarray) -> tuple[int, int]:
    """(row of the OOM a report explains, how many of ``rows`` the program survived).

    An OOM followed by further allocations was survived: a caller caught it and went on (cuDNN
    retries a convolution with a smaller workspace; batch-size finders do the same). The one
    that matters is the last: the OOM that ended the run when nothing was allocated after it."""
    allocs = np.flatnonzero(rep.events["action"].to_numpy() == A_ALLOC)
    last_alloc = int(allocs[-1]) if len(allocs) else -1
    return int(rows[-1]), int((rows < last_alloc).sum())


def oom_note(n: int, survived: int) -> str | None:
    """The warning for a run with several OOMs (None for one): which one the report explains."""
    if n <= 1:
        return None
    if survived >= n:
        return (
            f"the run hit CUDA out-of-memory {n} times and went on allocating after each; the report explains the last"
        )
    went_on = (
        f"{survived} were survived (allocations went on after them: a caller caught them and retried with less)"
        if survived
        else "none was followed by another allocation"
    )
    return f"the run hit CUDA out-of-memory {n} times; {went_on}; the report explains the last, which ended the run"


def run_json_oom(run_json: dict[str, Any] | None, device: int) -> dict[str, Any] | None:
    """The collectors' OOM record for ``device`` (None: none, or another device's)."""
    rec = (run_json or {}).get("oom")
    if not isinstance(rec, dict) or not isinstance(rec.get("requested_bytes"), int):
        return None
    dev = rec.get("device", device)
    return rec if dev == device or dev is None else None


def oom_devices(snap: Snapshot, run_json: dict[str, Any] | None) -> list[int]:
    """Devices whose trace holds an ``oom`` entry, or the one the collectors' record names."""
    ev = snap.events
    devs = sorted({int(d) for d in ev.loc[ev["action"] == A_OOM, "device"].tolist()}) if len(ev) else []
    rec = (run_json or {}).get("oom")
    if not devs and isinstance(rec, dict) and isinstance(rec.get("device"), int):
        devs = [int(rec["device"])]
    return devs


def _segments_at(snap: Snapshot, rep: ReplayResult, row: int, expandable: bool) -> list[tuple[int, int]]:
    """Segments (``[start, end)``) mapped just after ``row``: the end state's, with the trace's
    segment events after ``row`` undone (an alloc/map is unmapped, a free/unmap mapped again).
    Blocks never merge across segments, so plain segments stay apart; the pages of an
    expandable segment are one address range, so adjacent mapped ranges join."""
    segs = snap.segments
    dev = segs[segs["device"] == rep.device] if len(segs) else segs
    ranges: dict[int, int] = (
        dict(zip(dev["address"].tolist(), (dev["address"] + dev["total_size"]).tolist(), strict=True))
        if len(dev)
        else {}
    )
    ev = rep.events
    act = ev["action"].to_numpy()[row + 1 :]
    sel = np.flatnonzero(np.isin(act, (A_SEG_ALLOC, A_SEG_MAP, A_SEG_FREE, A_SEG_UNMAP)))
    addrs = ev["addr"].to_numpy()[row + 1 :][sel].tolist()
    sizes = ev["size"].to_numpy()[row + 1 :][sel].tolist()
    for a, addr, size in zip(act[sel].tolist()[::-1], addrs[::-1], sizes[::-1], strict=True):
        if a in (A_SEG_ALLOC, A_SEG_MAP):
            _cut(ranges, addr, addr + size)
        else:
            ranges[addr] = addr + size
    out = sorted(ranges.items())
    if expandable and out:
        merged = [list(out[0])]
        for s, e in out[1:]:
            if s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        out = [(s, e) for s, e in merged]
    return out


def _cut(ranges: dict[int, int], lo: int, hi: int) -> None:
    """Remove ``[lo, hi)`` from the disjoint ranges (start -> end)."""
    for s, e in list(ranges.items()):
        if e <= lo or s >= hi:
            continue
        del ranges[s]
        if s < lo:
            ranges[s] = lo
        if e > hi:
            ranges[hi] = e


def _nonfree_at(snap: Snapshot, rep: ReplayResult, row: int) -> tuple[np.ndarray, np.ndarray]:
    """(address, size) of the blocks not free just after ``row``: recorded allocations alive
    then, blocks from before the recording freed later, and end-state blocks the trace never
    touched."""
    ev = rep.events
    live = live_at(rep, row)
    addr = [live["addr"].to_numpy(np.int64)]
    size = [live["block_size"].to_numpy(np.int64)]
    act = ev["action"].to_numpy()
    rows = np.arange(len(ev))
    orphan = np.isin(act, (A_FREE_REQ, A_FREE, A_FREE_DONE)) & (ev["alloc_row"].to_numpy() < 0) & (rows > row)
    if orphan.any():
        a = ev["addr"].to_numpy(np.int64)[orphan]
        first = np.unique(a, return_index=True)[1]
        addr.append(a[first])
        size.append(ev["block_size"].to_numpy(np.int64)[orphan][first])
    blocks = snap.blocks
    if len(blocks):
        b = blocks[(blocks["device"] == rep.device) & (blocks["state"] != "inactive")]
        touched = ev["addr"].to_numpy(np.int64)[np.isin(act, (A_ALLOC, A_FREE_REQ, A_FREE, A_FREE_DONE))]
        keep = ~np.isin(b["address"].to_numpy(np.int64), touched)
        addr.append(b["address"].to_numpy(np.int64)[keep])
        size.append(b["size"].to_numpy(np.int64)[keep])
    return np.concatenate(addr), np.concatenate(size)


def largest_free_block(
    snap: Snapshot, rep: ReplayResult, row: int, expandable: bool, request: int
) -> tuple[int, int] | None:
    """(largest free block, free bytes) in the segments of the request's pool just after ``row``.

    None when the file does not show the segments (no end-state segments).
    """
    if not len(snap.segments):
        return None
    segs = _segments_at(snap, rep, row, expandable)
    if not expandable:  # a request > 1 MiB is served from the large pool, not the 2 MiB small segments
        small = request <= SMALL_REQUEST
        segs = [(s, e) for s, e in segs if (e - s == SMALL_SEGMENT) == small]
    if not segs:
        return 0, 0
    s0 = np.array([s for s, _ in segs], np.int64)
    e0 = np.array([e for _, e in segs], np.int64)
    ba, bs = _nonfree_at(snap, rep, row)
    seg_of = np.searchsorted(s0, ba, side="right") - 1
    inside = (seg_of >= 0) & (ba < e0[np.maximum(seg_of, 0)])
    ba, bs, seg_of = ba[inside], bs[inside], seg_of[inside]
    k = len(s0)
    # Occupied ranges per segment, with empty sentinels at each segment's start and end.
    seg = np.concatenate([seg_of, np.arange(k), np.arange(k)])
    start = np.concatenate([ba, s0, e0])
    end = np.concatenate([ba + bs, s0, e0])
    order = np.lexsort((start, seg))
    seg, start, end = seg[order], start[order], end[order]
    reach = np.maximum.accumulate(end)  # overlapping blocks (an inconsistent file) leave no gap
    same = seg[1:] == seg[:-1]
    # Segments are disjoint and sorted, so the running end never carries into the next one.
    gaps = np.maximum(np.where(same, start[1:] - reach[:-1], 0), 0)
    return (int(gaps.max()) if len(gaps) else 0), int(gaps.sum())


def _cap(run_json: dict[str, Any] | None, reserved: int, device_free: int | None) -> tuple[int | None, str | None]:
    from snapviz.analyses.whatif import cap_from_run_json  # noqa: PLC0415 - one reader of the recorded cap

    limit = cap_from_run_json(run_json).limit  # memory_limit_bytes, or allocator.cap (a memory fraction)
    if limit is not None:
        return limit, "the run's memory limit"
    if device_free is not None and device_free >= 0:
        return reserved + device_free, "reserved + free on the device"
    return None, None


def oom_report(
    snap: Snapshot,
    rep: ReplayResult,
    labels: np.ndarray,
    sites: SiteNamer,
    live_categories: pd.DataFrame | None,
    run_json: dict[str, Any] | None,
    expandable: bool,
) -> Oom | None:
    """The summary's ``oom`` section for the OOM of ``rep``'s device that ended the run
    (:func:`explained_oom`; None: no OOM): its facts. What would have fit (``simulation``,
    ``advice``) and the sentences (``headline`` … ``card``) are left for the summary builder,
    which has the advice and the simulation (:func:`snapviz.analyses.summary_builder.build_summary`).

    ``live_categories`` is the bytes by category live at the OOM (categorize_live at its row).
    """
    rows = oom_rows(rep)
    rec = run_json_oom(run_json, rep.device)
    ev = rep.events
    if not len(rows) and rec is None:
        return None
    n = len(ev)
    if len(rows):
        row = explained_oom(rep, rows)[0]
        request = int(ev["size"].iat[row])
        stream: int | None = int(ev["stream"].iat[row])
        df = int(ev["device_free"].iat[row])
        device_free: int | None = df if df >= 0 else None
        sid = int(ev["stack_id"].iat[row])
        source = "trace"
    else:
        assert rec is not None
        row = n - 1  # the collectors dump right after the failure: the end state is the moment
        request = int(rec["requested_bytes"])
        stream = None
        rec_free = rec.get("device_free")
        device_free = rec_free if isinstance(rec_free, int) and not isinstance(rec_free, bool) else None
        sid = -1
        source = "run.json"
    if row >= 0:
        allocated, reserved = int(ev["allocated"].iat[row]), int(ev["reserved"].iat[row])
        stage = str(labels[row])
    else:
        allocated, reserved = rep.final_allocated, rep.final_reserved
        stage = str((rec or {}).get("stage") or "")
    if rec is not None and rec.get("stage") and source == "run.json":
        stage = str(rec["stage"])
    cap, cap_source = _cap(run_json, reserved, device_free)
    free_res = max(reserved - allocated, 0)
    got = largest_free_block(snap, rep, row, expandable, request) if row >= 0 else None
    largest = got[0] if got is not None else None
    verdict, short = NOT_DETERMINED, None
    if cap is not None:
        if allocated + request > cap:
            verdict, short = OUT_OF_MEMORY, allocated + request - cap
        elif largest is not None:
            piece = max(largest, cap - reserved)
            verdict, short = (FRAGMENTED, request - piece) if piece < request else (NOT_DETERMINED, None)
    elif largest is not None and free_res >= request > largest:
        verdict, short = FRAGMENTED, request - largest
    live = live_categories if live_categories is not None else pd.DataFrame(columns=["category", "bytes"])
    cats = [
        LiveCategory(category=str(c), bytes=int(b))
        for c, b in zip(live["category"].tolist(), live["bytes"].tolist(), strict=True)
        if b
    ]
    top = live_at(rep, row) if row >= 0 else ev.iloc[0:0]
    by_site: dict[str, int] = {}
    for s, b in zip(top["stack_id"].tolist(), top["block_size"].tolist(), strict=True):
        name = sites.site(int(s))
        by_site[name] = by_site.get(name, 0) + int(b)
    sites_out = [
        LiveSite(site=k, bytes=v) for k, v in sorted(by_site.items(), key=lambda kv: (-kv[1], kv[0]))[:LIVE_ROWS]
    ]
    shrink = None
    if verdict == OUT_OF_MEMORY and cats:
        biggest = max(cats, key=lambda c: c.bytes)
        shrink = Shrink(category=biggest.category, bytes=biggest.bytes, stage=stage)
    time_us = int(ev["time_us"].iat[row]) if source == "trace" else -1
    return Oom(
        source=source,
        count=int(len(rows)) or 1,
        device=int(rep.device),
        event_index=row if source == "trace" else None,
        # the program allocated again after it: a caller caught the error and went on
        survived=bool(source == "trace" and (explained_oom(rep, rows)[1] >= len(rows))),
        time_us=time_us if time_us >= 0 else None,
        requested_bytes=request,
        stream=stream,
        site=sites.site(sid) if sid >= 0 else None,
        stack=sites.stack_text(sid).splitlines() if sid >= 0 else [],
        stage=stage,
        allocated_bytes=int(allocated),
        reserved_bytes=int(reserved),
        cap_bytes=_int_or_none(cap),
        cap_source=cap_source,
        device_free_bytes=device_free,
        free_reserved_bytes=int(free_res),
        largest_free_block_bytes=largest,
        verdict=verdict,
        bytes_short=_int_or_none(short),
        live_categories=cats,
        live_sites=sites_out,
        shrink=shrink,
        advice=None,  # the first advice entry that would free bytes_short (filled by the summary builder)
        # the sentences every sink says: written by the summary builder, once it has the advice and the simulation
        headline="",
        state="",
        verdict_text="",
        fix=None,
    )


def _int_or_none(v: int | None) -> int | None:
    return None if v is None else int(v)


RULE_OF_THUMB = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def _simulation(oom: Oom) -> OomSimulation | None:
    """The OOM's simulation (None: not simulated at all, or a document written before the simulator)."""
    return oom.simulation if isinstance(oom.simulation, OomSimulation) else None


def pick_advice(oom: Oom, advice: Sequence[AnyAdvice]) -> str | None:
    """What the fix line suggests trying. Where the simulator reproduced the run
    (``oom.simulation``, :func:`snapviz.analyses.whatif.oom_simulation`), the allocator setting
    under which it fits, simulated; else, for a ``fragmented`` verdict the simulation did not
    check, expandable segments as the rule of thumb; for ``out of memory`` (or a fragmented one no
    setting fixes), the first advice entry that saves at least ``bytes_short`` (None: none does)."""
    sim = _simulation(oom)
    simulated = sim is not None and sim.simulated
    if sim is not None and sim.simulated and sim.setting is not None:
        return f"PYTORCH_CUDA_ALLOC_CONF={sim.setting.alloc_conf}"
    if oom.verdict == FRAGMENTED and not simulated:
        return RULE_OF_THUMB
    if oom.verdict not in (OUT_OF_MEMORY, FRAGMENTED):
        return None
    short = oom.bytes_short or 0
    # allocator settings: the simulation's answer where there is one, never the rule of thumb beside it
    fits = [
        a
        for a in advice
        if not isinstance(a, SimulatedAdvice)
        and not (simulated and a.technique == "expandable segments")
        and (a.saves_up_to_bytes or 0) >= short
    ]
    return fits[0].technique if fits else None


def _simulated_clauses(oom: Oom) -> list[str]:
    """The fix line's ``try:`` and what the simulation says would have fit (setting, card)."""
    sim = _simulation(oom)
    advice = oom.advice
    out = []
    if sim is not None and sim.simulated:
        setting = sim.setting
        if advice and setting is not None and advice.endswith(f"={setting.alloc_conf}"):
            who = "the run fits" if oom.survived else "the recorded requests fit"  # after a fatal OOM: unknown
            out.append(
                f"try: {advice} (simulated: {who} under the same cap, reserved peak "
                f"{fmt_bytes(setting.peak_reserved_bytes)})"
            )
        else:
            if advice:
                out.append(f"try: {advice}")
            if sim.settings_tried:
                out.append("no allocator setting fits it under this cap (simulated)")
    elif advice == RULE_OF_THUMB and oom.verdict == FRAGMENTED:
        why = (
            (sim.why_not or "the simulator did not reproduce this run") if sim is not None else "no history to simulate"
        )
        out.append(f"try: {advice} (the rule of thumb for fragmentation; not simulated: {why})")
    elif advice:
        out.append(f"try: {advice}")
    return out


def oom_fix_short(oom: Oom) -> str | None:
    """The fix and card lines in a few words, for a picture's title (None: nothing to suggest)."""
    sim = _simulation(oom)
    parts = []
    if sim is not None and sim.simulated:
        if sim.setting is not None:
            parts.append(f"fits with {sim.setting.alloc_conf} (simulated)")
        elif sim.settings_tried:
            parts.append("no allocator setting fits under this cap (simulated)")
        if sim.cards and sim.cards[0].smallest_bytes is not None:
            parts.append(f"smallest card {fmt_bytes(sim.cards[0].smallest_bytes)} (simulated)")
    elif oom.advice:
        parts.append(f"try: {oom.advice}" + (" (not simulated)" if oom.advice == RULE_OF_THUMB else ""))
    return "; ".join(parts) or None


def oom_headline(oom: Oom) -> str:
    """The sentence every sink leads with when a run hit an OOM: the failed request."""
    where = f" at {oom.site}" if oom.site else ""
    stage = f" in {oom.stage}" if oom.stage else ""
    req = oom.requested_bytes
    stream = f" on stream {oom.stream}" if oom.stream else ""
    if oom.survived:
        return (
            f"CUDA out of memory, survived: a {fmt_bytes(req)} request ({req:,} B){stream}{where} failed{stage}, "
            "and the run went on (the error was caught)"
        )
    return f"CUDA out of memory: a {fmt_bytes(req)} request ({req:,} B){stream}{where} failed{stage}"


def oom_short(oom: Oom) -> str:
    """The headline in a few words, for a picture's title and marker label."""
    stage = f" in {oom.stage}" if oom.stage else ""
    survived = " (survived)" if oom.survived else ""
    return f"CUDA OOM{survived}: a {fmt_bytes(oom.requested_bytes)} request failed{stage} ({oom.verdict})"


def oom_state(oom: Oom) -> str:
    """The allocator's state at that moment, with the cap and the free memory."""
    state = f"at that moment {fmt_bytes(oom.allocated_bytes)} allocated, {fmt_bytes(oom.reserved_bytes)} reserved"
    cap = oom.cap_bytes
    state += f" under a {fmt_bytes(cap)} cap ({oom.cap_source})" if cap is not None else " (the cap is not known)"
    largest = oom.largest_free_block_bytes
    return (
        state
        + f"; {fmt_bytes(oom.free_reserved_bytes)} free in reserved segments"
        + (f", largest free block {fmt_bytes(largest)}" if largest is not None else "")
    )


def oom_verdict(oom: Oom) -> str:
    """Fragmented or really out of memory, with the numbers that decide it."""
    v = oom.verdict
    short = oom.bytes_short
    req = fmt_bytes(oom.requested_bytes)
    if v == OUT_OF_MEMORY and short is not None:
        return f"verdict: really out of memory: allocated + request exceed the cap by {fmt_bytes(short)} ({short:,} B)"
    if v == FRAGMENTED and short is not None:
        cap = oom.cap_bytes
        free = cap - oom.allocated_bytes if cap is not None else oom.free_reserved_bytes
        # under a cap, "free" is the free reserved memory plus the room not yet reserved: say both,
        # so the figure reads with the line before it (free in reserved segments)
        where = (
            f" under the cap ({fmt_bytes(oom.free_reserved_bytes)} in reserved segments, "
            f"{fmt_bytes(cap - oom.reserved_bytes)} not yet reserved)"
            if cap is not None
            else ""
        )
        return (
            f"verdict: fragmented: {fmt_bytes(free)} was free{where}, enough for the {req} request, but no free "
            f"piece was large enough (the largest was {fmt_bytes(oom.requested_bytes - short)})"
        )
    return "verdict: not determined (fragmented or out of memory: the file does not show the cap)"


def oom_fix(oom: Oom) -> str | None:
    """What would have made it fit, in words (None: not known): the shortfall, then what to try
    and what the simulation says would have fit (:func:`_simulated_clauses`)."""
    short = oom.bytes_short
    parts = []
    if short is not None and oom.verdict == FRAGMENTED:
        parts.append(f"to fit, the largest free piece had to be {fmt_bytes(short)} ({short:,} B) larger")
    elif short is not None:
        shrink = oom.shrink
        what = f" (the largest part then: {shrink.category}, {fmt_bytes(shrink.bytes)})" if shrink else ""
        parts.append(f"to fit, live memory in {oom.stage} had to be {fmt_bytes(short)} ({short:,} B) smaller{what}")
    parts += _simulated_clauses(oom)
    return "; ".join(parts) if parts else None


def oom_card(oom: Oom) -> str | None:
    """The smallest card the run fits on, simulated (None: not simulated)."""
    sim = _simulation(oom)
    if sim is None or not sim.simulated or not sim.cards:
        return None
    from snapviz.analyses.whatif import card_fit_text  # noqa: PLC0415 - the words whatif uses too

    return card_fit_text(sim.cards, ended=not oom.survived)


def oom_lines(oom: Oom) -> list[str]:
    """The OOM story in the words every sink uses: headline, state, verdict, fix, card."""
    extra = [x for x in (oom_fix(oom), oom_card(oom)) if x]
    return [oom_headline(oom), oom_state(oom), oom_verdict(oom), *extra]
