"""Names every layer shares that must not cost an import: `midlens --help` reads them while building its parser."""

# The packaged model that answers by default: ask, the demo, the LlamaIndex classes, Pipeline and Generator
# (registry entries in generators.models, which loads torch). Qwen2.5-0.5B answers more questions right end to
# end (docs/results/answer-path/: 33.3 vs 20.0 % EM on a train-split tuning copy of the e2e set, 30.0 vs 25.0 %
# on the 40 embedded questions).
DEFAULT_MODEL = "qwen2.5-0.5b"
# The model the research commands default to (eval, bench, training): 4x faster on a CPU, the one every shipped
# trained artefact (MuDAF delta, MoICE routers) was trained for, and the one the documented
# measurements ran on.
EVAL_MODEL = "smollm2-135m"

# The prompt instructions by name (their texts: generators.prompt.STYLES) and the default one.
PROMPT_STYLES = ("litm", "short")
DEFAULT_PROMPT_STYLE = "litm"

# Passages stacked into the prompt when answering (ask, Pipeline, the LlamaIndex engine, eval e2e). Top 3 was
# tried for Qwen2.5-0.5B (docs/results/answer-path/): on a train-split tuning copy of the e2e set 38.3 % EM
# against 33.3 % with the top 5 (paired +5.0 [-3.3, +15.0]), on the 40 embedded questions 22.5 against 30.0.
# Neither difference is outside noise, so the default stays 5, which retrieves more gold paragraphs
# (75.0 vs 67.5 % on the 40 questions). The demo has its own default, also 5, so a gold passage can sit mid-prompt.
DEFAULT_TOP_K = 5

# The longest answer, in tokens, wherever an answer is generated for a user (ask, Pipeline, Generator, the
# LlamaIndex LLM, the demo) and in `eval e2e`, so the measured end-to-end numbers are those of `ask`. Small models
# often restate the question before answering; 16-24 tokens cut many right answers off (docs/results/answer-path/).
DEFAULT_MAX_NEW_TOKENS = 48

# How passages are retrieved (retrievers.build.build_retriever) and the default. Following the titles the top 2
# passages mention (retrievers.links) was the first answer-path change whose EM gain on the train-split tuning copy
# excluded zero: +10.0 points [+1.7, +20.0] for Qwen2.5-0.5B at top 5 (docs/results/answer-path/, fifth round).
RETRIEVALS = ("dense", "hybrid", "dense+links", "hybrid+links")
DEFAULT_RETRIEVAL = "dense+links"

# The built-in methods (generators.registry registers one entry per name, in this order; that module loads torch),
# and the orderings the position sweep runs on the baseline generator (eval.sweep).
METHODS = ("baseline", "ms-poe", "mudaf", "moice", "attn-calibration")
ORDERINGS = ("lcr", "attn-sort")
