"""Names every layer shares that must not cost an import: `midlens --help` reads them while building its parser."""

# The packaged model everything defaults to (registry entry in generators.models, which loads torch).
DEFAULT_MODEL = "smollm2-135m"

# The prompt instructions by name (their texts: generators.prompt.STYLES) and the default one.
PROMPT_STYLES = ("litm", "short")
DEFAULT_PROMPT_STYLE = "litm"

# How passages are retrieved (retrievers.hybrid.build_retriever) and the default.
RETRIEVALS = ("dense", "hybrid")
DEFAULT_RETRIEVAL = "dense"
