"""The page's Bokeh documents as JSON: what ``Document.to_json(deferred=False)`` writes for a
document holding the same roots, in a fifth of its time.

Bokeh serialises a model by asking every one of its ~100 properties for its value, default
included (a theme lookup and a validation each), and then keeps only those set on the
model: 0.29 s of a 1M-event report's 0.39 s of serialisation, for 452 models. Here only
the properties Bokeh would keep are read, in Bokeh's order. No ``Document`` is built either:
adding the roots to one walks and attaches every model (0.1 s) for nothing a static page
uses. Tests compare the JSON with Bokeh's own on every kind of report
(tests/unit/test_bokeh_integrity.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bokeh import __version__ as bokeh_version
from bokeh.core.has_props import is_DataModel
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.core.serialization import Serializer
from bokeh.document.config import DocumentConfig
from bokeh.document.document import DEFAULT_TITLE, Document
from bokeh.document.json import DocJson
from bokeh.embed.util import RenderItem
from bokeh.model import Model
from bokeh.models import UIElement
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id


def _set_properties(model: Model) -> dict[str, Any]:
    """``model.properties_with_values(include_defaults=False)`` without computing the defaults
    it drops: the values set on the model, its unstable defaults (sub-models made on first
    access) and its theme's values, minus the serialised containers still at their default."""
    themed = model.themed_values() or {}
    keep = model._property_values.keys() | model._unstable_default_values.keys() | themed.keys()
    out: dict[str, Any] = {}
    for key in model.properties(_with_props=True):
        if key not in keep:
            continue
        descriptor = model.lookup(key)
        if not descriptor.serialized:
            continue
        value = descriptor.get_value(model)
        if key not in themed and isinstance(value, PropertyValueContainer) and key in model._unstable_default_values:
            continue
        out[key] = value
    return out


class _Serializer(Serializer):
    """Bokeh's serializer, with models encoded as ``Model.to_serializable`` does but from
    :func:`_set_properties`."""

    def _encode(self, obj: Any) -> Any:
        if not isinstance(obj, Model):
            return super()._encode(obj)
        self.add_ref(obj, obj.ref)
        rep: dict[str, Any] = {"type": "object", "name": obj.__qualified_model__, "id": obj.id}
        attributes = {key: self.encode(val) for key, val in _set_properties(obj).items()}
        if attributes:
            rep["attributes"] = attributes
        return rep


# The serializer reads Bokeh's internals as these releases have them (the integrity test
# compares its JSON with Bokeh's own); under any other release the page is written by Bokeh.
FAST_RELEASES = ("3.9.",)


def document_json(roots: Sequence[UIElement]) -> DocJson:
    """``Document.to_json(deferred=False)`` of a new document holding ``roots``: the same
    fields, encoded in the same order (a model is written in full where first met, by
    reference after); no document callbacks, the default title and configuration."""
    if not bokeh_version.startswith(FAST_RELEASES):
        doc = Document()
        for root in roots:
            doc.add_root(root)
        return doc.to_json(deferred=False)
    data_models = [m for m in Model.model_class_reverse_map.values() if is_DataModel(m)]
    serializer = _Serializer(deferred=False)
    defs = serializer.encode(data_models)
    # Held until the roots are written: the serializer knows models by id(), and a freed
    # config's address could be taken by a value met later, which would then be written as
    # a reference to it.
    config = DocumentConfig()
    config_rep = serializer.encode(config)
    out = DocJson(version=bokeh_version, title=DEFAULT_TITLE, config=config_rep, roots=serializer.encode(list(roots)))
    if data_models:
        out["defs"] = defs
    return out


def documents_json(groups: Sequence[Sequence[UIElement]]) -> tuple[dict[str, DocJson], list[RenderItem]]:
    """One document per group of roots, as ``bokeh.embed.standalone_docs_json_and_render_items``
    returns them for those roots (documents in group order, each root with a fresh element id)."""
    docs_json: dict[str, DocJson] = {}
    items: list[RenderItem] = []
    for group in groups:
        docid = make_globally_unique_id()
        docs_json[docid] = document_json(group)
        items.append(RenderItem(docid, roots={r: make_globally_unique_css_safe_id() for r in group}))
    return docs_json, items
