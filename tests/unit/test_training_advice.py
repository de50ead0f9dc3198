"""Training advice and the per-step view on hand-made phase peaks: how each technique moves the
run's peak between phases, when a technique is offered, and how phases group into steps."""

from __future__ import annotations

from snapviz.analyses.training_advice import PhasePeak, advise_training, training_estimates
from snapviz.analyses.training_view import phase_steps, step_table
from snapviz.category_vocab import BEFORE_RECORDING, GRADIENT, canonical_category

G = 10**9


def _p(name: str, **cats: float) -> PhasePeak:
    # written with the training set's old names, said as the one vocabulary says them
    c = {canonical_category(k.replace("_", " ")): int(v * G) for k, v in cats.items()}
    return PhasePeak(name, name.split("/")[0], sum(c.values()), c)


# a full fine-tune with foreach AdamW: the peak is the optimizer step (weights + grads + moments + temporaries)
FULL = [
    _p("forward/0", parameters=3, saved_activations=5),
    _p("backward/0", parameters=3, gradients=1, saved_activations=4),
    _p("optimizer/0", parameters=3, gradients=3, optimizer_state=6, temporaries=3),
    _p("zero_grad/0", parameters=3, gradients=3, optimizer_state=6),
    _p("forward/1", parameters=3, optimizer_state=6, saved_activations=5),
    _p("backward/1", parameters=3, gradients=1, optimizer_state=6, saved_activations=4),
    _p("optimizer/1", parameters=3, gradients=3, optimizer_state=6, temporaries=3),
]


def test_checkpointing_does_not_move_a_peak_in_the_optimizer_step() -> None:
    e = training_estimates(FULL)["checkpointing"]
    assert e.saving == 0 and e.new_peak == 15 * G
    assert e.phase_savings["forward"] == 5 * G


def test_8bit_adam_moves_the_peak_to_the_forward() -> None:
    e = training_estimates(FULL)["adamw8bit"]
    # optimizer: 15 - 4.5 = 10.5; forward/1: 14 - 4.5 = 9.5
    assert e.new_peak == int(10.5 * G) and e.saving == int(4.5 * G)


def test_fused_removes_the_step_temporaries_and_the_forward_becomes_the_peak() -> None:
    e = training_estimates(FULL)["fused"]
    assert e.new_peak == 14 * G and e.saving == 1 * G


def test_accumulation_shrinks_activations_but_keeps_gradients_live() -> None:
    run = {"batch": 4, "train": {"micro_batch": 4}}
    e = training_estimates(FULL, run)["accumulation"]
    # forward/1: 14 - 5 * 3/4 + 3 (gradients live through the micro-batches) = 13.25 < optimizer's 15
    assert e.saving == 0 and e.phase_savings["forward"] == int(0.75 * G)


def test_advice_respects_what_the_run_already_uses() -> None:
    run = {
        "batch": 4,
        "train": {
            "optimizer": "adamw8bit",
            "checkpointing": True,
            "lora_rank": 0,
            "micro_batch": 4,
            "set_to_none": True,
            "precision": "amp-fp16",
        },
    }
    names = {a.technique for a in advise_training(FULL, run)}
    assert "8-bit AdamW / Adafactor" not in names and "gradient checkpointing" not in names and "LoRA" in names
    plain = {a.technique: a for a in advise_training(FULL)}
    assert plain["gradient checkpointing"].saves_up_to_bytes == 0  # shown for its forward saving
    assert "does not touch" in plain["gradient checkpointing"].why
    assert plain["LoRA"].estimated_peak_bytes < plain["8-bit AdamW / Adafactor"].estimated_peak_bytes
    assert "mixed precision (AMP bf16/fp16)" not in plain  # precision is not in the categories: only run.json says fp32
    savings = [a.saves_up_to_bytes or 0 for a in advise_training(FULL)]
    assert savings == sorted(savings, reverse=True)


def test_set_to_none_is_offered_when_gradients_live_through_every_later_forward() -> None:
    kept = [
        PhasePeak(
            p.name,
            p.group,
            p.peak + (3 * G if p.group == "forward" and p.name != "forward/0" else 0),
            {**p.cats, GRADIENT: 3 * G} if p.name == "forward/1" else p.cats,
        )
        for p in FULL
    ]
    assert "zero_grad(set_to_none=True)" in {a.technique for a in advise_training(kept)}
    assert "zero_grad(set_to_none=True)" not in {a.technique for a in advise_training(FULL)}


def test_steps_group_micro_batches_with_their_optimizer_step() -> None:
    names = [
        "forward/0",
        "backward/0",
        "forward/1",
        "backward/1",
        "optimizer/0",
        "zero_grad/0",
        "forward/2",
        "backward/2",
        "forward/3",
        "backward/3",
        "optimizer/1",
    ]
    phases = [PhasePeak(n, n.split("/")[0], i, {}) for i, n in enumerate(names)]
    assert phase_steps(phases) == [0] * 6 + [1] * 5
    st = step_table(phases)
    assert st["phase"].tolist() == ["zero_grad/0", "optimizer/1"]
    # no category live at any phase peak: the peaks are memory from before the recording
    assert list(st.columns[3:]) == [BEFORE_RECORDING]
    assert st[BEFORE_RECORDING].tolist() == st["peak_allocated_bytes"].tolist()
