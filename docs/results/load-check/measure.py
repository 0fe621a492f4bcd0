"""The load check (generators/models/transformers_parity.py) on real and random-weight models: what it measures, what it
costs.

    python docs/results/load-check/measure.py packaged      # smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b
    python docs/results/load-check/measure.py families      # every tiny family of tests/tiny.py
    python docs/results/load-check/measure.py 1b            # a Llama-3.2-1B shape with random weights
    python docs/results/load-check/measure.py injected      # a 1 % scale error in one layer: is it caught?
    python docs/results/load-check/measure.py table         # rows.jsonl -> table.md

Each row runs `load_check.measure` on a model loaded by transformers as `load_model` loads it (nothing is read
from or written to the load-check records), in float32 and in bfloat16, and appends to rows.jsonl (a model and
dtype already there is skipped, so a killed run resumes). `ratio` is midlens' distance from transformers' float32
logits over transformers' own bfloat16 distance from them, at the step the check reports.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from midlens.generators.attention import positional_attention as attention
from midlens.generators.models import transformers_parity as load_check
from midlens.generators.models.loading import check_attention
from midlens.generators.models.model_cache import resolve_model_dir
from midlens.generators.models.random_models import save_random_model

HERE = Path(__file__).parent
ROWS = HERE / "rows.jsonl"
DTYPES = ("float32", "bfloat16")
PACKAGED = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")
UNIT_TOKENS = 64


def done() -> set[tuple[str, str, str]]:
    if not ROWS.is_file():
        return set()
    return {(r["model"], r["dtype"], r.get("injected", "")) for r in map(json.loads, ROWS.read_text().splitlines())}


def measure_folder(label: str, folder: Path, injected: str = "") -> None:
    config = AutoConfig.from_pretrained(folder)
    implementation = check_attention(label, folder, config)
    vocab = len(AutoTokenizer.from_pretrained(folder))
    for dtype in DTYPES:
        if (label, dtype, injected) in done():
            continue
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), attn_implementation=implementation
        ).eval()
        loaded_s = time.perf_counter() - start
        # The unit the check's cost is read in: one plain 64-token prefill of the same model, timed just before
        # (a shared machine's load moves both alike).
        ids = unit_ids(model, vocab)
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1)  # warm-up
            start = time.perf_counter()
            model(input_ids=ids, logits_to_keep=1)
            prefill_s = time.perf_counter() - start
        try:
            check = load_check.measure(model, label, folder, vocab)
            row = {k: v for k, v in check.__dict__.items() if k not in ("folder",)}
        except Exception as err:  # a refusal is a row too
            row = {"model": label, "dtype": dtype, "error": str(err)[:300]}
        row.update(model=label, injected=injected, load_s=round(loaded_s, 2), threads=torch.get_num_threads())
        row.update(prefill_s=round(prefill_s, 3), load_average=round(os.getloadavg()[0], 1))
        if row.get("spread"):
            row["ratio"] = row["difference"] / row["spread"]
            row["kernel_ratio"] = kernel_ratio(model, vocab)
        print(json.dumps(row), flush=True)
        with ROWS.open("a") as f:
            f.write(json.dumps(row) + "\n")
        del model


def unit_ids(model, vocab: int) -> torch.Tensor:
    """The ids of the prefill the check's cost is read in: 64 fixed in-vocabulary ids, whatever the check's own
    prompt length (rows measured before it was shortened used the same unit)."""
    high = min(vocab, model.get_input_embeddings().weight.shape[0])
    return torch.randint(3, high, (1, UNIT_TOKENS), generator=torch.Generator().manual_seed(load_check.SEED))


def kernel_ratio(model, vocab: int) -> float | None:
    """How far another attention kernel alone moves transformers' own bf16 logits: its eager attention's distance
    from the float32 logits over its SDPA's (largest over the steps). midlens' module on a GPU runs SDPA with an
    explicit mask where stock SDPA may take another kernel, so its rounding need not be stock's; this says by how
    much such a change moves the spread the tolerance is a multiple of."""
    if model.config._attn_implementation == "eager":
        return None
    ids = load_check._prompt_ids(model, vocab)

    def spread(low, full):
        return max((a[0] - b[0]).abs().max().item() for a, b in zip(low, full, strict=True))

    with load_check._float32_parameters(model):
        full = load_check._run(model, ids, ours=False)
    sdpa = load_check._run(model, ids, ours=False)
    current = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        eager = load_check._run(model, ids, ours=False)
    finally:
        model.set_attn_implementation(current)
    return spread(eager, full) / spread(sdpa, full)


def packaged() -> None:
    for name in PACKAGED:
        measure_folder(name, resolve_model_dir(name))


def families() -> None:
    from tests.tiny import FAMILIES, save_tiny

    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(FAMILIES):
            measure_folder(f"tiny {name}", save_tiny(name, Path(tmp) / name))


def one_b() -> None:
    folder = Path(tempfile.gettempdir()) / "midlens-llama-1b-shape"
    if not (folder / "model.safetensors").is_file() and not list(folder.glob("*.safetensors")):
        # the prompt's ids come from the SmolLM2 tokenizer the folder carries
        save_random_model("llama-3.2-1b", folder, resolve_model_dir("smollm2-135m"), dtype=torch.bfloat16)
    measure_folder("llama-3.2-1b shape (random)", folder)


def injected() -> None:
    """One layer's attention scale 1 % off (a misread query_pre_attn_scalar or multiplier would be far more)."""
    read = attention.read_anatomy

    def wrong(attn, rotary_emb):
        anatomy = read(attn, rotary_emb)
        if attn.layer_idx == 3:
            anatomy = type(anatomy)(**{**anatomy.__dict__, "scale": anatomy.scale * 1.01})
        return anatomy

    attention.read_anatomy = wrong
    try:
        measure_folder("smollm2-135m", resolve_model_dir("smollm2-135m"), injected="layer 3 scale x 1.01")
    finally:
        attention.read_anatomy = read


def table() -> None:
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    lines = [
        "| model | dtype | injected | compared in | difference | transformers' own bf16 spread | ratio | "
        "eager / SDPA spread | tolerance | passed | first layer | fp32 difference | check s | 64-token prefill s | "
        "check / prefill |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['injected']} | refused: {r['error'][:160]} |" + "|" * 11)
            continue
        spread = f"{r['spread']:.2e}" if r.get("spread") is not None else "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
        where = "prefill" if r["step"] == 0 else f"decode {r['step']}"
        kernel = f"{r['kernel_ratio']:.2f}" if r.get("kernel_ratio") is not None else "-"
        if r["compared_in"] != "float32":  # the rule as the module states it now (rows keep what they measured)
            r["tolerance"] = load_check.SPREAD_MULTIPLE * r["spread"] + load_check.SPREAD_FLOOR
            r["passed"] = r["difference"] <= r["tolerance"]
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['injected']} | {r['compared_in']} | {r['difference']:.2e} ({where}) "
            f"| {spread} | {ratio} | {kernel} | {r['tolerance']:.2e} | {'yes' if r['passed'] else 'no'} | "
            f"{r['layer'] if r['layer'] is not None else '-'} | {r['float32_difference']:.2e} | {r['seconds']:.1f} "
            f"| {r['prefill_s']:.2f} | {r['seconds'] / r['prefill_s']:.0f} |"
        )
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    {"packaged": packaged, "families": families, "1b": one_b, "injected": injected, "table": table}[sys.argv[1]]()
