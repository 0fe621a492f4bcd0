"""What the anatomy reader says about every causal-LM model type of the installed transformers, from a skeleton.

Each model type's config class is built at the tiny test shape (tests/tiny.py SHAPE; head_dim 16 where the default
does not fit), its causal LM built on the meta device (no weights), and read by `model_anatomy` as `midlens
methods --model` and `load_model` read a folder before loading. "read" is what the reader found, not a logit check:
the families of table.md are compared with transformers' forward by tests/test_families.py, and any other model
is compared at its first load (generators/models/transformers_parity.py). `python docs/results/families/survey.py`
writes survey.md beside it (about 30 s on 2 CPU cores).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for tests.tiny

from midlens.generators.attention.anatomy import UnsupportedAttention, model_anatomy  # noqa: E402
from midlens.generators.models.random_models import random_config  # noqa: E402
from tests.tiny import SHAPE  # noqa: E402

# Fields some configs need at this shape: a pad id inside the tiny vocabulary, a head size that fits 64 channels.
ATTEMPTS = ({}, {"pad_token_id": 0}, {"head_dim": 16}, {"head_dim": 16, "pad_token_id": 0})
# Special-token ids inside the tiny vocabulary, as tests/tiny.py gives them.
TOKENS = dict(vocab_size=512, bos_token_id=1, eos_token_id=2)


def verdict(model_type: str) -> tuple[str, str]:
    """("read" | "refused" | "not built", what the layers do / why); a config that does not build, or whose layer
    fails the reader's probe, is tried again with the next ATTEMPTS fields."""
    found = ("not built", "")
    for extra in ATTEMPTS:
        try:
            config = random_config(model_type, **{**SHAPE, **extra, **TOKENS})
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
        except Exception as err:  # a config that needs fields this shape does not give
            if found[0] == "not built":
                found = ("not built", f"{type(err).__name__} at the tiny shape")
            continue
        try:
            layers = model_anatomy(skeleton)
        except UnsupportedAttention as err:
            found = ("refused", str(err))
            if "could not be read" in str(err):
                continue
            return found
        return "read", "; ".join(dict.fromkeys(a.describe() for a in layers))
    return found


def survey() -> str:
    rows = [(t, *verdict(t)) for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)]
    counts = {v: sum(r[1] == v for r in rows) for v in ("read", "refused", "not built")}
    lines = [
        f"Every causal-LM model type of transformers {transformers.__version__}, read from a tiny meta-device "
        f"skeleton (survey.py): {counts['read']} read, {counts['refused']} refused, {counts['not built']} not built "
        "at the tiny shape.",
        "",
        "| model type | verdict | what its layers do, or why it is refused |",
        "|---|---|---|",
    ]
    lines += [f"| {t} | {v} | {why.replace('|', '/')} |" for t, v, why in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    out = Path(__file__).with_name("survey.md")
    out.write_text(survey())
    print(f"wrote {out}")
