"""Where trained artefacts ship: `generators/trained/<method>/<model>/`, one verified folder each (the format is
`core.saved_parts`), found by the packaged model's name; any other folder is given by path."""

from __future__ import annotations

from pathlib import Path

from midlens.core.errors import ArtefactError
from midlens.core.saved_parts import META, WEIGHTS, train_step

# The generators package's data folder, beside this sub-package: every shipped artefact, slot order and head list.
SHIPPED = Path(__file__).resolve().parent.parent / "trained"


def shipped_path(method: str, model: str) -> Path:
    return SHIPPED / method / model


def shipped_artefact(method: str, model: str) -> Path | None:
    """The folder of the artefact shipped for (method, model), or None. Artefacts ship for packaged models by name;
    a model given as a folder path has none (joined to SHIPPED, an absolute path would point into that folder)."""
    if Path(model).name != model:
        return None
    path = shipped_path(method, model)
    return path if (path / META).is_file() else None


def resolve_artefact(spec: str | None, method: str, model: str) -> Path:
    """None -> the artefact shipped for (method, model); otherwise a folder path."""
    if spec is None:
        path = shipped_artefact(method, model)
        if path is None:
            shipped = sorted(p.name for p in (SHIPPED / method).glob("*") if (p / META).is_file())
            raise ArtefactError(
                f"no trained {method} artefact ships for model {model!r} "
                f"(shipped folders: {', '.join(shipped) or 'none'}).",
                [train_step(method, model)],
            )
        return path
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ArtefactError(f"{method} artefact {spec!r}: no such folder (expected {WEIGHTS} + {META} inside).")
    return path
