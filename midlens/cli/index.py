"""`midlens index`: build a retrieval index ahead of time, list the indexes, clear them.

midlens index build [--corpus PATH] [--index-type flat|ivf|hnsw]
midlens index info
midlens index clear
"""

from __future__ import annotations

import argparse

from midlens.cli.cache import clear_indexes, entries, human, index_line, print_leftovers
from midlens.core.files import folder_size, indexes_dir


def add_parser(sub) -> None:
    index = sub.add_parser("index", help="retrieval indexes: build one ahead of time, list, clear")
    actions = index.add_subparsers(dest="index_command", required=True)
    build = actions.add_parser("build", help="embed and index a corpus now, so the first question does not wait")
    build.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    build.add_argument("--index-type", default="flat", choices=["flat", "ivf", "hnsw"])
    build.set_defaults(func=run_build)
    info = actions.add_parser("info", help="list the retrieval indexes with their corpus, size and path")
    info.set_defaults(func=run_info)
    clear = actions.add_parser("clear", help="delete every retrieval index (rebuilt on next use)")
    clear.set_defaults(func=run_clear)


def run_build(args: argparse.Namespace) -> int:
    from midlens.retrievers.corpus import default_corpus_path
    from midlens.retrievers.dense import DenseRetriever

    corpus = args.corpus or default_corpus_path()
    retriever = DenseRetriever.build(corpus, index_type=args.index_type)
    folder = indexes_dir() / retriever.meta["fingerprint"][:20]
    print(
        f"index ready: {len(retriever)} passages from {corpus}, {args.index_type}, {human(folder_size(folder))}\n"
        f"  {folder}\n`midlens ask --corpus {corpus}` (same --index-type) reuses it."
    )
    return 0


def run_info(args: argparse.Namespace) -> int:
    indexes = entries(indexes_dir(), False)
    print(f"retrieval indexes in {indexes_dir()}: {len(indexes) or 'none built yet'}")
    for folder in indexes:
        print(index_line(folder, detail=True))
    print_leftovers(entries(indexes_dir(), True))
    return 0


def run_clear(args: argparse.Namespace) -> int:
    print(f"freed {human(clear_indexes())}")
    return 0
