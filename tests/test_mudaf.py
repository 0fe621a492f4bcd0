"""MuDAF on the real SmolLM2-135M: the contrastive loss, head scores, the data split, a few training steps,
the trained delta applied per call (base logits untouched), the shipped artefact, retrieval-head evidence."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from midlens.core.errors import ArtefactError, MidlensError
from midlens.core.saved_parts import json_artefacts
from midlens.generators import Generator
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.retrieval_heads import SHIPPED, load_scores, select_heads, top_heads
from midlens.retrievers.hotpotqa import load_rows, split_of
from midlens.training.data import data_record, training_examples
from midlens.training.heads import head_f1_em, save_scores
from midlens.training.loop import LoopConfig
from midlens.training.mudaf import MudafConfig, MudafObjective, contrastive_loss, new_delta, train_mudaf
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


def test_contrastive_loss_is_low_when_the_gold_keys_align_with_the_query():
    torch.manual_seed(0)
    q = torch.randn(64)
    noise = torch.randn(6, 64)
    aligned = noise.clone()
    aligned[2] = q * 3.0  # cosine 1 for the gold passage; the others are random (cosine ~ 0)
    misaligned = noise.clone()
    misaligned[2] = -q  # gold points away; a negative points at the query
    misaligned[4] = q
    low = contrastive_loss(q, aligned, gold=[2], tau=0.05)
    high = contrastive_loss(q, misaligned, gold=[2], tau=0.05)
    # With tau 0.05 a cosine gap of ~1 is a logit gap of ~20: the aligned loss is ~exp(-20) * 5, the other ~40.
    assert low.item() < 1e-3
    assert high.item() > 30.0
    # Two gold passages: each is a positive against the negatives only (not against the other gold).
    both = noise.clone()
    both[1], both[2] = q, q
    assert contrastive_loss(q, both, gold=[1, 2], tau=0.05).item() < 1e-3


def test_head_f1_and_em_match_a_hand_computed_case():
    # One prompt, 2 layers x 2 heads, 4 passages; gold = passages 0 and 2; eps 0.3.
    mass = torch.tensor(
        [
            [[0.40, 0.10, 0.35, 0.05], [0.50, 0.40, 0.00, 0.00]],  # attends {0,2}: F1 1; {0,1}: P .5 R .5 F1 .5
            [[0.10, 0.10, 0.10, 0.10], [0.00, 0.31, 0.32, 0.33]],  # attends {}: F1 0; {1,2,3}: P 1/3 R 1/2 F1 .4
        ]
    )
    f1, em = head_f1_em(mass, gold=[0, 2], eps=0.3)
    assert torch.allclose(f1, torch.tensor([[1.0, 0.5], [0.0, 0.4]]), atol=1e-6)
    # EM: are the top-2 passages exactly the gold ones? (ties in [1][0] resolve to the first indices: 0, 1)
    assert em.tolist() == [[1.0, 0.0], [0.0, 0.0]]


def test_head_selection_top_breaks_ties_and_sampling_is_seeded():
    f1 = [[0.0, 0.2, 0.1], [0.2, 0.0, 0.0]]
    em = [[0.0, 0.1, 0.0], [0.3, 0.0, 0.0]]
    assert select_heads(f1, 2, mode="top", tiebreak=em) == [(0, 1), (1, 0)]
    assert select_heads(f1, 1, mode="top", tiebreak=em) == [(1, 0)]  # equal F1: the higher EM wins
    a = select_heads(f1, 3, seed=7)
    assert a == select_heads(f1, 3, seed=7) and len(set(a)) == 3
    # P(h) ~ exp(R / 0.05): a 0.5 lead is a factor e^10, so the leader is (almost) always drawn first.
    peaked = [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
    assert all((1, 0) in select_heads(peaked, 1, seed=s) for s in range(20))
    with pytest.raises(ValueError, match="'sample' or 'top'"):
        select_heads(f1, 2, mode="best")


def test_train_and_eval_splits_are_disjoint_and_training_reads_only_train(loaded):
    rows = load_rows(None)
    train_ids = {r["_id"] for r in rows if split_of(r["_id"]) == "train"}
    eval_ids = {r["_id"] for r in rows if split_of(r["_id"]) == "eval"}
    assert train_ids and eval_ids and not train_ids & eval_ids
    assert len(train_ids) + len(eval_ids) == len({r["_id"] for r in rows})
    assert {r["_id"] for r in load_rows("eval")} == eval_ids
    examples = training_examples(loaded.tokenizer, 50, seed=0, max_words=20)
    assert {ex.id for ex in examples} <= train_ids
    # Gold slots spread over the prompt (uniform over the 10 slots in expectation), so the middle is trained.
    slots = {g for ex in examples for g in ex.gold}
    assert len(slots) >= 8, slots


@pytest.fixture(scope="module")
def tiny_slice(loaded):
    return training_examples(loaded.tokenizer, 2, seed=0, max_words=20)


def test_a_few_steps_on_a_fixed_batch_lower_the_loss(loaded, tiny_slice):
    heads = ((20, 1), (22, 7), (28, 1))
    config = MudafConfig(heads=heads, rank=4, lora_layers="targets")
    delta = new_delta(loaded, config)
    objective = MudafObjective(loaded, MethodParts(baseline_schemes(loaded.model), delta), config)
    opt = torch.optim.AdamW(list(delta.parameters()), lr=3e-3)
    loaded.model.requires_grad_(False)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        total = sum(objective(ex)[0] for ex in tiny_slice) / len(tiny_slice)
        total.backward()
        opt.step()
        losses.append(total.item())
    assert losses[-1] < losses[0] - 0.05, losses  # AdamW at 3e-3 on two fixed examples must fit them
    assert all(p.grad is None for p in loaded.model.parameters())  # only the delta is trained


def test_trained_delta_is_per_call_and_base_logits_are_restored_exactly(loaded, tiny_slice, tmp_path):
    heads = ((22, 7), (28, 1))
    config = MudafConfig(heads=heads, rank=4, lora_layers="targets")
    out = tmp_path / "delta"
    result = train_mudaf(
        loaded,
        tiny_slice,
        config,
        LoopConfig(examples=4, batch=2, lr=5e-3),
        str(out),
        data_record(tiny_slice, 0, 20),
        progress=False,
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["base_model_sha256"] == loaded.sha256 and meta["training"]["steps_done"] == 2
    assert result["log"]["steps_done"] == 2

    base = Generator(loaded, method="baseline")
    tuned = Generator(loaded, method=f"mudaf(artefact='{out}')")
    prompt = base.prompt(QUESTION, planted_passages(6, gold_at=3), max_new_tokens=8)
    ids = prompt.input_ids

    def logits(gen):
        with gen.running():
            return loaded.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].clone()

    before = logits(base)
    changed = logits(tuned)
    after = logits(base)
    assert torch.equal(before, after)  # the shared weights were never written
    assert (changed - before).abs().max().item() > 1e-4  # and the delta does act when installed
    # The delta also detaches when the context is left by an exception.
    with pytest.raises(RuntimeError), method_context(loaded, tuned.parts):
        raise RuntimeError("interrupted")
    assert torch.equal(logits(base), before)


def test_shipped_deltas_load_by_name_and_another_base_model_is_refused(loaded, tmp_path):
    for spec in ("mudaf", "mudaf(alpha=0)"):
        gen = Generator(loaded, method=spec)
        assert gen.parts.delta is not None
    with pytest.raises(MidlensError, match="alpha"):
        Generator(loaded, method="mudaf(alpha=0.5)")  # nothing shipped for it: a clear error, not a random delta
    # The same artefact with another base model's hash: refused before any weight is used.
    from midlens.generators.methods.mudaf import shipped_name
    from midlens.generators.models.shipped import SHIPPED as TRAINED

    forged = tmp_path / "forged"
    shutil.copytree(TRAINED / "mudaf" / shipped_name(loaded.name, {"alpha": 0.7}), forged)
    meta = json.loads((forged / "meta.json").read_text())
    meta["base_model_sha256"] = "0" * 64
    (forged / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtefactError, match="base model"):
        Generator(loaded, method=f"mudaf(artefact='{forged}')")


def test_retrieval_head_evidence_averages_the_shipped_top_heads(loaded):
    scores = load_scores(loaded)
    pairs = tuple(top_heads(scores))
    assert len(pairs) == round(0.05 * 30 * 9)  # 5 % of SmolLM2's 270 heads
    gen = Generator(loaded, evidence=EvidenceConfig(heads="retrieval", query="last"))
    assert gen.evidence_config.head_pairs == pairs
    answer = gen.score(gen.prompt(QUESTION, planted_passages(6, gold_at=3)), calibrate=False)
    by_hand = torch.stack([answer.maps.last[layer, head] for layer, head in pairs]).mean(0)
    assert [p.evidence for p in answer.passages] == pytest.approx(by_hand.tolist(), abs=1e-7)
    # Only the layers holding those heads are probed: the others stay empty.
    probed = {layer for layer, _ in pairs}
    assert all(answer.maps.last[layer].abs().sum() == 0 for layer in range(30) if layer not in probed)


def test_every_shipped_score_file_is_for_a_packaged_model_and_its_exact_weights():
    # Loading checks the hash against the loaded model; this checks what ships without loading the 0.5B model.
    from midlens.generators.models.packaged_models import REGISTRY

    shipped = json_artefacts(SHIPPED)
    # The two models that answer; Gemma 3 270M (a base model, no trained method yet) ships none: `midlens heads`
    # computes them for it as for any model folder.
    assert {"smollm2-135m", "qwen2.5-coder-0.5b"} <= {p.stem for p in shipped} <= set(REGISTRY)
    for path in shipped:
        scores = json.loads(path.read_text())
        assert scores["model"] == path.stem and scores["model_sha256"] == REGISTRY[path.stem].sha256
        assert scores["split"] == "train" and scores["method"] == {"name": "baseline"}
        f1, em = torch.tensor(scores["f1"]), torch.tensor(scores["em"])
        assert f1.shape == em.shape and f1.ndim == 2 and ((0 <= f1) & (f1 <= 1)).all()
        assert path.with_suffix(".png").is_file()


def test_retrieval_head_scores_for_another_model_are_refused(loaded, tmp_path):
    scores = json.loads((SHIPPED / f"{loaded.name}.json").read_text())
    scores["model_sha256"] = "f" * 64
    path = tmp_path / "other.json"
    save_scores(scores, path)  # as `midlens heads score` writes them: verified, so the model is what is refused
    with pytest.raises(ArtefactError, match="another model"):
        load_scores(loaded, path)
    with pytest.raises(ArtefactError, match="no retrieval-head scores"):
        load_scores(loaded, tmp_path / "missing.json")


@pytest.mark.slow
def test_train_command_runs_the_recipe_each_trainable_method_s_entry_names(loaded, tmp_path, capsys):
    """`midlens train METHOD`: the methods come from the registry (no shell names them), each recipe's options
    become flags, bad options are refused before any model loads, and a tiny run writes a loadable artefact."""
    from midlens.cli import main
    from midlens.generators.methods.registry import REGISTRY

    assert [m.name for m in REGISTRY.values() if m.trainer] == ["mudaf", "moice", "channel-scaling", "pos2distill"]
    assert main(["train", "ms-poe", "--out", str(tmp_path / "x")]) == 2
    trainable = "mudaf, moice, channel-scaling, pos2distill"
    assert f"'ms-poe' has nothing to train: choose one of {trainable}" in capsys.readouterr().err
    assert main(["train", "mudaf", "--alpha", "1.5", "--out", str(tmp_path / "x")]) == 2
    assert "alpha 1.5: the contrastive weight is in [0, 1]" in capsys.readouterr().err
    assert main(["train", "moice", "--top-k", "7", "--out", str(tmp_path / "x")]) == 2
    assert "K must be below N" in capsys.readouterr().err
    assert main(["train", "mudaf", "--data", "squad", "--out", str(tmp_path / "x")]) == 2
    assert "data 'squad': expected one of hotpotqa, hotpotqa+squad" in capsys.readouterr().err

    tiny = ["--examples", "2", "--batch", "2", "--max-words", "15", "--no-progress", "--device", "cpu"]
    out = tmp_path / "mudaf"
    mixed = ["--data", "hotpotqa+squad"]  # one example of each corpus
    assert (
        main(["train", "mudaf", "--heads-n", "2", "--num-heads", "2", "--rank", "2", *tiny, *mixed, "--out", str(out)])
        == 0
    )
    assert "trained" in capsys.readouterr().out and (out.with_name("mudaf.heads.json")).is_file()
    assert json.loads((out / "meta.json").read_text())["data"]["data"] == "hotpotqa+squad"
    Generator(loaded, method=f"mudaf(artefact='{out}')")  # verified and loaded like a shipped delta
    out = tmp_path / "moice"
    assert main(["train", "moice", "--experts", "3", "--top-k", "1", *tiny, "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["method"] == "moice" and len(meta["experts"]["bases"]) == 3 and meta["training"]["steps_done"] == 1
    Generator(loaded, method=f"moice(artefact='{out}')")


@pytest.mark.model
def test_the_default_models_shipped_artefacts_load_verified_and_act_only_while_installed():
    # The Qwen artefacts were trained on a GPU; here they load on the CPU, pass their hash and base-model checks,
    # change the logits while installed and leave the shared weights as they were afterwards.
    from midlens.generators.models.loading import load_model
    from midlens.generators.models.packaged_models import DEFAULT_MODEL
    from midlens.generators.models.shipped import shipped_path

    qwen = load_model(DEFAULT_MODEL)
    base = Generator(qwen, method="baseline")  # the stock model: the default model answers with a delta
    ids = base.prompt(QUESTION, planted_passages(4, gold_at=2), max_new_tokens=4).input_ids

    def logits(gen):
        with gen.running():
            return qwen.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].clone()

    before = logits(base)
    for spec, folder in (
        ("mudaf", "mudaf/qwen2.5-coder-0.5b"),
        ("mudaf(alpha=0)", "mudaf/qwen2.5-coder-0.5b-alpha0"),
        ("moice", "moice/qwen2.5-coder-0.5b"),
    ):
        meta = json.loads((shipped_path(*folder.split("/")) / "meta.json").read_text())
        assert meta["base_model"] == DEFAULT_MODEL and meta["data"]["split"].startswith("train")
        if spec.startswith("mudaf"):  # each delta saw at least what the SmolLM2 deltas saw
            assert meta["training"]["examples_seen"] >= 1100, spec
        tuned = Generator(qwen, method=spec)
        # fp32 logits of a 0.5B model move by far more than 1e-3 under a trained delta; rounding noise does not.
        assert (logits(tuned) - before).abs().max().item() > 1e-3, spec
        assert torch.equal(logits(base), before), spec  # uninstalled: the base model is untouched
