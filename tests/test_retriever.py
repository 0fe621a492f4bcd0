"""Dense retriever on real sentence-transformers + faiss: build, search, persist, reuse, refuse bad input."""

from __future__ import annotations

import json
import sys

import pytest

from midlens.core.errors import CorpusError, RetrievalIndexError
from midlens.retrievers.corpus import chunk_text, read_documents
from midlens.retrievers.dense import DenseRetriever
from tests.damage import age, dead_owner


def test_default_corpus_search_finds_the_matching_paragraph(default_retriever):
    hits = default_retriever.search("Scott Derrickson American director screenwriter", top_k=5)
    assert len(hits) == 5
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(-1.0 <= h.score <= 1.0 for h in hits)
    # Self-retrieval: a paragraph's own first sentence should bring it back in the top 3 (top 1 is 18/20 here:
    # HotpotQA has several paragraphs about the same entity). Allow 1 miss in 20.
    sample = default_retriever.passages[::22][:20]
    found = sum(
        p.metadata["doc_id"] in {h.metadata["doc_id"] for h in default_retriever.search(p.text.split(". ")[0], 3)}
        for p in sample
    )
    assert found >= 19, f"self-retrieval {found}/20"


@pytest.fixture
def small_corpus(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "volcanoes.txt").write_text("Mount Etna is an active volcano on the east coast of Sicily.")
    (folder / "sub" / "whales.md").write_text("# Whales\n\nThe blue whale is the largest animal known to have lived.")
    (folder / "trains.txt").write_text("The Shinkansen is a network of high-speed railway lines in Japan.")
    (folder / "ignored.csv").write_text("a,b")
    return folder


def test_folder_corpus_build_save_reuse(small_corpus, tmp_path):
    index_dir = tmp_path / "index"
    r = DenseRetriever.build(small_corpus, index_dir=index_dir)
    assert len(r) == 3
    assert r.search("largest animal", top_k=1)[0].title == "whales"
    mtime = (index_dir / "index.faiss").stat().st_mtime_ns
    again = DenseRetriever.build(small_corpus, index_dir=index_dir)  # unchanged corpus: reuse
    assert (index_dir / "index.faiss").stat().st_mtime_ns == mtime
    assert again.search("volcano in Sicily", top_k=1)[0].id == "volcanoes.txt"
    (small_corpus / "trains.txt").write_text("The TGV is a French high-speed train.")
    rebuilt = DenseRetriever.build(small_corpus, index_dir=index_dir)  # changed: rebuild
    assert "TGV" in rebuilt.search("French train", top_k=1)[0].text


def test_index_types_agree_on_the_top_hit(small_corpus, tmp_path):
    flat = DenseRetriever.build(small_corpus, index_dir=tmp_path / "flat")
    hnsw = DenseRetriever.build(small_corpus, index_dir=tmp_path / "hnsw", index_type="hnsw")
    q = "railway in Japan"
    assert flat.search(q, 1)[0].id == hnsw.search(q, 1)[0].id
    with pytest.raises(RetrievalIndexError, match="needs at least 78 passages"):
        DenseRetriever.build(small_corpus, index_dir=tmp_path / "ivf", index_type="ivf")


def test_corrupt_index_is_detected(small_corpus, tmp_path):
    index_dir = tmp_path / "index"
    DenseRetriever.build(small_corpus, index_dir=index_dir)
    with (index_dir / "index.faiss").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(RetrievalIndexError, match=r"index.faiss: sha256 .*, the manifest records"):
        DenseRetriever.load(index_dir)
    (index_dir / "passages.jsonl").unlink()
    with pytest.raises(RetrievalIndexError, match="passages.jsonl is missing"):
        DenseRetriever.load(index_dir)
    # build() over a corrupt folder rebuilds instead of failing
    assert len(DenseRetriever.build(small_corpus, index_dir=index_dir)) == 3


def test_an_edited_passage_is_caught_and_the_index_rebuilt(small_corpus, tmp_path, caplog):
    """Defect: `sed -i s/Pembrook/Zanzibar/` on an index's passages.jsonl was served by `ask` and passed `cache
    verify`. The index's manifest covers every file: a load refuses it; a build from the corpus rebuilds it."""
    index_dir = tmp_path / "index"
    built = DenseRetriever.build(small_corpus, index_dir=index_dir)
    passages = index_dir / "passages.jsonl"
    text = passages.read_text(encoding="utf-8")
    word = built.passages[0].text.split()[0]
    passages.write_text(text.replace(word, "Zanzibar"), encoding="utf-8")
    with pytest.raises(RetrievalIndexError, match=r"passages.jsonl: (sha256|\d+ bytes)"):
        DenseRetriever.load(index_dir)
    with caplog.at_level("WARNING"):
        rebuilt = DenseRetriever.build(small_corpus, index_dir=index_dir)
    assert "Rebuilding the index from the corpus" in caplog.text
    assert [p.text for p in rebuilt.passages] == [p.text for p in built.passages]
    assert DenseRetriever.load(index_dir).passages[0].text == built.passages[0].text
    (index_dir / "MANIFEST.json").unlink()  # unverified: refused, never re-recorded
    with pytest.raises(RetrievalIndexError, match="has no MANIFEST.json"):
        DenseRetriever.load(index_dir)


def test_jsonl_corpus_and_its_errors(tmp_path):
    good = tmp_path / "c.jsonl"
    rows = [json.dumps({"id": "a", "title": "A", "text": "alpha"}), "", json.dumps({"text": "beta"})]
    good.write_text("\n".join(rows) + "\n")
    docs = read_documents(good)
    assert [d["id"] for d in docs] == ["a", "c:3"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "ok"}) + "\n{not json\n")
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: invalid JSON"):
        read_documents(bad)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(CorpusError, match=r'wrong.jsonl:1: .*"text"'):
        read_documents(wrong)


def test_bad_corpus_inputs_get_clear_errors(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        read_documents(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no .txt, .md or .jsonl files"):
        read_documents(tmp_path / "empty")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("   \n")
    with pytest.raises(CorpusError, match="is empty"):
        read_documents(tmp_path / "blank")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin.txt: not UTF-8 .*byte 0xe9 at byte offset 3"):
        read_documents(latin)
    (tmp_path / "x.pdf").write_text("x")
    with pytest.raises(CorpusError, match="unsupported corpus file type"):
        read_documents(tmp_path / "x.pdf")


def lines_run(function, *args):
    """`function(*args)` and how many of its source lines ran: a count of the work it did, the same on every run."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += event == "line"
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = function(*args)
    finally:
        sys.settrace(previous)
    return result, count


def test_five_megabyte_document_is_chunked_linearly():
    # A single 5 MB document with no paragraph breaks: LlamaIndex's punkt-based splitter times out here.
    def document(sentences: int) -> str:
        return " ".join(f"Sentence {i} talks about topic {i % 97}." for i in range(sentences))

    text = document(170_000)
    assert len(text) > 5_000_000
    chunks, steps = lines_run(chunk_text, text, 160, 24)
    # Linear work: twice the document takes twice the steps (5% slack for the windows' rounding; quadratic work
    # would take four times), and the chunks hold each word at most 160 / (160 - 24) times over (the overlap).
    _, half_steps = lines_run(chunk_text, document(85_000), 160, 24)
    assert steps <= 2.05 * half_steps
    words = len(text.split())
    assert sum(len(c.split()) for c in chunks) <= words * 160 / (160 - 24) + 160
    assert all(len(c.split()) <= 160 for c in chunks)
    assert chunks[0].split()[-24:] == chunks[1].split()[:24]  # overlap kept
    assert chunks[-1].split()[-1] == text.split()[-1]  # nothing lost at the end


def test_search_rejects_bad_arguments(default_retriever):
    with pytest.raises(ValueError, match="query is empty"):
        default_retriever.search(" ")
    with pytest.raises(ValueError, match="top_k=0"):
        default_retriever.search("x", top_k=0)


def test_interrupted_build_resumes_from_saved_shards(tmp_path, monkeypatch):
    import numpy as np

    from midlens.retrievers import dense

    corpus = tmp_path / "many.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "text": f"Fact number {i} about item {i * 7}."}) + "\n" for i in range(300))
    )
    real_embed = dense.embed
    calls = []

    def interrupted(texts, show_progress=False):
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user hits Ctrl-C during the second shard
        return real_embed(texts)

    monkeypatch.setattr(dense, "embed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        DenseRetriever.build(corpus, index_dir=tmp_path / "idx")
    assert not (tmp_path / "idx").exists()  # no half-written index
    calls.clear()
    monkeypatch.setattr(
        dense, "embed", lambda texts, show_progress=False: calls.append(len(texts)) or real_embed(texts)
    )
    resumed = DenseRetriever.build(corpus, index_dir=tmp_path / "idx")
    assert calls == [128, 44]  # the first shard came from disk
    fresh = real_embed([f"\n{p.text}".strip() for p in resumed.passages])
    stored = resumed.index.reconstruct_n(0, resumed.index.ntotal)
    assert np.allclose(stored, fresh, atol=1e-5)


def test_two_builds_of_one_index_at_once_embed_it_once(tmp_path, monkeypatch):
    # Two eval shards started together once built the same index side by side, and the first to finish removed
    # the shard folder the second was writing into (FileNotFoundError deep inside numpy). Threads stand in for
    # the processes: the lock is an flock on a file, which two open files in one process contend for as well.
    import threading

    from midlens.retrievers import dense

    corpus = tmp_path / "many.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "text": f"Fact number {i} about item {i * 7}."}) + "\n" for i in range(300))
    )
    real_embed = dense.embed
    real_embed(["load the embedder once, before the race"])
    calls = []
    # The overlap is made, not waited for: the first build's first embedding waits until the second build has
    # reached the lock, so the two builds always overlap (no sleep, whatever the machine's speed).
    real_lock = dense.build_lock
    both_at_lock = threading.Barrier(2, timeout=60)
    arrived = []

    def lock_after_arriving(path):
        arrived.append(threading.get_ident())
        if len(arrived) == 2:
            both_at_lock.wait()
        return real_lock(path)

    def slow_embed(texts, show_progress=False):
        if not calls:
            both_at_lock.wait()
        calls.append(len(texts))
        return real_embed(texts)

    monkeypatch.setattr(dense, "build_lock", lock_after_arriving)
    monkeypatch.setattr(dense, "embed", slow_embed)
    results, errors = [], []

    def build():
        try:
            results.append(DenseRetriever.build(corpus, index_dir=tmp_path / "idx"))
        except Exception as err:  # noqa: BLE001 - the assertion below reports it
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == 2
    assert calls == [128, 128, 44]  # one build embedded the corpus; the other waited and loaded it
    assert results[0].meta["fingerprint"] == results[1].meta["fingerprint"]
    assert (
        results[1].search("Fact number 5 about item 35", top_k=1)[0].id
        == results[0].search("Fact number 5 about item 35", top_k=1)[0].id
    )
    assert not [p.name for p in tmp_path.iterdir() if ".embeddings-" in p.name]


def test_stale_build_folders_are_swept_and_resumable_shards_kept(small_corpus, tmp_path, monkeypatch):
    from midlens.core.files import OWNER, indexes_dir, make_temp_dir

    monkeypatch.setenv("MIDLENS_CACHE", str(tmp_path / "cache"))
    parent = indexes_dir()
    dead = make_temp_dir(parent, ".0123abcd.tmp-")
    dead_owner(dead)
    old = parent / ".0123abcd.old-4242"  # a swap interrupted an hour ago (no owner record)
    old.mkdir()
    age(old, 7200)
    live = make_temp_dir(parent, ".4567ef.tmp-")  # another build, still running in this process
    shards = parent / ".0123abcd.embeddings-0123abcd0123"  # an interrupted build's progress: kept to resume
    shards.mkdir()
    age(shards, 7200)
    abandoned = parent / ".89ab.embeddings-89ab89ab89ab"  # nobody came back for it in a week
    abandoned.mkdir()
    age(abandoned, 8 * 24 * 3600)
    retriever = DenseRetriever.build(small_corpus)
    assert not dead.exists() and not old.exists() and not abandoned.exists()
    assert live.exists() and shards.exists()
    folder = parent / retriever.meta["fingerprint"][:20]
    assert sorted(p.name for p in parent.iterdir() if not p.name.startswith(".")) == [folder.name]
    assert not (folder / OWNER).exists()  # the owner record stays with the temp folder
    assert json.loads((folder / "meta.json").read_text())["source"] == str(small_corpus.resolve())


def test_a_chosen_index_folder_sweeps_only_its_own_leftovers(small_corpus, tmp_path):
    from midlens.core.files import make_temp_dir

    mine = make_temp_dir(tmp_path, ".index.tmp-")
    dead_owner(mine)
    theirs = tmp_path / ".cache.tmp-notours"  # the user's own hidden folder next to the index
    theirs.mkdir()
    age(theirs, 7200)
    DenseRetriever.build(small_corpus, index_dir=tmp_path / "index")
    assert not mine.exists() and theirs.exists()


# Hybrid retrieval (retrievers.hybrid): real MiniLM + faiss + bm25s.


@pytest.fixture(scope="module")
def hybrid(default_retriever):
    from midlens.retrievers.hybrid import HybridRetriever

    return HybridRetriever(default_retriever)


def test_hybrid_brings_back_an_exact_name_the_embedder_ranks_low(default_retriever, hybrid):
    # A rare name plus generic words: MiniLM matches the generic meaning ("American film director": dozens of
    # paragraphs; the target is 18th here), BM25 the name, which only one paragraph (Gail Hopkins) contains.
    query = "Pepperdine American film director"
    target = {p.id for p in default_retriever.passages if "Pepperdine" in p.text}
    assert len(target) == 1, "the embedded corpus should hold one paragraph naming Pepperdine"
    dense_rank = next(
        r for r, (i, _) in enumerate(default_retriever.ranked(query, 400)) if default_retriever.passages[i].id in target
    )
    hits = hybrid.search(query, top_k=3)
    assert dense_rank >= 5, f"the dense ranker alone now finds it (rank {dense_rank}): pick a harder query"
    assert hits[0].id in target, f"dense rank {dense_rank}; hybrid top 3: {[h.title for h in hits]}"
    # RRF scores: sorted, and bounded by a passage first in both rankings (2 / 61).
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert 0 < hits[-1].score <= hits[0].score <= 2 / 61 + 1e-12


def test_hybrid_without_a_lexical_match_keeps_the_dense_order(default_retriever, hybrid):
    query = "the of and a to in"  # stop words only: BM25 scores every passage 0 and must not rank them
    assert [h.id for h in hybrid.search(query, 8)] == [p.id for p in default_retriever.search(query, 8)]


def test_hybrid_and_retrieval_names_reject_bad_arguments(hybrid):
    from midlens.core.errors import InvalidArgumentError
    from midlens.retrievers.build import build_retriever

    with pytest.raises(InvalidArgumentError, match="query is empty"):
        hybrid.search("  ")
    with pytest.raises(InvalidArgumentError, match="top_k=0"):
        hybrid.search("x", top_k=0)
    with pytest.raises(
        InvalidArgumentError, match=r"retrieval=.sparse.: expected one of dense, hybrid, dense\+links, hybrid\+links"
    ):
        build_retriever("unused", "sparse")
    assert len(hybrid.search("Wings of Desire", top_k=10_000)) == len(hybrid)  # capped at the corpus, with a warning


def test_both_retrievers_answer_the_protocol_the_pipeline_types(default_retriever, hybrid):
    from midlens.retrievers.base import Retriever

    for retriever in (default_retriever, hybrid):
        assert isinstance(retriever, Retriever)
        assert len(retriever) == len(default_retriever.passages) and retriever.meta["fingerprint"]
    assert not isinstance(object(), Retriever)


# Link expansion (retrievers.links): the same real index, titles followed from the top 2 passages.


@pytest.fixture(scope="module")
def linked(default_retriever):
    from midlens.retrievers.links import LinkedRetriever

    return LinkedRetriever(default_retriever)


def test_links_bring_in_the_second_hop_the_question_does_not_name(default_retriever, linked):
    # Two hops: the show's paragraph names its models; the asked-for model's own paragraph shares no rare word with
    # the question, so the embedder ranks it outside the top 5. The show's 2009 paragraph mentions her by title.
    question = "The Victoria's Secret Fashion Show features what fashion model who was born in 1988?"
    dense = [p.title for p in default_retriever.search(question, 5)]
    hits = linked.search(question, 5)
    assert "Candice Swanepoel" not in dense, f"the dense top 5 now finds her ({dense}): pick a harder question"
    found = next(h for h in hits if h.title == "Candice Swanepoel")
    assert found.metadata["linked_from"] in [h.title for h in hits[:2]]
    # The seeds are the dense ranker's own top 2; everything else keeps its dense score and the list has no repeats.
    assert [h.id for h in hits[:2]] == [p.id for p in default_retriever.search(question, 2)]
    assert len({h.id for h in hits}) == 5 and all(h.score is not None for h in hits)


def test_link_mentions_are_whole_words_longest_first_and_skip_the_seeds_own_title(linked):
    # "Khan Kluay" and "Khan Kluay 2" are both titles in the embedded corpus; "Whitewater Canal" is one too.
    text = "Khan Kluay 2 was released after the first film. Whitewater Canalside is not a link, nor is khan-kluays."
    titles = [" ".join(t) for t in linked.mentioned(text)]
    assert titles == ["khan kluay 2"], titles  # the longest title wins; no partial words
    # A name is read whole (no "Whitewater Canal" inside the tunnel's name) and starts with a capital: the
    # lower-case "khan kluay" is running text, not a link. Case and punctuation inside a name do not matter.
    text = "The CINCINNATI and Whitewater-Canal Tunnel opened; the khan kluay sequel."
    assert [" ".join(t) for t in linked.mentioned(text)] == ["cincinnati and whitewater canal tunnel"]
    # A paragraph names its own subject; following that would just repeat the seed.
    for hit in linked.search("Who directed Wings of Desire?", 5):
        assert hit.metadata.get("linked_from") != hit.title


def test_links_wrap_hybrid_and_answer_the_protocol(default_retriever, hybrid):
    from midlens.retrievers.base import RankingRetriever, Retriever
    from midlens.retrievers.build import build_retriever
    from midlens.retrievers.corpus import default_corpus_path
    from midlens.retrievers.links import LinkedRetriever

    built = build_retriever(default_corpus_path(), "hybrid+links")
    assert isinstance(built, LinkedRetriever) and isinstance(built, Retriever)
    assert isinstance(default_retriever, RankingRetriever) and isinstance(hybrid, RankingRetriever)  # what it wraps
    assert built.meta["retrieval"] == "hybrid+links" and len(built) == len(default_retriever)
    question = "Which canal was built between 1836 and 1847, Washington City Canal or Whitewater Canal?"
    assert [h.id for h in built.search(question, 5)[:2]] == [p.id for p in hybrid.search(question, 2)]  # the seeds
    assert len(built.search(question, 10_000)) == len(default_retriever)  # capped at the corpus, like the others


def test_links_in_a_folder_corpus_follow_file_names_and_change_nothing_without_mentions(small_corpus, tmp_path):
    from midlens.retrievers.links import LinkedRetriever

    # Folder documents are titled by file name, so a note that names another note's file links to it.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Etna.txt").write_text(
        "Etna is the volcano on Sicily whose slopes were first mapped by Giuseppe Recupero."
    )
    (notes / "Giuseppe Recupero.txt").write_text("He was an eighteenth-century geologist, born in Catania.")
    (notes / "Vesuvius.txt").write_text("Vesuvius is the volcano above Naples that buried Pompeii in 79 AD.")
    (notes / "Stromboli.txt").write_text(
        "Stromboli is a volcanic island north of Sicily that erupts every few minutes."
    )
    linked = LinkedRetriever(DenseRetriever.build(notes, index_dir=tmp_path / "notes-index"))
    hits = linked.search("Which volcano on Sicily was mapped, and by whom?", 2)
    assert [h.title for h in hits] == ["Etna", "Giuseppe Recupero"], [h.title for h in hits]
    assert hits[1].metadata["linked_from"] == "Etna"
    assert [h.title for h in linked.search("Which volcano on Sicily was mapped, and by whom?", 1)] == ["Etna"]
    # A long named document is chunked; one chunk, its best-ranked, comes in by the link, not the whole document.
    filler = " ".join(f"In year {1700 + i} he surveyed lava flow number {i} on the island." for i in range(40))
    (notes / "Giuseppe Recupero.txt").write_text("He was an eighteenth-century geologist, born in Catania. " + filler)
    linked = LinkedRetriever(DenseRetriever.build(notes, index_dir=tmp_path / "notes-index"))
    chunks = sum(p.title == "Giuseppe Recupero" for p in linked.passages)
    hits = linked.search("Which volcano on Sicily was mapped, and by whom?", 4)
    assert chunks >= 3 and [h.title for h in hits if h.metadata.get("linked_from")] == ["Giuseppe Recupero"]
    # The three-file corpus mentions no file name: the dense ranking comes back unchanged, scores included.
    dense = DenseRetriever.build(small_corpus, index_dir=tmp_path / "index")
    for query in ("largest animal", "volcano in Sicily", "fast trains"):
        assert [(h.id, h.score) for h in LinkedRetriever(dense).search(query, 3)] == [
            (p.id, p.score) for p in dense.search(query, 3)
        ]
