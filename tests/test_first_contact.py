"""What a RAG developer meets first: messages, help, JSON output, the demo's options (the small defects of the
first-contact review, each reproduced here)."""

from __future__ import annotations

import hashlib
import json

import pytest

from midlens.core.errors import CorpusError
from tests.conftest import PLANTED_FACT, planted_passages


def test_scoring_without_generating_says_so_instead_of_an_empty_answer(generator, capsys):
    from midlens.cli.ask import print_answer

    answer = generator.score(generator.prompt("What is the secret code word?", planted_passages(3, 2)))
    print_answer(answer, max_new_tokens=0)
    out = capsys.readouterr().out
    assert "A: (none: --max-new-tokens 0 scores the passages without generating an answer)" in out
    assert "A: \n" not in out


def test_json_output_carries_each_passage_s_token_span(generator):
    prompt = generator.prompt("What is the secret code word?", planted_passages(3, 2))
    record = json.loads(json.dumps(generator.score(prompt).to_dict()))
    assert [tuple(p["span"]) for p in record["passages"]] == prompt.passage_spans
    start, end = record["passages"][1]["span"]
    assert "Zorbland" in generator.tokenizer.decode(prompt.input_ids[start:end])


def test_a_malformed_jsonl_line_is_named_without_stutter(tmp_path):
    from midlens.retrievers.corpus import read_documents

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + '\n{"text": "unterminated\n')
    with pytest.raises(CorpusError) as err:
        read_documents(bad)
    message = str(err.value)
    assert "bad.jsonl:2: invalid JSON: Unterminated string starting at column 10." in message
    assert "at at" not in message


def test_methods_listing_starts_every_summary_in_one_column(capsys):
    import argparse

    from midlens.cli.methods import run as list_methods

    list_methods(argparse.Namespace())
    lines = capsys.readouterr().out.splitlines()
    names, options = lines[0::2], lines[1::2]
    columns = {len(line) - len(line.split(maxsplit=1)[1]) for line in names}
    assert len(columns) == 1 and any(line.startswith("attn-calibration ") for line in names)
    (column,) = columns
    assert all(opt[:column].strip() == "" and opt[column] != " " for opt in options)


def test_every_ask_and_eval_option_has_help():
    from midlens.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse's own table of sub-commands
    missing = []
    for name in ("ask", "demo"):
        for action in commands[name]._actions:
            if action.option_strings and not action.help and action.dest != "help":
                missing.append(f"{name} {action.option_strings[0]}")
    sweep = commands["eval"]._subparsers._group_actions[0].choices["sweep"]
    missing += [f"eval sweep {a.option_strings[0]}" for a in sweep._actions if a.option_strings and not a.help]
    assert "ask --evidence-query" not in missing
    assert not [m for m in missing if "evidence" in m], missing


def test_the_demo_serves_on_a_chosen_host():
    from midlens.cli import build_parser

    args = build_parser().parse_args(["demo", "--host", "0.0.0.0"])
    assert args.host == "0.0.0.0"
    assert build_parser().parse_args(["demo"]).host == "127.0.0.1"


def test_a_binary_upload_names_the_chosen_file_not_the_server_s_temp_path(pipeline, tmp_path):
    from midlens.demo.backend import DemoBackend, UserError

    upload = tmp_path / "gradio-temp-3f9a" / "my notes.txt"  # where Gradio keeps an upload on the server
    upload.parent.mkdir()
    upload.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(UserError) as err:
        DemoBackend(pipeline).retriever(str(upload))
    assert "my notes.txt" in str(err.value) and "gradio-temp-3f9a" not in str(err.value)


# -- round three ------------------------------------------------------------------------------------------------


def _corpus(folder):
    folder.mkdir()
    (folder / "zorbland.txt").write_text("Zorbland expedition\n\n" + PLANTED_FACT + "\n")
    (folder / "rivers.txt").write_text("Rivers\n\nThe longest river of the valley is the Amberflow.\n")
    return folder


@pytest.mark.slow
def test_ask_json_is_json_on_first_use_and_after_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch, capfd):
    """The first run converts the packaged GGUF and records a manifest of every file; a damaged cache is converted
    again from it (the GGUF is verified by hash, so the damage is repaired, not just refused). Both notes go to stderr,
    so `ask --json > out.json` holds only the answer. The repair's note names the damaged file and does not ask the
    user to clear a cache that midlens is already replacing."""
    from midlens.cli import main
    from midlens.generators.models import loading, packaged_models
    from tests.damage import overwrite

    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_LOADED", {})  # a fresh process: nothing converted, nothing in memory
    corpus = _corpus(tmp_path / "docs")
    ask = ["ask", "What is the secret code word?", "--corpus", str(corpus), "--model", "smollm2-135m"]
    ask += ["--json", "--device", "cpu", "--max-new-tokens", "2", "--top-k", "2"]

    assert main(ask) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["question"] == "What is the secret code word?"
    assert "converting smollm2-135m from GGUF" in err

    # The conversion recorded a manifest of every file it wrote, and left no temp folder behind (the empty lock
    # file stays on purpose: core.files.build_lock).
    folder = tmp_path / "cache" / "models" / "smollm2-135m"
    manifest = folder / "MANIFEST.json"
    recorded = json.loads(manifest.read_text())
    assert recorded["recorded"] == "at conversion"
    assert recorded["source_sha256"] == packaged_models.REGISTRY["smollm2-135m"].sha256
    on_disk = {p.name for p in folder.iterdir()} - {"MANIFEST.json"}
    assert set(recorded["files"]) == on_disk and "model.safetensors" in on_disk
    for name, entry in recorded["files"].items():
        assert entry["size"] == (folder / name).stat().st_size
    config = recorded["files"]["config.json"]
    assert config["sha256"] == hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    assert sorted(p.name for p in folder.parent.iterdir()) == [".smollm2-135m.lock", "smollm2-135m"]

    weights = folder / "model.safetensors"
    good = recorded["files"]["model.safetensors"]["sha256"]
    overwrite(weights, weights.stat().st_size // 2, b"\x7f\x7f\x7f\x7f")
    monkeypatch.setattr(loading, "_LOADED", {})
    assert main(ask) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["question"] == "What is the secret code word?"
    note = err[err.index("note: model 'smollm2-135m'") :].split("\n\n")[0]
    assert f"{weights}: sha256 " in note and "the manifest records" in note
    assert "converting smollm2-135m again from its installed GGUF" in note
    assert "cache clear" not in note and not note.splitlines()[0].endswith(":")
    # Repaired, not just refused: the weights are those the first conversion recorded.
    assert json.loads(manifest.read_text())["files"]["model.safetensors"]["sha256"] == good


def _e2e_run(tmp_path, loaded_name: str):
    from midlens.cli import main

    questions = tmp_path / "q.jsonl"  # the user's own questions: no "gold_titles" (optional)
    rows = [
        {"question": "What is the secret code word of the Zorbland expedition?", "answers": ["pelican"]},
        {"question": "What is the longest river of the valley?", "answers": ["Amberflow"]},
    ]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    args = ["eval", "e2e", "--questions", str(questions), "--corpus", str(_corpus(tmp_path / "docs")), "--top-k", "2"]
    args += ["--methods", "baseline,mudaf", "--model", loaded_name, "--max-new-tokens", "4", "--out", str(run)]
    assert main(args) == 0
    return run


def test_report_of_an_e2e_run_without_gold_titles_says_recall_is_unavailable(loaded, tmp_path, capsys):
    from midlens.cli import main

    run = _e2e_run(tmp_path, loaded.name)
    bar = capsys.readouterr().err
    assert main(["eval", "report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "| baseline | 2 |" in text and "| mudaf | 2 |" in text
    assert "Paired on the same questions" in text
    assert text.count("n/a (no gold_titles)") >= 5  # recall and evidence R@2 of both methods, the paired recall
    assert 'add `"gold_titles": [title, ...]` to each question' in text
    # The progress bar counts units (2 questions x 2 methods), and says so.
    assert " 4/4 " in bar and "unit" in bar and "ex/s" not in bar and "s/ex" not in bar


def test_an_out_path_that_is_a_file_is_named_with_what_to_do(tmp_path, capsys):
    from midlens.cli import main
    from midlens.core.errors import InvalidArgumentError
    from midlens.core.files import write_atomic

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "e2e", "model": "m", "top_k": 5, "max_new_tokens": 16}))
    row = dict(key="q0|baseline", example_id="q0", kind="e2e", dataset="qs", method="baseline", em=1.0, f1=1.0)
    (run / "results.jsonl").write_text(json.dumps({**row, "seconds": 1.0}) + "\n")
    taken = tmp_path / "results.txt"
    taken.write_text("someone's notes\n")

    assert main(["eval", "report", str(run), "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write into {taken}: {taken} is a file" in err and "Give a folder path" in err
    assert "Traceback" not in err and "FileExistsError" not in err
    with pytest.raises(InvalidArgumentError, match=f"{taken} is a file"):  # a parent that is a file, too
        write_atomic(taken / "sub" / "report.md", "x")
    assert taken.read_text() == "someone's notes\n"


@pytest.mark.slow
def test_an_unreachable_ray_address_fails_fast_and_names_it(tmp_path):
    import subprocess
    import sys
    import time

    command = [sys.executable, "-m", "midlens.cli", "eval", "sweep", "--dataset", "kv", "--n", "1", "--k", "2"]
    command += ["--methods", "baseline", "--engine", "ray", "--address", "127.0.0.1:1", "--out", str(tmp_path / "r")]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    seconds = time.perf_counter() - t0
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--address 127.0.0.1:1: no Ray cluster answers there" in done.stderr
    assert "ray start --head" in done.stderr and "firewall" in done.stderr
    assert "Failed to connect to GCS" not in done.stderr and seconds < 60


def test_another_model_s_mudaf_artefact_on_a_model_folder_names_the_layer_counts(tmp_path):
    import json
    import shutil

    from midlens.core.errors import ArtefactError
    from midlens.generators import Generator, load_model
    from midlens.generators.models.shipped import SHIPPED
    from tests.tiny import save_tiny

    folder = save_tiny("llama", tmp_path / "tiny")  # 4 layers; the shipped SmolLM2 delta adapts 30
    artefact = SHIPPED / "mudaf" / "smollm2-135m"
    # Verified before it is parsed: the base model is what is refused first, naming both.
    with pytest.raises(ArtefactError) as err:
        Generator(str(folder), method=f"mudaf(artefact='{artefact}')", device="cpu", dtype="float32")
    message = str(err.value)
    assert "trained on base model 'smollm2-135m'" in message and "not on the model loaded now" in message
    # Relabelled as this model's (its weights hash still holds): the delta's own layers are refused, by count.
    forged = tmp_path / "forged"
    shutil.copytree(artefact, forged)
    meta = json.loads((forged / "meta.json").read_text())
    meta["base_model_sha256"] = load_model(str(folder), device="cpu", dtype="float32").sha256
    (forged / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtefactError) as err:
        Generator(str(folder), method=f"mudaf(artefact='{forged}')", device="cpu", dtype="float32")
    message = str(err.value)
    assert "layers 0-29 (30 layers)" in message and "it has 4 layers (0-3)" in message
    assert "trained for another model" in message


def test_a_model_folder_without_tokenizer_files_says_so(tmp_path):
    from midlens.core.errors import ModelError
    from midlens.generators.models.loading import load_model
    from tests.tiny import save_tiny

    folder = save_tiny("llama", tmp_path / "weights-only")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ModelError) as err:
        load_model(str(folder), device="cpu")
    message = str(err.value)
    assert f"{folder} has no tokenizer files" in message and "tokenizer.json" in message
    assert "sentencepiece" not in message and "tiktoken installed" not in message


def test_a_questions_file_that_is_not_utf8_is_named_by_line(tmp_path):
    from midlens.eval.datasets import load_questions

    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"question": "fine?", "answers": ["yes"]}\n{"question": "caf\xe9?", "answers": ["x"]}\n')
    with pytest.raises(CorpusError) as err:
        load_questions(path)
    assert f"{path}:2: not UTF-8 text (byte 0xe9 at column 18)" in str(err.value)


def test_a_max_new_tokens_of_the_wrong_type_is_named_at_the_pipeline(pipeline):
    from midlens.core.errors import InvalidArgumentError

    for bad in ("5", 2.5, -1, None):
        with pytest.raises(InvalidArgumentError, match=f"max_new_tokens={bad!r}: the longest answer"):
            pipeline.ask("What is the secret code word?", max_new_tokens=bad)


def test_train_max_minutes_counts_the_preparation_before_the_loop():
    import time

    from midlens.training.recipe import Budget

    budget = Budget(examples=8, max_minutes=0.01)  # 0.6 s in all
    time.sleep(0.4)  # the retrieval-head scoring MuDAF runs before its loop
    assert budget.max_seconds == pytest.approx(0.2, abs=0.1)
    time.sleep(0.3)
    assert budget.max_seconds == 0.0  # the loop runs one step, checkpointed, and stops
    assert Budget(examples=8).max_seconds is None


def test_a_failed_ivf_build_leaves_no_shards_that_look_resumable(tmp_path):
    from midlens.core.errors import RetrievalIndexError
    from midlens.retrievers.dense import DenseRetriever

    passages = planted_passages(8, 3)
    with pytest.raises(RetrievalIndexError, match="ivf' needs at least 78 passages"):
        DenseRetriever.from_passages(passages, tmp_path / "idx", index_type="ivf")
    assert not [p.name for p in tmp_path.iterdir() if ".embeddings-" in p.name]


def test_a_same_size_edit_of_the_passages_with_the_mtime_kept_is_refused_at_load(tmp_path, caplog):
    import os

    from midlens.core.errors import RetrievalIndexError
    from midlens.retrievers.dense import DenseRetriever

    passages = planted_passages(4, 2)
    index_dir = tmp_path / "idx"
    DenseRetriever.from_passages(passages, index_dir)
    path = index_dir / "passages.jsonl"
    kept = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("'pelican'", "'penguin'"), encoding="utf-8")  # same size, other answer
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert path.stat().st_size == kept.st_size and path.stat().st_mtime_ns == kept.st_mtime_ns
    with pytest.raises(RetrievalIndexError) as err:
        DenseRetriever.load(index_dir)
    assert f"{path}: sha256 " in str(err.value) and "the manifest records" in str(err.value)
    # Built again from the passages at hand: the note says what was wrong, not to clear what is being rebuilt.
    rebuilt = DenseRetriever.from_passages(passages, index_dir)
    assert any("'pelican'" in p.text for p in rebuilt.passages)
    note = next(r.getMessage() for r in caplog.records if "passages.jsonl" in r.getMessage())
    assert "Rebuilding the index from the corpus now" in note and "index clear" not in note


def test_a_max_new_tokens_past_the_window_names_the_option_and_the_window(generator):
    """It used to surface as "max_tokens=-91807 leaves no room": an internal name and a negative number."""
    from midlens.core.errors import InvalidArgumentError

    window = generator.context_window
    with pytest.raises(InvalidArgumentError, match=f"max_new_tokens={window + 5} leaves no room .* {window}-token"):
        generator.prompt("What is the secret code word?", planted_passages(2), max_new_tokens=window + 5)
