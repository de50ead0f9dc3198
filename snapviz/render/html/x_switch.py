"""One timeline read on several x axes (time, event index) without a figure per axis.

The timeline's figures are built once, on the first axis. What differs on another axis is
recorded as (model, property, one value per axis): every glyph field naming an x column
(the lines, the markers, the stage bands' edges), the peak's span and label, the axis title
and tick format. A click on the axis tabs sets each recorded property to that axis' value
and re-fits the x range. A second set of figures cost ~40% of a report's Bokeh models: their
building and serialisation in Python, their deserialisation in the browser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bokeh.models import CustomJS, GlyphRenderer, Model, Spacer, TabPanel, Tabs

# The glyph properties that can name an x column (step/scatter/varea_step: x; quad: left/right).
_X_PROPS = ("x", "left", "right")
_GLYPH_SLOTS = ("glyph", "selection_glyph", "nonselection_glyph", "hover_glyph", "muted_glyph")

_SWITCH_JS = """
const i = tabs.active;
if (i < 0 || i === shown[0]) return;
shown[0] = i;
for (const [model, attr, kind, values] of swaps) {
  model[attr] = kind === "field" ? {field: values[i]} : values[i];
}
x_range.reset();
"""


@dataclass(frozen=True)
class XAxis:
    """One x axis of the timeline: its source column, the stage bands' edge columns on it, the
    axis title, the tab's title and where the peak sits on it (None: not on this axis)."""

    field: str
    label: str
    band: tuple[str, str]
    tab: str
    peak_x: float | None


class XSwitch:
    """The properties a change of x axis sets, each with one value per axis in ``axes``."""

    def __init__(self, axes: Sequence[XAxis]) -> None:
        self.axes = list(axes)
        self.swaps: list[list[Any]] = []
        first = self.axes[0]
        # A column named on the first axis -> its name on each axis.
        self._fields: dict[str, list[str]] = {first.field: [a.field for a in self.axes]}
        for k in (0, 1):
            self._fields[first.band[k]] = [a.band[k] for a in self.axes]

    def set(self, model: Model, attr: str, values: Sequence[Any]) -> None:
        """``model.attr`` takes ``values[i]`` on axis ``i`` (``values[0]`` is what it holds now)."""
        if len(values) != len(self.axes):
            raise ValueError(f"{attr}: {len(values)} values for {len(self.axes)} axes")
        self.swaps.append([model, attr, "value", list(values)])

    def fields(self, figures: Sequence[Any]) -> None:
        """Record every glyph property of ``figures`` that names an x column of the first axis."""
        for fig in figures:
            for r in fig.renderers:
                if not isinstance(r, GlyphRenderer):
                    continue
                for slot in _GLYPH_SLOTS:
                    glyph = getattr(r, slot)
                    if not isinstance(glyph, Model):  # "auto" or None: follows the main glyph
                        continue
                    for attr in _X_PROPS:
                        current = getattr(glyph, attr, None)
                        if isinstance(current, str) and current in self._fields:
                            self.swaps.append([glyph, attr, "field", self._fields[current]])

    def tabs(self, x_range: Any) -> Tabs:
        """The axis tabs (headers only: the figures sit under them and change in place)."""
        # Spacer, not Div: a Div would pull BokehJS's widgets bundle into the first document.
        tabs = Tabs(
            tabs=[TabPanel(title=a.tab, child=Spacer(height=0)) for a in self.axes],
            sizing_mode="stretch_width",
        )
        tabs.js_on_change(
            "active",
            CustomJS(args={"tabs": tabs, "swaps": self.swaps, "x_range": x_range, "shown": [0]}, code=_SWITCH_JS),
        )
        return tabs
