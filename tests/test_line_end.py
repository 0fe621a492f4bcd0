"""A model without a chat template stops at the end of its answer's line (AnswerOptions.stop_at_line_end: None is
the model's default), in the Python API, the LlamaIndex LLM and the CLI's flags; a chat model is left as it was."""

from __future__ import annotations

import argparse

import pytest

from midlens.core.errors import InvalidArgumentError
from midlens.rag.options import AnswerOptions
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


@pytest.fixture(scope="module")
def gemma():
    from midlens.generators import Generator
    from midlens.generators.models.loading import load_model

    return Generator(load_model("gemma3-270m", dtype="float32"), method="baseline")


def test_a_base_model_answers_one_line_by_default_and_on_when_asked_to_go_on(gemma):
    """Issue 74 D: gemma3-270m (no chat template) answered "In 1952 [1].\\nQuestion: ...\\nAnswer: ..." to all its
    tokens. Measured here: by default one line in 18 of 32 tokens; stop_at_line_end=False runs on to all 32 with a
    made-up "Answer:" line, as before."""
    from midlens.rag.llamaindex import MidlensLLM
    from midlens.rag.pipeline import Pipeline

    assert not getattr(gemma.tokenizer, "chat_template", None)
    pipe = Pipeline(None, gemma, max_new_tokens=32)
    answer = pipe.answer(QUESTION, planted_passages(5, 2))
    assert answer.text.strip() and "\n" not in answer.text and answer.generated_tokens < 32
    on = pipe.answer(QUESTION, planted_passages(5, 2), stop_at_line_end=False)
    assert "\n" in on.text and on.generated_tokens == 32
    assert on.text.startswith(answer.text)  # the same first line, then more

    llm = MidlensLLM.from_generator(gemma, max_new_tokens=32)
    response = llm.complete(QUESTION, passages=planted_passages(5, 2))
    assert response.text == answer.text
    assert (
        "\n"
        in MidlensLLM.from_generator(gemma, max_new_tokens=32, stop_at_line_end=False)
        .complete(QUESTION, passages=planted_passages(5, 2))
        .text
    )


def test_a_chat_model_keeps_going_past_a_line_end_by_default(generator):
    """SmolLM2 has a chat template: its default stays off (a chat model ends its turn itself; its answers may hold
    several lines)."""
    assert AnswerOptions().stops_at_line_end(generator.tokenizer) is False
    assert AnswerOptions(stop_at_line_end=True).stops_at_line_end(generator.tokenizer) is True
    assert AnswerOptions().decoding()["stop_at_line_end"] is False  # no model known: off


def test_the_option_is_checked_and_spelt_by_the_cli():
    from midlens.cli import build_parser
    from midlens.cli.ask import answer_options

    with pytest.raises(InvalidArgumentError, match="stop_at_line_end"):
        AnswerOptions(stop_at_line_end="yes")
    parser = build_parser()
    for flags, expected in (([], None), (["--stop-at-line-end"], True), (["--no-stop-at-line-end"], False)):
        args = parser.parse_args(["ask", QUESTION, *flags])
        assert isinstance(args, argparse.Namespace) and answer_options(args).stop_at_line_end is expected


def test_the_server_resolves_the_line_end_for_its_model_and_takes_it_from_a_request(gemma):
    """The served model's default decides where a request does not say (a RAG answer and a plain chat alike); an
    answer request's `stop_at_line_end` and a chat's `midlens.stop_at_line_end` override it."""
    from midlens.rag.remote import AnswerRequest
    from midlens.serve.engine import Engine
    from midlens.serve.schemas import ChatCompletionRequest

    engine = Engine("gemma3-270m", method="baseline", max_new_tokens=16)
    passages = [{"id": p.id, "title": p.title, "text": p.text} for p in planted_passages(3, 2)]
    assert engine.answer_job(AnswerRequest(question=QUESTION, passages=passages)).decoding.stop_at_line_end
    off = AnswerRequest(question=QUESTION, passages=passages, stop_at_line_end=False)
    assert not engine.answer_job(off).decoding.stop_at_line_end
    chat = {"messages": [{"role": "user", "content": QUESTION}]}
    assert engine.chat_job(ChatCompletionRequest(**chat)).decoding.stop_at_line_end
    kept = ChatCompletionRequest(**chat, midlens={"stop_at_line_end": False})
    assert not engine.chat_job(kept).decoding.stop_at_line_end
