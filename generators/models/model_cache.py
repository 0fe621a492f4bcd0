"""Where a model's files are: the verified cache of converted registry models, or a user's own folder.

Each load checks every file's size and stat (mtime, inode, ctime) against MANIFEST.json, one stat per file, and
hashes a file whose stat changed; hashing the weights at every load would add 1 s (SmolLM2) to 4.5 s (Qwen) to
each load (docs/guide.md, "What a load checks"). Every hash is checked by `midlens cache verify` and whenever
loading fails or the first forward pass gives non-finite logits (`loading`), so damage no stat shows (bit rot)
is named instead of surfacing as an empty answer. Temp folders left by killed conversions are swept on the next
run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from midlens.core.errors import ModelError, Step
from midlens.core.files import (
    FileProblem,
    build_lock,
    manifest_problems,
    models_dir,
    read_manifest,
    sha256_of,
    sweep_stale,
)
from midlens.generators.models.packaged_models import REGISTRY, canonical_name, convert_gguf


def sweep_stale_conversions() -> list[Path]:
    """Remove the temp folders of conversions whose process is gone (or, owner unknown, an hour old)."""
    return sweep_stale(models_dir(), lambda name: "-" in name)


def _in_cache(folder: Path) -> bool:
    return folder.resolve().parent == models_dir().resolve()


def rebuild(folder: Path) -> tuple[str, list[Step]]:
    """How a damaged model folder is written again: a cached conversion by clearing it (the step each interface
    words), a user's own folder by restoring it (words only: no step of ours writes it)."""
    if _in_cache(folder):
        step = Step(
            "cache-clear",
            f"delete {folder}, then load the model again",
            {"model": folder.name},
            "(the model is converted again from its installed GGUF)",
        )
        return "", [step]
    return f"Restore {folder} from where it came from (re-copy or re-download it), or use another model.", []


class DamagedModelError(ModelError):
    """A model folder whose files differ from its manifest, or that has none to vouch for them. `damage` says what
    is wrong without what to do about it: midlens repairs a cached conversion itself, and its note must not tell
    the user to clear the cache while the repair is already running."""

    def __init__(self, message: str, damage: str, folder: Path):
        restore, steps = rebuild(folder)
        super().__init__(f"{message} {restore}".rstrip(), steps)
        self.damage = damage


def _damaged(name: str, folder: Path, problems: list[FileProblem], cause: str = "") -> DamagedModelError:
    listed = "\n".join(f"  {p}" for p in problems)
    return DamagedModelError(
        f"model '{name}': the files in {folder} do not match its manifest{cause}:\n{listed}\n"
        "The folder is damaged (a partial copy, a full disk, or bytes changed on disk).",
        f"{folder} does not match its manifest ({'; '.join(map(str, problems))})",
        folder,
    )


def check_model_folder(name: str, folder: Path, hashes: bool = False, cause: str = "") -> None:
    """Refuse a folder whose files differ from MANIFEST.json: sizes and stats always, re-hashing any file whose
    stat changed; sha256 of every file when `hashes`.

    A cached conversion without a manifest is unverified (deleted, or written by an older midlens): refused, never
    re-recorded from whatever is on disk, which would vouch for damaged bytes. A user's own folder has no
    manifest to compare with and is not checked here (its load fails loudly on damage, `load_model`)."""
    try:
        manifest = read_manifest(folder)
    except ValueError as err:
        raise DamagedModelError(f"model '{name}': {err}.", str(err), folder) from None
    if manifest is None:
        if _in_cache(folder):
            damage = (
                f"{folder} has no MANIFEST.json, so nothing vouches for its files (the manifest was deleted, or an "
                "older midlens converted it)"
            )
            raise DamagedModelError(f"model '{name}': {damage}.", damage, folder)
        return
    problems = manifest_problems(folder, manifest, hashes, progress=f"verifying {name}" if hashes else None)
    if problems:
        raise _damaged(name, folder, problems, cause)


def resolve_model_dir(name_or_path: str) -> Path:
    """A registry name -> its converted cache folder (converting on first use); a folder -> itself.

    Either way the folder's files are checked against its manifest by size (hashes are checked on failure)."""
    name_or_path = canonical_name(name_or_path)
    if name_or_path in REGISTRY:
        source = REGISTRY[name_or_path]
        target = models_dir() / name_or_path
        sweep_stale_conversions()
        marker = target / "SOURCE_SHA256"
        with build_lock(target):  # a second process waits for the first's conversion instead of redoing it
            converted = not (marker.is_file() and marker.read_text().strip() == source.sha256)
            if converted:
                convert_gguf(name_or_path, source, target)
            try:
                check_model_folder(name_or_path, target)
            except DamagedModelError as damage:
                if converted:
                    raise
                try:  # damaged or unverified: convert again from the GGUF (verified by hash) when it is installed
                    source.locate()
                except ModelError:
                    raise damage from None
                print(
                    f"note: model '{name_or_path}': {damage.damage}.\n  converting {name_or_path} again from its "
                    "installed GGUF (nothing to do: the damaged folder is replaced when the conversion finishes).",
                    file=sys.stderr,
                    flush=True,
                )
                convert_gguf(name_or_path, source, target)
                check_model_folder(name_or_path, target)
        return target
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {path} has no config.json; expected a Hugging Face model folder.")
        check_model_folder(name_or_path, path)
        return path
    raise ModelError(f"unknown model '{name_or_path}': not a registry name ({', '.join(REGISTRY)}) and not a folder.")


def content_sha256(name_or_path: str) -> str:
    """What a model's weights are, as one hash: the verified GGUF source of a registry model, else the sha256
    of a folder's weight files (sorted by name). Trained artefacts record it to refuse another base model."""
    name_or_path = canonical_name(name_or_path)
    if name_or_path in REGISTRY:
        return REGISTRY[name_or_path].sha256
    folder = resolve_model_dir(name_or_path)
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not weights:
        raise ModelError(f"model folder {folder} has no *.safetensors or *.bin weight files.")
    return sha256_of(weights)
