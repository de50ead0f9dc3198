"""Progress bars: drawn on stderr only for a terminal (or SNAPVIZ_PROGRESS=always), with an ETA
from the rate so far; the bytes-read bar (click's) follows what the loader's readers report."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from snapviz import progress as pg


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_eta_follows_the_rate_and_notes_go_above_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(pg.time, "monotonic", clock)
    out = io.StringIO()
    bar = pg.Bar(8, "snapviz matrix: variants", show=True, stream=out)
    assert bar.eta_s() is None  # nothing done yet: no rate to go by
    clock.now += 30
    bar.note("[1/8] fp16  ok")
    bar.update(2)
    assert bar.eta_s() == pytest.approx(90.0)  # 2 done in 30 s: 6 more take 90 s
    assert bar.line() == "snapviz matrix: variants [######------------------] 2/8   25%  eta 01:30"
    assert out.getvalue().startswith("\r\x1b[K[1/8] fp16  ok\n\r\x1b[Ksnapviz matrix: variants [")
    bar.close()
    assert out.getvalue().endswith("\r\x1b[K")


def test_a_hidden_bar_prints_only_its_notes() -> None:
    out = io.StringIO()
    bar = pg.Bar(3, "x", show=False, stream=out)
    bar.update(1)
    bar.note("[1/3] a")
    bar.close()
    assert out.getvalue() == "[1/3] a\n"


@pytest.mark.parametrize(
    "env,enabled,expected",
    [
        ("always", True, True),
        ("always", False, False),  # -q wins over the forced terminal
        ("never", True, False),
        (None, True, False),  # pytest's stderr is not a terminal
    ],
)
def test_when_to_draw(monkeypatch: pytest.MonkeyPatch, env: str | None, enabled: bool, expected: bool) -> None:
    if env is None:
        monkeypatch.delenv(pg.ENV, raising=False)
    else:
        monkeypatch.setenv(pg.ENV, env)
    assert pg.wanted(enabled) is expected


def test_bytes_read_bar_follows_what_the_reader_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(os.urandom(1 << 20))
    monkeypatch.setenv(pg.ENV, "always")  # the forced terminal (the file is under BIG_INPUT too)
    with pg.reading([str(path)], "snapviz: loading") as bar:
        assert bar is not None
        with open(path, "rb") as f:
            f.read(1 << 18)
            pg.bytes_read(f)
            assert bar.pos == 1 << 18
            pg.bytes_read(io.BytesIO(b"x"))  # a stream without a file: nothing to count
            with open(tmp_path / "other", "wb+") as g:  # another file: not this bar's
                g.write(b"y" * 100)
                pg.bytes_read(g)
            assert bar.pos == 1 << 18
            f.read()
            pg.bytes_read(f)
        assert bar.pos == 1 << 20
    err = capsys.readouterr().err
    assert "snapviz: loading" in err and "1.00 MiB/1.00 MiB" in err and "100%" in err
    pg.bytes_read(io.BytesIO(b"x"))  # no bar: a no-op
    monkeypatch.setenv(pg.ENV, "never")
    with pg.reading([str(path)], "snapviz: loading") as bar:
        assert bar is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("compress", [None, gzip.compress, lzma.compress])
def test_the_loader_feeds_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], compress: Any
) -> None:
    """The snapshot reader reports its reads: the bar moves while it reads, compressed or not."""
    from snapviz.load.snapshot.safe_pickle import safe_load_pickle

    data = pickle.dumps(
        {"segments": [], "device_traces": [[{"action": "alloc", "addr": i, "size": 512} for i in range(60_000)]]},
        protocol=4,
    )
    path = tmp_path / "s.pickle"
    path.write_bytes(compress(data) if compress else data)
    positions: list[int] = []
    monkeypatch.setenv(pg.ENV, "always")
    with pg.reading([str(path)], "snapviz: loading") as bar:
        real = bar.update

        def update(n: int, *a: Any) -> None:
            positions.append(n)
            real(n, *a)

        monkeypatch.setattr(bar, "update", update)
        safe_load_pickle(str(path))
        assert bar.pos == path.stat().st_size  # every byte on disk, reported by the reader itself
    assert positions and sum(positions) == path.stat().st_size
    assert "100%" in capsys.readouterr().err


def test_compare_progress_is_off_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert not sys.stderr.isatty()
    with pg.progress(5, "snapviz: analysing runs") as step:
        step(1)
    assert capsys.readouterr().err == ""
