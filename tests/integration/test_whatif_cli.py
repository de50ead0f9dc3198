"""``snapviz whatif``: the table, its one story across terminal / Markdown / JSON / HTML, the
schema, and exit 2 with no output on bad options."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import synth
from paths import ROOT, SAMPLES

OOM = SAMPLES / "sdxl-fp16-oom-10gb"
SD15 = SAMPLES / "sd15-fp16-classic"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _snapviz(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapviz", *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600
    )


def test_whatif_on_the_oom_sample_one_story(tmp_path: Path) -> None:
    out = tmp_path / "w"
    p = _snapviz(
        "whatif",
        str(OOM),
        "--alloc-conf",
        "expandable_segments:True",
        "--gpu-memory",
        "12GiB",
        "--json",
        f"{out}.json",
        "--markdown",
        f"{out}.md",
        "-o",
        f"{out}.html",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(Path(f"{out}.json").read_text())
    assert doc["schema"] == "snapviz.whatif/1"
    assert doc["fidelity"]["reproduced"] is True
    rows = {(s["alloc_conf"], s["gpu_memory_bytes"]): s for s in doc["scenarios"]}
    assert set(rows) == {
        (None, None),
        (None, 12 << 30),
        ("expandable_segments:True", None),
        ("expandable_segments:True", 12 << 30),
    }
    keys = {
        "alloc_conf",
        "gpu_memory_bytes",
        "peak_reserved_bytes",
        "peak_allocated_bytes",
        "fragmentation_bytes",
        "device_mallocs",
        "device_frees",
        "retries",
        "oom",
        "reproduces_recording",
    }
    assert all(keys <= set(s) for s in doc["scenarios"])
    rec = rows[(None, None)]
    run_json = json.loads((OOM / "run.json").read_text())
    # the recorded scenario is the recording: the allocator's own figures, its OOM where it happened
    assert rec["reproduces_recording"] is True
    assert rec["peak_reserved_bytes"] == run_json["allocator"]["max_memory_reserved"]
    assert rec["peak_allocated_bytes"] == run_json["allocator"]["max_memory_allocated"]
    assert rec["oom"]["event_index"] == doc["recorded"]["oom_event_index"]
    assert rec["oom"]["stage"] == run_json["oom"]["stage"]
    assert rec["oom"]["requested_bytes"] == run_json["oom"]["requested_bytes"]
    assert not rows[("expandable_segments:True", None)]["reproduces_recording"]
    # expandable segments avoid the recorded OOM under the same 10 GiB cap
    assert rows[("expandable_segments:True", None)]["oom"] is None
    # the same numbers in every output
    md = Path(f"{out}.md").read_text()
    html = Path(f"{out}.html").read_text()
    for s in doc["scenarios"]:
        gib = f"{s['peak_reserved_bytes'] / 2**30:.2f} GiB"
        assert gib in p.stdout and gib in md and gib in html
    assert "reproduced this run exactly" in p.stdout and "reproduced this run exactly" in md
    assert "reproduced this run exactly" in html
    # the smallest card, as analyze's OOM line says it (one simulation, one story): fits there
    # and not 1 GiB below, by whatif's own scenarios
    an = json.loads(_snapviz("analyze", str(OOM), "--json", "-").stdout)["oom"]
    assert doc["smallest_card"] == an["simulation"]["cards"] and len(doc["smallest_card"]) == 2
    g = doc["smallest_card"][0]["smallest_bytes"]
    q = _snapviz("whatif", str(OOM), "--gpu-memory", str(g), "--gpu-memory", str(g - (1 << 30)), "--json", "-")
    by = {s["gpu_memory_bytes"]: s for s in json.loads(q.stdout)["scenarios"] if s["alloc_conf"] is None}
    assert by[g]["oom"] is None and by[g - (1 << 30)]["oom"] is not None
    line = an["card"][:1].upper() + an["card"][1:]
    assert line in p.stdout and line in md and line in html


def test_whatif_default_sweep_lists_every_setting_and_card(tmp_path: Path) -> None:
    p = _snapviz("whatif", str(SD15), "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    confs = {s["alloc_conf"] for s in doc["scenarios"]}
    assert None in confs and "expandable_segments:True" in confs and "garbage_collection_threshold:0.8" in confs
    assert len(confs) == 10
    assert {s["gpu_memory_bytes"] for s in doc["scenarios"]} == {None, *(g << 30 for g in (8, 12, 16, 24, 40, 48, 80))}
    # an 8 GiB card is more than this run ever holds (3.6 GiB): the recorded settings fit and match
    by = {(s["alloc_conf"], s["gpu_memory_bytes"]): s for s in doc["scenarios"]}
    assert by[(None, 8 << 30)]["peak_reserved_bytes"] == by[(None, None)]["peak_reserved_bytes"]
    assert by[(None, 8 << 30)]["oom"] is None
    assert doc["smallest_card"] == []  # no OOM: no smallest-card answer


def test_whatif_small_card_reports_the_oom_where_it_happens(tmp_path: Path) -> None:
    p = _snapviz("whatif", str(SD15), "--alloc-conf", "expandable_segments:True", "--gpu-memory", "3GiB", "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    small = [s for s in doc["scenarios"] if s["gpu_memory_bytes"] == 3 << 30]
    assert all(s["oom"] is not None for s in small)
    for s in small:
        assert s["oom"]["reserved_bytes"] <= 3 << 30 and s["oom"]["stage"]
        assert s["peak_reserved_bytes"] <= 3 << 30


def test_whatif_bad_options_exit_2_and_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    for args in (
        ["--alloc-conf", "max_split_size_mb:nope"],
        ["--alloc-conf", "bogus_option:1"],
        ["--gpu-memory", "12 G"],
        ["--gpu-memory", "0"],
        ["-o", str(SD15 / "run.json")],
    ):
        p = _snapviz("whatif", str(SD15), *args, "--json", str(out))
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
        assert not out.exists()


def test_whatif_on_a_late_recording_says_figures_are_approximate(tmp_path: Path) -> None:
    model = synth.random_workload(5, n_ops=500, record_from=0.5)
    snap = tmp_path / "late.pickle"
    snap.write_bytes(pickle.dumps(model.snapshot(marker=False)))
    p = _snapviz("whatif", str(snap), "--gpu-memory", "8GiB", "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["fidelity"]["reproduced"] is False and "predates the recording" in doc["fidelity"]["reason"]
    assert all(s["approximate"] and not s["reproduces_recording"] for s in doc["scenarios"])


def test_check_fits_gates_on_a_simulated_card(tmp_path: Path) -> None:
    junit = tmp_path / "fits.xml"
    p = _snapviz("check", str(OOM), "--fits", "8GiB", "--fits", "24GiB", "--junit-xml", str(junit))
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert any(
        x.startswith("FAIL fits a 8.00 GiB card") and "out of memory at event" in x and "vae_decode" in x for x in lines
    )
    assert any(x.startswith("PASS fits a 24.00 GiB card") for x in lines)
    assert junit.exists()
    p = _snapviz("check", str(SD15), "--fits", "8GiB")
    assert p.returncode == 0, p.stdout + p.stderr
    p = _snapviz("check", str(SD15), "--fits", "12 G")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_compare_whatif_shows_the_run_beside_its_simulated_twin(tmp_path: Path) -> None:
    out = tmp_path / "c"
    p = _snapviz(
        "compare",
        str(OOM),
        "--whatif",
        "expandable_segments:True",
        "--whatif",
        "max_split_size_mb:128",
        "--json",
        f"{out}.json",
        "--markdown",
        f"{out}.md",
    )
    assert p.returncode == 0, p.stderr
    tw = json.loads(Path(f"{out}.json").read_text())["whatif"]
    rec, *twins = tw["rows"]
    run_json = json.loads((OOM / "run.json").read_text())
    # the recorded row is the recording's own figures; the twins are whatif's scenarios, marked simulated
    assert not rec["simulated"] and rec["peak_reserved_bytes"] == run_json["allocator"]["max_memory_reserved"]
    assert rec["peak_allocated_bytes"] == run_json["allocator"]["max_memory_allocated"]
    assert rec["oom"]["event_index"] == tw["recorded"]["oom_event_index"]
    w = json.loads(
        _snapviz(
            "whatif",
            str(OOM),
            "--alloc-conf",
            "expandable_segments:True",
            "--alloc-conf",
            "max_split_size_mb:128",
            "--gpu-memory",
            "80GiB",
            "--json",
            "-",
        ).stdout
    )
    by = {s["alloc_conf"]: s for s in w["scenarios"] if s["gpu_memory_bytes"] is None}
    # the recording's fragmentation and segment counts are what the reproduced simulation says
    for k in ("fragmentation_bytes", "device_mallocs", "device_frees"):
        assert rec[k] == by[None][k], k
    assert [t["alloc_conf"] for t in twins] == ["expandable_segments:True", "max_split_size_mb:128"]
    for t in twins:
        s = by[t["alloc_conf"]]
        assert t["simulated"] and t["label"].endswith("(simulated)")
        for k in ("peak_reserved_bytes", "fragmentation_bytes", "device_mallocs", "device_frees", "retries", "oom"):
            assert t[k] == s[k], k
        assert t["peak_reserved_delta_bytes"] == s["peak_reserved_bytes"] - rec["peak_reserved_bytes"]
    md = Path(f"{out}.md").read_text()
    for t in tw["rows"]:
        gib = f"{t['peak_reserved_bytes'] / 2**30:.2f} GiB"
        assert gib in p.stdout and gib in md
    assert "reproduced this run exactly" in p.stdout and "`expandable_segments:True` (simulated)" in md


def test_compare_whatif_html_draws_the_twins_curves(tmp_path: Path) -> None:
    """-o with --whatif: alone, the what-if page of BASE's twins; beside a second run, the same
    cards above the comparison. The same simulation, so the same figures as the JSON."""
    one, two = tmp_path / "one.html", tmp_path / "two.html"
    p = _snapviz("compare", str(OOM), "--whatif", "expandable_segments:True", "-o", str(one), "--json", f"{one}.json")
    assert p.returncode == 0, p.stderr
    q = _snapviz("compare", str(SD15), str(OOM), "--whatif", "expandable_segments:True", "-o", str(two))
    assert q.returncode == 0, q.stderr
    rows = json.loads(Path(f"{one}.json").read_text())["whatif"]["rows"]
    page_one, page_two = one.read_text(), two.read_text()
    assert "Reserved memory, simulated over recorded" in page_one and "expandable_segments:True" in page_one
    for r in rows:  # the recorded and simulated reserved peaks, as the JSON gives them
        assert f"{r['peak_reserved_bytes'] / 2**30:.2f} GiB" in page_one, r["label"]
    assert "beside its simulated twins" in page_two and "Reserved memory, simulated over recorded" in page_two
    # the comparison is still there, below the twins' cards
    assert page_two.index("beside its simulated twins") < page_two.rindex(OOM.name)
    assert SD15.name in page_two and "compare --whatif" not in page_two
    assert "snapviz compare --whatif" in page_one


def test_compare_whatif_with_two_runs_and_bad_uses(tmp_path: Path) -> None:
    p = _snapviz("compare", str(SD15), str(OOM), "--whatif", "expandable_segments:True", "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert len(doc["runs"]) == 2 and doc["whatif"]["label"] == doc["runs"][0]["label"]  # BASE's twin
    from snapviz.analyses.compare_document import load_compare
    from snapviz.analyses.document import to_json
    from snapviz.analyses.whatif_document import RecordedTwin, SimulatedTwin, WhatIfTwins

    twins = load_compare(doc).whatif  # read back through the typed document, twins typed too
    assert isinstance(twins, WhatIfTwins) and to_json(twins) == doc["whatif"]
    assert [type(r) for r in twins.rows] == [RecordedTwin, SimulatedTwin]
    for args in (
        ["--whatif", "bogus:1"],
        ["--whatif", "expandable_segments:True", "--png", str(tmp_path / "c.png")],
        [],
    ):
        q = _snapviz("compare", str(SD15), *args, "--json", str(tmp_path / "c.json"))
        assert q.returncode == 2, (args, q.stderr)
        assert q.stderr.count("\n") == 1 and "Traceback" not in q.stderr and not (tmp_path / "c.json").exists()
