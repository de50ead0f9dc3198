"""The open sections of a :class:`~snapviz.analyses.document.Summary` (attention, OOM, advice,
end state, allocator truth, the run's fields, the allocator's settings) as the HTML and picture
renderers read them: their JSON form, with an absent or empty section as ``{}`` (``None`` for
no OOM).

The one place those renderers read these sections: every other field of the summary they read
as a typed attribute. The JSON form is :func:`~snapviz.analyses.document.to_json` of the
section, whether it is a JSON value or a typed part of the document, so the reports stay the
same as the sections get their own types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapviz.analyses.document import Absent, Summary, to_json


@dataclass(frozen=True)
class OpenSections:
    attention: dict[str, Any]
    oom: dict[str, Any] | None  # None: no OOM recorded
    advice: list[dict[str, Any]]
    end_state: dict[str, Any]
    allocator_truth: dict[str, Any]
    run: dict[str, Any]
    allocator_settings: dict[str, Any]

    @property
    def end_state_only(self) -> bool:
        """The snapshot holds no history, only what was live when it was taken."""
        return bool(self.end_state.get("only"))


def _object(value: object) -> dict[str, Any]:
    plain = None if isinstance(value, Absent) else to_json(value)
    return plain if isinstance(plain, dict) else {}


def open_sections(summary: Summary) -> OpenSections:
    """The open sections of ``summary`` in their JSON form (see the module doc)."""
    advice = None if isinstance(summary.advice, Absent) else to_json(summary.advice)
    return OpenSections(
        attention=_object(summary.attention),
        oom=_object(summary.oom) or None,
        advice=[a for a in advice if isinstance(a, dict)] if isinstance(advice, list) else [],
        end_state=_object(summary.end_state),
        allocator_truth=_object(summary.allocator_truth),
        run=_object(summary.run),
        allocator_settings=_object(summary.allocator_settings),
    )
