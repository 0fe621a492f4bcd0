"""Trained artefacts: one verified folder format for anything a method learns (LoRA factors, routers).

    <folder>/weights.safetensors   tensors only (never a pickle)
    <folder>/meta.json             the keys of SCHEMAS[format_version], plus the section of the trained part

One format_version is one schema. Every meta.json of version 1 holds the keys in `SCHEMAS[1]`: method, base
model and its content sha256, options, training (the run's config and loss record; a value a run did not record
is null), data (split and the sha256 of its example ids), and what this module derives on save (format_version,
weights_sha256, shapes, parameters). A kind of trained part adds its own section and declares its fields
(`Section`: `LoRADelta.SECTION` is "delta", MoICE's routers "experts"). Every kind is a `SavedPart`, the way a
sentence-transformers module is one: its section holds the fields its `Section` declares (`config`, by default
those attributes of the part) and its tensors are what `tensors` returns. Saving and loading are written once, here
(`part.save(folder, meta)`, `Kind.load(folder, method, base_model_sha256, ...)`): a kind only says how it is built
from its verified section (`from_config`, as sentence-transformers builds a module from its config keys) and how it
takes the saved tensors (`with_tensors`, as a module takes its state dict).

Where artefacts ship, and how one is found by name, is for the layer that ships them; this module only
reads and writes the format, wherever the folder is. Reading (`open_artefact`) verifies before anything is parsed, in
this order: the files exist, meta.json is a JSON object with this version's keys, the method and the base model's
content hash match, and the weights' sha256 matches the one recorded (a damaged or edited file is refused). Only then
does a part read its section (`Section.read`) and build itself, and `Artefact.tensors_for` checks every tensor has the
shape the model needs. Each refusal is an ArtefactError that names the folder or file and says what to do. Saving writes
a temp folder next to the target and renames it into place.

A trained artefact that is one JSON record, not tensors (a model's slot order, its retrieval-head scores), is a
verified JSON artefact: `<folder>/<name>.json`, its size and sha256 recorded in `<folder>/MANIFEST.json` (the
manifest of core.files, one entry per file, so files written one at a time share a folder). `save_json_artefact`
writes the file atomically and records its hash; `read_json_artefact` verifies before anything is parsed, in this
order: the file exists, its folder's manifest records a sha256 for it, the file's bytes match it, and it is a JSON
object. Each refusal is an ArtefactError that names the file and says what to do; what the record must hold (and
which model it was made for) its reader checks after. `record_json_artefact` records the hash of a file written
without one (by hand, or before hashes were recorded), for whoever trusts its content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from midlens.core.errors import ArtefactError, Step
from midlens.core.files import MANIFEST, read_manifest, record_in_manifest, replacing_folder, sha256_of, write_atomic

FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"
META = "meta.json"
# What save_artefact derives from the tensors; the caller gives the other keys of the schema.
DERIVED = ("format_version", "weights_sha256", "shapes", "parameters")
# format_version -> the top-level keys every meta.json of that version holds (a part's section comes on top).
SCHEMAS: dict[int, tuple[str, ...]] = {
    1: ("method", "base_model", "base_model_sha256", "options", "training", "data", *DERIVED),
}
OBJECTS = ("options", "training", "data", "shapes")  # keys whose values are JSON objects


@dataclass(frozen=True)
class Section:
    """The part of meta.json one kind of trained part owns: its key and its fields' types. The part writes it on
    save and reads it back through `read`, so a missing or mistyped field is an ArtefactError naming meta.json,
    never a KeyError inside a method."""

    key: str
    fields: dict[str, type | tuple[type, ...]]

    def read(self, artefact: Artefact) -> dict:
        section = artefact.meta.get(self.key)
        if not isinstance(section, dict):
            raise ArtefactError(
                f"artefact {artefact.meta_file}: no {self.key!r} object (what the trained part is); "
                "re-save or retrain the artefact."
            )
        wrong = [
            f"{name} (needs {_type_names(kind)}, has {type(section.get(name)).__name__})"
            for name, kind in self.fields.items()
            if not _fits(section.get(name), kind)
        ]
        if wrong:
            raise ArtefactError(
                f"artefact {artefact.meta_file}: {self.key!r} field(s) missing or of the wrong type: "
                f"{', '.join(wrong)}; re-save or retrain the artefact."
            )
        return section


def _fits(value: object, kind: type | tuple[type, ...]) -> bool:
    # bool is an int to isinstance; a flag written where a count belongs (or the reverse) is still wrong.
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _type_names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


@dataclass
class Artefact:
    path: Path
    meta: dict
    tensors: dict[str, torch.Tensor]

    @property
    def meta_file(self) -> Path:
        return self.path / META

    def tensors_for(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """The tensors, once each has the shape the model needs (`shapes`) and none is left over."""
        tensors = self.tensors
        wrong = [
            f"{k}: has {list(tensors[k].shape) if k in tensors else 'nothing'}, needs {list(v)}"
            for k, v in shapes.items()
            if k not in tensors or tuple(tensors[k].shape) != tuple(v)
        ]
        wrong += [f"{k}: not expected" for k in sorted(set(tensors) - set(shapes))]
        if wrong:
            raise ArtefactError(
                f"artefact {self.path} does not fit this model ({len(wrong)} tensor(s) wrong, e.g. {wrong[0]}); "
                "it was made for another architecture or configuration."
            )
        return tensors


def _plain(value: object) -> object:
    """A field as JSON holds it: tuples as lists, numpy scalars as Python numbers."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


class SavedPart:
    """A trained part saved as an artefact folder: its `config()` as meta.json's `SECTION`, its `tensors()` as the
    verified weights. A kind declares SECTION, `tensors`, `from_config` and, unless it is an nn.Module whose state
    dict is its tensors, `with_tensors`; `save` and `load` are these, for every kind, and no kind overrides them:
    `Kind.load(folder, method, base_model_sha256, **context)` loads any kind, what it needs beyond its folder (the
    model a delta adapts) given as keywords its `from_config` takes."""

    SECTION: ClassVar[Section]

    def config(self) -> dict:
        """This part's section of meta.json: the attributes its SECTION names (a kind whose section records what
        it derives, not holds, says so itself)."""
        return {name: _plain(getattr(self, name)) for name in self.SECTION.fields}

    def tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact, **context: Any) -> Self:
        """The part its verified, type-checked `section` describes, before its tensors are read; `context` is what
        a kind needs beyond its folder (the model a delta adapts). Refuses a section this midlens cannot build."""
        raise NotImplementedError

    def with_tensors(self, tensors: dict[str, torch.Tensor], artefact: Artefact) -> Self:
        """The part holding the saved `tensors` (shapes already checked against `self.tensors()`), frozen: by
        default an nn.Module's state dict."""
        if not isinstance(self, torch.nn.Module):
            raise NotImplementedError(f"{type(self).__name__} does not say how it takes its saved tensors")
        self.load_state_dict(tensors)
        self.requires_grad_(False)
        return self

    @classmethod
    def load(cls, folder: str | Path, method: str, base_model_sha256: str, **context: Any) -> tuple[Self, Artefact]:
        """The part saved in `folder` and the verified artefact it came from. The folder is verified (files,
        schema, method, base model, weights hash) before its section is read; the part that section describes
        names the tensors it holds and their shapes, which the saved ones must match, none missing or extra."""
        section, artefact = cls.open(folder, method, base_model_sha256)
        part = cls.from_config(section, artefact, **context)
        tensors = artefact.tensors_for({name: tuple(t.shape) for name, t in part.tensors().items()})
        return part.with_tensors(tensors, artefact), artefact

    def save(self, folder: str | Path, meta: dict) -> Path:
        """Save as an artefact folder; `meta` gives the schema's other keys (method, base model, training, data)."""
        return save_artefact(folder, self.tensors(), {**meta, self.SECTION.key: self.config()})

    @classmethod
    def open(
        cls,
        folder: str | Path,
        method: str,
        base_model_sha256: str,
        shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[dict, Artefact]:
        """The verified artefact in `folder` (files, schema, method, base model, weights hash; with `shapes`, each
        tensor's shape) and its section, read and type-checked."""
        artefact = (
            open_artefact(folder, method, base_model_sha256)
            if shapes is None
            else load_artefact(folder, method, base_model_sha256, shapes)
        )
        return cls.SECTION.read(artefact), artefact


def save_artefact(folder: str | Path, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write `tensors` + `meta` atomically to `folder`. `meta` holds the schema's keys that are not derived (method,
    base_model, base_model_sha256, options, training, data) and the part's own section; format_version,
    weights_sha256, shapes and parameters are written here."""
    from safetensors.torch import save_file

    missing = [k for k in SCHEMAS[FORMAT_VERSION] if k not in DERIVED and k not in meta]
    if missing:
        raise ArtefactError(
            f"artefact metadata lacks {missing}: format_version {FORMAT_VERSION} records the method, the base model, "
            "the options, the training run and its data."
        )
    folder = Path(folder)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with replacing_folder(folder) as work:
        save_file(cpu, str(work / WEIGHTS))
        full = {
            **meta,
            "format_version": FORMAT_VERSION,
            "weights_sha256": sha256_of([work / WEIGHTS]),
            "shapes": {k: list(v.shape) for k, v in cpu.items()},
            "parameters": sum(v.numel() for v in cpu.values()),
        }
        (work / META).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    return folder


def train_step(method: str, model: str | None = None) -> Step:
    """The step that trains a `method` artefact (for `model`; None: the user's), to pass as artefact=FOLDER."""
    return Step(
        "train",
        f"train a {method} artefact for {'your model' if model is None else repr(model)} with the method's recipe "
        "(`RECIPE.train` of its registry entry's `trainer` module), then pass artefact=FOLDER",
        {"method": method, "model": model, "out": None},
    )


def open_artefact(path: str | Path, method: str, base_model_sha256: str) -> Artefact:
    """Read and verify an artefact folder (see the module doc) before any of its meta is parsed for a part."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    meta_file, weights_file = path / META, path / WEIGHTS
    for f in (meta_file, weights_file):
        if not f.is_file():
            raise ArtefactError(f"artefact {path}: {f.name} is missing; an artefact folder holds {WEIGHTS} and {META}.")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtefactError(f"artefact {meta_file}: not valid JSON ({err}); re-save or retrain the artefact.") from None
    if not isinstance(meta, dict):
        raise ArtefactError(f"artefact {meta_file}: not a JSON object; re-save or retrain the artefact.")
    version = meta.get("format_version")
    if version not in SCHEMAS:
        raise ArtefactError(
            f"artefact {meta_file}: format_version {version!r}, this midlens reads {', '.join(map(str, SCHEMAS))}."
        )
    missing = [k for k in SCHEMAS[version] if k not in meta]
    if missing:
        raise ArtefactError(
            f"artefact {meta_file}: format_version {version} holds {missing}, missing here; re-save or retrain it."
        )
    not_objects = [k for k in OBJECTS if not isinstance(meta[k], dict)]
    if not_objects:
        raise ArtefactError(f"artefact {meta_file}: {not_objects} must be JSON objects; re-save or retrain it.")
    if meta["method"] != method:
        raise ArtefactError(f"artefact {path} was trained for method {meta['method']!r}, not {method!r}.")
    if meta["base_model_sha256"] != base_model_sha256:
        raise ArtefactError(
            f"artefact {path} was trained on base model {meta['base_model']!r} "
            f"(sha256 {str(meta['base_model_sha256'])[:12]}...), not on the model loaded now "
            f"(sha256 {base_model_sha256[:12]}...); use an artefact trained for this model."
        )
    actual = sha256_of([weights_file])
    if actual != meta["weights_sha256"]:
        raise ArtefactError(
            f"artefact {weights_file}: sha256 {actual[:12]}... does not match the "
            f"{str(meta['weights_sha256'])[:12]}... recorded in meta.json (damaged or edited file); "
            "restore it from the repository or retrain."
        )
    try:
        tensors = load_file(str(weights_file))
    except SafetensorError as err:
        raise ArtefactError(f"artefact {weights_file}: unreadable safetensors file ({err}).") from None
    return Artefact(path, meta, tensors)


def load_artefact(
    path: str | Path,
    method: str,
    base_model_sha256: str,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Artefact:
    """`open_artefact`, then (given `shapes`, what the model needs) the tensors' shapes checked."""
    artefact = open_artefact(path, method, base_model_sha256)
    if shapes is not None:
        artefact.tensors_for(shapes)
    return artefact


# -- verified JSON artefacts: one JSON record, its sha256 recorded in its folder's MANIFEST.json -------------------


def json_artefacts(folder: str | Path) -> list[Path]:
    """The JSON artefacts in `folder` (its *.json files but the manifest), sorted."""
    return sorted(p for p in Path(folder).glob("*.json") if p.name != MANIFEST)


def save_json_artefact(path: str | Path, record: dict) -> Path:
    """Write `record` to `path` (JSON, indent 1) atomically, then record its size and sha256 in its folder's
    MANIFEST.json, beside the entries of the folder's other files."""
    path = Path(path)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    record_in_manifest(path.parent, [path.name])
    return path


def record_json_artefact(path: str | Path) -> Path:
    """Record the sha256 of the JSON artefact at `path` in its folder's MANIFEST.json: what `save_json_artefact`
    does after writing, for a file written without it (by hand, or before hashes were recorded) whose content you
    trust. From then on an edit to it is refused."""
    path = Path(path)
    _json_object(path, "JSON artefact", "")
    record_in_manifest(path.parent, [path.name])
    return path


def read_json_artefact(path: str | Path, what: str, fix: str = "", steps: Sequence[Step] = ()) -> dict:
    """The JSON object in `path`, once verified (see the module doc): the file exists, its folder's MANIFEST.json
    records its sha256 and the bytes match it. `what` names the kind of file in a refusal ("slot-order file"), `fix`
    says how to make a good one ("write one with eval.slots ..."), `steps` the steps that do."""
    path = Path(path)

    def refuse(problem: str, fix: str = fix) -> ArtefactError:
        return ArtefactError(f"{problem}; {fix}." if fix else f"{problem}.", steps)

    if not path.is_file():
        raise refuse(f"{path}: not a {what} (no such file)")
    manifest_file = path.parent / MANIFEST
    try:
        manifest = read_manifest(path.parent)
    except ValueError as err:
        raise refuse(f"{path}: its folder's manifest cannot be read ({err})") from None
    entry = None if manifest is None else manifest["files"].get(path.name)
    if entry is None:
        record = f"record its hash with midlens.core.saved_parts.record_json_artefact({str(path)!r})"
        raise refuse(
            f"{path}: no sha256 is recorded for it in {manifest_file} (written by hand, before midlens recorded one, "
            "or copied without its folder's manifest), so it cannot be verified",
            f"{fix}, or, if you trust its content, {record}" if fix else f"if you trust its content, {record}",
        )
    actual = sha256_of([path])
    if actual != entry["sha256"]:
        raise refuse(
            f"{path}: sha256 {actual[:12]}... does not match the {str(entry['sha256'])[:12]}... recorded in "
            f"{manifest_file} (damaged or edited file)",
            f"restore it, or {fix}" if fix else "restore it",
        )
    return _json_object(path, what, fix, steps)


def _json_object(path: Path, what: str, fix: str, steps: Sequence[Step] = ()) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"{path}: not a {what} ({type(err).__name__}: {err})"
    else:
        if isinstance(record, dict):
            return record
        problem = f"{path}: not a {what} (not a JSON object)"
    raise ArtefactError(f"{problem}; {fix}." if fix else f"{problem}.", steps)
