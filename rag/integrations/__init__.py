"""LlamaIndex's conventional import paths for midlens' classes, as thin re-exports (no code of their own), each class
at its package's `base.py` as in LlamaIndex's integration packages; importing them loads no torch.

pyproject.toml maps these folders to the namespace packages LlamaIndex integrations use, so that
    from llama_index.llms.midlens import MidlensLLM
    from llama_index.postprocessor.midlens_rerank import AttentionReranker
work after `pip install midlens`, like any llama-index-llms-* / llama-index-postprocessor-* package.
"""
