"""Fast tier: device/dtype plumbing, the method registry, the weight-delta hook, method_context and trained
artefacts, on tiny random-weight Llama and Qwen2 models (no packaged model needed)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from midlens.core.device import resolve_device, resolve_dtype
from midlens.core.errors import ArtefactError, DeviceError, MethodConfigError
from midlens.core.passage import Passage
from midlens.core.saved_parts import load_artefact, save_artefact
from midlens.generators import Generator, Method, MethodParts, load_model, method_config, method_context, register
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.registry import REGISTRY, available
from tests.tiny import save_tiny

# fp32, same math in another kernel order: ~1e-6. bf16 has 8 mantissa bits: one rounding of a logit of
# magnitude ~1 is ~4e-3 and a few layers compound it; 0.1 is loose enough for rounding, far below the
# O(1) changes a wrong rotation or a dropped delta makes.
FP32_TOL = 1e-4
BF16_TOL = 0.1


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory):
    return save_tiny(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), device="cpu", dtype="float32")


def passages(n: int = 4) -> list[Passage]:
    return [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(n)]


def logits_of(gen: Generator, ids: list[int]) -> torch.Tensor:
    with gen.running():
        return gen.forward(ids, new_cache(), keep=len(ids))


# -- device and dtype -------------------------------------------------------------------------------


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16") == torch.bfloat16
    with pytest.raises(DeviceError, match="choose one of auto, float32, bfloat16, float16"):
        resolve_dtype("float8")
    with pytest.raises(DeviceError, match="not a device name"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(DeviceError, match="no CUDA GPU visible"):
            resolve_device("cuda:0")


def untrained_routers(loaded, folder) -> str:
    """A MoICE artefact with freshly initialised routers (3 experts, top 2) for a tiny model."""
    from midlens.generators.methods.moice import MoiceRouters
    from midlens.generators.methods.rope_bases import complementary_bases, rope_base

    head_dim = 2 * loaded.model.model.rotary_emb.inv_freq.shape[0]
    bases = complementary_bases(rope_base(loaded.model.config), head_dim, 3)
    meta = {"method": "moice", "base_model": loaded.name, "base_model_sha256": loaded.sha256}
    meta |= {"options": {}, "training": {}, "data": {}}
    return str(MoiceRouters.new(loaded.model, bases, 2).save(folder, meta))


def test_bf16_model_runs_every_method_with_fp32_evidence(tiny_dir, tmp_path):
    loaded = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    stock = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    assert loaded.dtype == torch.bfloat16
    routers = untrained_routers(loaded, tmp_path / "routers")
    for method in (
        "baseline",
        "ms-poe(layers=[1, 2, 3])",
        "attn-calibration(layers=[1, 2, 3])",
        f"moice(artefact={routers!r})",
    ):
        gen = Generator(loaded, method=method)
        prompt = gen.prompt("what is the code word of city 2 ?", passages(), max_new_tokens=4)
        answer = gen.generate(prompt, max_new_tokens=4)
        assert answer.maps.last.dtype == torch.float32
        # Each query row's mass over the passages is a share of one softmax row: within (0, 1] on the layers
        # evidence reads (the probe skips the others).
        mass = answer.maps.question[gen.evidence_config.layer_indices(gen.num_layers)].sum(-1)
        assert 0 < float(mass.min()) and float(mass.max()) <= 1 + 1e-5
    with torch.inference_mode():
        ref = stock(torch.tensor([prompt.input_ids])).logits[0].float()
    ours = logits_of(Generator(loaded, method="baseline"), prompt.input_ids).float()
    assert (ref - ours).abs().max().item() < BF16_TOL


# -- registry -----------------------------------------------------------------------------------------


def test_specs_validate_before_any_model_loads():
    config = method_config("ms-poe(ratio_min=1.0, ratio_max=1.3, head_order=sequential)")
    assert config.options["ratio_max"] == 1.3 and config.options["head_order"] == "sequential"
    assert config.options["gqa"] == "group"  # default filled in
    assert method_config(config.spec()) == config
    with pytest.raises(MethodConfigError, match="unknown method 'ms_poe': choose one of baseline, ms-poe"):
        method_config("ms_poe")
    with pytest.raises(MethodConfigError, match=r"unknown ms-poe option\(s\) \['ratio'\]"):
        method_config("ms-poe(ratio=1.5)")
    with pytest.raises(MethodConfigError, match="ratio_min=2.0 is larger than ratio_max=1.5"):
        method_config("ms-poe", {"ratio_min": 2.0, "ratio_max": 1.5})
    with pytest.raises(MethodConfigError, match="is not option=value"):
        method_config("ms-poe(1.5)")
    # A shorthand is the spec it stands for, its own options on top; the spec itself keeps working.
    assert method_config("finetuned") == method_config("mudaf(alpha=0)")
    assert method_config("finetuned").spec() == method_config("mudaf(alpha=0)").spec()
    assert method_config("finetuned(alpha=0.5)").options["alpha"] == 0.5


def test_methods_trained_per_model_are_listed_only_where_their_artefact_ships(tmp_path):
    everything = available()
    assert {"baseline", "ms-poe", "attn-calibration", "mudaf", "moice"} <= set(everything)
    # Artefacts ship for both packaged models (generators/trained/) but Pos2Distill's, trained on the CPU for
    # SmolLM2 only; a model folder is offered the training-free methods only.
    assert available("smollm2-135m") == everything
    assert available("qwen2.5-coder-0.5b") == [m for m in everything if m != "pos2distill"]
    (tmp_path / "meta.json").write_text("{}")  # a model folder that happens to hold a meta.json ships nothing
    trained = ("mudaf", "moice", "channel-scaling", "pos2distill", "finetuned")
    assert available(str(tmp_path)) == [m for m in everything if m not in trained]


def test_a_registered_user_method_runs_through_the_same_module(tiny):
    calls = []

    def build(loaded, options):
        calls.append(options["scale"])
        delta = LoRADelta(loaded.model, layers=[0], projections=["v"], rank=2)
        with torch.no_grad():
            delta.factors["0_v_B"].fill_(options["scale"])
        return MethodParts(baseline_schemes(loaded.model), delta)

    register(Method("test-shift-v", "a constant push on layer 0's values", build=build, defaults={"scale": 0.5}))
    try:
        with pytest.raises(MethodConfigError, match="already registered"):
            register(Method("test-shift-v", "again", build=build))
        ids = list(range(3, 40))
        shifted = logits_of(Generator(tiny, method="test-shift-v(scale=0.25)"), ids)
        assert calls == [0.25]
        assert (shifted - logits_of(Generator(tiny), ids)).abs().max().item() > 1e-3
    finally:
        REGISTRY.pop("test-shift-v")


# -- the weight-delta hook ----------------------------------------------------------------------------


def _random_delta(model, seed=1):
    delta = LoRADelta(model, layers=[1, 2], projections=["q", "k", "v", "o"], rank=4)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in delta.factors.items():
            if name.endswith("_B"):
                p.normal_(0, 0.2)
    return delta


def test_delta_on_changes_logits_and_off_restores_the_baseline_exactly(tiny):
    model = tiny.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())
    ids = list(range(3, 50))
    base = logits_of(Generator(tiny), ids)
    tuned = Generator(tiny)
    tuned.parts = MethodParts(tuned.parts.schemes, _random_delta(model))
    with_delta = logits_of(tuned, ids)
    assert (with_delta - base).abs().max().item() > 1e-2
    with method_context(tiny, tuned.parts):  # installed: the model's own parameters are still all it has
        assert sum(p.numel() for p in model.parameters()) == n_params
    assert torch.equal(logits_of(Generator(tiny), ids), base)  # off again: bit-identical
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_fresh_lora_is_the_baseline_and_the_context_trains_only_the_delta(tiny):
    model = tiny.model
    delta = LoRADelta(model, layers=[0, 3], projections=["q", "k"], rank=4)
    parts = MethodParts(baseline_schemes(model), delta)
    ids = torch.tensor([list(range(3, 30))])
    with torch.no_grad():
        base = model(ids).logits
    with method_context(tiny, parts) as run:
        out = model(ids).logits
        assert torch.equal(out, base)  # B = 0 at initialisation
        assert run.aux_loss() is None
        # Training a delta: nudge B so gradients reach A, then check only delta parameters get gradients.
        with torch.no_grad():
            delta.factors["0_q_B"].fill_(0.01)
        model.requires_grad_(False)
        model(ids).logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in parts.trainable())
    assert all(p.grad is None for p in model.parameters())
    assert all(m.self_attn.delta is None for m in model.model.layers)  # uninstalled on exit


# -- trained artefacts --------------------------------------------------------------------------------


def _meta(tiny, method="test"):
    return {
        "method": method,
        "base_model": tiny.name,
        "base_model_sha256": tiny.sha256,
        "options": {"rank": 4},
        "training": {},
        "data": {},
    }


def test_artefact_round_trip_and_refusals(tiny, tmp_path):
    delta = _random_delta(tiny.model)
    shapes = {k: tuple(v.shape) for k, v in delta.state_dict().items()}
    folder = save_artefact(tmp_path / "a", delta.state_dict(), _meta(tiny))
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "weights.safetensors"]
    art = load_artefact(folder, "test", tiny.sha256, shapes)
    assert all(torch.equal(art.tensors[k], v) for k, v in delta.state_dict().items())
    assert art.meta["options"] == {"rank": 4}

    with pytest.raises(ArtefactError, match="trained on base model .* not on the model loaded now"):
        load_artefact(folder, "test", "0" * 64, shapes)
    with pytest.raises(ArtefactError, match="trained for method 'test', not 'mudaf'"):
        load_artefact(folder, "mudaf", tiny.sha256, shapes)
    with pytest.raises(ArtefactError, match="does not fit this model .*needs \\[64, 8\\]"):
        load_artefact(folder, "test", tiny.sha256, {**shapes, "factors.1_q_A": (64, 8)})

    weights = folder / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte inside a tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtefactError, match="does not match .* recorded in meta.json"):
        load_artefact(folder, "test", tiny.sha256, shapes)

    (folder / "meta.json").write_text("{not json")
    with pytest.raises(ArtefactError, match="meta.json: not valid JSON"):
        load_artefact(folder, "test", tiny.sha256, shapes)
    (folder / "meta.json").unlink()
    with pytest.raises(ArtefactError, match="meta.json is missing"):
        load_artefact(folder, "test", tiny.sha256, shapes)


def test_a_delta_saves_and_loads_itself_verified_before_its_section_is_read(tiny, tmp_path):
    delta = _random_delta(tiny.model)
    folder = delta.save(tmp_path / "d", {**_meta(tiny, "mudaf"), "options": {"alpha": 0.7}})
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["delta"] == delta.config() and meta["parameters"] == delta.num_parameters()
    loaded, artefact = LoRADelta.load(folder, "mudaf", tiny.sha256, model=tiny.model)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in delta.state_dict().items())
    assert not any(p.requires_grad for p in loaded.parameters()) and artefact.meta["options"] == {"alpha": 0.7}

    # Another base model with a section no delta could be built from: the base model is what is refused.
    meta["delta"] = {"kind": "lora"}
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtefactError, match="not on the model loaded now"):
        LoRADelta.load(folder, "mudaf", "0" * 64, model=tiny.model)
    with pytest.raises(ArtefactError, match=r"meta.json: 'delta' field\(s\) missing .*rank \(needs int"):
        LoRADelta.load(folder, "mudaf", tiny.sha256, model=tiny.model)
    del meta["parameters"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtefactError, match=r"format_version 1 holds \['parameters'\], missing here"):
        LoRADelta.load(folder, "mudaf", tiny.sha256, model=tiny.model)


def test_a_corrupt_meta_json_is_an_artefact_error_naming_the_file(tiny, tmp_path):
    # Through the method, as `--method "mudaf(artefact=...)"` reads it: never a bare JSONDecodeError.
    for spec, save in (
        ("mudaf", lambda f: _random_delta(tiny.model).save(f, {**_meta(tiny, "mudaf"), "options": {"alpha": 0.7}})),
        ("moice", lambda f: untrained_routers(tiny, f)),
    ):
        folder = tmp_path / spec
        save(folder)
        (folder / "meta.json").write_text('{"method": "' + spec + '", "delta": {')
        with pytest.raises(ArtefactError, match=f"artefact {folder / 'meta.json'}: not valid JSON"):
            Generator(tiny, method=f"{spec}(artefact='{folder}')")


def test_shipped_metas_of_one_format_version_have_one_schema():
    """Both packaged models' artefacts of a method hold the same keys (top level and each object inside), and
    each holds every key its format_version's schema and its part's section name."""
    from midlens.core.saved_parts import SCHEMAS
    from midlens.generators.answering.support import SECTION as SUPPORT
    from midlens.generators.methods.channel_scaling import ChannelChoice
    from midlens.generators.methods.moice import MoiceRouters
    from midlens.generators.models.shipped import SHIPPED

    sections = {
        "mudaf": LoRADelta.SECTION,
        "moice": MoiceRouters.SECTION,
        "channel-scaling": ChannelChoice.SECTION,
        "pos2distill": LoRADelta.SECTION,
        "support": SUPPORT,
        "support-verified": SUPPORT,
        "support-checked": SUPPORT,
    }
    # Where a method ships for one packaged model only (Pos2Distill's default-model run needs a GPU), or also for any
    # model (the model-agnostic support models).
    everywhere = {"smollm2-135m", "qwen2.5-coder-0.5b", "any"}
    # Gemma 3 270M's artefacts are short CPU runs (docs/results/gemma3-270m/trained/).
    shipped_for = {
        "pos2distill": {"smollm2-135m", "gemma3-270m"},
        "moice": {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"},
        "mudaf": {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"},
        "channel-scaling": {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"},
        "support": everywhere,
        "support-verified": everywhere,
    }

    def keys(meta: dict) -> dict:
        return {k: sorted(v) if isinstance(v, dict) and k != "shapes" else None for k, v in meta.items()}

    by_version_and_method: dict[tuple, list] = {}
    for path in sorted(SHIPPED.glob("*/*/meta.json")):
        meta = json.loads(path.read_text())
        version, section = meta["format_version"], sections[meta["method"]]
        assert set(SCHEMAS[version]) | {section.key} <= set(meta), path
        assert set(section.fields) <= set(meta[section.key]), path
        by_version_and_method.setdefault((version, meta["method"]), []).append((path, keys(meta)))
    assert {m for _, m in by_version_and_method} == set(sections)
    for (_, method), group in by_version_and_method.items():
        models = {path.parent.name.split("-alpha")[0] for path, _ in group}
        assert models == shipped_for.get(method, {"smollm2-135m", "qwen2.5-coder-0.5b"}), group
        first_path, first = group[0]
        for path, other in group[1:]:
            assert other == first, f"{path} and {first_path} differ in keys"


def test_artefact_save_is_atomic(tiny, tmp_path):
    class Boom(dict):
        def items(self):
            raise KeyboardInterrupt

    target = tmp_path / "b"
    save_artefact(target, {"x": torch.ones(2)}, _meta(tiny))
    with pytest.raises(KeyboardInterrupt):
        save_artefact(target, Boom(), _meta(tiny))
    assert json.loads((target / "meta.json").read_text())["shapes"] == {"x": [2]}  # the old one is intact
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temp folder left behind


# -- GPU (runs where CUDA is present) -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_method_on_cuda_in_bf16_matches_the_cpu(tiny_dir):
    cpu = load_model(str(tiny_dir), device="cpu", dtype="float32")
    gpu = load_model(str(tiny_dir), device="cuda", dtype="auto")
    assert gpu.dtype == torch.bfloat16 and gpu.device.type == "cuda"
    for method in ("baseline", "ms-poe(layers=[1, 2, 3])", "ms-poe(gqa=per_query_head)", "attn-calibration"):
        a, b = Generator(cpu, method=method), Generator(gpu, method=method)
        prompt = a.prompt("what is the code word of city 2 ?", passages(), max_new_tokens=3)
        ref = logits_of(a, prompt.input_ids)
        assert (logits_of(b, prompt.input_ids).float().cpu() - ref).abs().max().item() < BF16_TOL
        ans_a, ans_b = a.generate(prompt, max_new_tokens=3), b.generate(prompt, max_new_tokens=3)
        assert ans_b.maps.last.device.type == "cpu" and ans_b.maps.last.dtype == torch.float32
        assert (ans_a.maps.last - ans_b.maps.last).abs().max().item() < 0.05  # shares of a row, bf16 keys
