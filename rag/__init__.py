"""midlens' spine: stacked prompts with spans, the offline model registry, evidence results, the pipeline.

Public entry points: `rag.pipeline.Pipeline`, `rag.prompt.Passage`, `rag.evidence.Answer` / `EvidenceConfig`.
"""
