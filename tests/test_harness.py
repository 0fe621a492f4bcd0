"""midlens as an lm-evaluation-harness back-end (eval/harness.py): the harness's own command line runs the
midlens_mdqa task and reproduces a committed sweep's answers; loglikelihood requests equal a stock transformers
forward of the same tokens."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# A committed sweep: SmolLM2 baseline, HotpotQA eval split (n = 200, seed 0, K = 10, 60 words, short instruction,
# 16 tokens, stopped at the line end), fp32.
SWEEP = ROOT / "docs/results/smollm2-135m/short-answer/runs/hotpotqa/results.jsonl.gz"


def test_the_harness_cli_reproduces_a_committed_sweeps_answers(tmp_path):
    """`midlens-lm-eval --model midlens --tasks midlens_mdqa`, the harness's own runner, on the first questions of
    the committed sweep with the gold at position 5: every answer equals the sweep row's text (exact: same prompt,
    same greedy decoding in fp32), so EM does too."""
    limit, position = 2, 5
    args = [
        "--model", "midlens",
        "--model_args", "model=smollm2-135m,method=baseline,dtype=float32",
        "--device", "cpu",
        "--tasks", "midlens_mdqa",
        "--metadata", json.dumps({"position": position}),
        "--limit", str(limit),
        "--log_samples",
        "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    code = "import sys; from midlens.eval.harness import main; main(sys.argv[1:])"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|midlens_mdqa|" in out.stdout
    (samples,) = (tmp_path / "out").rglob("samples_midlens_mdqa_*.jsonl")
    got = [json.loads(line) for line in samples.read_text().splitlines()]
    rows = [json.loads(line) for line in gzip.open(SWEEP, "rt")]
    swept = {r["example"]: r for r in rows if r["method"] == "baseline" and r["position"] == position}
    assert len(got) == limit
    for sample in got:
        row = swept[sample["doc_id"]]
        assert sample["doc"]["id"] == row["example_id"]
        assert sample["filtered_resps"][0].strip() == row["prediction"]
        assert sample["em"] == row["em"]


@pytest.fixture(scope="module")
def harness_lm(loaded):
    from midlens.eval.harness import MidlensLM

    return MidlensLM(loaded, method="baseline", device="cpu")


def _stock_logprobs(loaded, ids: list[int], start: int) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= start, from the model's own forward (no method, no cache)."""
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(start, len(ids))]


def test_loglikelihood_equals_a_stock_forward_and_says_when_greedy(harness_lm, loaded):
    from lm_eval.api.instance import Instance

    tok = loaded.tokenizer
    context = "The capital of France is"
    greedy = harness_lm.generate_until(
        [Instance("generate_until", {}, (context, {"until": ["."], "max_gen_toks": 4}), 0)], disable_tqdm=True
    )[0]
    requests = [Instance("loglikelihood", {}, (context, c), i) for i, c in enumerate([greedy, " a small cheese"])]
    (lp_greedy, is_greedy), (lp_other, other_greedy) = harness_lm.loglikelihood(requests, disable_tqdm=True)
    assert is_greedy and not other_greedy
    for continuation, lp in ((greedy, lp_greedy), (" a small cheese", lp_other)):
        prefix = ([tok.bos_token_id] if tok("a")["input_ids"][:1] == [tok.bos_token_id] else []) + tok(
            context, add_special_tokens=False
        )["input_ids"]
        ids = prefix + tok(continuation, add_special_tokens=False)["input_ids"]
        # fp32, the same tokens: the cached decode path and one full forward differ by summation order only.
        assert lp == pytest.approx(sum(_stock_logprobs(loaded, ids, len(prefix))), abs=1e-3)


def test_loglikelihood_rolling_scores_every_token_after_end_of_text(harness_lm, loaded):
    from lm_eval.api.instance import Instance

    text = "Lost in the middle: how language models use long contexts."
    (total,) = harness_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    ids = [harness_lm.eot_token_id] + loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert total == pytest.approx(sum(_stock_logprobs(loaded, ids, 1)), abs=1e-3)


def test_registering_midlens_keeps_the_harness_own_back_ends():
    from lm_eval.api.registry import get_model

    import midlens.eval.harness  # noqa: F401

    assert get_model("midlens").__name__ == "MidlensLM"
    assert get_model("local-chat-completions").__name__ == "LocalChatCompletion"


def test_the_readme_harness_command_runs_as_written(tmp_path):
    """The README's `midlens-lm-eval` line, run by the installed console script on one question."""
    import shlex

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (line,) = [x for x in readme.splitlines() if x.startswith("midlens-lm-eval ")]
    args = shlex.split(line.split("#")[0])[1:] + ["--limit", "1", "--output_path", str(tmp_path / "out")]
    script = Path(sys.executable).parent / "midlens-lm-eval"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([str(script), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "|midlens_mdqa|" in out.stdout and "|em " in out.stdout
