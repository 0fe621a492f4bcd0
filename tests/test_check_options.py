"""The check path's options (rag/check_options.py) and its shells: every shell of the check path spells CheckOptions'
fields from their OptionInfo, with one default each, and every one checks through `Answering.check`."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields

import pytest

from midlens.core.defaults import CHECK_MODEL
from midlens.core.errors import InvalidArgumentError
from midlens.core.passage import Passage
from midlens.rag.check_options import CheckOptions, check_options_from
from midlens.rag.option_fields import spelt_by
from midlens.rag.options import AnswerOptions, option_info

QUESTION = "When did the Kessler Bridge open?"
PASSAGES = [
    Passage(text="The Kessler Bridge opened in 1931. It spans the Ashwood river.", title="Kessler Bridge", id="a"),
    Passage(text="The pelican film was directed by Mara Lind in 1988.", title="Pelican film", id="b"),
]
GIVEN = "The Kessler Bridge opened in 1931."


def _check_flags() -> dict[str, argparse.Action]:
    from midlens.cli.check import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    check = parser._subparsers._group_actions[0].choices["check"]
    names = {f.name for f in fields(CheckOptions)}
    return {a.dest: a for a in check._actions if a.option_strings and a.dest in names}


def _spelt(shell: str) -> dict:
    if shell == "cli":
        return _check_flags()
    if shell == "request":
        from midlens.rag.remote import CheckRequest

        return dict(CheckRequest.model_fields)
    if shell == "llamaindex":
        from midlens.rag.llamaindex.checked_engine import CheckedQueryEngine
        from midlens.rag.llamaindex.evaluator import MidlensEvaluator

        # Both take every field by keyword (from_model: `model` by name too); their defaults are CheckOptions'.
        taken = {}
        for cls in (MidlensEvaluator, CheckedQueryEngine):
            params = inspect.signature(cls.from_model).parameters
            assert "options" in params and any(p.kind is p.VAR_KEYWORD for p in params.values()), cls
            taken.update({n: CheckOptions() for n in spelt_by("llamaindex", CheckOptions)})
        return taken
    if shell == "demo":
        import re
        from pathlib import Path

        source = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[1] / "demo" / "app.py").read_text())
        return {
            f.name: f
            for f in fields(CheckOptions)
            if f'controls.control( check, "{f.name}"' in source or f'controls.control(check, "{f.name}"' in source
        }
    raise AssertionError(shell)


@pytest.mark.parametrize("shell", CheckOptions.SHELLS)
def test_every_check_shell_spells_every_check_option_or_says_why_not(shell):
    spelt = _spelt(shell)
    for field in fields(CheckOptions):
        if (
            field.name in option_info(field.name, CheckOptions).absent.get(shell, "")
            or shell in option_info(field.name, CheckOptions).absent
        ):
            assert field.name not in spelt_by(shell, CheckOptions)
            continue
        assert field.name in spelt, f"{shell} does not spell {field.name}, and its OptionInfo gives no reason"
        if shell == "cli":
            assert spelt[field.name].default == field.default, (field.name, spelt[field.name].default)
        elif shell == "request":
            server_default = field.name == "prompt_style"  # None: the server's instruction
            assert spelt[field.name].default == (None if server_default else field.default), field.name


def test_verify_has_one_default_on_every_check_path():
    """Issue: verify was on in the server, the evaluator, the checked engine and the demo tab, off in `midlens check`
    and Pipeline.check. Every one now takes CheckOptions' default."""
    from midlens.demo.backend import DemoBackend
    from midlens.demo.handlers import Handlers
    from midlens.rag.pipeline import Pipeline
    from midlens.rag.remote import CheckRequest

    assert CheckOptions().verify is True
    assert _check_flags()["verify"].default is CheckOptions().verify
    assert CheckRequest(question=QUESTION, answer=GIVEN).verify is CheckOptions().verify
    assert inspect.signature(DemoBackend.check).parameters["verify"].default is CheckOptions().verify
    assert inspect.signature(Handlers.check).parameters["verify"].default is CheckOptions().verify
    assert inspect.signature(Pipeline.check).parameters["options"].default is None  # CheckOptions.like(...)
    assert CheckOptions.like(AnswerOptions(verify=False)).verify is True  # an answer's verify is not a check's


def test_the_reader_has_one_default():
    """The evaluator and the checked engine hard-coded smollm2-135m while `midlens check` used the answering
    default: all three read with core.defaults.CHECK_MODEL."""
    assert CheckOptions().reader == CHECK_MODEL
    assert _check_flags()  # built
    from midlens.cli.check import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    check = parser._subparsers._group_actions[0].choices["check"]
    assert f"default: {CHECK_MODEL}" in " ".join(check.format_help().split())
    options, rest = check_options_from(None, {"model": None, "verify": False, "dtype": "float32"}, "llamaindex")
    assert (options.reader, options.verify, rest) == (CHECK_MODEL, False, {"dtype": "float32"})


def test_check_options_refuse_bad_values_by_field():
    for bad in ({"verify": "yes"}, {"top_k": 0}, {"truncate": "cut"}, {"prompt_style": "terse"}, {"model": ""}):
        with pytest.raises(InvalidArgumentError) as caught:
            CheckOptions(**bad)
        name = next(iter(bad))
        said = str(caught.value)
        by_field = caught.value.about and caught.value.about.option == name
        assert by_field or said.startswith((name, name.replace("_", " "))), said
    with pytest.raises(InvalidArgumentError, match="CheckOptions"):
        check_options_from(AnswerOptions(), {}, "llamaindex")  # type: ignore[arg-type]


@pytest.mark.parametrize("verify", [False, True])
def test_answering_check_is_the_generators_attribution_with_the_answer_paths_verification(tmp_path, verify):
    """`Answering.check` reads given texts as `Generator.attribute_batch` does and verifies them through the answer
    path's `verify` (timed under verify_s): same text, citations, evidence and support."""
    from midlens.generators import Generator
    from midlens.rag.answering import Answering
    from tests.tiny import save_tiny

    generator = Generator(str(save_tiny("llama", tmp_path / "llama")), method="baseline", dtype="float32")
    answering = Answering(generator)
    options = CheckOptions(verify=verify)
    prompt = answering.check_prompt(QUESTION, PASSAGES, GIVEN, options)
    checked = answering.check([prompt], [GIVEN], options)[0]
    direct = generator.attribute(prompt, GIVEN, verify=verify)
    assert checked.checked and checked.text == direct.text
    assert [c.span for c in checked.citations] == [c.span for c in direct.citations]
    assert [[s.verified for s in c.sources] for c in checked.citations] == [
        [s.verified for s in c.sources] for c in direct.citations
    ]
    assert [p.evidence for p in checked.passages] == pytest.approx([p.evidence for p in direct.passages], abs=1e-6)
    assert ("verify_s" in checked.timings) is verify
