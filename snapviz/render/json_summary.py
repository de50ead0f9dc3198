"""JSON renderer: the summary dict as strict JSON text (numpy scalars made plain; strings
clipped and non-finite numbers written as null with a warning, see :func:`bounded_doc`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from snapviz.analyses.document import Summary, to_json
from snapviz.safe_text import bounded_doc, clip


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
    return clip(str(o))


def render_summary_json(doc: Summary) -> str:
    """The ``--json`` output of ``analyze``: the typed document, encoded (:func:`render_json`)."""
    return render_json(to_json(doc))


def render_json(doc: dict[str, Any], whole: tuple[str, ...] = ()) -> str:
    """The document as JSON, bounded like every sink (:func:`bounded_doc`); the top-level keys
    named in ``whole`` are snapviz's own sentences (no text from a file), written unclipped so
    the JSON says what the Markdown says."""
    out = bounded_doc(doc)
    out.update({k: doc[k] for k in whole if k in doc})
    # allow_nan=False: NaN/Infinity are not JSON (JSON.parse rejects them); bounded_doc has
    # replaced them, so this only guards against a renderer bug.
    return json.dumps(out, indent=2, default=_plain, allow_nan=False) + "\n"
