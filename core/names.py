"""Names every layer shares that must not cost an import: `midlens --help` reads them while building its parser."""

# The packaged model that answers by default: ask, the demo, the LlamaIndex classes, Pipeline and Generator
# (registry entries in generators.models, which loads torch). Qwen2.5-0.5B answers more questions right end to
# end (docs/results/answer-path/: 33.3 vs 20.0 % EM on a train-split tuning copy of the e2e set, 30.0 vs 25.0 %
# on the 40 embedded questions).
DEFAULT_MODEL = "qwen2.5-0.5b"
# The model the research commands default to (eval, bench, training): 4x faster on a CPU, the one every shipped
# artefact (MuDAF delta, MoICE routers, retrieval-head scores) was trained for, and the one the documented
# measurements ran on.
EVAL_MODEL = "smollm2-135m"

# The prompt instructions by name (their texts: generators.prompt.STYLES) and the default one.
PROMPT_STYLES = ("litm", "short")
DEFAULT_PROMPT_STYLE = "litm"

# How passages are retrieved (retrievers.hybrid.build_retriever) and the default.
RETRIEVALS = ("dense", "hybrid")
DEFAULT_RETRIEVAL = "dense"
