"""Pos2Distill on the real SmolLM2-135M: placements, the KL to the teacher, a few steps that close it, and the
recipe run through `midlens train`, its artefact loaded like a shipped one."""

from __future__ import annotations

import json
import random

import pytest
import torch

from midlens.core.errors import ArtefactError
from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.answering.restack import SlotOrder
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts
from midlens.training.data import TrainExample
from midlens.training.pos2distill import (
    Pos2DistillConfig,
    Pos2DistillObjective,
    advantageous_slots,
    kl_to_teacher,
    measured_order,
    new_delta,
    place,
    trivial_placements,
)
from tests.conftest import planted_passages


def test_the_gold_paragraphs_go_to_the_advantageous_slots_and_never_all_there_in_the_trivial_placements():
    passages = list("abcdefghij")
    gold = [2, 6]  # "c" and "g"
    order = SlotOrder((10, 9, 8, 7, 6, 5, 1, 3, 4, 2), "given")
    slots = advantageous_slots(order, 10, 2)
    assert slots == [10, 9]
    placed = place(passages, gold, slots)
    assert placed[9] == "c" and placed[8] == "g"
    assert [p for p in placed if p not in "cg"] == list("abdefhij")  # the others keep their order
    assert advantageous_slots(None, 10, 2) == [1, 2]  # the paper's sink
    trivial = trivial_placements(passages, gold, slots, 200, random.Random(0))
    assert len(trivial) == 200 and all(sorted(t) == passages for t in trivial)
    assert all({t.index("c") + 1, t.index("g") + 1} != {9, 10} for t in trivial)
    # The draws are seeded: a resumed run sees the same placements.
    assert trivial_placements(passages, gold, slots, 5, random.Random(0)) == trivial[:5]


def test_the_kl_to_the_teacher_is_zero_for_the_teacher_itself_and_positive_elsewhere():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    teacher = torch.log_softmax(logits, dim=-1)
    assert kl_to_teacher(teacher, logits).item() == pytest.approx(0.0, abs=1e-6)
    assert kl_to_teacher(teacher, torch.randn(3, 50)).item() > 0.1


@pytest.fixture(scope="module")
def examples(loaded):
    """One question over 4 short paragraphs (the planted fact second): a prompt of ~200 tokens, so each step's
    teacher answer and two student passes stay within seconds on a CPU."""
    from midlens.generators.models.prompt import render

    passages = [Passage(p.text[:160], title=p.title, id=p.id) for p in planted_passages(4, gold_at=2)]
    prompt = render(loaded.tokenizer, passages, "What is the secret code word?", style="short")
    answer = loaded.tokenizer("pelican", add_special_tokens=False)["input_ids"] + [loaded.tokenizer.eos_token_id]
    return [TrainExample("planted", prompt, answer, gold=[1])]


def test_a_few_steps_pull_the_other_placements_towards_the_teacher(loaded, examples):
    config = Pos2DistillConfig(placements=1, max_answer_tokens=4, rank=4, lora_alpha=8.0)
    delta = new_delta(loaded, config)
    order = measured_order(loaded, "measured")
    objective = Pos2DistillObjective(loaded, MethodParts(baseline_schemes(loaded.model), delta), config, order)
    loaded.model.requires_grad_(False)
    opt = torch.optim.AdamW(list(delta.parameters()), lr=3e-3)
    logs = []
    for _ in range(3):
        opt.zero_grad()
        results = [objective(ex) for ex in examples]
        (sum(loss for loss, _ in results) / len(results)).backward()
        opt.step()
        logs.append([parts for _, parts in results])
    # The delta starts at zero, so the student IS the teacher at the advantageous placement: anchoring starts at 0.
    assert all(parts["anc"] < 1e-5 for parts in logs[0])
    act = [sum(p["act"] for p in step) for step in logs]
    assert act[-1] < 0.8 * act[0], act  # AdamW at 3e-3 on one fixed question must close part of the gap
    assert all(p.grad is None for p in loaded.model.parameters())  # only the delta is trained
    assert objective.teacher_seen == 3  # one teacher answer per question per step


@pytest.mark.slow
def test_train_command_writes_a_pos2distill_artefact_that_loads_verified(loaded, tmp_path, capsys):
    from midlens.cli import main

    assert main(["train", "pos2distill", "--anchor", "-1", "--out", str(tmp_path / "x")]) == 2
    assert "anchor -1.0: the anchoring weight lambda is >= 0" in capsys.readouterr().err
    out = tmp_path / "p2d"
    tiny = ["--examples", "1", "--batch", "1", "--max-words", "10", "--no-progress", "--device", "cpu"]
    tiny += ["--placements", "1", "--max-answer-tokens", "2", "--rank", "2"]
    assert main(["train", "pos2distill", *tiny, "--out", str(out)]) == 0
    assert "trained" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["method"] == "pos2distill" and meta["training"]["steps_done"] == 1
    assert meta["advantage"]["slots_of_10"] == advantageous_slots(measured_order(loaded, "measured"), 10, 2)
    assert meta["teacher"]["answers"] == 1 and meta["data"]["split"].startswith("train")

    base = Generator(loaded, citations=None)
    tuned = Generator(loaded, method=f"pos2distill(artefact='{out}')", citations=None)
    ids = base.prompt("What is the secret code word?", planted_passages(4, gold_at=2), max_new_tokens=4).input_ids

    def logits(gen):
        with gen.running():
            return loaded.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].clone()

    before = logits(base)
    assert (logits(tuned) - before).abs().max().item() > 1e-5  # the delta acts while installed
    assert torch.equal(logits(base), before)  # and the shared weights were never written
    # A pos2distill artefact is not a MuDAF delta: the method named in meta.json is checked.
    with pytest.raises(ArtefactError, match="mudaf"):
        Generator(loaded, method=f"mudaf(artefact='{out}', alpha=0.7)")
