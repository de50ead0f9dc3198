"""The fit finder's plan, pruning, search and document on synthetic results (no torch, no GPU).

The truth is a table of per-combination peaks that a fake runner plays back under each card's
cap (``fits`` exactly when the peak is at most the cap, otherwise out of memory after the load
stage): the search must find every combination that truly fits, prune only ones that truly do
not, and run fewer than all of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collectors.fit import (
    Card,
    FitError,
    Measured,
    default_candidates,
    fit_dict,
    measured_from,
    measuring_order,
    parse_card,
    parse_cards,
    prune_reason,
    render_fit_markdown,
    run_fit,
)
from collectors.fit.search import plan_rows
from collectors.matrix.runner import MatrixOptions, VariantResult
from collectors.matrix.variants import parse_variant
from fitfake import TRUTH, FakeRunner

G = 2**30


def card(gib: float) -> Card:
    return Card(f"{gib:g} GiB", int(gib * G))


@pytest.mark.parametrize(
    "text, label, n",
    [
        ("24GiB", "24 GiB", 24 * G),
        ("16 GiB", "16 GiB", 16 * G),
        ("12", "12 GiB", 12 * G),
        ("48G", "48 GiB", 48 * G),
        ("24GB", "24 GB", 24 * 10**9),
        ("7.5GiB", "7.5 GiB", int(7.5 * G)),
    ],
)
def test_card_sizes(text: str, label: str, n: int) -> None:
    assert parse_card(text) == Card(label, n)


@pytest.mark.parametrize("text", ["", "24 parsecs", "-3GiB", "0", "GiB"])
def test_bad_card_sizes(text: str) -> None:
    with pytest.raises(FitError, match="--gpu-memory"):
        parse_card(text)


def test_cards_largest_first_without_duplicates_and_defaults() -> None:
    assert [c.label for c in parse_cards(["16GiB", "24GiB", "16G"])] == ["24 GiB", "16 GiB"]
    assert [c.bytes // G for c in parse_cards([])] == [48, 24, 16, 12]


def test_default_candidates_per_family() -> None:
    flux = [v.label for v in default_candidates("flux-dev")]
    assert flux[0] == "bf16" and flux == [v.label for v in default_candidates("flux-schnell")]
    assert "bf16+no-t5" in [v.label for v in default_candidates("sd35-large")]
    with pytest.raises(FitError, match="no default candidate set"):
        default_candidates("sd15")


def test_measuring_order_cheap_first_supersets_before_subsets() -> None:
    vs = [
        parse_variant(t)
        for t in (
            "bf16",
            "bf16,sequential-offload",
            "bf16,vae-tiling",
            "bf16,model-offload",
            "bf16,layerwise-fp8,vae-tiling",
            "bf16,group-offload",
        )
    ]
    got = [v.label for v in measuring_order(vs)]
    assert got == [
        "bf16+layerwise-fp8+vae-tiling",
        "bf16+vae-tiling",
        "bf16",
        "bf16+group-offload",
        "bf16+model-offload",
        "bf16+sequential-offload",
    ]


def M(label: str, gib: float, status: str, peak: float | None = None, load: float | None = None) -> Measured:
    v = parse_variant(label)
    return Measured(
        v.label,
        v.techniques,
        card(gib),
        status,
        int(peak * G) if peak is not None else None,
        int(load * G) if load is not None else None,
    )


@pytest.mark.parametrize(
    "measured, variant, cap, pruned_by",
    [
        # rule 1: the same combination ran out of memory under a cap at least as large
        ([M("bf16", 24, "oom")], "bf16", 16, "out of memory under the larger 24 GiB cap"),
        ([M("bf16", 16, "oom")], "bf16", 16, "out of memory under this cap"),
        ([M("bf16", 12, "oom")], "bf16", 16, None),  # a smaller cap proves nothing for a bigger one
        # rule 2: its measured peak is over the cap
        ([M("bf16", 48, "ok", peak=30)], "bf16", 24, "peak allocated 30.00 GiB"),
        ([M("bf16", 48, "ok", peak=20)], "bf16", 24, None),  # below the cap: it must run (fragmentation)
        # rule 3: weights alone, also measured on a combination that only adds VAE tiling
        ([M("bf16,vae-tiling", 48, "oom", load=33)], "bf16", 24, "weights alone (33.00 GiB"),
        ([M("bf16,model-offload", 48, "ok", peak=10, load=0.1)], "bf16", 24, None),
        ([M("bf16,torchao-int8", 48, "ok", peak=15, load=14)], "bf16,layerwise-fp8", 12, None),  # other weights
        # rule 4: a strictly more memory-saving superset cannot fit
        ([M("bf16,layerwise-fp8", 16, "oom")], "bf16", 16, "`bf16+layerwise-fp8` saves strictly more memory"),
        ([M("bf16,layerwise-fp8", 24, "ok", peak=18)], "bf16", 16, "saves strictly more memory"),
        ([M("bf16,classic", 16, "oom")], "bf16", 16, None),  # classic attention is not memory-saving
        ([M("bf16", 16, "oom")], "bf16,layerwise-fp8", 16, None),  # a subset's failure proves nothing
        ([M("bf16,layerwise-fp8", 16, "failed")], "bf16", 16, None),  # a crash proves nothing
    ],
)
def test_prune_reason(measured: list[Measured], variant: str, cap: float, pruned_by: str | None) -> None:
    why = prune_reason(parse_variant(variant), card(cap), measured)
    if pruned_by is None:
        assert why is None
    else:
        assert why is not None and pruned_by in why


def test_measured_from_run_json() -> None:
    run = {
        "status": "oom",
        "stages": [
            {"name": "load", "end_us": 2, "peak_allocated_bytes": 20 * G},
            {"name": "text_encode", "end_us": 3, "peak_allocated_bytes": 22 * G},
            {"name": "denoise/0", "end_us": None, "open": True, "peak_allocated_bytes": 23 * G},
        ],
    }
    m = measured_from("bf16", ("bf16",), card(24), "oom", run)
    assert (m.peak_bytes, m.load_bytes) == (22 * G, 20 * G)  # the open stage proves nothing
    ok = {**run, "status": "ok", "allocator": {"max_memory_allocated": 23 * G}}
    assert measured_from("bf16", ("bf16",), card(24), "ok", ok).peak_bytes == 23 * G
    assert measured_from("bf16", ("bf16",), card(24), "failed", None) == Measured("bf16", ("bf16",), card(24), "failed")


# ----------------------------------------------------------------------------- the search, end to end


def test_search_finds_every_fit_prunes_only_what_cannot_fit(tmp_path: Path) -> None:
    cards = parse_cards(["48GiB", "24GiB", "16GiB", "12GiB"])
    variants = [parse_variant(v) for v in TRUTH]
    fake = FakeRunner(tmp_path)
    rows = run_fit(cards, variants, fake)
    assert len(rows) == len(cards) * len(variants)
    for r in rows:
        truly_fits = TRUTH[r.variant.label][0] * G <= r.card.bytes
        assert r.fits == truly_fits, (r.card.label, r.variant.label)
        if r.pruned is not None:
            assert not truly_fits
    pruned = [r for r in rows if r.pruned is not None]
    inferred = [r for r in rows if r.inferred is not None]
    assert len(fake.calls) + len(pruned) + len(inferred) == len(rows) and len(pruned) >= 10
    # a fit is inferred, never run again, only where an earlier run of the same combination under a
    # larger cap reserved no more than this card: then this card's cap was never met
    for r in inferred:
        assert r.fits and r.result is not None and r.result.run is not None
        assert r.result.run["allocator"]["max_memory_reserved"] <= r.card.bytes
    # group offload (6 GiB + 1.5 reserved) runs once, under 48 GiB; the other cards follow from it
    assert [c for c in fake.calls if c[1] == "bf16+group-offload"] == [("48 GiB", "bf16+group-offload")]
    # the nf4 pair (11 GiB allocated, 12.5 reserved) is inferred down to 16 GiB but must run under 12 GiB
    assert ("12 GiB", "bf16+nf4-transformer+nf4-t5") in fake.calls
    # bf16 (35 GiB) measured under 48 GiB is never run again on smaller cards
    assert fake.calls.count(("48 GiB", "bf16")) == 1 and not [
        c for c in fake.calls if c[1] == "bf16" and c[0] != "48 GiB"
    ]
    # on 16 GiB the nf4 transformer (17 GiB under 24) is pruned by its measured peak
    nf4 = next(r for r in rows if r.card.label == "16 GiB" and r.variant.label == "bf16+nf4-transformer")
    assert nf4.pruned is not None and "17.00 GiB" in nf4.pruned


def test_fit_document_fastest_and_markdown(tmp_path: Path) -> None:
    cards = parse_cards(["24GiB", "12GiB"])
    variants = [parse_variant(v) for v in TRUTH]
    rows = run_fit(cards, variants, FakeRunner(tmp_path))
    opts = MatrixOptions(pipeline="flux-dev", size="full", device="cuda", steps=2, out=tmp_path)
    first = next(r.result.run for r in rows if r.result is not None and r.result.ok)
    doc = fit_dict(opts, cards, rows, [{"label": "bf16+torchao-int8", "reason": "torchao is not installed"}], [], first)
    json.dumps(doc)
    by = {c["label"]: c for c in doc["cards"]}
    # fastest that fits = least call time among those with peak <= cap
    for c in cards:
        expect = min((k for k, t in TRUTH.items() if t[0] * G <= c.bytes), key=lambda k: TRUTH[k][2])
        assert by[c.label]["fastest"] == expect
    assert by["24 GiB"]["fastest"] == "bf16+layerwise-fp8"
    row = next(r for r in by["24 GiB"]["rows"] if r["label"] == "bf16+layerwise-fp8")
    assert row["time_per_image_s"] == pytest.approx(12.0) and row["stages"]["vae_decode"] == 23 * G
    assert row["stages"]["load"] == 20 * G
    statuses = {r["label"]: r["status"] for r in by["12 GiB"]["rows"]}
    assert statuses["bf16"] == "pruned" and statuses["bf16+nf4-transformer+nf4-t5"] == "fits"
    assert doc["runs"] + doc["pruned"] + doc["inferred"] == 2 * len(TRUTH) and doc["inferred"] > 0
    # each card's runs also as a ranked matrix document; bf16 did not run on 24 GiB (pruned), so
    # the first combination that fits there is the baseline, and pruned ones are not in it
    m24 = by["24 GiB"]["matrix"]
    assert m24["schema"] == "snapviz.matrix/1" and m24["baseline"] == "bf16+layerwise-fp8+vae-tiling"
    assert "bf16" not in [v["label"] for v in m24["variants"]]
    assert [v["rank"] for v in m24["variants"] if v["status"] == "ok"][1:] == list(
        range(1, sum(t[0] <= 24 for t in TRUTH.values()))
    )
    md = render_fit_markdown(doc)
    assert "Fastest that fits 24 GiB: `bf16+layerwise-fp8`" in md and "at 2 steps" in md
    assert "torchao is not installed" in md and "Pruning:" in md


def test_plan_rows_is_the_dry_run_order() -> None:
    cards = parse_cards(["16GiB", "24GiB"])
    vs = [parse_variant(v) for v in ("bf16", "bf16,model-offload", "bf16,vae-tiling")]
    assert [(c.label, v.label) for c, v in plan_rows(cards, vs)] == [
        ("24 GiB", "bf16+vae-tiling"),
        ("24 GiB", "bf16"),
        ("24 GiB", "bf16+model-offload"),
        ("16 GiB", "bf16+vae-tiling"),
        ("16 GiB", "bf16"),
        ("16 GiB", "bf16+model-offload"),
    ]


def test_a_refused_combination_runs_once(tmp_path: Path) -> None:
    """The collector refusing the options (exit 2) does not depend on the cap: asked once."""
    fake = FakeRunner(tmp_path)

    def run_one(v: Any, c: Card) -> Any:
        res = fake(v, c)
        if "nf4-t5" in v.techniques:
            res.status, res.reason, res.measure = "unsupported", "nf4 needs bitsandbytes", None
        return res

    rows = run_fit(parse_cards(["24GiB", "16GiB", "12GiB"]), [parse_variant("bf16,nf4-transformer,nf4-t5")], run_one)
    assert [r.result.status for r in rows if r.result] == ["unsupported"] * 3 and len(fake.calls) == 1


# ----------------------------------------------------------------------------- cells the simulator decides


def test_smaller_cards_are_simulated_from_a_larger_cards_snapshot(tmp_path: Path) -> None:
    """A combination that completed under a larger cap with history (a snapshot) is simulated on the
    smaller cards instead of run, and each cell says simulated or measured. The recording is a real
    one (sd15-fp16-alloc-default: 2.64 GiB allocated, 3.19 GiB reserved at peak, no cap); the verdicts
    are checked against snapviz whatif's driver on the same file."""
    import shutil

    from collectors.fit.simulated import simulate_card
    from collectors.matrix.ranking import measure
    from paths import SAMPLES
    from snapviz.analyses.whatif import what_if
    from snapviz.load import load

    sample = SAMPLES / "sd15-fp16-alloc-default"
    run = json.loads((sample / "run.json").read_text())
    calls: list[tuple[str, str]] = []

    def run_one(v: Any, c: Card) -> Any:
        calls.append((c.label, v.label))
        rd = tmp_path / c.label.replace(" ", "") / v.label
        shutil.copytree(sample, rd)
        import lzma

        (rd / "snapshot.pickle").write_bytes(lzma.decompress((rd / "snapshot.pickle.xz").read_bytes()))
        (rd / "snapshot.pickle.xz").unlink()
        res = VariantResult(v, "ok", None, rd, rd.with_suffix(".log"), 0, 1.0, "0", run=run)
        res.measure = measure(run)
        return res

    # 8 GiB: measured; 3.1 GiB: above the allocated peak, below the reserved one: simulated;
    # 3.0 GiB: the same; 2.5 GiB: pruned (its measured allocated peak exceeds it)
    cards = parse_cards(["8GiB", f"{3.1}GiB", "3GiB", "2.5GiB"])
    rows = run_fit(cards, [parse_variant("bf16")], run_one, simulate=simulate_card)
    assert calls == [("8 GiB", "bf16")]
    by = {r.card.label: r for r in rows}
    assert by["8 GiB"].decided_by == "measured" and by["2.5 GiB"].decided_by == "pruned"
    w = what_if(load(str(tmp_path / "8GiB" / "bf16")), alloc_confs=[], gpu_memories=[c.bytes for c in cards[1:3]])
    assert w.fidelity.reproduced
    for c in cards[1:3]:
        row = by[c.label]
        assert row.simulated is not None
        assert (
            row.decided_by == "simulated"
            and row.result is None
            and "simulated from the 8 GiB run" in row.simulated.reason
        )
        sim = next(r.sim for r in w.results if r.scenario.gpu_memory == c.bytes and r.scenario.alloc_conf is None)
        assert row.fits == (sim.stopped_at is None) and row.simulated.peak_reserved_bytes == sim.peak_reserved
        assert row.simulated.peak_reserved_bytes <= c.bytes
    opts = MatrixOptions(pipeline="sd15", size="full", device="cuda", steps=2, out=tmp_path)
    doc = fit_dict(opts, cards, rows, [], [], run)
    assert doc["simulated"] == 2 and doc["runs"] == 1
    cells = {c["label"]: c["rows"][0] for c in doc["cards"]}
    assert [cells[c.label]["decided_by"] for c in cards] == ["measured", "simulated", "simulated", "pruned"]
    md = render_fit_markdown(doc)
    assert "(simulated)" in md and "2 cells simulated from a larger card's snapshot" in md
    # without a snapshot (no --history) nothing is simulated: the cells are run
    (tmp_path / "8GiB" / "bf16" / "snapshot.pickle").unlink()
    measured = by["8 GiB"].result
    assert measured is not None
    assert simulate_card(measured, cards[0], cards[1]) is None
