"""bf16 on the CPU: `dtype="auto"` follows what torch reports of the processor, and SmolLM2 in bf16 answers the
planted-fact prompts as fp32 does.

Tolerances: bf16 keeps 8 bits of mantissa (relative rounding ~4e-3 per operation), so logits and evidence differ
from fp32's by about 1e-2 relative after 30 layers; what is asserted is what a user reads: the same greedy answer
on prompts where the fact is planted (the margin between the top tokens there is large), the gold passage ranked
first by evidence in both, and passage evidence within 0.02 absolute of fp32's (shares of attention in [0, 1],
here ~0.02-0.08; measured differences ~5e-4, so the bound catches a broken bf16 path, not rounding;
docs/results/cpu-bf16/ measures the same on 100-question sweeps).
"""

from __future__ import annotations

import pytest
import torch

from midlens.core.device import cpu_runs_bf16, resolve_dtype
from midlens.core.errors import DeviceError
from tests.conftest import planted_passages

EVIDENCE_TOL = 0.02


def test_auto_is_bf16_exactly_where_the_cpu_runs_it_natively(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32  # the suite's pin (conftest)
    monkeypatch.delenv("MIDLENS_CPU_DTYPE")
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if cpu_runs_bf16() else torch.float32)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not cpu_runs_bf16() and resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("float32", cpu) == torch.float32  # always available
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setenv("MIDLENS_CPU_DTYPE", "fp32")  # the override, in any spelling resolve_dtype takes
    assert resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setenv("MIDLENS_CPU_DTYPE", "int4")
    with pytest.raises(DeviceError, match="MIDLENS_CPU_DTYPE='int4': set it to float32 or bfloat16"):
        resolve_dtype("auto", cpu)


def test_smollm2_in_bf16_answers_as_in_fp32(generator):
    """One planted prompt, the fact mid-stack: a guard that the bf16 path answers and reads evidence as fp32 does
    (the parity itself is measured over 800 sweep rows, docs/results/cpu-bf16/)."""
    gold_at = 4
    from midlens.generators import Generator, load_model

    bf16 = Generator(load_model("smollm2-135m", "cpu", "bfloat16"), method="baseline")
    question = "What is the secret code word of the Zorbland expedition?"
    answers = []
    for gen in (generator, bf16):
        prompt = gen.prompt(question, planted_passages(8, gold_at), style="short")
        answers.append(gen.generate(prompt, max_new_tokens=16, stop_at_line_end=True))
    fp32, low = answers
    assert generator.loaded.dtype == torch.float32 and bf16.loaded.dtype == torch.bfloat16
    assert low.text == fp32.text
    assert low.ranked()[0].passage.id == fp32.ranked()[0].passage.id == "gold"
    diff = max(abs(a.evidence - b.evidence) for a, b in zip(fp32.passages, low.passages, strict=True))
    assert diff < EVIDENCE_TOL
