"""Pos2Distill at inference: the LoRA delta a position-to-position self-distillation trained (Wang et al., EMNLP
2025), added per call to the attention projections like MuDAF's.

    Generator("smollm2-135m", method="pos2distill")                        # the delta shipped for this model
    Generator(m, method="pos2distill(artefact='runs/my-delta')")

Training is in `training.pos2distill`.
"""

from __future__ import annotations

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.models.shipped import resolve_artefact

DEFAULTS = {"artefact": None}
# Where `midlens train pos2distill` finds its recipe (the training layer, above this one).
TRAINER = "midlens.training.pos2distill"


def check_options(opts: dict) -> None:
    if opts["artefact"] is not None and not isinstance(opts["artefact"], str):
        raise MethodConfigError(f"pos2distill artefact={opts['artefact']!r}: expected a folder path.")


def build(loaded, opts: dict) -> MethodParts:
    path = resolve_artefact(opts["artefact"], "pos2distill", loaded.name)
    delta, _ = LoRADelta.load(path, "pos2distill", loaded.sha256, model=loaded.model)  # verified before it is read
    return MethodParts(baseline_schemes(loaded.model), delta.to(loaded.dtype))


METHOD = Method(
    "pos2distill",
    "position-to-position self-distillation: the model at its best slots teaches the others, a LoRA delta "
    "(Wang et al. 2025)",
    build=build,
    defaults=DEFAULTS,
    check=check_options,
    trainer=TRAINER,
)
