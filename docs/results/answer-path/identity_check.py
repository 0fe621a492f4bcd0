"""Answers of a fixed set of option sets through every interface that answers (Pipeline, the eval plan's e2e
evaluators, the server's Engine), with the real SmolLM2-135M, written to JSON; `--compare BASE.json` then says
whether a change to the answer path kept every answer bit-identical (text and citations equal, evidence and support
within 0).

    .venv/bin/python docs/results/answer-path/identity_check.py OUT.json [--compare BASE.json]

OUT.json is written after every option set and a run given an OUT.json that exists goes on from it (a cut run
resumes); with --compare, only the (interface, option set) pairs the baseline holds are answered.

The corpus and questions are embedded below, so the passages each question retrieves (the real dense retriever over
them) are the same for every interface and every run. Timings are left out (wall time differs run to run). An
option set an interface cannot express (the eval plan has no verify, abstain, sampling or stop_at_line_end; the
server had no verify before one answer path) is recorded as absent there: a comparison then covers the pairs both
files have and lists the ones only one has. Option sets run in the order below, each through every interface, so a
run cut short still compares all three interfaces on the sets it reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m"
TOP_K = 4
MAX_NEW = 8

CORPUS = [
    (
        "Wings of Desire",
        "Wings of Desire is a 1987 romantic fantasy film directed by Wim Wenders. The film is about "
        "invisible, immortal angels who populate Berlin and listen to the thoughts of its human inhabitants.",
    ),
    (
        "Wim Wenders",
        "Wim Wenders is a German filmmaker, playwright, author and photographer, born in Dusseldorf in "
        "1945. He was a major figure in New German Cinema.",
    ),
    (
        "Brea Mall",
        "Brea Mall is a shopping mall in Brea, California, opened in 1977. It is owned by Simon Property "
        "Group and has about 170 stores.",
    ),
    (
        "Flash Gordon (soundtrack)",
        "Flash Gordon is the ninth studio album by the British rock band Queen, released "
        "on 8 December 1980 by EMI Records. It is the soundtrack to the science fiction film Flash Gordon.",
    ),
    (
        "Queen (band)",
        "Queen are a British rock band formed in London in 1970 by Freddie Mercury, Brian May and Roger "
        "Taylor; John Deacon joined in 1971.",
    ),
    (
        "Berlin",
        "Berlin is the capital and largest city of Germany, with about 3.8 million inhabitants. It lies on "
        "the banks of the Spree.",
    ),
    (
        "Simon Property Group",
        "Simon Property Group is an American real estate investment trust that invests in "
        "shopping malls, outlet centers and community centers; it is based in Indianapolis, Indiana.",
    ),
    (
        "Dusseldorf",
        "Dusseldorf is the capital city of North Rhine-Westphalia, the most populous state of Germany, "
        "known for its fashion industry and art scene.",
    ),
]
QUESTIONS = [
    ("q1", "Who directed Wings of Desire?", ["Wim Wenders"]),
    ("q2", "In which year was the band that recorded the Flash Gordon soundtrack formed?", ["1970"]),
    ("q3", "Which company owns the Brea Mall?", ["Simon Property Group"]),
]
SINGLE = QUESTIONS[:1]  # asked alone; "batch3" asks all three at once

# Option set -> AnswerOptions fields, most telling first. method None: the model's default (with its measured restack).
OPTION_SETS: dict[str, dict[str, Any]] = {
    "baseline": {"method": "baseline", "restack": None},
    "verify": {"method": "baseline", "restack": None, "verify": True},
    "abstain_below": {"method": "baseline", "restack": None, "abstain": True, "abstain_below": 0.9},
    "restack": {"method": "baseline", "restack": "mudaf"},
    "batch3": {"method": "baseline", "restack": None},
    "default": {},
    "stop_at_line_end": {"method": "baseline", "restack": None, "stop_at_line_end": True},
    "max_new_tokens": {"method": "baseline", "restack": None, "max_new_tokens": 4},
    "temperature0": {"method": "baseline", "restack": None, "temperature": 0.0, "top_p": 0.9},
    "ms-poe": {"method": "ms-poe", "restack": None},
    "attn-calibration": {"method": "attn-calibration", "restack": None},
}


def record(answer) -> dict:
    """What must not change: the text, the citations, the evidence rows, the support, what abstaining withheld."""
    out = answer.to_dict()
    out.pop("timings", None)
    return json.loads(json.dumps(out, default=str))


def files(tmp: Path) -> tuple[Path, Path]:
    corpus, questions = tmp / "corpus.jsonl", tmp / "questions.jsonl"
    corpus.write_text("".join(json.dumps({"id": t, "title": t, "text": x}) + "\n" for t, x in CORPUS))
    questions.write_text("".join(json.dumps({"id": i, "question": q, "answers": a}) + "\n" for i, q, a in QUESTIONS))
    return corpus, questions


class Interfaces:
    """The three ways of answering, each made once: `answer(interface, name)` answers one option set through one."""

    def __init__(self, tmp: Path) -> None:
        from midlens.generators.models.loading import load_model
        from midlens.retrievers.build import build_retriever

        self.tmp = tmp
        self.corpus, self.questions = files(tmp)
        self.retriever = build_retriever(self.corpus, "dense", tmp / "index")
        self.loaded = load_model(MODEL, "auto", "float32")
        self.generators: dict = {}
        self.engine = None

    def answer(self, interface: str, name: str) -> dict | None:
        """{question id: record} for the option set through the interface; None where it cannot express it."""
        return getattr(self, interface)(name, OPTION_SETS[name])

    def pipeline(self, name: str, fields: dict) -> dict:
        from midlens.generators.answering.generator import Generator
        from midlens.generators.models.packaged_models import default_method
        from midlens.rag.options import AnswerOptions
        from midlens.rag.pipeline import Pipeline

        method = fields.get("method") or default_method(MODEL)
        if method not in self.generators:
            self.generators[method] = Generator(self.loaded, method=method)
        options = AnswerOptions(**{"top_k": TOP_K, "max_new_tokens": MAX_NEW, **fields, "method": None})
        pipe = Pipeline(self.retriever, self.generators[method], options)
        if name == "batch3":
            answers = pipe.ask_many([q for _, q, _ in QUESTIONS], batch_size=3)
            return {i: record(a) for (i, _, _), a in zip(QUESTIONS, answers, strict=True)}
        return {i: record(pipe.ask(q)) for i, q, _ in SINGLE}

    def eval_plan(self, name: str, fields: dict) -> dict | None:
        """The e2e evaluators `eval.plan.build_run` makes; the Answer each unit's row is made of is kept by wrapping
        `eval.e2e.row_of` (a row holds only the prediction's text)."""
        if name not in EVAL_SETS:
            return None
        import midlens.eval.e2e as e2e
        from midlens.eval.options import RunOptions
        from midlens.eval.plan import build_run
        from midlens.generators.models.packaged_models import default_method

        kept: list = []
        row_of = e2e.row_of

        def keeping(question, answer):
            kept.append((question["id"], answer))
            return row_of(question, answer)

        e2e.row_of = keeping
        try:
            options = RunOptions(
                mode="e2e",
                out=self.tmp / f"run-{name}",
                methods=(fields.get("method") or default_method(MODEL),),
                restack=fields.get("restack"),
                model=MODEL,
                dtype="float32",
                questions=self.questions,
                corpus=self.corpus,
                index_dir=self.tmp / "index",
                top_k=TOP_K,
                retrieval="dense",
                max_new_tokens=fields.get("max_new_tokens", MAX_NEW),
                batch_size=3 if name == "batch3" else 1,
                progress=False,
            )
            run = build_run(options)
            # A restacked run also has the plain method's units; this set's are the restacked ones.
            units = [u for u in run.plan.units if fields.get("restack") is None or "+restack" in u["method"]]
            if name == "batch3":
                run.evaluate_many(units)
            else:
                for u in units:
                    if u["example_id"] in {i for i, _, _ in SINGLE}:
                        run.evaluate(u)
        finally:
            e2e.row_of = row_of
        return {i: record(a) for i, a in kept}

    def engine_(self, name: str, fields: dict) -> dict | None:
        from midlens.rag.remote import AnswerRequest
        from midlens.serve.engine import Engine

        if not set(fields) <= set(AnswerRequest.model_fields):
            return None
        if self.engine is None:
            self.engine = Engine(MODEL, max_new_tokens=MAX_NEW, dtype="float32")
        engine = self.engine
        asked = QUESTIONS if name == "batch3" else SINGLE
        jobs = []
        for _, question, _ in asked:
            passages = [
                {"id": p.id, "title": p.title, "text": p.text, "score": p.score}
                for p in self.retriever.search(question, TOP_K)
            ]
            jobs.append(engine.answer_job(AnswerRequest(question=question, passages=passages, **fields)))
        answers = []
        for job, outcome in zip(jobs, engine.run(jobs), strict=True):
            if outcome.error is not None:
                raise outcome.error
            # What the server's handler did with the answer before abstaining moved into the answer path (a no-op
            # on an answer already withheld there).
            job.decoding.answer.withhold(outcome.answer)
            answers.append(outcome.answer)
        return {i: record(a) for (i, _, _), a in zip(asked, answers, strict=True)}


EVAL_SETS = ("baseline", "restack", "batch3")  # the eval plan's own assembly: its systems (restacked too), batches
INTERFACES = {"pipeline": "pipeline", "eval_plan": "eval_plan", "engine": "engine_"}


def run(path: Path, only: dict | None) -> None:
    """Every option set through every interface (those `only` holds, when given), written after each."""
    result = json.loads(path.read_text()) if path.exists() else {"model": MODEL}
    with tempfile.TemporaryDirectory() as tmp_name:
        interfaces = Interfaces(Path(tmp_name))
        for name in OPTION_SETS:
            for interface, method in INTERFACES.items():
                done = result.setdefault(interface, {})
                if name in done or (only is not None and name not in only.get(interface, {})):
                    continue
                answered = interfaces.answer(method, name)
                if answered is None:
                    print(interface, name, "not expressible", flush=True)
                    continue
                done[name] = answered
                print(interface, name, [v["text"] for v in answered.values()], flush=True)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def compare(new: dict, base: dict) -> int:
    """Exact equality per (interface, option set, question); prints what differs and what only one file has."""
    differ, same, only = [], 0, []
    for interface in ("pipeline", "eval_plan", "engine"):
        a, b = new.get(interface, {}), base.get(interface, {})
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                only.append(f"{interface}/{name}: only in {'the new file' if name in a else 'the baseline'}")
                continue
            for qid in sorted(set(a[name]) | set(b[name])):
                # As JSON text: a NaN (an unscored field) equals itself there.
                if _text(a[name].get(qid)) == _text(b[name].get(qid)):
                    same += 1
                else:
                    keys = sorted(
                        k
                        for k in set(a[name].get(qid, {})) | set(b[name].get(qid, {}))
                        if _text(a[name].get(qid, {}).get(k)) != _text(b[name].get(qid, {}).get(k))
                    )
                    differ.append(f"{interface}/{name}/{qid}: {keys}")
    print(f"identical answers: {same}; differing: {len(differ)}")
    for line in differ + only:
        print("  " + line)
    return 1 if differ else 0


def _text(value) -> str:
    return json.dumps(value, sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="a baseline JSON this run must equal")
    args = parser.parse_args()
    base = None if args.compare is None else json.loads(args.compare.read_text())
    run(args.out, base)
    if base is None:
        return 0
    return compare(json.loads(args.out.read_text()), base)


if __name__ == "__main__":
    sys.exit(main())
