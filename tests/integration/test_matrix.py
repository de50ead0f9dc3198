"""``snapviz matrix`` on CPU with the tiny SD 1.5 pipeline: real collector subprocesses.

One end-to-end matrix (three variants, one of which the collector refuses) is shared by the
tests of this module; the ranking rule, run.json-only numbers and option errors are checked
against it and on hand-made rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from collectors import matrix as mx  # noqa: E402
from collectors.cli import matrix  # noqa: E402
from paths import ROOT

REPO = ROOT
VARIANTS = ["fp32", "fp32,vae-tiling", "fp32,model-offload"]  # the last needs CUDA: refused


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("matrix")
    out = root / "runs"
    args = [
        "--pipeline",
        "sd15",
        "--size",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--jobs",
        "3",
        "--timeout",
        "120",
        "--out",
        str(out),
        "--json",
        str(root / "m.json"),
        "--markdown",
        str(root / "m.md"),
        "-o",
        str(root / "m.html"),
    ]
    for v in VARIANTS:
        args += ["--variant", v]
    # a forced terminal: the variants' progress bar is drawn (on stderr) as on a TTY
    result = CliRunner().invoke(matrix, args, env={"SNAPVIZ_PROGRESS": "always"})
    assert result.exit_code == 0, (result.output, result.exception)
    return {"result": result, "root": root, "out": out, "doc": json.loads((root / "m.json").read_text())}


def test_every_variant_ran_in_its_own_process(ran: dict[str, Any]) -> None:
    doc, out = ran["doc"], ran["out"]
    assert doc["schema"] == "snapviz.matrix/1"
    assert {v["label"] for v in doc["variants"]} == {"fp32", "fp32+vae-tiling", "fp32+model-offload"}
    assert doc["baseline"] == "fp32"  # the first --variant
    by = {v["label"]: v for v in doc["variants"]}
    for label in ("fp32", "fp32+vae-tiling"):
        v = by[label]
        assert v["status"] == "ok" and v["returncode"] == 0
        run_dir = Path(v["run_dir"])
        assert run_dir.parent == out and (run_dir / "run.json").is_file()
        info = json.loads((run_dir / "run.json").read_text())
        assert info["techniques"] == v["recorded_techniques"]
        assert "--out" in info["command"] and str(run_dir) in info["command"]
        # a fresh process each: the logs name the collector command line
        assert Path(v["log"]).read_text().startswith("$ ")
        assert "-m collectors" in Path(v["log"]).read_text().splitlines()[0]
    assert by["fp32+vae-tiling"]["recorded_techniques"] == ["fp32", "sdpa", "vae-tiling"]


def test_failed_variant_is_recorded_and_the_matrix_goes_on(ran: dict[str, Any]) -> None:
    by = {v["label"]: v for v in ran["doc"]["variants"]}
    bad = by["fp32+model-offload"]
    assert bad["status"] == "unsupported" and bad["returncode"] == 2
    assert "needs a CUDA device" in bad["reason"]
    assert not bad["reason"].startswith("snapviz: error") and "--help" not in bad["reason"]  # the message alone
    assert bad["rank"] is None and bad["measure"] is None
    table = ran["result"].stdout
    assert "| ✗ | `fp32+model-offload` | unsupported: model-offload needs a CUDA device" in table
    assert ran["doc"]["variants"][-1]["label"] == "fp32+model-offload"  # unranked rows last


def test_progress_bar_counts_variants_on_stderr_only(ran: dict[str, Any]) -> None:
    err, out = ran["result"].stderr, ran["result"].stdout
    assert "snapviz matrix: variants [" in err and "] 3/3  100%" in err
    lines = [ln.split("\x1b[K")[-1] for ln in err.split("\n")]  # each line as a terminal shows it
    assert sum(ln.startswith("[") and "/3] " in ln for ln in lines) == 3  # one line per variant above the bar
    assert "\x1b[K" not in out and "variants [" not in out


def test_numbers_come_from_run_json_rss_on_cpu(ran: dict[str, Any]) -> None:
    doc = ran["doc"]
    assert doc["memory_metric"] == "rss" and "RSS" in doc["memory_metric_text"]
    for v in doc["variants"]:
        if v["status"] != "ok":
            continue
        info = json.loads((Path(v["run_dir"]) / "run.json").read_text())
        assert info["allocator"] is None and "snapshot.pickle" not in info["files"]
        m = v["measure"]
        assert m["memory_metric"] == "rss"
        assert m["peak_allocated_bytes"] == max(s["rss_peak_bytes"] for s in info["stages"])
        denoise = [s for s in info["stages"] if s["name"].startswith("denoise/")]
        assert m["stages"]["denoise"]["peak_allocated_bytes"] == max(s["rss_peak_bytes"] for s in denoise)
        assert m["step_median_s"] == pytest.approx(denoise[1]["wall_s"])  # step 0 left out
        assert m["call_s"] == pytest.approx(sum(s["wall_s"] for s in info["stages"][1:]), abs=1e-5)
        assert m["peak_reserved_bytes"] is None
    assert "peak RSS" in ran["result"].stdout and "peak reserved" not in ran["result"].stdout


def test_ranking_is_consistent_with_the_numbers(ran: dict[str, Any]) -> None:
    doc = ran["doc"]
    base = next(v for v in doc["variants"] if v["label"] == doc["baseline"])
    assert base["rank"] is None and base["verdict"] == "baseline"
    ranked = [v for v in doc["variants"] if v["rank"] is not None]
    assert [v["rank"] for v in ranked] == list(range(1, len(ranked) + 1))
    for v in ranked:
        saved = base["measure"]["peak_allocated_bytes"] - v["measure"]["peak_allocated_bytes"]
        extra = v["measure"]["call_s"] - base["measure"]["call_s"]
        assert v["vs_baseline"]["saved_bytes"] == saved
        assert v["vs_baseline"]["extra_call_s"] == pytest.approx(extra, abs=1e-5)
        expect = 1 if saved > 0 and extra <= 0 else 2 if saved > 0 else 3
        assert v["tier"] == expect
    assert "memory saved per extra second" in doc["ranking_rule"]
    assert doc["ranking_rule"] in ran["result"].stdout.replace("**", "")


def test_one_comparison_report_via_compare(ran: dict[str, Any]) -> None:
    doc, root = ran["doc"], ran["root"]
    cmp = doc["compare"]
    assert cmp["schema"] == "snapviz.compare/1"
    from snapviz.analyses.compare_document import load_compare

    assert load_compare(cmp, "matrix.json: compare").base == "fp32"  # the typed document reads it back
    assert [r["label"] for r in cmp["runs"]] == ["fp32", "fp32+vae-tiling"]  # base first, ok runs only
    oks = {v["label"]: v for v in doc["variants"] if v["status"] == "ok"}
    for r in cmp["runs"]:
        assert r["peak"]["allocated_bytes"] == oks[r["label"]]["measure"]["peak_allocated_bytes"]
    names = [s["name"] for s in cmp["stages"]]
    assert {"load", "text_encode", "denoise", "vae_decode"} <= set(names)
    md = (root / "m.md").read_text()
    assert "## Technique matrix: sd15" in md and "### GPU memory comparison" in md
    html = (root / "m.html").read_text()
    assert 'id="sv-matrix-table"' in html and 'id="sv-delta-table"' in html
    assert html.index('id="sv-matrix"') < html.index('id="sv-delta-table"')


# ----------------------------------------------------------------------------- rules, no processes


def _row(label: str, peak: int, call: float, status: str = "ok") -> dict[str, Any]:
    stages = {g: {"peak_allocated_bytes": peak, "peak_reserved_bytes": None} for g in mx.STAGE_GROUPS}
    m = {
        "memory_metric": "allocator",
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": peak,
        "stages": stages,
        "call_s": call,
        "step_median_s": call / 10,
    }
    return {
        "label": label,
        "status": status,
        "measure": m if status == "ok" else None,
        "vs_baseline": None,
        "tier": None,
        "score": None,
        "rank": None,
        "verdict": None,
    }


def test_ranking_rule_on_known_numbers() -> None:
    G = 2**30
    rows = [
        _row("base", 12 * G, 3.0),
        _row("bigger", 13 * G, 2.0),
        _row("same", 12 * G, 2.5),
        _row("offload", 5 * G, 10.0),  # saves 7 GiB for 7 s: 1 GiB/s
        _row("tiling", 8 * G, 4.0),  # saves 4 GiB for 1 s: 4 GiB/s
        _row("tiny-vae", 7 * G, 2.0),  # saves 5 GiB and 1 s
        _row("bf16", 9 * G, 2.9),  # saves 3 GiB and 0.1 s
        _row("oom", 0, 0.0, status="oom"),
    ]
    ordered = mx.rank_results(rows, "base")
    assert [r["label"] for r in ordered] == ["base", "tiny-vae", "bf16", "tiling", "offload", "same", "bigger", "oom"]
    by = {r["label"]: r for r in ordered}
    assert by["tiling"]["score"] == pytest.approx(4 * G)
    assert by["offload"]["score"] == pytest.approx(G)
    assert by["tiny-vae"]["tier"] == 1 and by["same"]["tier"] == 3 and by["oom"]["rank"] is None


def test_default_set_on_cpu_swaps_fp16_and_skips_cuda_only() -> None:
    chosen, notes = mx.default_variants("sdxl", "cpu")
    labels = [v.label for v in chosen]
    assert "fp16" not in " ".join(labels) and labels.count("fp32") == 1
    assert any("fp32" in n for n in notes)
    keep, skipped = mx.screen_variants(chosen, device="cpu", pipeline="sdxl")
    assert {s["label"] for s in skipped} == {"fp32+model-offload", "fp32+sequential-offload"}
    assert all("CUDA" in s["reason"] for s in skipped)
    assert "fp32+vae-tiling" in [v.label for v in keep]
    gpu, _ = mx.default_variants("pixart-sigma", "cuda")
    assert [v.label for v in gpu][:2] == ["fp16", "bf16"]
    assert mx.dispatch_order(gpu)[0].label == "fp16+staged+int8+nf4-text-encoder"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variant", "fp16,bogus"], "unknown technique 'bogus'"),
        (["--variant", "fp32", "--variant", "fp32"], "given twice"),
        (["--variant", "fp32", "--baseline", "bf16"], "--baseline bf16 is not one of the variants"),
        (["--memory-limit-gb", "4"], "--memory-limit-gb caps the CUDA caching allocator"),
        (["--height", "60", "--width", "64"], "multiples of 8"),
        (["--json", "-", "--markdown", "-"], "only one output can go to stdout"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    result = CliRunner().invoke(matrix, ["--pipeline", "sd15", "--device", "cpu", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert message in result.stderr
    # one error line; an option the parser refuses is preceded by the usage and the --help pointer
    assert lines[-1].startswith("snapviz: error: ") and message in lines[-1]
    assert len(lines) == 1 or (len(lines) == 4 and lines[0].startswith("Usage: ") and lines[2] == "")
    assert not out.exists()


def test_module_entry_point_and_no_torch_at_import() -> None:
    code = (
        "import sys, collectors.cli, collectors.matrix; "
        "assert 'torch' not in sys.modules, 'torch imported at module level'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    res = subprocess.run(
        [sys.executable, "-m", "collectors.matrix", "--pipeline", "sd15", "--device", "cpu", "--variant", "fp32,nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "unknown technique 'nope'" in res.stderr


def test_table_columns_are_the_inference_stages() -> None:
    # derived from snapviz.vocab, which also lists training phases the matrix never runs
    assert mx.STAGE_GROUPS == ("load", "text_encode", "denoise", "vae_decode")


def test_matrix_card_is_a_page_kit_card_with_escaped_text() -> None:
    """Without a comparison the page is the matrix card alone, built with the shared card and table."""
    G = 2**30
    rows = mx.rank_results(
        [_row("base", 12 * G, 3.0), _row("tiling", 8 * G, 4.0), _row("oom", 0, 0.0, status="oom")], "base"
    )
    for r in rows:
        r.setdefault("reason", "out of memory <b>")
        r.setdefault("verdict", None)
    doc = {
        "memory_metric": rows[0]["measure"]["memory_metric"],
        "baseline": "base",
        "variants": rows,
        "ranking_rule": mx.RANKING_RULE,
        "memory_metric_text": "RSS <i>",
        "time_text": "call s",
        "notes": ["a <note>"],
        "skipped": [],
        "jobs": 1,
        "device": "cpu",
        "pipeline": "sd15",
    }
    html = mx.render_matrix_html(doc, None)
    card = html[html.index('<section class="sv-card" id="sv-matrix">') :]
    card = card[: card.index("</section>")]
    head, cells = mx.table_cells(doc)
    assert card.count("<tr>") == 1 + len(cells) and card.count("<th>") == len(head)
    assert "RSS &lt;i&gt;" in card and "a &lt;note&gt;" in card and "OOM: out of memory &lt;b&gt;" in card
    assert "<b>" not in card and "table.sv-matrix" not in html, "escaped, and styled by the page kit's table CSS"


def test_matrix_markdown_states_the_ranking_rule_whole() -> None:
    """Issue 21: matrix.md cut its ranking explanation mid-word (the 300-character clip of file-derived
    strings); snapviz's own sentences are printed whole, and file-derived ones end between words."""
    G = 2**30
    rows = mx.rank_results([_row("base", 12 * G, 3.0), _row("tiling", 8 * G, 4.0)], "base")
    for r in rows:
        r.setdefault("reason", None)
        r.setdefault("verdict", None)
    long_name = " ".join(["vae-tiling"] * 40)  # a long file-derived string with words
    doc = {
        "memory_metric": rows[0]["measure"]["memory_metric"],
        "baseline": "base",
        "variants": rows,
        "ranking_rule": mx.RANKING_RULE,
        "memory_metric_text": "RSS",
        "time_text": "call s",
        "notes": [],
        "skipped": [],
        "jobs": 1,
        "device": "cpu",
        "pipeline": "sd15",
        "size": "tiny",
        "batch": 1,
        "steps": 2,
        "history": False,
        "device_name": long_name,
    }
    md = mx.render_matrix_markdown(doc)
    assert len(mx.RANKING_RULE) > 300 and f"**{mx.RANKING_RULE}**" in md
    cut = md.split(" on ", 1)[1].splitlines()[0]
    assert cut.endswith(f"vae-tiling… ({len(long_name):,} chars)")


def test_clip_ends_between_words_and_keeps_names_whole_to_the_limit() -> None:
    from snapviz.safe_text import clip

    prose = "word " * 100
    assert clip(prose, 52) == "word " * 9 + "word" + f"… ({len(prose):,} chars)"
    path = "/a" * 200  # nothing to break at: the hard limit
    assert clip(path, 50) == path[:50] + "… (400 chars)" and clip(clip(path, 50), 50) == clip(path, 50)
