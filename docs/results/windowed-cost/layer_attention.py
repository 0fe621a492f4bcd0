"""One windowed layer's attention at a Gemma 3 270M shape (4 query heads, 1 key-value head of 256 channels, window
512), fp32, one thread: SDPA over the whole window mask (what transformers' SDPA forward and midlens before the
banded path run) against midlens' banded attention, at 2k and 8k tokens; and the window mask's construction.

    OMP_NUM_THREADS=1 python docs/results/windowed-cost/layer_attention.py > layer_attention.json
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.nn.functional as F

from midlens.generators.attention import arithmetic as scores
from midlens.generators.attention import masks

torch.set_num_threads(1)


def timed(fn, repeats: int = 3) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def one_size(tokens: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, tokens, 256, generator=g)
    k, v = torch.randn(1, 1, tokens, 256, generator=g), torch.randn(1, 1, tokens, 256, generator=g)
    with torch.inference_mode():
        mask = masks.score_mask(None, None, tokens, tokens, q.device, 512)

        def whole():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.0625, enable_gqa=True)

        def causal():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.0625, enable_gqa=True)

        def banded():
            return scores._banded_attend(q, k, v, mask, 0.0625)

        def build():
            return masks._window_rows.__wrapped__(tokens, tokens, 512, q.device, True)

        times = {name: timed(fn) for name, fn in (("whole", whole), ("causal", causal), ("banded", banded))}
        return {
            "tokens": tokens,
            "sdpa_window_mask_s": times["whole"],
            "sdpa_causal_no_mask_s": times["causal"],
            "banded_s": times["banded"],
            "banded_over_whole": times["banded"] / times["whole"],
            "window_mask_build_s": timed(build),
            "max_abs_diff": float((banded() - whole()).abs().max()),
        }


def main() -> None:
    out = {"shape": "gemma3-270m layer: 4 q heads, 1 kv head, head_dim 256, window 512", "threads": 1, "rows": []}
    for tokens in (2048, 8192):
        out["rows"].append(one_size(tokens))
        print(json.dumps(out["rows"][-1]), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
