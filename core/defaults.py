"""Names every layer shares that must not cost an import: `midlens --help` reads them while building its parser."""

from typing import Literal, get_args

# The packaged model that answers by default: ask, the demo, the LlamaIndex classes, Pipeline and Generator
# (registry entries in generators.models.packaged_models, which loads torch): Qwen2.5-Coder-0.5B-Instruct, the
# checkpoint its GGUF names. It answers more questions right end to end than SmolLM2 (docs/results/answer-path/).
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# Names that were used before and still work, with a deprecation note: old name -> current name.
MODEL_ALIASES = {"qwen2.5-0.5b": "qwen2.5-coder-0.5b"}
# The model the research commands default to (eval, bench, training): 4x faster on a CPU and the one most
# documented measurements ran on. Trained artefacts (MuDAF delta, MoICE routers) ship for all three packaged models.
EVAL_MODEL = "smollm2-135m"
# The model that reads an answer written elsewhere (`midlens check`, Pipeline-less checks, the LlamaIndex evaluator
# and checked engine): SmolLM2-135M, the reader the checked support model's AUROC was measured with
# (docs/results/check/), 4x faster than Qwen on a CPU. A server or a pipeline checks with its own model.
CHECK_MODEL = "smollm2-135m"

# What a model does where the user names no method, chosen by measurement for each packaged model; any other model
# (a folder) gets the fallback, which needs no trained artefact.
# Answering (ask, the demo, Pipeline, Generator, the LlamaIndex LLM and engines, the server): the candidate that passes
# eval/report/default_rule.py's rule judged AS SHIPPED (litm instruction, 48 new tokens, the first line read; above
# the plain model on HotpotQA, SQuAD and NQ-open at n = 200, gold at 1/5/10; docs/results/as-shipped/). None passes
# yet, so every model answers with the baseline. The fine-tune (`finetuned`) had been chosen on sweeps under the
# `short` instruction, against a baseline handicapped by it (docs/results/qwen2.5-coder-0.5b/short-answer/); under
# the instruction every interface uses it answers NQ-open right less often than the plain model
# (docs/results/as-shipped/README.md). It stays one `--method finetuned` away.
ANSWER_METHODS: dict[str, str] = {}
FALLBACK_ANSWER_METHOD = "baseline"
# Reranking (AttentionReranker): the method whose evidence ranks, and which score (raw "evidence" or "calibrated"),
# with the best recall@2 of `midlens eval rerank` on 200 held-out HotpotQA questions: MuDAF's raw evidence for both
# (qwen 0.843 against its baseline's 0.682 and dense 0.608; smollm2 0.713 against 0.625 and 0.615).
RERANKERS = {"qwen2.5-coder-0.5b": ("mudaf", "evidence"), "smollm2-135m": ("mudaf", "evidence")}
FALLBACK_RERANKER = ("baseline", "calibrated")


def answer_method_for(model: str) -> str:
    """The answering method `model` (a registry name, an old alias, or a folder) runs by default."""
    return ANSWER_METHODS.get(MODEL_ALIASES.get(model, model), FALLBACK_ANSWER_METHOD)


def reranker_for(model: str) -> tuple[str, str]:
    """(method, score) AttentionReranker ranks `model`'s nodes by by default."""
    return RERANKERS.get(MODEL_ALIASES.get(model, model), FALLBACK_RERANKER)


# The prompt instructions by name (their texts: generators.models.prompt.STYLES) and the default one.
PromptStyle = Literal["litm", "short"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)
DEFAULT_PROMPT_STYLE = "litm"
# What happens to passages that overflow the context window: refused (naming what to change), or the last ones left
# out (listed in Answer.dropped).
Truncate = Literal["error", "drop_last"]
TRUNCATE_MODES: tuple[str, ...] = get_args(Truncate)

# Passages stacked into the prompt when answering (ask, Pipeline, the LlamaIndex engine, eval e2e): top 3 was no
# better and retrieves fewer gold paragraphs (docs/results/answer-path/). The demo's own default is also 5.
DEFAULT_TOP_K = 5

# The longest answer, in tokens, wherever an answer is generated for a user (ask, Pipeline, Generator, the
# LlamaIndex LLM, the demo) and in `eval e2e`, so the measured end-to-end numbers are those of `ask`. Small models
# often restate the question before answering; 16-24 tokens cut many right answers off (docs/results/answer-path/).
DEFAULT_MAX_NEW_TOKENS = 48

# The method whose evidence scores passages for restacking when none is named (generators.answering.restack; `ask
# --restack`, the demo's switch): MuDAF's evidence ranks the supporting paragraphs best of every ranker measured (R@2
# 0.713 on SmolLM2, 0.843 on the default model; docs/results/).
DEFAULT_RESTACK_SCORER = "mudaf"

# Whether a model's answers are restacked where the user does not say, per (model, canonical answering method spec):
# the restack that passes eval/report/default_rule.py's rule for that system, which for a restacked system also
# asks it to beat the method alone, judged outside the training data of its scorer and slot order (restacking costs
# a prefill). None passes today. SmolLM2's default restacked once by MuDAF's evidence did on both corpora pooled (EM
# +2.4 [+0.2, +4.7] over finetuned alone), but its scorer and its slot order were trained and measured on HotpotQA:
# on SQuAD alone it is EM +2.5 [-0.5, +5.5] (docs/results/restack/eval-smollm2-finetuned/,
# docs/results/out-of-domain/rule.txt). The default model's gains nothing (EM -0.5 [-4.8, +3.5] on HotpotQA, +0.0
# [-3.3, +3.3] on SQuAD; docs/results/restack/eval-qwen-finetuned/). Every model answers in the order retrieved.
MEASURED_RESTACKS: dict[tuple[str, str], str] = {}
# The value of every interface's `restack` option that means "what MEASURED_RESTACKS says for the model and method
# answering" (the default everywhere a user answers: ask, Pipeline, the demo, the LlamaIndex classes, the server).
# None (--no-restack, `restack: null`) answers in the order given; a method spec restacks by that method's evidence.
RESTACK_MEASURED = "measured"
# Where restacked passages go, strongest first into the slots a model reads best: "measured" reads the slot order a
# position sweep measured for the packaged model (generators/trained/slot-orders/; a folder has none), "first" puts
# the strongest passage in slot 1, the next in slot 2, ..., which needs no sweep and so runs on any model folder.
# Why first: the instruct models read slot 1 best of the slots measured (Qwen's measured order starts 1, 2;
# Liu et al. find primacy in every instruct model they test), and evidence ranks the gold passage first in most
# prompts, so a one-gold question puts its passage where reading is best without knowing the model.
# "read" reads the order from the prompt's own evidence, per prompt: the content-free pass (the question replaced by
# "N/A", the calibration every scoring pass runs) says how much attention each slot draws whatever it holds, the
# model's positional reading bias on this prompt (as Hsieh et al. 2024 measure it to calibrate it away); the strongest
# passage goes to the slot that draws most, the next to the next. No sweep and no extra pass, and it follows a model
# that reads its last slot best (SmolLM2's base measured order starts at 10), where "first" does not.
# "last" puts the strongest passage in the last slot, the one the question follows, then the one before: no sweep, no
# extra pass, and it is what attention sorting does (Peysakhovich & Lerer 2023 sort the most-attended document last).
# Why it is a candidate: both packaged base models' measured orders (HotpotQA's train split) start at slot 10 (SmolLM2
# 10, 9, 8, ...; Qwen 10, 7, 6, ...), the recency Liu et al. find when the question follows the documents.
SlotPolicy = Literal["measured", "first", "last", "read"]
SLOT_POLICIES: tuple[str, ...] = get_args(SlotPolicy)


def is_measured_restack(restack: object) -> bool:
    """Whether a restack option (None, "measured", a method spec, a Restack or a MethodConfig) is the "measured"
    word: a Restack or MethodConfig never equals it, whatever its own `==` makes of a string."""
    return isinstance(restack, str) and restack == RESTACK_MEASURED


def measured_restack_for(model: str, method_spec: str) -> str | None:
    """The scorer `model` (a registry name, an old alias, or a folder) restacks by when answering with
    `method_spec` (canonical) and no restack is named; None: it answers the passages in the order given."""
    return MEASURED_RESTACKS.get((MODEL_ALIASES.get(model, model), method_spec))


# How passages are retrieved (retrievers.build.build_retriever) and the default: following the titles the top 2
# passages mention (retrievers.links) gained on a train-split tuning copy (docs/results/answer-path/, fifth round).
RETRIEVALS = ("dense", "hybrid", "dense+links", "hybrid+links")
DEFAULT_RETRIEVAL = "dense+links"

# The built-in methods (generators.methods.registry registers one entry per name, in this order; that module loads
# torch), and the orderings the position sweep runs on the baseline generator (eval.sweep).
METHODS = (
    "baseline",
    "ms-poe",
    "mudaf",
    "moice",
    "attn-calibration",
    "attention-buckets",
    "channel-scaling",
    "rope-scaling",
    "pos2distill",
)
ORDERINGS = ("lcr", "attn-sort")
# Method specs under a name that says what they are (shorthand -> spec; options given with the shorthand win).
# "finetuned" is the shipped question-answering fine-tune: MuDAF's recipe with its contrastive term off (alpha=0),
# trained on HotpotQA's train split; the method that gains most on both corpora for the default model
# (docs/results/qwen2.5-coder-0.5b/). The spec it stands for keeps working and is what runs record.
METHOD_SHORTHANDS = {"finetuned": "mudaf(alpha=0)"}
