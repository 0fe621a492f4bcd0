"""LlamaIndex components over the midlens Generator (llama-index-core 0.14).

    MidlensLLM          a CustomLLM: complete / stream_complete / chat / acomplete; evidence in additional_kwargs
    AttentionReranker   a BaseNodePostprocessor: nodes scored by the attention the model gives them in one stacked pass
    MidlensQueryEngine  a CustomQueryEngine: LlamaIndex retrieval -> the LLM's Pipeline; source_nodes carry evidence,
                        metadata["midlens"]["citations"] what each answer sentence cites
    MidlensCitationQueryEngine  CitationQueryEngine's output ("Source n:" nodes, [n] markers), markers from attention
    MidlensRetriever    a BaseRetriever over the repo's own retriever (dense, hybrid, +links)
    MidlensEvaluator    a BaseEvaluator: any LLM's response cited against its contexts, each citation verified
    CheckedQueryEngine  wraps any query engine: its Response's sentences cited ([n], CitationBlocks) and checked

Every class is a shell: passages are stacked and answered by `Pipeline.answer/answer_stream` (MidlensLLM.pipeline,
which MidlensQueryEngine answers through) and scored by `Generator.score_batch` (AttentionReranker), so prompting,
evidence and calibration have one implementation, the one the CLI uses.

    index = VectorStoreIndex(nodes, storage_context=..., embed_model=...)
    engine = MidlensQueryEngine.from_index(index, method="ms-poe")
    response = engine.query("Who directed Wings of Desire?")
    for source in response.source_nodes: print(source.score, response.metadata[source.node_id])
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from midlens.core.lazy import lazy_attributes

# Before llama_index (or anything that imports huggingface_hub) loads: the models here are local files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# name -> the module that defines it. Loaded on first use: `from llama_index.llms.midlens import MidlensLLM`
# must not pay for the reranker's or the engines' imports (torch among them).
_LAZY = {
    "AttentionReranker": "midlens.rag.llamaindex.reranker",
    "CheckedQueryEngine": "midlens.rag.llamaindex.checked_engine",
    "MidlensCitationQueryEngine": "midlens.rag.llamaindex.citation_engine",
    "MidlensEvaluator": "midlens.rag.llamaindex.evaluator",
    "MidlensLLM": "midlens.rag.llamaindex.llm",
    "MidlensQueryEngine": "midlens.rag.llamaindex.query_engine",
    "MidlensRetriever": "midlens.rag.llamaindex.retriever",
    "citation_rows": "midlens.rag.llamaindex.citations",
    "evidence_rows": "midlens.rag.llamaindex.common",
    "to_passage": "midlens.rag.llamaindex.common",
}

__all__ = [
    "AttentionReranker",
    "CheckedQueryEngine",
    "MidlensCitationQueryEngine",
    "MidlensEvaluator",
    "MidlensLLM",
    "MidlensQueryEngine",
    "MidlensRetriever",
    "citation_rows",
    "evidence_rows",
    "to_passage",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from midlens.rag.llamaindex.checked_engine import CheckedQueryEngine
    from midlens.rag.llamaindex.citation_engine import MidlensCitationQueryEngine
    from midlens.rag.llamaindex.citations import citation_rows
    from midlens.rag.llamaindex.common import evidence_rows, to_passage
    from midlens.rag.llamaindex.evaluator import MidlensEvaluator
    from midlens.rag.llamaindex.llm import MidlensLLM
    from midlens.rag.llamaindex.query_engine import MidlensQueryEngine
    from midlens.rag.llamaindex.reranker import AttentionReranker
    from midlens.rag.llamaindex.retriever import MidlensRetriever


__getattr__, __dir__ = lazy_attributes("midlens.rag.llamaindex", _LAZY, globals())
