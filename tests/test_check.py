"""Checking an answer midlens did not write: `Generator.attribute` teacher-forces a given answer after the prompt in one
pass and reads its citations as a generated answer's are read (the real SmolLM2-135M, fp32)."""

import pytest

from midlens.core.errors import InvalidArgumentError
from midlens.generators.answering.check import CheckedSupport
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"
GOLD_AT = 3
RIGHT = "The code word is pelican."
WRONG = "The code word is albatross."
PLANTED_ANSWER = (
    "The secret code word of the Zorbland expedition is 'pelican'. "
    'A Kind of Magic is based on the soundtrack to the film "Flash Gordon". '
    "Sheer Heart Attack is the third studio album by the British rock band Queen."
)


@pytest.fixture(scope="module")
def prompt(generator):
    return generator.prompt(QUESTION, planted_passages(6, GOLD_AT))


def test_attributing_the_models_own_answer_gives_what_generating_it_gave(generator, prompt):
    generated = generator.generate(prompt, max_new_tokens=24)
    checked = generator.attribute(prompt, generated.text)
    assert checked.answer_ids == generated.answer_ids and checked.text == generated.text
    # The same tokens scored in one chunk instead of one step each: equal up to summation order (measured 2e-6 on
    # the log-probabilities, 1e-5 on the margins; fp32).
    assert checked.token_logprobs == pytest.approx(generated.token_logprobs, abs=1e-4)
    assert checked.token_margins == pytest.approx(generated.token_margins, abs=1e-4)
    assert [c.span for c in checked.citations] == [c.span for c in generated.citations]
    for a, b in zip(generated.citations, checked.citations, strict=True):
        assert [(s.position, s.sentence) for s in a.sources] == [(s.position, s.sentence) for s in b.sources]
        assert [s.score for s in b.sources] == pytest.approx([s.score for s in a.sources], abs=1e-4)
    assert [p.score for p in checked.passages] == pytest.approx([p.score for p in generated.passages], abs=1e-4)
    # The generation-time support model reads tokens this model picked; a given answer's were not: a checked answer
    # gets the checked support model's (generators.answering.check), one probability per sentence.
    assert generated.support is not None and checked.checked and checked.support.to_dict()["checked"]
    assert not isinstance(generated.support, CheckedSupport) and isinstance(checked.support, CheckedSupport)
    assert len(checked.support.sentences) == len(checked.citations)


def test_a_planted_right_answer_cites_its_passage_and_scores_above_a_wrong_one(generator, prompt):
    right, wrong = generator.attribute_batch([prompt, prompt], [RIGHT, WRONG], verify=True)
    assert right.text == RIGHT and right.citations[0].span == (0, len(RIGHT))
    top = right.citations[0].sources[0]
    assert top.position == GOLD_AT and top.passage_id == "gold"
    # Removing the planted passage costs the right answer many nats (measured 14.9), the wrong one none (-0.4).
    assert top.verified and top.logprob_drop > 5
    assert not any(s.verified for c in wrong.citations for s in c.sources)
    # One teacher-forced pass scores the answers: the right one is far likelier (measured -13.0 against -20.8 nats).
    assert right.reference_logprob > wrong.reference_logprob + 3
    alone = generator.attribute(prompt, WRONG)
    assert alone.token_logprobs == pytest.approx(wrong.token_logprobs, abs=1e-4)
    # The checked support model calls the right answer likelier right (measured 0.59 against 0.10).
    assert right.support.probability > wrong.support.probability + 0.1


def test_the_planted_false_sentence_of_a_right_answer_gets_the_lowest_sentence_support(generator):
    """Three sentences, each copied or shortened from a passage; the middle one's film swapped for the one another
    passage names ("Highlander" -> "Flash Gordon"), as docs/results/check plants them."""
    prompt = generator.prompt(QUESTION, planted_passages(4, 2))
    answer = generator.attribute(prompt, PLANTED_ANSWER)
    support = answer.support
    assert isinstance(support, CheckedSupport) and support.model == "smollm2-135m" and not support.verified
    assert len(support.sentences) == len(answer.citations) == 3
    # Measured 0.77 / 0.06 / 0.23: the planted sentence far below the others, in the "check this" band.
    lowest = min(range(3), key=support.sentences.__getitem__)
    assert answer.text[answer.citations[lowest].span[0] :].startswith("A Kind of Magic is based on")
    assert support.probability == support.sentences[lowest] and not support.likely
    record = answer.to_dict()["support"]
    assert record["checked"] and record["sentences"] == list(support.sentences)


def test_an_unsupported_sentence_is_the_one_left_unverified(generator, prompt):
    text = "The secret code word is 'pelican'. It was chosen in 1920 by the Romans."
    answer = generator.attribute(prompt, text, verify=True)
    first, second = answer.citations
    assert any(s.verified for s in first.sources)
    assert not any(s.verified for s in second.sources)


def test_bad_answers_are_refused_naming_what_to_change(generator, prompt):
    with pytest.raises(InvalidArgumentError, match="answer 1 is empty"):
        generator.attribute(prompt, "   ")
    with pytest.raises(InvalidArgumentError, match="does not fit after its prompt"):
        generator.attribute(prompt, "pelican " * generator.context_window)
    with pytest.raises(InvalidArgumentError, match="1 answers for 2 prompts"):
        generator.attribute_batch([prompt, prompt], [RIGHT])


def test_pipeline_check_over_given_passages_and_its_bad_input(generator):
    from midlens.rag.pipeline import Pipeline

    pipe = Pipeline(None, generator)
    answer = pipe.check(QUESTION, RIGHT, planted_passages(4, 2), verify=True)
    assert answer.checked and isinstance(answer.support, CheckedSupport)
    assert answer.citations[0].sources[0].position == 2 and answer.citations[0].sources[0].verified
    with pytest.raises(InvalidArgumentError, match="this pipeline has no retriever; pass passages"):
        pipe.check(QUESTION, RIGHT)
    with pytest.raises(InvalidArgumentError, match="the answer to check is empty"):
        pipe.check(QUESTION, "", planted_passages(4, 2))


def test_the_check_command_prints_the_marked_answer_support_first_and_the_unsupported_sentence(tmp_path, capsys):
    import json

    from midlens.cli import main

    rows = [{"title": p.title, "text": p.text, "id": p.id} for p in planted_passages(4, 2)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = "The secret code word is 'pelican'. It was chosen in 1920 by the Romans."
    model = ["--model", "smollm2-135m", "--method", "baseline", "--device", "cpu", "--dtype", "float32"]
    assert main(["check", QUESTION, "--answer", text, "--passages", str(tmp_path / "p.jsonl"), "--verify", *model]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[1].startswith("A: The secret code word is 'pelican' [2].")
    assert lines[2].startswith("   support: ") and "checked-answer support model of smollm2-135m" in lines[2]
    assert lines[3].startswith("   sentence support: 1. ")
    assert lines[4] == "   the sentences that may not be supported:"
    assert lines[5].strip().startswith("- It was chosen in 1920 by the Romans.  (needs none of the passages")
    assert main(["check", QUESTION, "--answer", "  ", "--passages", str(tmp_path / "p.jsonl")]) == 2
    assert "the answer to check is empty" in capsys.readouterr().err


def test_a_flagged_sentences_needed_passage_is_not_printed_as_verified(tmp_path, capsys):
    """Issue 83 A in the shell: a sentence flagged as possibly unsupported printed its citations "verified: log-prob
    drop +4.37". The demo's example passages and a made-up second sentence that borrows its wording from one of them
    (measured with SmolLM2, baseline, fp32: sentence support 0.08; 2.46 nats lost without the paragraph's
    "Torrid is an American women's retail chain ...")."""
    import json

    from midlens.cli import main
    from midlens.demo.check_views import EXAMPLE_TITLES, example
    from midlens.retrievers.corpus import default_corpus_path, read_documents

    docs = {d["title"]: d for d in read_documents(default_corpus_path())}
    rows = [{"title": t, "text": docs[t]["text"], "id": docs[t]["id"]} for t in EXAMPLE_TITLES]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    made_up = "The founder named the chain after her cat."
    text = f"The first Torrid store opened in the Brea Mall in Brea, California. {made_up}"
    model = ["--model", "smollm2-135m", "--method", "baseline", "--device", "cpu", "--dtype", "float32"]
    passages = ["--passages", str(tmp_path / "p.jsonl")]
    assert main(["check", example()[0], "--answer", text, *passages, "--verify", *model]) == 0
    out = capsys.readouterr().out
    assert f"     - {made_up}  (support 0.0" in out  # flagged by the checked support model
    lines = out.splitlines()
    # Each cited passage's line, "  [2]   Torrid ... (share ..., verified: ...)", and the quote printed under it.
    notes = {line: after for line, after in zip(lines, lines[1:], strict=False) if line.startswith("  [")}
    shaped = [line for line, quote in notes.items() if "Torrid is an American women's retail chain" in quote]
    assert shaped and all("shapes the wording of sentence 2 (log-prob drop +" in line for line in shaped), shaped
    assert all(", verified:" not in line for line in shaped) and "✓" not in out
    # The first sentence still needs the paragraph that says where the first store opened: verified as before.
    held = [line for line, quote in notes.items() if "opened in the Brea Mall in Brea, California" in quote]
    assert held and all(", verified: log-prob drop +" in line for line in held), held


def test_the_shell_says_a_needed_passage_shapes_a_generated_answer_in_the_check_this_band(capsys):
    """Issue 83 A for `midlens ask`: a generated answer has one support; in the "check this" band a passage it needs
    shapes its wording, and the shell says so instead of "verified"; likely supported, it is verified."""
    from midlens.cli.ask import print_citations
    from midlens.generators.answering.support import Support
    from tests.test_demo import MODEL, cited_answer

    answer = cited_answer((True, False), (4.37, 0.1))
    answer.support = Support.at(0.04, 0.56, True, MODEL)
    print_citations(answer)
    out = capsys.readouterr().out
    assert "(share 0.60, shapes the wording of sentence 1 (log-prob drop +4.37 nats without it), but that " in out
    assert ", verified:" not in out and "[1?]" in out
    answer.support = Support.at(0.9, 0.56, True, MODEL)
    print_citations(answer)
    assert "(share 0.60, verified: log-prob drop +4.37 nats without it)" in capsys.readouterr().out


def test_the_llamaindex_evaluator_passes_a_grounded_response_and_names_an_unsupported_sentence(generator):
    from llama_index.core.base.response.schema import Response
    from llama_index.core.evaluation import BaseEvaluator
    from llama_index.core.schema import NodeWithScore, TextNode

    from midlens.rag.llamaindex import MidlensEvaluator
    from midlens.rag.pipeline import Pipeline

    evaluator = MidlensEvaluator(Pipeline(None, generator))
    assert isinstance(evaluator, BaseEvaluator)
    contexts = [p.text for p in planted_passages(4, 2)]
    # Any query engine's Response: its source nodes are the contexts.
    nodes = [NodeWithScore(node=TextNode(text=text), score=1.0) for text in contexts]
    good = evaluator.evaluate_response(query=QUESTION, response=Response(response=RIGHT, source_nodes=nodes))
    assert good.passing and good.score == 1.0 and "[2]" in good.feedback
    text = "The secret code word is 'pelican'. It was chosen in 1920 by the Romans."
    bad = evaluator.evaluate(query=QUESTION, response=text, contexts=contexts)
    assert not bad.passing and bad.score == 0.5
    assert "- It was chosen in 1920 by the Romans." in bad.feedback
    with pytest.raises(InvalidArgumentError, match="needs the query, the response and its contexts"):
        evaluator.evaluate(query=QUESTION, response=RIGHT, contexts=[])


def test_the_server_engine_checks_an_answer_within_its_limits(generator):
    from midlens.rag.remote import CheckRequest, PassageIn
    from midlens.serve.engine import Engine, Limits, TooMuchWork

    passages = [PassageIn(id=p.id or str(i), title=p.title, text=p.text) for i, p in enumerate(planted_passages(4, 2))]
    engine = Engine("smollm2-135m", method="baseline", limits=Limits(max_answer_tokens=40))
    text = "The secret code word is 'pelican'. It was chosen in 1920 by the Romans."
    job = engine.check_job(CheckRequest(question=QUESTION, answer=text, passages=passages))
    (outcome,) = engine.run([job])
    assert outcome.error is None and outcome.answer.checked and isinstance(outcome.answer.support, CheckedSupport)
    first, second = outcome.answer.citations
    assert first.sources[0].passage_id == "gold" and first.sources[0].verified
    assert not any(s.verified for s in second.sources)
    with pytest.raises(TooMuchWork, match="over this server's limit of 40"):
        engine.check_job(CheckRequest(question=QUESTION, answer="pelican " * 60, passages=passages))
    with pytest.raises(InvalidArgumentError, match="the answer to check is empty"):
        engine.check_job(CheckRequest(question=QUESTION, answer=" ", passages=passages))
    with pytest.raises(InvalidArgumentError, match="no passages to check the answer against"):
        engine.check_job(CheckRequest(question=QUESTION, answer=text))
