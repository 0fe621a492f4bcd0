"""A step the library advises (rebuild an index, score heads, train an artefact) is data, a `core.errors.Step`:
a Python caller reads it in plain words, the command line as a command it accepts, the server as a job for its
operator. No layer below the shells names a command (tests/test_layers.py checks the source)."""

from __future__ import annotations

import pickle
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from midlens.cli import build_parser
from midlens.cli.options import STEP_COMMANDS, cli_message
from midlens.core.errors import ArtefactError, MidlensError, Remedy, RetrievalIndexError, Step
from midlens.generators.methods.retrieval_heads import load_scores
from midlens.generators.models.shipped import resolve_artefact
from midlens.retrievers.dense import verify_index
from midlens.serve.errors import describe

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("core", "retrievers", "generators", "training")


def commands(message: str) -> list[list[str]]:
    """The `midlens ...` commands a message tells its reader to run, as argv lists."""
    return [shlex.split(text) for text in re.findall(r"`midlens ([^`]+)`", message)]


def parses(argv: list[str]) -> bool:
    """Whether the command line takes `argv` (the command, its positionals and flags) as written."""
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        return False
    return True


def test_a_damaged_index_reads_as_a_call_in_python_and_as_commands_on_the_command_line(tmp_path):
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    with pytest.raises(RetrievalIndexError) as caught:
        verify_index(index_dir)
    err = caught.value
    python = str(err)
    assert "has no MANIFEST.json" in python and "`midlens" not in python
    assert f"To fix it, delete {index_dir} (the next use builds it again)" in python
    assert "or build it again now with DenseRetriever.build(corpus)." in python
    cli = cli_message(err)
    assert "run `midlens index clear`, then run the command again, or run `midlens index build --corpus CORPUS`" in cli
    assert [argv[:2] for argv in commands(cli)] == [["index", "clear"], ["index", "build"]]
    assert all(parses(argv) for argv in commands(cli))
    assert err.damage.startswith(f"index folder {index_dir} has no MANIFEST.json")  # the note a rebuild prints
    status, message, _, _ = describe(err)
    assert status == 400 and f"ask the server's operator to delete {index_dir}" in message
    assert "`midlens" not in message


def test_missing_head_scores_name_the_command_that_writes_them_and_it_parses(tmp_path):
    loaded = SimpleNamespace(name="smollm2-135m", sha256="0" * 64)
    with pytest.raises(ArtefactError) as caught:
        load_scores(loaded, tmp_path / "missing.json")
    assert "midlens.training.heads.retrieval_head_scores" in str(caught.value)
    assert "`midlens" not in str(caught.value)
    (argv,) = commands(cli_message(caught.value))
    assert argv == ["heads", "score", "--model", "smollm2-135m", "--out", str(tmp_path)]
    assert parses(argv)


def test_a_missing_artefact_names_the_training_command_and_how_to_pass_its_folder():
    with pytest.raises(ArtefactError) as caught:
        resolve_artefact(None, "mudaf", "no-such-model")
    assert "then pass artefact=FOLDER" in str(caught.value) and "`midlens" not in str(caught.value)
    cli = cli_message(caught.value)
    train = "run `midlens train mudaf --model no-such-model --out OUT`, then ask with --method 'mudaf(artefact=OUT)'"
    assert train in cli
    (argv,) = commands(cli)
    assert parses(argv)


def test_options_and_steps_read_together_each_with_its_verb():
    err = MidlensError("it failed.", [Remedy("dtype", "float32"), Step("cache-clear", "delete F", {"model": "m"})])
    assert str(err) == 'it failed. To fix it, pass dtype="float32", or delete F.'
    assert cli_message(err) == (
        "it failed. To fix it, pass --dtype float32, or run `midlens cache clear --model m`, then run the command "
        "again."
    )
    # From a Ray worker the error arrives pickled: still a step the command line words as its command.
    assert cli_message(pickle.loads(pickle.dumps(err))) == cli_message(err)
    only_options = MidlensError("it failed.", [Remedy("dtype", "float32"), Remedy("device", "cpu")])
    assert str(only_options) == 'it failed. To fix it, pass dtype="float32", or device="cpu".'


def test_a_step_unknown_to_the_command_line_reads_in_plain_words():
    assert cli_message(MidlensError("no.", [Step("not-a-step", "do the thing")])) == "no. To fix it, do the thing."


# Values for the args a raise site computes (a model's name, the positions of a sweep); a literal is taken as given.
COMPUTED = {"model": "smollm2-135m", "method": "mudaf", "out": "runs/x", "positions": (1, 2, 3), "runs": "runs/r"}


def _steps_in(folder: str) -> list[tuple[str, Step]]:
    """Each `Step(...)` call in a folder's source, its args given the values a raise site would pass."""
    import ast

    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Step" and node.args):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            name, args = node.args[0], node.args[2] if len(node.args) > 2 else ast.Dict(keys=[], values=[])
            assert isinstance(name, ast.Constant) and isinstance(args, ast.Dict), f"{where}: name and args literal"
            given = {
                k.value: v.value if isinstance(v, ast.Constant) else COMPUTED[k.value]  # None: the user's pick
                for k, v in zip(args.keys, args.values, strict=True)
            }
            found.append((where, Step(name.value, "", given)))
    return found


def test_every_step_the_library_advises_is_a_command_the_command_line_takes():
    """Each step below the shells, worded by the command line with the args its raise site gives, parses."""
    found = [step for folder in LIBRARY for step in _steps_in(folder)]
    assert {step.name for _, step in found} == set(STEP_COMMANDS)  # none unknown, none worded for nothing
    for where, step in found:
        (argv,) = commands(cli_message(MidlensError("x.", [step])))
        assert parses(argv), f"{where}: `midlens {shlex.join(argv)}` is refused by the command line"
