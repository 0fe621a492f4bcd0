"""MuDAF at inference: the trained LoRA delta of an artefact, added per call to the attention projections.

    Generator("smollm2-135m", method="mudaf")             # the delta shipped for this model (alpha 0.7)
    Generator("smollm2-135m", method="mudaf(alpha=0)")    # the plain fine-tuning baseline, same data and size
    Generator(m, method="mudaf(artefact='runs/my-delta')")

The model's weights are never modified: the delta is a per-call part like a scheme (generators.methods.install).
Training is in `training.mudaf`.
"""

from __future__ import annotations

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.models.shipped import resolve_artefact

DEFAULTS = {"alpha": 0.7, "artefact": None}
# Where `midlens train mudaf` finds its recipe (the training layer, above this one).
TRAINER = "midlens.training.mudaf"


def shipped_name(model: str, opts: dict) -> str:
    """Shipped folders: `<model>` for the paper's alpha 0.7, `<model>-alpha<a>` for the others (0 = plain SFT)."""
    alpha = float(opts["alpha"])
    return model if alpha == DEFAULTS["alpha"] else f"{model}-alpha{alpha:g}"


def check_options(opts: dict) -> None:
    alpha = opts["alpha"]
    if not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise MethodConfigError(f"mudaf alpha={alpha!r}: the contrastive weight must be a number in [0, 1].")
    if opts["artefact"] is not None and not isinstance(opts["artefact"], str):
        raise MethodConfigError(f"mudaf artefact={opts['artefact']!r}: expected a folder path.")


def build(loaded, opts: dict) -> MethodParts:
    path = resolve_artefact(opts["artefact"], "mudaf", shipped_name(loaded.name, opts))
    # Verified (base model, hash, shapes) before its options are read; the delta reads its own section.
    delta, artefact = LoRADelta.load(path, "mudaf", loaded.sha256, model=loaded.model)
    trained_alpha = artefact.meta["options"].get("alpha")
    if trained_alpha is not None and float(trained_alpha) != float(opts["alpha"]):
        raise MethodConfigError(
            f"mudaf artefact {path} was trained with alpha={trained_alpha}, but alpha={opts['alpha']} was asked."
        )
    return MethodParts(baseline_schemes(loaded.model), delta.to(loaded.dtype))


METHOD = Method(
    "mudaf",
    "contrastively tuned retrieval heads, a trained LoRA delta (Liu et al. 2025); alpha=0: plain fine-tuning",
    build=build,
    defaults=DEFAULTS,
    check=check_options,
    shipped_name=shipped_name,
    trainer=TRAINER,
)
