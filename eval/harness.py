"""midlens as a model back-end of EleutherAI's lm-evaluation-harness: `--model midlens`.

    pip install "midlens[lm-eval]"
    midlens-lm-eval --model midlens --model_args model=smollm2-135m,method=attn-calibration --tasks midlens_mdqa

The harness (0.4.13) finds model back-ends in its own registry only, so `midlens-lm-eval` registers this one and
runs the harness's own command line with the arguments given (and midlens's task folder on `--include_path`);
`import midlens.eval.harness` does the same for `lm_eval.simple_evaluate(model="midlens", ...)`.

Requests run through the batched Generator under any method:
- `generate_until`: greedy (or sampled, as the request asks), the text as generated up to the first `until` string
  after any leading whitespace; a context written as midlens's own RAG prompt (an instruction, "Document [i](Title:
  t) ..." lines, the question: what the `midlens_mdqa` task writes) is read back into its passages and stacked as
  `midlens ask` and the position sweeps stack them (the model's chat template around them), so the harness
  reproduces a sweep's answers; any other context is fed as plain text after the tokenizer's BOS.
- `loglikelihood`: the continuation's tokens scored teacher-forced on the context's cache (the log-probabilities
  a sweep records as `logprob`), and whether greedy decoding would have produced them.
- `loglikelihood_rolling`: the text's tokens scored in disjoint windows of the context window
  (lm_eval.utils.get_rolling_token_windows), each after the end-of-text token.
Contexts and continuations are tokenised apart (a harness's HF back-end splits one joint encoding), so a
word-piece merging across the boundary scores as two pieces here.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (the harness's own back-ends, lazily: see below)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from midlens.core.errors import InvalidArgumentError
from midlens.generators.answering.detokenize import cut_at_stop
from midlens.generators.answering.generator import Generator
from midlens.generators.models.packaged_models import DEFAULT_MODEL
from midlens.generators.models.prompt import StackedPrompt, ids_prompt, read_user_content, text_prompt
from midlens.rag.answering import Answering
from midlens.rag.options import AnswerOptions

# The harness fills its registry with its own back-ends only when the registry is empty at the first look-up, so
# registering midlens first would hide them (`--model hf` unknown): lm_eval.models is imported above, before the
# registration, and its back-ends register lazily (module paths, nothing heavy is imported).
logger = logging.getLogger(__name__)
TASKS = Path(__file__).parent / "harness_tasks"  # midlens_mdqa.yaml and its utils.py


@register_model("midlens")
class MidlensLM(LM):
    """The harness's LM interface over a midlens Generator (citations off: the harness reads text and numbers)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        method: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int | str = 1,
        max_length: int | None = None,
        **unused: Any,
    ) -> None:
        """`model`: a registry name or model folder; `method`: a method spec (None: the model's measured default);
        `max_length`: the context kept (default: the model's window). `device` is the harness's `--device`, whose
        default (cuda:0) on a machine without CUDA means the CPU here, with a warning. The harness's other keys it
        passes to every back-end (`max_batch_size`, ...) are accepted and left unused."""
        super().__init__()
        import torch

        if device.startswith("cuda") and not torch.cuda.is_available():
            logger.warning("midlens: --device %s, and this machine has no CUDA device: running on the CPU.", device)
            device = "cpu"
        self.generator = Generator(model, method=method, device=device, dtype=dtype, citations=None)
        self.answering = Answering(self.generator)
        self.batch_size = 1 if batch_size in (None, "auto") else int(str(batch_size).split(":")[0])
        self.max_length = max_length or self.generator.context_window

    @property
    def tokenizer(self):
        return self.generator.tokenizer

    @property
    def eot_token_id(self) -> int:
        tok = self.tokenizer
        return tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.generator.loaded.name

    def prompt_of(self, context: str, room: int) -> StackedPrompt:
        """The prompt for a context, leaving `room` tokens: midlens's RAG prompt read back and stacked again, or the
        text as it is."""
        read = read_user_content(context)
        if read is None:
            return text_prompt(self.tokenizer, context, self.max_length - room)
        style, passages, question = read
        return self.generator.prompt(question, passages, max_new_tokens=room, style=style)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(_decoding_key(request.args[1]), []).append(i)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="midlens generate_until")
        for (until, max_new, temperature, top_p), rows in groups.items():
            prompts = [self.prompt_of(requests[i].args[0], max_new) for i in rows]
            # The one answer path, as every interface answers: greedy or sampled as the harness asks, the prompts
            # in the order stacked (no restack), text and numbers only (no calibration, no verification).
            options = AnswerOptions(
                max_new_tokens=max_new,
                temperature=temperature,
                top_p=top_p,
                calibrate=False,
                stop_at_line_end="\n" in until,
                restack=None,
            )
            answers = self.answering.answer(prompts, options, self.batch_size, on_batch=bar.update)
            for i, answer in zip(rows, answers, strict=True):
                out[i] = cut_at_stop(self.tokenizer.decode(answer.answer_ids, skip_special_tokens=True), until)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        bar.close()
        return out

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for request in requests:
            context, continuation = request.args
            ids = self.tokenizer(continuation, add_special_tokens=False)["input_ids"]
            if not ids:
                raise InvalidArgumentError(f"an empty continuation to score after {context[-60:]!r}.")
            pairs.append((self.prompt_of(context, len(ids)), ids))
        results = list(self._scored(pairs, disable_tqdm, "midlens loglikelihood"))
        for request, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for (text,) in (r.args for r in tqdm(requests, disable=disable_tqdm, desc="midlens loglikelihood_rolling")):
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(ids, self.eot_token_id, self.max_length - 1, context_len=1)
            ]
            pairs = [(ids_prompt(context), continuation) for context, continuation in windows]
            totals.append(sum(lp for lp, _ in self._scored(pairs, True, "")))
        return totals

    def _scored(
        self, pairs: list[tuple[StackedPrompt, list[int]]], disable_tqdm: bool, desc: str
    ) -> Iterator[tuple[float, bool]]:
        """(log p(continuation | prompt), whether greedy decoding gives the continuation) per pair: one greedy pass
        as long as the continuation, teacher-forced log-probabilities read on the same cache."""
        for prompt, ids in tqdm(pairs, disable=disable_tqdm, desc=desc):
            answer = self.generator.generate(
                prompt, max_new_tokens=len(ids), reference=ids, calibrate=False, ignore_eos=True
            )
            yield float(sum(answer.reference_token_logprobs)), answer.answer_ids == list(ids)


def _decoding_key(gen_kwargs: dict) -> tuple[tuple[str, ...], int, float, float]:
    """What a batch of requests shares: stop strings, answer length, temperature, top-p (greedy unless sampled)."""
    kwargs = dict(gen_kwargs or {})
    until = kwargs.get("until") or ()
    until = (until,) if isinstance(until, str) else tuple(until)
    sampled = bool(kwargs.get("do_sample", False))
    temperature = float(kwargs.get("temperature", 1.0 if sampled else 0.0)) if sampled else 0.0
    return until, int(kwargs.get("max_gen_toks", 256)), temperature, float(kwargs.get("top_p", 1.0) or 1.0)


def main(argv: list[str] | None = None) -> None:
    """`midlens-lm-eval ARGS`: the harness's command line, with `--model midlens` registered and midlens's tasks
    (midlens_mdqa) on the include path."""
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args:
        args += ["--include_path", str(TASKS)]
    sys.argv = ["lm_eval", *args]
    cli_evaluate()
