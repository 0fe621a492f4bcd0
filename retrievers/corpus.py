"""Documents in, passages out: read a corpus (folder of .txt/.md, or .jsonl) and chunk long documents.

Chunking packs paragraphs into passages of at most `chunk_words` words and cuts oversized paragraphs
into overlapping word windows. It is linear in the input: LlamaIndex's SentenceSplitter (nltk punkt)
hits a regex time-out on multi-megabyte single documents, which a RAG corpus does contain.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from midlens.core.errors import CorpusError, invalid_json
from midlens.core.passage import Passage

TEXT_SUFFIXES = (".txt", ".md")


def default_corpus_path() -> Path:
    """The embedded corpus: 400 HotpotQA dev paragraphs (CC BY-SA 4.0; see retrievers/data/ATTRIBUTION.md)."""
    return Path(str(resources.files("midlens.retrievers") / "data" / "hotpotqa_corpus.jsonl"))


def default_questions_path() -> Path:
    """40 HotpotQA dev questions whose supporting paragraphs are in the embedded corpus."""
    return Path(str(resources.files("midlens.retrievers") / "data" / "hotpotqa_questions.jsonl"))


def _read_utf8(path: Path, folder: Path | None = None) -> str:
    """`folder`: the folder given whose file `path` is; None when the file itself was given."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        fix = "Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        raise CorpusError(
            f"{path}: not UTF-8 text (invalid byte 0x{data[err.start]:02x} at byte offset {err.start}). "
            + (f"{fix}." if folder is None else f"{fix} or remove it from {folder}.")
        ) from None


def _jsonl_documents(path: Path, folder: Path | None = None) -> Iterator[dict]:
    for lineno, line in enumerate(_read_utf8(path, folder).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise invalid_json(f"{path}:{lineno}", err) from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise CorpusError(
                f'{path}:{lineno}: each line must be an object with a string "text" (and optional "id", "title").'
            )
        yield {
            "id": str(row.get("id", f"{path.stem}:{lineno}")),
            "title": str(row.get("title", "")),
            "text": row["text"],
        }


def read_documents(path: str | Path, name: str = "corpus") -> list[dict]:
    """A folder (recursively, .txt/.md), one .txt/.md file, or a .jsonl file -> [{id, title, text}]. `name`: what
    the errors call the input, as its user gave it (the corpus, or a command's option such as "--passages")."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CorpusError(f"{name} not found: {path} does not exist.")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + (".jsonl",))
        if not files:
            raise CorpusError(f"{name} folder {path} has no .txt, .md or .jsonl files.")
    else:
        if path.suffix.lower() not in TEXT_SUFFIXES + (".jsonl",):
            raise CorpusError(f"{path}: unsupported {name} file type '{path.suffix}'; use .txt, .md or .jsonl.")
        files = [path]
    folder = path if path.is_dir() else None
    docs: list[dict] = []
    for f in files:
        if f.suffix.lower() == ".jsonl":
            docs.extend(_jsonl_documents(f, folder))
        else:
            rel = f.relative_to(path) if path.is_dir() else Path(f.name)
            docs.append({"id": str(rel), "title": f.stem.replace("_", " "), "text": _read_utf8(f, folder)})
    docs = [d for d in docs if d["text"].strip()]
    if not docs:
        raise CorpusError(f"{name} {path} is empty: no document has any text.")
    return docs


def chunk_text(text: str, chunk_words: int = 160, overlap_words: int = 24) -> list[str]:
    """Paragraph-packing chunker; oversized paragraphs become overlapping word windows."""
    if chunk_words < 1 or not 0 <= overlap_words < chunk_words:
        raise ValueError(f"chunk_words={chunk_words}, overlap_words={overlap_words}: need 0 <= overlap < chunk.")
    chunks: list[str] = []
    current: list[str] = []
    for paragraph in text.split("\n\n"):
        words = paragraph.split()
        if not words:
            continue
        if len(current) + len(words) <= chunk_words:
            current += words
            continue
        if current:
            chunks.append(" ".join(current))
            current = []
        if len(words) <= chunk_words:
            current = words
            continue
        step = chunk_words - overlap_words
        for start in range(0, len(words), step):
            window = words[start : start + chunk_words]
            if start + chunk_words >= len(words):
                current = window  # the tail may still pack with the next paragraph
                break
            chunks.append(" ".join(window))
    if current:
        chunks.append(" ".join(current))
    return chunks


def to_passages(docs: list[dict], chunk_words: int = 160, overlap_words: int = 24) -> list[Passage]:
    passages = []
    for doc in docs:
        pieces = chunk_text(doc["text"], chunk_words, overlap_words)
        for i, piece in enumerate(pieces):
            pid = doc["id"] if len(pieces) == 1 else f"{doc['id']}#{i}"
            passages.append(Passage(text=piece, title=doc["title"], id=pid, metadata={"doc_id": doc["id"]}))
    return passages


def fingerprint(passages: list[Passage], extra: dict) -> str:
    """sha256 over passages and build settings: an unchanged corpus maps to the same index."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text]).encode())
        h.update(b"\n")
    return h.hexdigest()
