"""``snapviz check``: size parsing, gate evaluation, CI lines, exit codes 0/1/2, JUnit XML."""

from __future__ import annotations

import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from snapviz.analyses.gate import evaluate_gates
from snapviz.errors import InputError
from snapviz.units import parse_percent, parse_size
from synth import GiB, MiB, Sim, make_frames


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12GiB", 12 * GiB),
        ("800MiB", 800 * MiB),
        ("12GB", 12_000_000_000),
        ("1.5 GiB", 3 * GiB // 2),
        ("123456", 123456),
        ("0.5KiB", 512),
        ("2 tib", 2 << 40),
        ("1e9", 10**9),
        ("1.5e3 MB", 1_500_000_000),
        ("7b", 7),
        (" 8 GiB ", 8 * GiB),
        (4096, 4096),
    ],
)
def test_parse_size(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("12XB", "unknown unit 'XB'"),
        ("12 G", "ambiguous unit 'G'"),
        ("", "invalid size ''"),
        ("-1GiB", "invalid size"),
        ("GiB", "invalid size"),
        ("1,5GiB", "invalid size"),
        ("twelve", "invalid size"),
        ("1e30", "implausibly large"),
    ],
)
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        parse_size(text, "--max-peak")


def test_parse_percent() -> None:
    assert parse_percent("5%") == 5.0 and parse_percent("0.5") == 0.5 and parse_percent("+2.5 %") == 2.5
    with pytest.raises(InputError):
        parse_percent("5 percent")


# --------------------------------------------------------------------------- a run to check


def run_snapshot(vae: int = 700 * MiB, seed: int = 0) -> tuple[dict[str, Any], dict[str, int]]:
    """1 GiB weights, two 300 MiB steps, a decode buffer; truth = allocator peaks per stage."""
    sim = Sim(seed=seed)
    truth: dict[str, int] = {}
    for stage, nbytes in (("load", GiB), ("denoise/0", 300 * MiB), ("denoise/1", 310 * MiB), ("vae_decode", vae)):
        sim.reset_peak()
        with sim.stage(stage):
            h = sim.alloc(nbytes, frames=make_frames(stage.split("/")[0], "/w/pipe.py", 7))
            if stage != "load":
                sim.free(h)
        truth[stage] = sim.peak_allocated()
    truth["peak"] = max(truth.values())
    return sim.snapshot(marker=False), truth


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("check")
    out: dict[str, Any] = {"dir": d}
    for name, vae in (("run", 700 * MiB), ("bigger", 900 * MiB)):
        snap, truth = run_snapshot(vae)
        (d / f"{name}.pickle").write_bytes(pickle.dumps(snap, protocol=4))
        out[name], out[f"{name}_truth"] = str(d / f"{name}.pickle"), truth
    return out


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from snapviz.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_evaluate_gates_on_a_summary(runs: dict[str, Any]) -> None:
    from snapviz.cli.inputs import document_input

    doc = document_input(runs["run"])
    t = runs["run_truth"]
    res = evaluate_gates(
        doc, max_peak=t["peak"], stage_limits=[("vae_decode", t["vae_decode"] - 1), ("denoise/1", 2 * GiB)]
    )
    assert [(r.name, r.passed, r.actual) for r in res] == [
        ("peak_allocated", True, t["peak"]),
        ("stage:vae_decode", False, t["vae_decode"]),
        ("stage:denoise/1", True, t["denoise/1"]),
    ]
    with pytest.raises(
        InputError, match=r"stage 'decode' is not in .* \(stages: load, denoise, denoise/0..denoise/1, vae_decode\)"
    ):
        evaluate_gates(doc, stage_limits=[("decode", GiB)])


def test_pass_prints_pass_lines_and_exits_0(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(
        ["check", runs["run"], "--max-peak", "12GiB", "--max-reserved", "14GiB", "--max-stage-peak", "vae_decode=8GiB"],
        capsys,
    )
    assert rc == 0, err
    assert out.splitlines()[:3] == [
        "PASS peak allocated 1.68 GiB <= 12.00 GiB",
        "PASS peak reserved 2.28 GiB <= 14.00 GiB",
        "PASS stage vae_decode 1.68 GiB <= 8.00 GiB",
    ]
    assert out.splitlines()[3].startswith("3 passed, 0 failed")


def test_fail_prints_fail_lines_and_exits_1(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    xml = tmp_path / "memory.xml"
    rc, out, err = _cli(
        [
            "check",
            runs["run"],
            "--max-peak",
            "2GB",
            "--max-stage-peak",
            "vae_decode=1.5GiB",
            "--max-stage-peak",
            "denoise=1.5GiB",
            "--junit-xml",
            str(xml),
        ],
        capsys,
    )
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == "PASS peak allocated 1.68 GiB <= 1.86 GiB"
    assert lines[1] == "FAIL stage vae_decode 1.68 GiB > 1.50 GiB (+12.2%)"
    assert lines[2] == "PASS stage denoise 1.30 GiB <= 1.50 GiB"
    assert "1 of 3 limits exceeded" in err
    root = ET.parse(xml).getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["peak_allocated", "stage:vae_decode", "stage:denoise"]
    fail = cases[1].find("failure")
    assert fail is not None and fail.get("message") == lines[1]
    assert f"actual_bytes={runs['run_truth']['vae_decode']}" in (fail.text or "")
    assert cases[0].find("failure") is None


def test_baseline_increase(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    # bigger: vae 900 MiB instead of 700 MiB -> peak +11.6%
    rc, out, _ = _cli(["check", runs["bigger"], "--baseline", runs["run"], "--max-increase", "5%"], capsys)
    assert rc == 1
    assert out.splitlines()[0] == (
        "FAIL peak allocated vs baseline 1.88 GiB > 1.77 GiB (baseline 1.68 GiB, +11.6%, allowed +5.0%)"
    )
    rc, out, _ = _cli(["check", runs["bigger"], "--baseline", runs["run"], "--max-increase", "12%"], capsys)
    assert rc == 0 and out.startswith(
        "PASS peak allocated vs baseline 1.88 GiB <= 1.89 GiB (baseline 1.68 GiB, +11.6%, allowed +12.0%)"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["{run}", "--max-peak", "12XB"], "snapviz: error: --max-peak: unknown unit 'XB' in '12XB'"),
        (["{run}", "--max-peak", "12 G"], "ambiguous unit 'G'"),
        (["{run}", "--max-stage-peak", "vae_decode"], "--max-stage-peak: expected STAGE=SIZE"),
        (["{dir}/missing.pickle", "--max-peak", "1GiB"], "missing.pickle: no such file or directory"),
        (["{run}", "--max-stage-peak", "upscale=1GiB"], "stage 'upscale' is not in"),
        (["{run}"], "nothing to check"),
        (["{run}", "--baseline", "{run}"], "--baseline and --max-increase go together"),
        (["{run}", "--max-increase", "5%"], "--baseline and --max-increase go together"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_xml(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    xml = tmp_path / "never.xml"
    rc, out, err = _cli(["check", *[a.format(**runs) for a in args], "--junit-xml", str(xml)], capsys)
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""
    assert not xml.exists()


def test_unknown_stage_names_the_stages_that_exist(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(["check", runs["run"], "--max-stage-peak", "decode=1GiB"], capsys)
    assert rc == 2 and "(stages: load, denoise, denoise/0..denoise/1, vae_decode)" in err


def test_console_script_exit_codes(runs: dict[str, Any]) -> None:
    """The real entry point, in a subprocess: exit statuses as CI sees them."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "snapviz", "check", *args], capture_output=True, text=True, timeout=120
        )

    ok, bad, usage = (
        run(runs["run"], "--max-peak", "2GiB"),
        run(runs["run"], "--max-peak", "1GiB"),
        run(runs["run"], "--max-peak", "x"),
    )
    assert (ok.returncode, bad.returncode, usage.returncode) == (0, 1, 2)
    assert "FAIL peak allocated 1.68 GiB > 1.00 GiB (+68.4%)" in bad.stdout
    assert usage.stderr.count("\n") == 1


# --------------------------------------------------------------------------- a summary JSON as input


def test_check_and_compare_read_back_a_summary_json(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """An earlier ``analyze --json`` is an input of ``check`` (and ``--baseline``) and ``compare``:
    read back through the typed document, with the verdict the run itself gets."""
    d = runs["dir"]
    js = d / "run.summary.json"
    assert _cli(["analyze", runs["run"], "--json", str(js), "--quiet"], capsys)[0] == 0
    t = runs["run_truth"]
    limit = str(t["vae_decode"] - 1)
    on_run = _cli(["check", runs["run"], "--max-stage-peak", f"vae_decode={limit}"], capsys)
    on_json = _cli(["check", str(js), "--max-stage-peak", f"vae_decode={limit}"], capsys)
    assert on_run[0] == on_json[0] == 1
    assert on_run[1].replace(runs["run"], "X") == on_json[1].replace(str(js), "X")
    code, out, _ = _cli(["check", runs["bigger"], "--baseline", str(js), "--max-increase", "1%"], capsys)
    assert code == 1 and "FAIL peak allocated vs baseline" in out and "baseline " in out
    code, out, err = _cli(["compare", str(js), runs["bigger"]], capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda doc: doc["peak"].pop("allocated_bytes"), "peak: missing field 'allocated_bytes'"),
        (
            lambda doc: doc["peak"].update(allocated_bytes="3 GiB"),
            "peak.allocated_bytes: expected an integer, got a string",
        ),
        (lambda doc: doc["stages"][0].update(surprise=1), "stages[0]: unknown field 'surprise'"),
        (lambda doc: doc.update(warnings="none"), "warnings: expected a list, got a string"),
    ],
)
def test_check_refuses_a_malformed_summary_json(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str], edit: Any, field: str
) -> None:
    import json

    js = runs["dir"] / "bad.summary.json"
    assert _cli(["analyze", runs["run"], "--json", str(js), "--quiet"], capsys)[0] == 0
    doc = json.loads(js.read_text())
    edit(doc)
    js.write_text(json.dumps(doc, indent=2))
    code, out, err = _cli(["check", str(js), "--max-peak", "1GiB"], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "malformed snapviz.summary/1 document" in err and field in err, err
