"""Evidence-guided restacking (generators.answering.restack): passages scored by a method's evidence, the strongest
placed in the slots the model reads best (measured per packaged model), the answer numbered as the caller stacked the
passages; and the option in Pipeline, `midlens ask`, the LlamaIndex query engine and `eval sweep`."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


def _prompt(generator, n: int = 5, gold_at: int = 2):
    return generator.prompt(QUESTION, planted_passages(n, gold_at), max_new_tokens=8, style="short")


@pytest.fixture(scope="module")
def restacker(generator):
    from midlens.generators.answering.restack import Restack, Restacker

    return Restacker(generator, Restack("baseline"))


def test_slot_orders_ship_for_every_packaged_model_and_scale_to_other_counts():
    from midlens.generators.answering.restack import SlotOrder, read_slot_order, shipped_slot_orders
    from midlens.generators.models.packaged_models import REGISTRY

    shipped = shipped_slot_orders()
    # What any reader of the model falls back to, for the two models that answer; Gemma 3 270M (a base model, not
    # swept by position yet) has none, and restacking on it is refused naming how to measure one.
    answering = {"smollm2-135m", "qwen2.5-coder-0.5b"}
    assert answering <= set(REGISTRY) and all((model, "baseline") in shipped for model in answering)
    for (model, method), path in shipped.items():
        record = json.loads(path.read_text())
        assert record["model"] == model and record.get("method", "baseline") == method
        order = read_slot_order(path).order
        assert sorted(order) == list(range(1, record["k"] + 1))
        assert record["dataset"] == "hotpotqa-train" and record["questions"] >= 8 and "eval sweep" in record["command"]
        assert f"--methods {method}" in record["command"].replace('"', "")  # the file's reader is the one swept
    measured = SlotOrder((10, 1, 9, 2, 8, 3, 7, 4, 6, 5), "given")  # ends first, the middle last
    assert measured.for_count(10) == list(measured.order)
    assert measured.for_count(5) == [5, 1, 4, 2, 3]  # first and last keep their measured places
    assert sorted(measured.for_count(13)) == list(range(1, 14)) and measured.for_count(1) == [1]


def test_a_reader_gets_its_own_measured_order_else_its_base_models(generator, loaded):
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker, shipped_slot_orders, slot_order

    shipped = shipped_slot_orders()
    finetuned = Generator(loaded, method="finetuned")
    assert slot_order(finetuned).source == str(shipped[(loaded.name, "mudaf(alpha=0)")])
    assert slot_order(generator).source == str(shipped[(loaded.name, "baseline")])
    unmeasured = Generator(loaded, method="attn-calibration")  # no sweep of its own: the base model's order
    assert slot_order(unmeasured).source == str(shipped[(loaded.name, "baseline")])
    answer = Restacker(finetuned, Restack("baseline")).generate(_prompt(finetuned), max_new_tokens=4)
    assert answer.restack["slot_order"] == shipped[(loaded.name, "mudaf(alpha=0)")].name
    assert slot_order(finetuned, (2, 1)).source == "given"


def test_slots_rank_by_em_then_f1_then_log_probability_over_questions_answered_at_every_slot(tmp_path):
    from midlens.eval.slots import rank_slots, slot_table, write_slot_order

    def row(example, slot, em, f1, logprob):
        return {
            "kind": "sweep",
            "method": "baseline",
            "example_id": example,
            "position": slot,
            "em": em,
            "f1": f1,
            "logprob": logprob,
        }

    rows = [row("a", 1, 1.0, 1.0, -1.0), row("a", 2, 0.0, 0.5, -2.0), row("a", 3, 0.0, 0.5, -1.0)]
    rows += [row("b", 1, 0.0, 0.0, -3.0), row("b", 2, 0.0, 0.0, -3.0), row("b", 3, 0.0, 0.0, -3.0)]
    rows += [row("c", 1, 1.0, 1.0, 0.0)]  # not answered at every slot: left out
    table = slot_table(rows)
    assert table[1] == {"em": 0.5, "f1": 0.5, "logprob": -2.0, "n": 2}
    assert rank_slots(table) == [1, 3, 2]  # slot 1 by EM; 3 before 2 by log-probability (EM and F1 tie)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"model": "m", "model_sha256": "x", "k": 3, "dataset": "hotpotqa-train", "prompt_style": "short"})
    )
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = write_slot_order(run, tmp_path / "m.json", command="midlens eval sweep ...")
    assert record["order"] == [1, 3, 2] and record["questions"] == 2
    # One question of two right at slot 1 separates nothing beyond noise: the log-probability decided.
    assert record["decided_by"] == "logprob" and record["order_by_accuracy"] == [1, 3, 2]
    assert json.loads((tmp_path / "m.json").read_text())["command"] == "midlens eval sweep ..."


def test_place_puts_the_highest_score_into_the_first_slot():
    from midlens.generators.answering.restack import place

    assert place([0.1, 0.9, 0.5], [3, 1, 2]) == [2, 0, 1]  # 0.9 -> slot 3, 0.5 -> slot 1, 0.1 -> slot 2
    assert place([0.5, 0.5], [2, 1]) == [1, 0]  # a tie keeps the caller's order: the first given, the best slot


def test_restacked_answer_is_numbered_as_given_and_the_gold_sits_in_the_best_slot(generator, restacker):
    from midlens.generators.attention.evidence import passage_evidence

    prompt = _prompt(generator)
    answer = restacker.generate(prompt, max_new_tokens=8)
    record = answer.restack
    given = [p.id for p in prompt.passages]
    assert [pe.position for pe in answer.passages] == [1, 2, 3, 4, 5]
    assert [pe.passage.id for pe in answer.passages] == given
    assert sorted(record["order"]) == [1, 2, 3, 4, 5] and record["numbering"] == "original"
    # The planted fact has the strongest evidence, and went into the slot the model reads best.
    scores = record["scores"][0]
    assert max(range(5), key=lambda i: scores[i]) == 1
    assert record["order"][record["slots"][0] - 1] == 2 == given.index("gold") + 1
    # The evidence read in the restacked prompt follows each passage home: the maps were permuted with it.
    again = passage_evidence(prompt.passages, answer.maps, generator.evidence_config)
    assert [p.calibrated for p in again] == pytest.approx([p.calibrated for p in answer.passages])
    # The span is where the passage sat in the prompt answered: the gold's lies in its slot's line.
    slot = record["order"].index(2)
    answered = restacker.arrange([prompt])[0].prompt
    assert answer.passages[1].span == answered.passage_spans[slot]
    for citation in answer.citations:
        for source in citation.sources:
            assert answer.passages[source.position - 1].passage.id == source.passage_id


def test_batched_restacking_equals_each_prompt_alone(generator, restacker, monkeypatch):
    prompts = [_prompt(generator, 5, 2), _prompt(generator, 4, 4)]
    alone = [restacker.generate(p, max_new_tokens=8) for p in prompts]
    calls = []
    real = restacker.scorer.score_batch
    monkeypatch.setattr(restacker.scorer, "score_batch", lambda ps, **kw: calls.append(len(ps)) or real(ps, **kw))
    batched = restacker.generate_batch(prompts, max_new_tokens=8)
    assert calls == [2]  # one scoring pass for the batch
    for a, b in zip(alone, batched, strict=True):
        assert a.text == b.text and a.restack["order"] == b.restack["order"]
        assert [p.score for p in a.passages] == pytest.approx([p.score for p in b.passages], abs=1e-5)


def test_two_rounds_score_twice_and_the_second_reads_the_restacked_prompt(generator, monkeypatch):
    from midlens.generators.answering.restack import Restack, Restacker

    twice = Restacker(generator, Restack("baseline", rounds=2))
    seen = []
    real = twice.scorer.score_batch
    monkeypatch.setattr(twice.scorer, "score_batch", lambda ps, **kw: seen.append(ps) or real(ps, **kw))
    prompt = _prompt(generator)
    answer = twice.generate(prompt, max_new_tokens=0)
    assert len(seen) == 2 and len(answer.restack["scores"]) == 2
    first = Restacker(generator, Restack("baseline")).arrange([prompt])[0]
    assert [p.id for p in seen[1][0].passages] == [p.id for p in first.prompt.passages]  # scored as placed
    assert answer.restack["rounds"] == 2


def test_bad_restack_options_name_the_option_and_what_to_do(generator):
    from midlens.core.errors import ArtefactError, InvalidArgumentError, MethodConfigError
    from midlens.generators.answering.restack import Restack, Restacker, as_restack
    from midlens.rag.pipeline import Pipeline

    with pytest.raises(MethodConfigError, match=r"restack=\"mudaff\": .* 'mudaff' is no method: choose one of .*mudaf"):
        Restack("mudaff")
    with pytest.raises(MethodConfigError, match=r'restack="mudaf\(alpha=2\)": mudaf alpha=2'):
        Restack("mudaf(alpha=2)")
    with pytest.raises(InvalidArgumentError, match=r"restack_rounds=0: .* pass restack_rounds=1"):
        as_restack("mudaf", 0)
    with pytest.raises(InvalidArgumentError, match=r"restack_rounds=0"):
        Pipeline(None, generator, restack="baseline", restack_rounds=0)
    with pytest.raises(InvalidArgumentError, match=r"restack_rounds=2: .* nothing is restacked"):
        Pipeline(None, generator, restack=None, restack_rounds=2)
    with pytest.raises(
        InvalidArgumentError,
        match=r'restack_rounds=2: more than one scoring pass needs a named scorer.*restack="mudaf"',
    ):
        Pipeline(None, generator, restack_rounds=2)  # the measured default restacks once or not at all
    with pytest.raises(InvalidArgumentError, match=r"rounds=1.5"):
        Restack("baseline", rounds=1.5)
    with pytest.raises(InvalidArgumentError, match=r"slots=\(1, 1\): expected the prompt positions 1..n"):
        Restack("baseline", slots=(1, 1))
    with pytest.raises(InvalidArgumentError, match=r"3 slots for a prompt of 5 passages"):
        Restacker(generator, Restack("baseline", slots=(3, 1, 2))).arrange([_prompt(generator)])
    with pytest.raises(ArtefactError, match="not a slot-order file"):
        Restacker(generator, Restack("baseline", slots="/nonexistent/slots.json"))


def test_cli_refuses_bad_restack_options_before_loading(capsys):
    from midlens.cli import main

    assert main(["ask", QUESTION, "--restack", "mudaff"]) == 2
    assert "--restack mudaff: restacking scores the passages with a method's evidence" in capsys.readouterr().err
    assert main(["ask", QUESTION, "--restack-rounds", "2"]) == 2
    assert "--restack-rounds 2: more than one scoring pass needs a named scorer" in capsys.readouterr().err
    # The bound is AnswerOptions' own (the flags are spelt from its fields), so the command line words its reason.
    assert main(["ask", QUESTION, "--restack", "--restack-rounds", "0"]) == 2
    assert "--restack-rounds 0: restacking scores the passages at least once" in capsys.readouterr().err
    assert main(["eval", "sweep", "--out", "/nonexistent/run", "--restack", "mudaf", "--restack-rounds", "0"]) == 2
    assert "--restack-rounds 0: restacking scores the passages at least once" in capsys.readouterr().err


def test_pipeline_restacks_answers_streams_and_verifies_in_the_given_numbering(generator):
    from midlens.rag.pipeline import Pipeline, marked_answer

    pipe = Pipeline(None, generator, max_new_tokens=8, prompt_style="short", restack="baseline")
    passages = planted_passages(4, 3)
    answer = pipe.answer(QUESTION, passages, verify=True)
    assert [pe.passage.id for pe in answer.passages] == [p.id for p in passages]
    assert answer.restack["order"][answer.restack["slots"][0] - 1] == 3  # the gold, in the best slot
    cited = {s.position for c in answer.citations for s in c.sources}
    assert cited and all(s.verified is not None for c in answer.citations for s in c.sources)
    assert all(f"[{p}" in marked_answer(answer).text for p in cited)
    stream = pipe.answer_stream(QUESTION, passages)
    assert "".join(stream).strip() == answer.text
    assert stream.answer.restack["order"] == answer.restack["order"]
    assert [pe.position for pe in stream.answer.passages] == [1, 2, 3, 4]
    # Citations handed over as sentences end are in the caller's numbering too, streamed or batched.
    shape = [(c.span, [(s.position, s.passage_id) for s in c.sources]) for c in answer.citations]
    streamed = [e for e in pipe.answer_stream(QUESTION, passages).events() if not isinstance(e, str)]
    assert [(c.span, [(s.position, s.passage_id) for s in c.sources]) for c in streamed] == shape
    handed = []
    pipe.answerer.generate_batch(
        [pipe.prompt(QUESTION, passages, pipe.options.replace(max_new_tokens=8))],
        max_new_tokens=8,
        on_citation=lambda _row, c: handed.append(c),
    )
    assert [(c.span, [(s.position, s.passage_id) for s in c.sources]) for c in handed] == shape
    # Verification after the fact (what a LlamaIndex engine does) rebuilds the prompt that was answered.
    again = pipe.verify([stream.answer])[0]
    assert [(s.position, s.verified) for c in again.citations for s in c.sources] == [
        (s.position, s.verified) for c in answer.citations for s in c.sources
    ]
    assert again.restack["numbering"] == "original"


def test_query_engine_restacks_and_keeps_the_retrieved_order(loaded):
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, TextNode

    from midlens.rag.llamaindex import MidlensLLM, MidlensQueryEngine

    nodes = [
        NodeWithScore(node=TextNode(id_=p.id, text=p.text[:200], metadata={"title": p.title}), score=1.0 - i / 10)
        for i, p in enumerate(planted_passages(4, 2))
    ]

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return list(nodes)

    llm = MidlensLLM(loaded, method="baseline", max_new_tokens=6, prompt_style="short")
    engine = MidlensQueryEngine(Fixed(), llm=llm, restack="baseline")
    response = engine.query(QUESTION)
    record = response.metadata["midlens"]["restack"]
    assert record["scorer"] == "baseline" and sorted(record["order"]) == [1, 2, 3, 4]
    assert {response.metadata[n.node.node_id]["position"] for n in nodes} == {1, 2, 3, 4}
    assert [response.metadata[n.node.node_id]["position"] for n in nodes] == [1, 2, 3, 4]
    plain = MidlensQueryEngine(Fixed(), llm=llm).query(QUESTION)
    assert plain.metadata["midlens"]["restack"] is None


def test_eval_sweep_runs_restacked_systems_beside_the_methods_and_the_report_tells_them_apart(tmp_path, loaded):
    from midlens.cli import main
    from midlens.eval.report import write_report
    from midlens.eval.runner import read_rows

    out = tmp_path / "run"
    args = ["eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "1,3", "--methods", "baseline"]
    args += ["--max-new-tokens", "4", "--no-progress", "--restack", "baseline", "--restack-rounds", "1,2"]
    assert main([*args, "--out", str(out)]) == 0
    rows = read_rows(out / "results.jsonl")
    labels = ["baseline", "baseline+restack(baseline)", "baseline+restack(baseline, rounds=2)"]
    assert sorted({r["method"] for r in rows}) == labels
    config = json.loads((out / "config.json").read_text())
    assert config["methods"]["baseline+restack(baseline, rounds=2)"]["restack"] == {"scorer": "baseline", "rounds": 2}
    assert "restack" not in config["methods"]["baseline"]  # runs made before restacking keep their hashes
    for row in rows:
        assert ("restack_gold_rank" in row) == ("+restack" in row["method"])
    restacked = [r for r in rows if "+restack" in r["method"]]
    assert {r["gold_prompt_position"] for r in restacked} <= {1, 2, 3}
    report = (write_report([out], tmp_path / "report")).read_text()
    assert all(f"| {label} |" in report for label in labels)
    assert "| method | accuracy, points | F1, points |" in report


def test_restacking_leaves_a_generator_s_own_answers_alone(generator, restacker):
    prompt = _prompt(generator)
    plain = generator.generate(prompt, max_new_tokens=4)
    assert plain.restack is None and "restack" in plain.to_dict()
    restacked = restacker.generate(prompt, max_new_tokens=4)
    assert restacked.to_dict()["restack"]["scorer"] == "baseline"
    assert isinstance(restacked.maps.question, torch.Tensor)


def test_ask_restacks_and_shows_what_the_prompt_held(generator, restacker, default_retriever, capsys):
    from midlens.cli import main
    from midlens.cli.ask import print_answer

    args = ["ask", QUESTION, "--top-k", "3", "--max-new-tokens", "6", "--model", "smollm2-135m", "--json"]
    assert main([*args, "--restack", "baseline", "--restack-rounds", "2"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["restack"]["scorer"] == "baseline" and record["restack"]["rounds"] == 2
    assert [p["position"] for p in record["passages"]] == [1, 2, 3]  # as retrieved
    print_answer(restacker.generate(_prompt(generator), max_new_tokens=6))
    out = capsys.readouterr().out
    assert "restacked by baseline evidence (1 round): the prompt held passages " in out
    assert "(pos = position as retrieved, ret = retrieval cosine)" in out


def test_strongest_first_needs_no_measured_order_and_runs_on_a_model_without_one(tmp_path, loaded):
    """slots="first" puts the passage the scorer ranks first in slot 1, the next in slot 2, ... for any passage
    count and any model: a tiny random folder (no slot order measured) restacks with it, where the measured policy
    is refused; a sweep restacks only the methods named and records the policy in the label and the config."""
    from midlens.cli import main
    from midlens.eval.runner import read_rows
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker, slot_order
    from midlens.generators.models.loading import load_model
    from tests.tiny import save_tiny

    first = Restack("baseline", slots="first")
    assert first.label == "restack(baseline, slots=first)" and first.slot_policy == "first"
    assert (
        Restack("baseline", slots="measured") == Restack("baseline") and Restack("baseline").slot_policy == "measured"
    )
    order = slot_order(Generator(loaded), "first")
    assert [order.for_count(n) for n in (1, 3, 10, 13)] == [list(range(1, n + 1)) for n in (1, 3, 10, 13)]
    tiny = load_model(str(save_tiny("llama", tmp_path / "llama", max_position_embeddings=4096)), "cpu", "float32")
    gen = Generator(tiny)
    with pytest.raises(Exception, match="no measured slot order"):
        Restacker(gen, Restack("baseline"))
    answer = Restacker(gen, first).generate(_prompt(gen), max_new_tokens=2)
    scores, placed = answer.restack["scores"][-1], answer.restack["order"]
    assert placed[0] == 1 + max(range(len(scores)), key=lambda i: (scores[i], -i))  # the strongest in slot 1
    assert answer.restack["slot_order"] == "strongest-first"

    out = tmp_path / "run"
    args = ["eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "2", "--max-new-tokens", "2"]
    args += ["--methods", "baseline,ms-poe", "--restack", "baseline", "--restack-slots", "first"]
    assert main([*args, "--restack-methods", "baseline", "--no-progress", "--out", str(out)]) == 0
    labels = {r["method"] for r in read_rows(out / "results.jsonl")}
    assert labels == {"baseline", "ms-poe", "baseline+restack(baseline, slots=first)"}
    config = json.loads((out / "config.json").read_text())
    restack = config["methods"]["baseline+restack(baseline, slots=first)"]["restack"]
    assert restack == {"scorer": "baseline", "rounds": 1, "slots": "first"}
    assert main([*args, "--restack-methods", "moice", "--out", str(tmp_path / "bad")]) == 2  # not among the methods


def test_strongest_last_puts_the_strongest_passage_next_to_the_question_at_any_count(tmp_path, loaded):
    """slots="last" needs no measured order: the passage the scorer ranks first goes to the last slot (the one the
    question follows), the next to the slot before, for any passage count; the label and a sweep's config say so."""
    from midlens.cli import main
    from midlens.eval.runner import read_rows
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker, slot_order

    last = Restack("baseline", slots="last")
    assert last.label == "restack(baseline, slots=last)" and last.slot_policy == "last"
    generator = Generator(loaded)
    order = slot_order(generator, "last")
    assert [order.for_count(n) for n in (1, 3, 10, 13)] == [list(range(n, 0, -1)) for n in (1, 3, 10, 13)]
    answer = Restacker(generator, last).generate(_prompt(generator), max_new_tokens=2)
    scores, placed = answer.restack["scores"][-1], answer.restack["order"]
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    assert placed == [1 + i for i in reversed(ranked)]  # strongest last, weakest first
    assert answer.restack["slot_order"] == "strongest-last"

    out = tmp_path / "run"
    args = ["eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "2", "--max-new-tokens", "2"]
    args += ["--methods", "baseline", "--restack", "baseline", "--restack-slots", "last", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 0
    assert {r["method"] for r in read_rows(out / "results.jsonl")} == {
        "baseline",
        "baseline+restack(baseline, slots=last)",
    }
    config = json.loads((out / "config.json").read_text())
    assert config["methods"]["baseline+restack(baseline, slots=last)"]["restack"]["slots"] == "last"


def test_slots_read_from_the_content_free_pass_place_the_strongest_where_the_prompt_draws_most(tmp_path, loaded):
    """slots="read" needs no measured order either: each prompt's slots are ordered by the attention each drew in the
    scorer's content-free pass (evidence less calibrated evidence), and the strongest passage goes to the slot that
    drew most, per prompt and per round. On SmolLM2 the order read is not the identity "first" gives: this prompt's
    content-free pass draws most to slot 1, then the last slot (primacy, then recency)."""
    from midlens.cli import main
    from midlens.core.errors import InvalidArgumentError
    from midlens.eval.runner import read_rows
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker, read_slots

    read = Restack("baseline", slots="read", rounds=2)
    assert read.label == "restack(baseline, rounds=2, slots=read)" and read.slot_policy == "read"
    generator = Generator(loaded)
    restacker = Restacker(generator, read)
    prompt = _prompt(generator)
    answer = restacker.generate(prompt, max_new_tokens=2)
    assert answer.restack["slot_order"] == "read-from-evidence" and len(answer.restack["scores"]) == 2
    # The last round's slots are those its scoring pass read: re-score the prompt that round placed and read them.
    state = restacker.arrange([prompt])[0]
    scored = restacker.scorer.score_batch([_prompt_held(restacker, prompt, state, rounds=1)])[0]
    assert state.slots == read_slots(scored.passages)
    prior = [pe.evidence - pe.calibrated for pe in scored.passages]
    scores = state.scores[-1]
    strongest = max(range(len(scores)), key=lambda i: (scores[i], -i))
    assert state.order[state.slots[0] - 1] == strongest  # the strongest passage sits in the slot that drew most
    assert prior[state.slots[0] - 1] == max(prior)
    as_given = read_slots(restacker.scorer.score_batch([prompt])[0].passages)
    assert as_given[0] == 1 and as_given[1] == len(as_given) and as_given != sorted(as_given)
    with pytest.raises(InvalidArgumentError, match="content-free"):
        read_slots([pe.__class__(**{**pe.__dict__, "calibrated": None}) for pe in scored.passages])

    out = tmp_path / "run"
    args = ["eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "2", "--max-new-tokens", "2"]
    args += ["--methods", "baseline", "--restack", "baseline", "--restack-slots", "read", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 0
    assert {r["method"] for r in read_rows(out / "results.jsonl")} == {
        "baseline",
        "baseline+restack(baseline, slots=read)",
    }


def _prompt_held(restacker, prompt, state, rounds: int):
    """The prompt as the first `rounds` of `state`'s scoring left it (the prompt the next round scored)."""
    from midlens.generators.answering.restack import Restack, Restacker

    earlier = Restacker(restacker.generator, Restack("baseline", slots="read", rounds=rounds)).arrange([prompt])[0]
    return earlier.prompt
