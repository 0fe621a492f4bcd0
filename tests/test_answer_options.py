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


def test_resolve_makes_the_measured_settings_concrete(measured_restack):
    # A model's default restacks by the scorer core.defaults.MEASURED_RESTACKS names for it (SmolLM2's, patched in);
    # another model's does not; a named scorer and None are taken as given.
    smol = AnswerOptions().resolve("smollm2-135m")
    assert smol.method.spec() == "mudaf(alpha=0)" and smol.restack.scorer_spec == "mudaf" and smol.restack.rounds == 1
    qwen = AnswerOptions().resolve("qwen2.5-coder-0.5b")
    assert qwen.method.spec() == "baseline" and qwen.restack is None  # no measured default: the fallback
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


# Each shell's spelling is written from AnswerOptions' fields (rag/option_fields.py); these tests fail when a shell
# spells an option by hand again (another default, other bounds) or drops one without saying why (OptionInfo.absent).
SHELL_FIELDS = {
    "cli": lambda: _cli_actions(),
    "llm": lambda: _pydantic_of("midlens.rag.llamaindex.llm", "MidlensLLM"),
    "request": lambda: _pydantic_of("midlens.rag.remote", "AnswerRequest"),
    "chat": lambda: _pydantic_of("midlens.serve.schemas", "ChatExtension"),
}
# A request's fields whose None is the server's default (the served model's) and a chat request's decoding, which
# it spells the OpenAI way (max_tokens, temperature, top_p, seed).
SERVER_DEFAULT = {"request": {"max_new_tokens", "prompt_style"}, "chat": {"calibrate", "prompt_style"}}
OPENAI_DECODING = {"max_new_tokens", "temperature", "top_p", "seed"}


def _cli_actions() -> dict:
    import argparse

    from midlens.cli.ask import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    ask = parser._subparsers._group_actions[0].choices["ask"]
    return {a.dest: a for a in ask._actions if a.option_strings and a.dest in FIELDS}


def _pydantic_of(module: str, name: str) -> dict:
    import importlib

    return {k: v for k, v in getattr(importlib.import_module(module), name).model_fields.items() if k in FIELDS}


def _bounds(field) -> dict:
    return {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le") if hasattr(m, k)}


@pytest.mark.parametrize("shell", sorted(SHELL_FIELDS))
def test_every_shell_spells_every_option_with_its_default_and_bounds_or_says_why_not(shell):
    from dataclasses import fields

    from midlens.rag.options import option_info

    spelt = SHELL_FIELDS[shell]()
    for field in fields(AnswerOptions):
        info = option_info(field.name)
        reason = info.absent.get("request" if shell == "chat" else shell)
        if reason or (shell == "chat" and field.name in OPENAI_DECODING):
            continue  # spelt another way, or not at all, for the reason given (e.g. the server's own `method`)
        assert field.name in spelt, f"{shell} does not spell {field.name}, and its OptionInfo gives no reason"
        given = spelt[field.name]
        server_default = field.name in SERVER_DEFAULT.get(shell, ())
        assert given.default == (None if server_default else field.default), (shell, field.name, given.default)
        if shell == "cli":
            assert given.choices in (None, list(info.choices or ()), info.choices), (field.name, given.choices)
            continue  # the flags' values are checked by AnswerOptions, in their own spelling
        stated = {k: v for k, v in (("ge", info.ge), ("gt", info.gt), ("le", info.le)) if v is not None}
        assert _bounds(given) == stated, (shell, field.name, _bounds(given), stated)
        assert given.description.startswith(info.help), (shell, field.name)


# Per bounded field: a value at each bound it allows and one just past each bound.
EDGES = {
    "top_k": ([1], [0]),
    "max_new_tokens": ([0], [-1]),
    "temperature": ([0.0, 2.0], [-0.01, 2.01]),
    "top_p": ([1.0, 0.01], [0.0, 1.01]),
    "restack_rounds": ([1], [0]),
    "abstain_below": ([0.0, 1.0], [-0.01, 1.01]),
}


def test_the_stated_bounds_are_the_ones_answer_options_enforces():
    """OptionInfo's bounds are what the shells' schemas show: AnswerOptions, which enforces them, must agree."""
    from dataclasses import fields

    from midlens.rag.options import option_info

    bounded = {
        f.name
        for f in fields(AnswerOptions)
        if {option_info(f.name).ge, option_info(f.name).gt, option_info(f.name).le} != {None}
    }
    assert bounded == set(EDGES), bounded ^ set(EDGES)
    context = {"restack_rounds": {"restack": "mudaf"}, "abstain_below": {"abstain": True}}
    for name, (inside, outside) in EDGES.items():
        info = option_info(name)
        for value in inside:
            assert info.ge is None or value >= info.ge
            assert info.gt is None or value > info.gt
            assert info.le is None or value <= info.le
            AnswerOptions(**{name: value}, **context.get(name, {}))
        for value in outside:
            with pytest.raises(InvalidArgumentError) as caught:
                AnswerOptions(**{name: value}, **context.get(name, {}))
            err = caught.value
            assert (err.about and err.about.option == name) or str(err).startswith(f"{name}="), str(err)
    for name in ("truncate", "prompt_style"):
        for word in option_info(name).choices:
            AnswerOptions(**{name: word})
        with pytest.raises(InvalidArgumentError):
            AnswerOptions(**{name: "other"})


def test_the_command_line_reads_its_flags_into_options_with_what_they_imply():
    import argparse

    from midlens.cli.ask import add_parser, answer_options

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["ask", "Who?", "--top-k", "3", "--no-calibrate", "--abstain-below", "0.4"])
    options = answer_options(args)
    assert (options.top_k, options.calibrate, options.abstain, options.abstain_below) == (3, False, True, 0.4)
    assert answer_options(parser.parse_args(["ask", "Who?"])) == AnswerOptions()
    assert answer_options(parser.parse_args(["ask", "Who?", "--restack"])).restack == "mudaf"
    assert answer_options(parser.parse_args(["ask", "Who?", "--no-restack"])).restack is None
    assert answer_options(parser.parse_args(["ask", "Who?", "--no-stop-at-line-end"])).stop_at_line_end is False


def test_a_new_option_is_its_field_alone(monkeypatch):
    """A field added to AnswerOptions, with its OptionInfo, reaches the flags and the pydantic shells with no edit
    there (here a subclass stands for the edited class)."""
    import argparse
    from dataclasses import dataclass

    from midlens.rag import option_fields
    from midlens.rag.options import _option

    @dataclass(frozen=True)
    class WithNew(AnswerOptions):
        new_share: float | None = _option(None, "A share of something.", ge=0.0, le=1.0)

    monkeypatch.setattr(option_fields, "AnswerOptions", WithNew)
    parser = argparse.ArgumentParser()
    option_fields.add_arguments(parser)
    assert parser.parse_args(["--new-share", "0.25"]).new_share == 0.25
    model = option_fields.option_model("Shell", "request")
    assert model.model_fields["new_share"].default is None and _bounds(model.model_fields["new_share"]) == {
        "ge": 0.0,
        "le": 1.0,
    }
    with pytest.raises(ValueError, match="less than or equal to 1"):
        model(new_share=1.5)


def test_the_llm_and_the_server_spell_options_without_a_list_of_their_own():
    from midlens.rag.llamaindex.llm import CALL_OPTIONS, LLM_OPTIONS, MidlensLLM
    from midlens.serve.schemas import ChatCompletionRequest

    assert set(LLM_OPTIONS) <= set(MidlensLLM.model_fields) and set(CALL_OPTIONS) <= FIELDS
    assert "max_tokens" in ChatCompletionRequest.model_fields  # the chat request's decoding, OpenAI's way
    # The LLM's temperature is bounded as everywhere else (it was unbounded when spelt by hand).
    assert _bounds(MidlensLLM.model_fields["temperature"]) == {"ge": 0.0, "le": 2.0}


def test_the_query_engine_takes_its_options_from_answer_options():
    """MidlensQueryEngine's `verify` / `restack` / `restack_rounds`, as pydantic fields and as constructor keywords,
    have AnswerOptions' defaults, help and bounds (they were written by hand there, and could drift)."""
    import inspect
    from dataclasses import fields

    from midlens.rag.llamaindex import query_engine
    from midlens.rag.options import option_info

    engine = query_engine.MidlensQueryEngine
    keywords = inspect.signature(engine.__init__).parameters
    assert set(query_engine.EngineOptions.model_fields) == query_engine.ENGINE_OPTIONS
    for name in query_engine.ENGINE_OPTIONS:
        default = next(f.default for f in fields(AnswerOptions) if f.name == name)
        given = engine.model_fields[name]
        assert given.default == keywords[name].default == default, (name, given.default, keywords[name].default)
        assert given.description.startswith(option_info(name).help), name
        stated = {k: v for k, v in (("ge", option_info(name).ge), ("le", option_info(name).le)) if v is not None}
        assert _bounds(given) == stated, (name, _bounds(given))


def test_the_guide_shows_the_options_as_they_are():
    from pathlib import Path

    from midlens.rag.option_fields import options_table

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text(encoding="utf-8")
    assert options_table() in guide, "docs/guide.md's options table: paste option_fields.options_table() there"
