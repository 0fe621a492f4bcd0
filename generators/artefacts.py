"""Trained artefacts: one verified folder format for anything a method learns (LoRA factors, routers).

    <folder>/weights.safetensors   tensors only (never a pickle)
    <folder>/meta.json             method, base model + its content sha256, options, layers/heads, training
                                   config, data split + its sha256, weights sha256, format version

Artefacts that ship live in `generators/trained/<method>/<model>/` and are found by name; any other folder
is given by path. Loading checks, in this order, that the files exist and parse, that the method and the
base model's content hash match, that the weights' sha256 matches the one recorded (a damaged or edited
file is refused), and that every tensor has the shape the model needs. Each refusal names the folder and
says what to do. Saving writes a temp folder next to the target and renames it into place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from midlens.core.errors import ArtefactError
from midlens.core.files import replacing_folder, sha256_of

FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"
META = "meta.json"
SHIPPED = Path(__file__).parent / "trained"


@dataclass
class Artefact:
    path: Path
    meta: dict
    tensors: dict[str, torch.Tensor]


def save_artefact(folder: str | Path, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write `tensors` + `meta` (method, base_model, base_model_sha256, options, ... ) atomically to `folder`."""
    from safetensors.torch import save_file

    missing = [k for k in ("method", "base_model", "base_model_sha256") if k not in meta]
    if missing:
        raise ArtefactError(f"artefact metadata lacks {missing}: every artefact records its method and base model.")
    folder = Path(folder)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with replacing_folder(folder) as work:
        save_file(cpu, str(work / WEIGHTS))
        full = {
            **meta,
            "format_version": FORMAT_VERSION,
            "weights_sha256": sha256_of([work / WEIGHTS]),
            "shapes": {k: list(v.shape) for k, v in cpu.items()},
        }
        (work / META).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    return folder


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
                f"(shipped folders: {', '.join(shipped) or 'none'}). "
                f"Train one with `midlens train {method} --model {model}` and pass artefact=PATH."
            )
        return path
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ArtefactError(f"{method} artefact {spec!r}: no such folder (expected {WEIGHTS} + {META} inside).")
    return path


def load_artefact(
    path: str | Path,
    method: str,
    base_model_sha256: str,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Artefact:
    """Read and verify an artefact folder (see the module doc); `shapes` are what the model needs."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    meta_file, weights_file = path / META, path / WEIGHTS
    for f in (meta_file, weights_file):
        if not f.is_file():
            raise ArtefactError(f"artefact {path}: {f.name} is missing; an artefact folder holds {WEIGHTS} and {META}.")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"artefact {meta_file}: not valid JSON ({err}); re-save or retrain the artefact.") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ArtefactError(
            f"artefact {path}: format_version {meta.get('format_version')!r}, this midlens reads {FORMAT_VERSION}."
        )
    if meta.get("method") != method:
        raise ArtefactError(f"artefact {path} was trained for method {meta.get('method')!r}, not {method!r}.")
    if meta.get("base_model_sha256") != base_model_sha256:
        raise ArtefactError(
            f"artefact {path} was trained on base model {meta.get('base_model')!r} "
            f"(sha256 {str(meta.get('base_model_sha256'))[:12]}...), not on the model loaded now "
            f"(sha256 {base_model_sha256[:12]}...); use an artefact trained for this model."
        )
    actual = sha256_of([weights_file])
    if actual != meta.get("weights_sha256"):
        raise ArtefactError(
            f"artefact {weights_file}: sha256 {actual[:12]}... does not match the "
            f"{str(meta.get('weights_sha256'))[:12]}... recorded in meta.json (damaged or edited file); "
            "restore it from the repository or retrain."
        )
    try:
        tensors = load_file(str(weights_file))
    except SafetensorError as err:
        raise ArtefactError(f"artefact {weights_file}: unreadable safetensors file ({err}).") from None
    if shapes is not None:
        wrong = [
            f"{k}: has {list(tensors[k].shape) if k in tensors else 'nothing'}, needs {list(v)}"
            for k, v in shapes.items()
            if k not in tensors or tuple(tensors[k].shape) != tuple(v)
        ]
        wrong += [f"{k}: not expected" for k in sorted(set(tensors) - set(shapes))]
        if wrong:
            raise ArtefactError(
                f"artefact {path} does not fit this model ({len(wrong)} tensor(s) wrong, e.g. {wrong[0]}); "
                "it was made for another architecture or configuration."
            )
    return Artefact(path, meta, tensors)
