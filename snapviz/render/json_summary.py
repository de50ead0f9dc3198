"""JSON renderer: the summary dict as text (numpy scalars made plain)."""
from __future__ import annotations

import json
from typing import Any

import numpy as np


def _plain(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=_plain) + "\n"
