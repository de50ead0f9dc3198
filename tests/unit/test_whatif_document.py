"""The what-if document and ``compare --whatif``'s twins are typed code (issue 22): built as
dataclasses, encoded by the summary's ``to_json`` and read back by its ``from_json`` unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paths import SAMPLES
from snapviz.analyses.document import CardFit, bounded, from_json, to_json
from snapviz.analyses.whatif import card_fit_text, twin_document, what_if, whatif_document
from snapviz.analyses.whatif_document import RecordedTwin, SimulatedTwin, WhatIfDocument, WhatIfTwins
from snapviz.errors import InputError
from snapviz.load import load


@pytest.fixture(scope="module")
def oom_run():  # a capped run that ended on an OOM: scenarios with OOMs and the smallest cards
    return what_if(
        load(str(SAMPLES / "gpt2-train-varlen-cap-oom")), alloc_confs=["expandable_segments:True"], gpu_memories=[]
    )


def test_the_document_round_trips(oom_run) -> None:
    doc = whatif_document(oom_run)
    assert (
        isinstance(doc, WhatIfDocument) and doc.smallest_card and all(isinstance(c, CardFit) for c in doc.smallest_card)
    )
    js = to_json(doc)
    assert list(js) == ["schema", "source", "device", "recorded", "fidelity", "scenarios", "smallest_card", "notes"]
    assert from_json(js, WhatIfDocument) == bounded(doc)
    # what the text sinks cut is said in ``warnings``, a field of the type (absent when nothing was cut)
    cut = bounded(replace(doc, notes=["n"] * 1500))
    assert len(cut.notes) == 1000 and cut.warnings == ["notes: 1,500 entries, the first 1,000 kept"]
    with pytest.raises(InputError, match=r"scenarios\[0\]\.peak_reserved_bytes: expected an integer"):
        from_json({**js, "scenarios": [{**js["scenarios"][0], "peak_reserved_bytes": "1"}]}, WhatIfDocument)


def test_the_twins_keep_their_kinds(oom_run) -> None:
    tw = twin_document(oom_run, "base", 3)
    back = from_json(to_json(tw), WhatIfTwins)
    assert [type(r) for r in back.rows] == [RecordedTwin, SimulatedTwin]
    assert back.rows[0].retries == 3 and back.rows[0].oom is not None and back.rows[0].oom.requested_bytes is None
    # the JSON keeps the order its rows always had: the recorded one names its setting before ``simulated``
    assert list(to_json(tw.rows[0]))[:3] == ["label", "alloc_conf", "simulated"]
    assert list(to_json(tw.rows[1]))[:3] == ["label", "simulated", "alloc_conf"]


def test_card_words_from_the_typed_cards(oom_run) -> None:
    cards = whatif_document(oom_run).smallest_card
    text = card_fit_text(cards)
    # one clause per card, in the document's order, each naming its setting and its size
    assert [c.alloc_conf for c in cards] == [None, "expandable_segments:True"]
    assert text.index("with the recorded settings") < text.index("with expandable_segments:True")
    assert text.count("8.00 GiB with") == len(cards)
    assert "the program after the OOM was not recorded" in card_fit_text(cards, ended=True)
