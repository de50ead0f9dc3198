"""JUnit XML for ``snapviz check``: one testcase per limit, so CI dashboards show each gate."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Sequence

from snapviz.analyses.gate import GateResult


def render_junit(results: Sequence[GateResult], source: str, notes: Sequence[str] = (), suite: str = "snapviz check") -> str:
    """A ``<testsuites>`` document; failures carry the FAIL line as message and limit/actual bytes as text."""
    failures = sum(1 for r in results if not r.passed)
    root = ET.Element("testsuites", {"name": suite, "tests": str(len(results)), "failures": str(failures), "errors": "0"})
    ts = ET.SubElement(root, "testsuite", {"name": suite, "tests": str(len(results)), "failures": str(failures),
                                            "errors": "0", "skipped": "0", "time": "0"})
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", {"name": "source", "value": source})
    for r in results:
        tc = ET.SubElement(ts, "testcase", {"classname": f"snapviz.check.{source}", "name": r.name, "time": "0"})
        if not r.passed:
            f = ET.SubElement(tc, "failure", {"message": r.message, "type": "GpuMemoryLimitExceeded"})
            f.text = f"{r.message}\nactual_bytes={r.actual}\nlimit_bytes={r.limit}\n"
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = r.message
    if notes:
        err = ET.SubElement(ts, "system-err")
        err.text = "\n".join(notes)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
