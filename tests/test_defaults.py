"""Where no method is named, every interface runs the one measured for the model (core.defaults): the answering
method of Generator, Pipeline, the LlamaIndex classes, the demo, the server and the CLI, and the reranker's
method and score. The tables are patched to a method that is not the fallback, so a shell that still passed a
hard-coded "baseline" would fail here."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from midlens.core import defaults
from midlens.core.errors import InvalidArgumentError, MethodConfigError
from midlens.generators import Generator
from midlens.generators.methods.registry import method_config
from midlens.generators.models.prompt import build_prompt
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


@pytest.fixture
def answering_default(loaded, monkeypatch) -> str:
    monkeypatch.setitem(defaults.ANSWER_METHODS, loaded.name, "attn-calibration")
    monkeypatch.setitem(defaults.ANSWER_METHODS, defaults.DEFAULT_MODEL, "attn-calibration")
    return "attn-calibration"


def test_every_answering_interface_runs_the_models_measured_default(loaded, answering_default):
    from midlens.cli.options import method_spec
    from midlens.demo.backend import DemoBackend
    from midlens.rag.llamaindex import MidlensLLM
    from midlens.rag.pipeline import Pipeline
    from midlens.serve.engine import Engine

    assert Generator(loaded).method == method_config(answering_default)
    assert Pipeline(None, Generator(loaded)).generator.method.name == answering_default
    llm = MidlensLLM(loaded)
    assert llm.method == answering_default and llm.generator.method.name == answering_default
    backend = DemoBackend(model=loaded.name)
    assert backend.method == answering_default == backend.default_method_of(loaded.name)
    shorthand = DemoBackend(model=loaded.name, method="finetuned")  # its own menu entry, run with its options
    assert shorthand.method == "finetuned" and shorthand.startup_method == method_config("mudaf(alpha=0)")
    assert Engine(loaded.name).default.method.name == answering_default
    assert method_spec(argparse.Namespace(method=None, model=None)).name == answering_default
    # Naming a method still wins, and a model folder (no measurement) falls back to the baseline.
    assert Generator(loaded, method="baseline").method.name == "baseline"
    assert defaults.answer_method_for("/models/my-own") == defaults.FALLBACK_ANSWER_METHOD == "baseline"


def test_the_reranker_ranks_by_the_best_ranker_measured_for_its_model(loaded):
    from llama_index.core.schema import NodeWithScore, TextNode

    from midlens.rag.llamaindex import AttentionReranker

    method, score = defaults.reranker_for(loaded.name)
    assert (method, score) == ("mudaf", "evidence")  # docs/results/smollm2-135m/mudaf/report-rerank-n200/
    reranker = AttentionReranker(model=loaded, top_n=4)
    assert reranker.method == method and reranker._score_by() == score
    assert AttentionReranker(model=loaded, method="baseline")._score_by() == "calibrated"  # its own measured best
    assert defaults.reranker_for("/models/my-own") == defaults.FALLBACK_RERANKER

    passages = planted_passages(4, 3)
    nodes = [NodeWithScore(node=TextNode(id_=p.id, text=p.text, metadata={"title": p.title})) for p in passages]
    ranked = reranker.postprocess_nodes(nodes, query_str=QUESTION)
    scored = Generator(loaded, method=method).score(build_prompt(loaded.tokenizer, passages, QUESTION, 4096))
    expected = sorted(scored.passages, key=lambda pe: -pe.evidence)  # raw evidence, under MuDAF's delta
    assert [n.node.node_id for n in ranked] == [pe.passage.id for pe in expected]
    assert [n.score for n in ranked] == pytest.approx([pe.evidence for pe in expected], abs=1e-5)


# The committed as-shipped sweeps (docs/results/as-shipped/sweep.sh): each packaged model's candidates answering as
# every interface does (litm, 48 new tokens, first line), n = 200 on HotpotQA, SQuAD and NQ-open.
AS_SHIPPED = Path(__file__).resolve().parent.parent / "docs/results/as-shipped"
PACKAGED = ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m")


@pytest.mark.parametrize("model", PACKAGED)
def test_each_packaged_models_shipped_default_is_what_the_rule_decides_on_runs_as_shipped(model):
    """The default every interface runs (method, instruction, token budget, restack) is the one the default rule
    supports on the committed sweeps run in exactly that configuration: the runs' conditions are the shipped
    options', and the rule's winner is the shipped candidate (the baseline where nothing passes, or nothing is
    complete yet). A default chosen under another instruction or budget than the interfaces use fails here."""
    from midlens.eval.report.default_rule import REFERENCE_STYLE, chosen, judge_runs, shipped_candidate
    from midlens.rag.options import AnswerOptions

    options = AnswerOptions()
    assert (options.prompt_style, options.max_new_tokens) == (
        defaults.DEFAULT_PROMPT_STYLE,
        defaults.DEFAULT_MAX_NEW_TOKENS,
    )
    assert defaults.is_measured_restack(options.restack) and options.restack_rounds == 1
    folders = sorted(
        {p.parent for p in (AS_SHIPPED / model).rglob("config.json")} if (AS_SHIPPED / model).is_dir() else set()
    )
    verdicts = None
    if folders:
        shared, verdicts = judge_runs(folders, complete=200)
        assert shared["model"] == model and shared["max_new_tokens"] == options.max_new_tokens
        assert shared["examples"] == 200
    decided = chosen(verdicts) if verdicts else "baseline"
    assert decided == shipped_candidate(model)
    assert REFERENCE_STYLE == defaults.DEFAULT_PROMPT_STYLE or " @" in decided  # the instruction ships with its winner


def test_every_answering_interface_restacks_where_it_was_measured_to_help(loaded, measured_restack, tmp_path):
    """Where restacking was measured to help a model's default (none today: the entry is patched in), Pipeline,
    `ask`, the LlamaIndex LLM and engine, the demo's switch and the server restack its answers unless told not to;
    other methods do not, and None (--no-restack, `restack: null`) turns it off everywhere."""
    from midlens.cli import build_parser
    from midlens.demo.backend import DemoBackend
    from midlens.rag.llamaindex import MidlensLLM, MidlensQueryEngine
    from midlens.rag.pipeline import Pipeline
    from midlens.rag.remote import AnswerRequest
    from midlens.serve.engine import Engine
    from midlens.serve.schemas import ChatExtension

    default = defaults.answer_method_for(loaded.name)
    spec = method_config(default).spec()
    assert defaults.measured_restack_for(loaded.name, spec) == "mudaf"
    assert defaults.measured_restack_for(loaded.name, "baseline") is None
    assert defaults.measured_restack_for("/models/my-own", spec) is None  # a folder: never measured

    generator = Generator(loaded)
    pipe = Pipeline(None, generator)
    assert pipe.restack is not None and pipe.restack.scorer_spec == "mudaf" and pipe.restack.rounds == 1
    assert pipe.with_method("baseline").restack is None  # "measured" is re-read for the new method
    assert pipe.with_method("baseline").with_method(default).restack.scorer_spec == "mudaf"
    assert Pipeline(None, generator, restack=None).restack is None
    assert Pipeline(None, generator, restack="baseline").restack.scorer_spec == "baseline"  # named: as named
    assert Pipeline(None, Generator(loaded, method="baseline")).restack is None
    with pytest.raises(InvalidArgumentError, match="restack_rounds=2: more than one scoring pass needs a named scorer"):
        Pipeline(None, generator, restack_rounds=2)

    ask = build_parser()
    assert ask.parse_args(["ask", QUESTION]).restack == defaults.RESTACK_MEASURED
    assert ask.parse_args(["ask", QUESTION, "--no-restack"]).restack is None
    assert ask.parse_args(["ask", QUESTION, "--restack"]).restack == defaults.DEFAULT_RESTACK_SCORER
    with pytest.raises(SystemExit):  # one or the other
        ask.parse_args(["ask", QUESTION, "--restack", "--no-restack"])

    llm = MidlensLLM(generator)
    assert llm.restack == defaults.RESTACK_MEASURED and llm.pipeline.restack.scorer_spec == "mudaf"
    assert MidlensLLM(generator, restack=None).pipeline.restack is None
    with pytest.raises(MethodConfigError, match="restack=.no-such-scorer.: restacking scores"):
        MidlensLLM(generator, restack="no-such-scorer")
    assert MidlensQueryEngine(_no_retriever(), llm=llm)._call() == {}  # the LLM's field decides
    assert MidlensQueryEngine(_no_retriever(), llm=llm, restack=None)._call() == {"restack": None}

    backend = DemoBackend(model=loaded.name)
    assert backend.measured_restack(loaded.name, backend.method) == "mudaf"
    assert backend.measured_restack(loaded.name, "baseline") is None

    assert AnswerRequest(question=QUESTION).restack == ChatExtension().restack == defaults.RESTACK_MEASURED
    engine = Engine(loaded.name)
    assert engine.spec()["restack"] == "mudaf"  # what a client learns from GET /v1/midlens/spec
    assert engine._decoding(None, {"restack": defaults.RESTACK_MEASURED}).restack == "mudaf"
    assert engine._decoding("baseline", {"restack": defaults.RESTACK_MEASURED}).restack is None
    assert engine._decoding(None, {"restack": None}).restack is None
    assert engine._decoding(None, {}).restack is None  # a score request: nothing is answered


def _no_retriever():
    from llama_index.core.retrievers import BaseRetriever

    class NoRetriever(BaseRetriever):
        """Only for building an engine here: no query is run."""

        def _retrieve(self, query_bundle):
            return []

    return NoRetriever()
