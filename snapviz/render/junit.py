"""JUnit XML for ``snapviz check``: one testcase per limit, so CI dashboards show each gate."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from snapviz.analyses.gate import GateResult
from snapviz.safe_text import xml_text


def render_junit(
    results: Sequence[GateResult], source: str, notes: Sequence[str] = (), suite: str = "snapviz check"
) -> str:
    """A ``<testsuites>`` document; failures carry the FAIL line as message and limit/actual bytes as text.

    Every name and message may quote the input (file name, stage names): :func:`xml_text`
    keeps the document parseable whatever they hold."""
    x = xml_text
    failures = sum(1 for r in results if not r.passed)
    root = ET.Element(
        "testsuites", {"name": x(suite), "tests": str(len(results)), "failures": str(failures), "errors": "0"}
    )
    ts = ET.SubElement(
        root,
        "testsuite",
        {
            "name": x(suite),
            "tests": str(len(results)),
            "failures": str(failures),
            "errors": "0",
            "skipped": "0",
            "time": "0",
        },
    )
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", {"name": "source", "value": x(source)})
    for r in results:
        tc = ET.SubElement(ts, "testcase", {"classname": x(f"snapviz.check.{source}"), "name": x(r.name), "time": "0"})
        if not r.passed:
            f = ET.SubElement(tc, "failure", {"message": x(r.message), "type": "GpuMemoryLimitExceeded"})
            f.text = f"{x(r.message)}\nactual_bytes={r.actual}\nlimit_bytes={r.limit}\n"
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = x(r.message)
    if notes:
        err = ET.SubElement(ts, "system-err")
        err.text = "\n".join(x(n) for n in notes)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
