"""Evidence is what the model attended to: for every registered method, the attention the probe records is
the attention the module applied, at prefill and at decode, for a left-padded batch and for a prompt alone.

The check needs no access to the module's internals: with one probe span per key, the probe records each
scored row's full attention distribution P (experts already mixed). The module's output for that row, read
where it enters `o_proj`, must then equal P @ V with V the values in the KV cache. A mask, bias, scale or
expert weight that differed between the two paths would break that equality.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.probe import PassageProbe
from midlens.generators.methods.install import method_context
from midlens.generators.methods.registry import REGISTRY, build_parts, method_config

# fp32 on the CPU: SDPA and the written-out softmax sum the same ~50 products in another order; outputs are of
# size ~1, so agreement to 1e-6 is expected and 1e-5 leaves room for the kernels' different accumulation.
OUT_TOL = 1e-5

QUESTIONS = ["The capital of France is Paris. Where is the Eiffel Tower?", "Bees make honey. What do bees make?"]


def _batch(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask, as the generator batches prompts."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :] = torch.tensor(r)
        mask[b, width - len(r) :] = 1
    return ids, mask


class _AppliedAttention:
    """The attention output each layer handed to its output projection, [B, H, L, d] per call."""

    def __init__(self, model):
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            self.handles.append(attn.o_proj.register_forward_pre_hook(self._keep(i, attn.head_dim)))

    def _keep(self, layer: int, head_dim: int):
        def hook(_module, args):
            x = args[0]
            self.outputs[layer] = x.view(x.shape[0], x.shape[1], -1, head_dim).transpose(1, 2).detach().clone()

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _check_rows(
    mass: torch.Tensor, applied: _AppliedAttention, cache: DynamicCache, rows: list[int], real: torch.Tensor
) -> None:
    """mass [layers, B, H, S, T] (one span per key) @ cached values == the applied output at `rows`."""
    for layer, out in applied.outputs.items():
        values = cache.layers[layer].values.float()  # [B, Hkv, T, d]
        heads = out.shape[1]
        values = values.repeat_interleave(heads // values.shape[1], dim=1)
        probs = mass[layer]
        assert probs.shape[-1] == values.shape[2]
        expected = probs @ values  # [B, H, S, d]
        got = out[:, :, rows].float()
        keep = real[:, rows]  # left padding's query rows attend to nothing real: not compared
        diff = (expected - got).abs().amax(dim=(1, 3))[keep]
        assert diff.max().item() < OUT_TOL, f"layer {layer}: probe and applied attention differ by {diff.max()}"
        # And the rows are distributions: an expert mixture whose weights sum to 1 keeps them so.
        sums = probs.sum(-1)[keep[:, None].expand(-1, heads, -1)]
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def _set_key_bias(parts, batch: int, heads: int, width: int, start: int) -> None:
    """A method that biases keys (attn-calibration) gets a random bias for the queries from `start` on, so its
    additive-mask path is compared too; its answering hook would set one from the prompt's evidence."""
    generator = torch.Generator().manual_seed(0)
    for scheme in parts.schemes:
        if hasattr(scheme, "set_bias"):
            scheme.set_bias(torch.randn(batch, heads, width, generator=generator), start=start)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "alone"])
def test_probe_records_the_attention_the_module_applied(loaded, name, batched):
    check_probe_records_applied_attention(loaded, name, QUESTIONS if batched else QUESTIONS[:1])


def check_probe_records_applied_attention(loaded, name: str, texts: list[str]) -> None:
    """Prefill and one decode step of `texts` (left-padded when several) under method `name`: the probe's rows @ V
    equal the output each layer applied (tests/test_families.py runs it on every model family too)."""
    ids, attention_mask = _batch(loaded.tokenizer, texts)
    batch, width = ids.shape
    parts = build_parts(method_config(name), loaded)
    heads = loaded.model.config.num_attention_heads
    _set_key_bias(parts, batch, heads, width, start=width - 4)
    layers = len(parts.schemes)
    probe = PassageProbe([(t, t + 1) for t in range(width)], layers)  # one span per key: full rows
    applied = _AppliedAttention(loaded.model)
    real = attention_mask.bool()
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    try:
        with torch.inference_mode(), method_context(loaded, parts, probe) as run:
            cache = new_cache()
            rows = list(range(width - 6, width))  # the last prompt tokens, some under the key bias
            probe.score_rows(rows)
            logits = loaded.model(
                input_ids=ids, attention_mask=attention_mask, position_ids=positions, past_key_values=cache
            ).logits
            mass = probe.take()
            _check_rows(mass, applied, cache, rows, real)

            # A decode step: each row's next token at its next position, scored by the deferred path.
            token = logits[:, -1].argmax(-1, keepdim=True)
            attention_mask = torch.cat([attention_mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
            decode_probe = PassageProbe([(t, t + 1) for t in range(width + 1)], layers)
            decode_probe.score_rows([0])
            with run.probe(decode_probe):
                loaded.model(
                    input_ids=token,
                    attention_mask=attention_mask,
                    position_ids=positions[:, -1:] + 1,
                    past_key_values=cache,
                )
            mass = decode_probe.take()
            _check_rows(mass, applied, cache, [0], torch.ones(batch, 1, dtype=torch.bool))
    finally:
        applied.close()
        for scheme in parts.schemes:
            if hasattr(scheme, "set_bias"):
                scheme.set_bias(None)
