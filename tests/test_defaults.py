"""Where no method is named, every interface runs the one measured for the model (core.names): the answering
method of Generator, Pipeline, the LlamaIndex classes, the demo, the server and the CLI, and the reranker's
method and score. The tables are patched to a method that is not the fallback, so a shell that still passed a
hard-coded "baseline" would fail here."""

from __future__ import annotations

import argparse

import pytest

from midlens.core import names
from midlens.generators import Generator
from midlens.generators.methods.registry import method_config
from midlens.generators.prompt import build_prompt
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


@pytest.fixture
def answering_default(loaded, monkeypatch) -> str:
    monkeypatch.setitem(names.ANSWER_METHODS, loaded.name, "attn-calibration")
    monkeypatch.setitem(names.ANSWER_METHODS, names.DEFAULT_MODEL, "attn-calibration")
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
    assert names.answer_method_for("/models/my-own") == names.FALLBACK_ANSWER_METHOD == "baseline"


def test_the_reranker_ranks_by_the_best_ranker_measured_for_its_model(loaded):
    from llama_index.core.schema import NodeWithScore, TextNode

    from midlens.rag.llamaindex import AttentionReranker

    method, score = names.reranker_for(loaded.name)
    assert (method, score) == ("mudaf", "evidence")  # docs/results/smollm2-135m/mudaf/report-rerank-n200/
    reranker = AttentionReranker(model=loaded, top_n=4)
    assert reranker.method == method and reranker._score_by() == score
    assert AttentionReranker(model=loaded, method="baseline")._score_by() == "calibrated"  # its own measured best
    assert names.reranker_for("/models/my-own") == names.FALLBACK_RERANKER

    passages = planted_passages(4, 3)
    nodes = [NodeWithScore(node=TextNode(id_=p.id, text=p.text, metadata={"title": p.title})) for p in passages]
    ranked = reranker.postprocess_nodes(nodes, query_str=QUESTION)
    scored = Generator(loaded, method=method).score(build_prompt(loaded.tokenizer, passages, QUESTION, 4096))
    expected = sorted(scored.passages, key=lambda pe: -pe.evidence)  # raw evidence, under MuDAF's delta
    assert [n.node.node_id for n in ranked] == [pe.passage.id for pe in expected]
    assert [n.score for n in ranked] == pytest.approx([pe.evidence for pe in expected], abs=1e-5)


@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "smollm2-135m"])
def test_each_packaged_models_answering_default_is_what_its_committed_sweeps_support(model):
    """The table follows the measurement: the default rule, applied to the committed n = 200 short-answer sweeps of
    each packaged model, supports the method core.names names for it."""
    from pathlib import Path

    from midlens.eval.report.default_rule import chosen, judge
    from midlens.eval.report.load import load_runs

    runs = Path(__file__).resolve().parent.parent / f"docs/results/{model}/short-answer/runs"
    configs, rows = load_runs([runs / "hotpotqa", runs / "squad"])
    assert all(c["model"] == model and c["examples"] == 200 and c["prompt_style"] == "short" for c in configs)
    assert method_config(names.answer_method_for(model)).spec() == chosen(judge(rows))
