"""docs/guide.md's Python examples run as written, top to bottom in one namespace (a later example may use what an
earlier one built), on SmolLM2-135M and short prompts. An example a test cannot run (it needs a server, a GPU or a
long training) is marked in the guide, just above its code block, with

    <!-- example-not-run: NAME (why) -->

and NAME is listed in NOT_RUN below: a new mark, or a mark taken away, fails the test until this list says so."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import planted_passages

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
QUESTION = "What is the secret code word of the Zorbland expedition?"
# The guide's examples no test runs, by the name of their mark, and why.
NOT_RUN = {
    "serve-client": "OpenAI's client against a running `midlens serve` (tests/test_serve.py starts a server for it)",
}
SUPPORT_WORDS = (
    r" \| (likely supported|uncertain: check it against the passages|check this: the passages may not support it) "
    # The number, then where "likely" starts and who set it, or, for a method outside the support model's fitted
    # set, that it is not calibrated for it (generators/answering/support.py).
    r"\(0\.\d\d+(; likely from 0\.\d\d+, (the support model's threshold|set by abstain_below|abstain_below "
    r"[\d.]+ raised to the 0\.5 floor)|, not calibrated for [\w()=.-]+: (the model-agnostic support model|"
    r"[\w.-]+'s support model) was fitted on answers of .+)\)$"
)
EXAMPLE = re.compile(r"(?:<!-- example-not-run: ([\w-]+)[^\n]*-->\n)?```python\n(.*?)```", re.S)


def guide_examples() -> list[tuple[str | None, str, int]]:
    """(mark name or None, code, line number) of every ```python block of the guide, in order."""
    text = GUIDE.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1) for m in EXAMPLE.finditer(text)]


def test_every_python_example_of_the_guide_runs_as_written(loaded, default_retriever, tmp_path, monkeypatch, capsys):
    # `loaded` and `default_retriever`: the examples' SmolLM2 and embedded-corpus index come from this session.
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, p in enumerate(planted_passages(4, gold_at=2)):
        (docs / f"doc{i}.txt").write_text(p.text[:300], encoding="utf-8")
    monkeypatch.setenv("MIDLENS_DOCS", str(docs))  # the LlamaIndex example's folder and question
    monkeypatch.setenv("MIDLENS_QUESTION", QUESTION)
    from midlens.generators.methods import registry

    # The method the guide registers leaves with this test: the registry of the other tests stays the shipped one.
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))

    examples = guide_examples()
    assert sorted(name for name, _, _ in examples if name) == sorted(NOT_RUN)
    namespace: dict = {"__name__": "__main__"}
    printed = {}
    for name, code, line in examples:
        if name is None:
            exec(compile(code, f"{GUIDE}:{line}", "exec"), namespace)
            printed[line] = capsys.readouterr().out
    ran = [(code, printed[line]) for name, code, line in examples if name is None]
    assert len(ran) >= 2
    for code, out in ran:
        lines = [line for line in out.splitlines() if not line.startswith("converting ")]
        if "Pipeline.from_corpus" in code:  # the first answer, then the ranked passages, then the baseline's answer
            assert "Whitewater Canal" in lines[0], out
            assert [int(line.split()[0]) for line in lines[1:-1]] == list(range(1, len(lines) - 1))
        if "abstain=True" in code:  # the answer and its support in words, then the cautious pipeline's
            assert re.search(SUPPORT_WORDS, lines[0])
            assert len(lines) == 2 and lines[1], out
        if "register(Method(" in code:  # the registered method answered
            assert len(lines) == 1 and lines[0].strip(), out
        if "CheckedQueryEngine(" in code:  # another LLM's answer: the planted fact's sentence marked, the Romans named
            assert re.fullmatch(r"The code word is pelican \[\d\]\. It was chosen in 1920 by the Romans\.", lines[0])
            assert "'It was chosen in 1920 by the Romans.'" in lines[1] and lines[2], out
            assert any("pelican" in line for line in lines[3:]), out  # a CitationBlock cites the fact's sentence
        if "MidlensQueryEngine.from_index" in code:  # the planted fact found and answered
            assert lines[0].startswith("Answer:") and "pelican" in lines[0].lower(), out
            assert len(re.findall(r"evidence [+-]\d\.\d{4} +prompt position \d", out)) == 4


LAYERS = ("core", "retrievers", "generators", "rag", "training", "eval", "demo", "serve", "midlens")


def test_the_layout_section_names_every_module():
    """The guide's Layout block names every module of every layer (a new module, or a renamed one, fails here until
    the guide says what it holds)."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text[text.index("## Layout\n") : text.index("## Data and licences")]
    root = GUIDE.parent.parent
    missing = [
        str(path.relative_to(root))
        for layer in LAYERS
        for path in sorted((root / layer).rglob("*.py"))
        if path.stem != "__init__" and not re.search(rf"\b{re.escape(path.stem)}\b", block)
    ]
    assert not missing, f"docs/guide.md's Layout does not name: {missing}"


def test_every_results_folder_is_linked_from_a_page():
    """A folder of measured results that no page names is lost to a reader: README.md, the guide or another
    results page (docs/results/**/README.md, not its own) names each top-level folder of docs/results/."""
    root = GUIDE.parent.parent
    pages = [root / "README.md", GUIDE, *sorted((root / "docs" / "results").rglob("*.md"))]
    unlinked = []
    for folder in sorted(p for p in (root / "docs" / "results").iterdir() if p.is_dir()):
        named = re.compile(rf"(results/{re.escape(folder.name)}\b|`{re.escape(folder.name)}/`)")
        if not any(named.search(page.read_text(encoding="utf-8")) for page in pages if folder not in page.parents):
            unlinked.append(folder.name)
    assert not unlinked, f"docs/results folders no page links to: {unlinked}"
