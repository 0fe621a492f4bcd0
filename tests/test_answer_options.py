"""AnswerOptions (rag.options): one value for how to answer, checked without torch, resolved once a model is known,
and spelt by every shell (the command line, the LlamaIndex LLM, the server's requests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from midlens.core.errors import InvalidArgumentError, MidlensError
from midlens.rag.options import FIELDS, AnswerOptions


def test_making_and_refusing_options_loads_no_torch():
    code = (
        "import sys\n"
        "from midlens.rag.options import AnswerOptions\n"
        "AnswerOptions(top_k=3, restack='mudaf', restack_rounds=2, verify=True, abstain=True, abstain_below=0.5)\n"
        "try:\n"
        "    AnswerOptions(restack='mudaff')\n"
        "except Exception as err:\n"
        "    print(type(err).__name__)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["MethodConfigError", "False"]


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": "32"}, "max_new_tokens"),
        ({"truncate": "drop_first"}, "truncate"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"seed": 1.5}, "seed"),
        ({"verify": "yes"}, "verify"),
        ({"method": "ms-poee"}, "method"),
        ({"restack": "mudaff"}, "restack"),
        ({"restack_rounds": 2}, "restack_rounds"),  # the measured default restacks once or not at all
        ({"restack": None, "restack_rounds": 0}, "restack_rounds"),
        ({"cite_evidence": "nope"}, "cite_evidence"),
        ({"abstain_below": 0.5}, "abstain_below"),  # without abstain
        ({"abstain": True, "abstain_below": 1.5}, "abstain_below"),
        ({"verify": True, "max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_a_bad_option_is_refused_by_its_field_name(changes, field):
    with pytest.raises(MidlensError) as caught:
        AnswerOptions(**changes)
    err = caught.value
    named = {err.about.option} if err.about else set()
    named |= {r.option for r in err.remedies}
    assert field in named or str(err).startswith(f"{field}="), str(err)
    assert "Traceback" not in str(err)


def test_the_command_line_renders_an_options_error_with_its_flags(capsys):
    from midlens.cli import main

    assert main(["ask", "Who?", "--verify", "--max-new-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-new-tokens 0: nothing is generated" in err and "leave out --verify" in err
    assert main(["ask", "Who?", "--restack-rounds", "2"]) == 2
    assert "--restack-rounds 2: more than one scoring pass needs a named scorer" in capsys.readouterr().err
    assert main(["ask", "Who?", "--abstain-below", "2"]) == 2
    assert "--abstain-below 2.0: a support probability, from 0 to 1" in capsys.readouterr().err


def test_replace_checks_the_change_and_names_the_fields_there_are():
    options = AnswerOptions()
    assert options.replace() is options
    assert options.replace(top_k=3).top_k == 3 and options.top_k != 3  # frozen: a copy
    with pytest.raises(InvalidArgumentError, match=r"unknown answering option\(s\) topk: AnswerOptions takes .*top_k"):
        options.replace(topk=3)
    with pytest.raises(InvalidArgumentError, match=r"^top_k=-1"):
        options.replace(top_k=-1)


def test_resolve_makes_the_measured_settings_concrete():
    # SmolLM2's default (finetuned = mudaf(alpha=0)) restacks by MuDAF's evidence where measured; the default
    # model's does not; a named scorer and None are taken as given (core.names.MEASURED_RESTACKS).
    smol = AnswerOptions().resolve("smollm2-135m")
    assert smol.method.spec() == "mudaf(alpha=0)" and smol.restack.scorer_spec == "mudaf" and smol.restack.rounds == 1
    qwen = AnswerOptions().resolve("qwen2.5-coder-0.5b")
    assert qwen.method.spec() == "mudaf(alpha=0)" and qwen.restack is None
    assert AnswerOptions(restack=None).resolve("smollm2-135m").restack is None
    named = AnswerOptions(method="baseline", restack="baseline", restack_rounds=2).resolve("smollm2-135m")
    assert named.method.spec() == "baseline" and (named.restack.scorer_spec, named.restack.rounds) == ("baseline", 2)
    # A generator's running method stands where the options name none; a folder gets the fallback.
    assert AnswerOptions().resolve("smollm2-135m", running="baseline").restack is None
    assert AnswerOptions().resolve("/some/model/folder").method.spec() == "baseline"
    assert AnswerOptions(cite_evidence="mudaf").resolve("smollm2-135m").citations.evidence_from == "mudaf"


def test_a_pipeline_checks_its_options_before_any_model():
    from midlens.rag.pipeline import Pipeline

    with pytest.raises(InvalidArgumentError, match=r"^top_k=0"):
        Pipeline(None, None, top_k=0)
    with pytest.raises(InvalidArgumentError, match="unknown answering option"):
        Pipeline(None, None, AnswerOptions(), topk=3)
    assert Pipeline(None, None, AnswerOptions(top_k=3), max_new_tokens=9).options == AnswerOptions(
        top_k=3, max_new_tokens=9
    )


# What each shell spells of AnswerOptions, and what it leaves out on purpose (why beside it). A field added to
# AnswerOptions fails here until each shell spells it or says why it does not.
NOT_ON_THE_COMMAND_LINE = {"temperature", "top_p", "seed"}  # `ask` answers greedily, as measured
NOT_ON_THE_LLM = {"method", "cite_evidence", "top_k", "verify"}  # fields of the generator, the retriever, the engine
NOT_IN_A_REQUEST = {"top_k", "cite_evidence", "verify"}  # the caller retrieves; the operator chooses citations


def test_every_option_is_spelt_by_the_command_line():
    import argparse

    from midlens.cli.ask import add_parser, answer_options

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["ask", "Who?", "--top-k", "3", "--no-calibrate", "--abstain-below", "0.4"])
    options = answer_options(args)
    assert (options.top_k, options.calibrate, options.abstain, options.abstain_below) == (3, False, True, 0.4)
    spelt = {a.dest for a in parser._subparsers._group_actions[0].choices["ask"]._actions}
    spelt |= {"calibrate"} if "no_calibrate" in spelt else set()
    assert FIELDS - NOT_ON_THE_COMMAND_LINE <= spelt, FIELDS - NOT_ON_THE_COMMAND_LINE - spelt


def test_every_option_is_spelt_by_the_llamaindex_llm_and_the_server():
    from midlens.rag.llamaindex.llm import CALL_OPTIONS, LLM_OPTIONS, MidlensLLM
    from midlens.rag.remote import AnswerRequest
    from midlens.serve.schemas import ChatCompletionRequest, ChatExtension

    assert set(LLM_OPTIONS) <= set(MidlensLLM.model_fields) and set(CALL_OPTIONS) <= FIELDS
    assert FIELDS - NOT_ON_THE_LLM <= CALL_OPTIONS, FIELDS - NOT_ON_THE_LLM - CALL_OPTIONS
    assert FIELDS - NOT_IN_A_REQUEST <= set(AnswerRequest.model_fields), FIELDS - set(AnswerRequest.model_fields)
    # A chat request spells the decoding the OpenAI way (max_tokens, temperature, ...) and the rest in `midlens`.
    chat = set(ChatExtension.model_fields) | {"max_new_tokens", "temperature", "top_p", "seed"}
    assert "max_tokens" in ChatCompletionRequest.model_fields
    assert FIELDS - NOT_IN_A_REQUEST <= chat, FIELDS - NOT_IN_A_REQUEST - chat
