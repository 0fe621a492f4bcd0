"""Loading a model into memory once per process, and naming the damage when its weights fail to load or compute.

A folder transformers cannot read, or a first forward pass that gives non-finite logits, has its files hashed
against MANIFEST.json, so the error names a damaged file instead of surfacing as an empty answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from midlens.core.device import dtype_name, resolve_device, resolve_dtype
from midlens.core.errors import ModelError, Remedy
from midlens.core.files import read_manifest
from midlens.generators.anatomy import UnsupportedAttention, model_anatomy
from midlens.generators.load_check import LoadCheck, check_model
from midlens.generators.model_cache import check_model_folder, content_sha256, rebuild, resolve_model_dir
from midlens.generators.packaged_models import DEFAULT_MODEL, REGISTRY, canonical_name


@dataclass
class LoadedModel:
    """One model in memory, shared by every generator that uses it (methods swap per call, under `lock`)."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    context_window: int
    lock: threading.RLock = field(default_factory=threading.RLock)
    folder: Path | None = None  # where the weights were read from, for error messages
    verified: LoadCheck | None = None  # the load-time comparison with transformers' own forward
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
        implementation = check_attention(name_or_path, model_dir, config)
        window = int(config.max_position_embeddings)
        _check_tokenizer_files(name_or_path, model_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch_dtype, attn_implementation=implementation
            )
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # e.g. SafetensorError "invalid JSON in header": find out whether a file is bad
            raise _load_failure(name_or_path, model_dir, err) from err
        model.to(torch_device).eval()
        # Before midlens' attention is installed anywhere: the stock modules are the reference, on the same weights.
        verified = check_model(model, name_or_path, model_dir, len(tokenizer))
        loaded = LoadedModel(
            name=name_or_path,
            model=model,
            tokenizer=tokenizer,
            context_window=window,
            folder=model_dir,
            verified=verified,
        )
        _LOADED[key] = loaded
        return loaded


def check_attention(name: str, folder: Path, config) -> str:
    """Refuse, before any weight is read, a model whose layers' attention the one attention module cannot run;
    return the attention implementation to load it with.

    The layers are built on the meta device (no memory, no weights) and read as the module will read them
    (`generators.anatomy`), so what is accepted is what runs: there is no list of family names to keep. The
    implementation only shapes the masks transformers builds (every layer's attention is replaced): SDPA where the
    class allows it, eager where it refuses SDPA (Gemma 2, whose soft-cap SDPA cannot apply)."""
    from transformers import AutoModelForCausalLM

    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    where = f"model '{name}' ({arch}, {folder / 'config.json'})"
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as err:
        raise ModelError(
            f"{where}: transformers cannot build a causal language model from this config ({type(err).__name__}: "
            f"{err}). midlens answers with decoder-only causal LMs; check the config's model_type and architectures."
        ) from None
    try:
        model_anatomy(skeleton)
    except UnsupportedAttention as err:
        raise ModelError(
            f"{where} cannot run through midlens' attention module: {err}. Use a model whose layers it implements "
            "(docs/guide.md, 'Model families')."
        ) from None
    return "sdpa" if getattr(type(skeleton), "_supports_sdpa", False) else "eager"


def refuse_unrunnable(name_or_path: str) -> None:
    """`check_attention` for a model folder from its config alone (no weights read, nothing converted), for callers
    that do slower work before loading (a corpus's index): a family the module cannot run is refused first. A
    packaged name, or a folder whose config does not read, is left to `load_model` and its messages."""
    from transformers import AutoConfig

    name = canonical_name(name_or_path)
    folder = Path(name)
    if name in REGISTRY or not (folder / "config.json").is_file():
        return
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception:  # load_model reports an unreadable config with what is wrong with the folder
        return
    check_attention(name, folder, config)


# The files a Hugging Face tokenizer is read from: one of these sets must be in the folder. Without any, transformers
# says to install sentencepiece or tiktoken, which would not help.
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))


def _check_tokenizer_files(name: str, folder: Path) -> None:
    if any(all((folder / f).is_file() for f in files) for files in TOKENIZER_FILES) or any(folder.glob("*.tiktoken")):
        return
    expected = ", ".join(" + ".join(files) for files in TOKENIZER_FILES)
    raise ModelError(
        f"model '{name}': {folder} has no tokenizer files (expected one of: {expected}, or a *.tiktoken file). Copy "
        "the tokenizer files from where the model came from into the folder (save_pretrained writes them for both "
        "the model and its tokenizer)."
    )


def _load_failure(name: str, folder: Path, err: Exception) -> ModelError:
    """The error for a folder transformers could not read: a damaged file when the hashes say so."""
    cause = f" (loading failed with {type(err).__name__}: {err})"
    try:
        check_model_folder(name, folder, hashes=True, cause=cause)
    except ModelError as damaged:
        return damaged
    if "mismatched_sizes" in str(err) or "size mismatch" in str(err):
        return ModelError(
            f"model '{name}': the shapes {folder / 'config.json'} describes (layers, heads, head_dim, hidden size) do "
            f"not match the weights' tensors in {folder}{cause}. Use the config.json the weights were saved with."
        )
    if read_manifest(folder) is None:
        return ModelError(
            f"model '{name}': could not load {folder}{cause}. Check that it is a complete Hugging Face model folder."
        )
    restore, steps = rebuild(folder)
    return ModelError(
        f"model '{name}': could not load {folder}{cause}, though its files match their manifest, so the manifest may "
        f"have been recorded from an already damaged cache. {restore}".rstrip(),
        steps,
    )


def release_model(loaded: LoadedModel) -> None:
    """Forget `loaded` in this process' model cache: its memory is freed once nothing else holds it (generators,
    pipelines), and the next `load_model` of it reads its folder again. For a process that goes through many models
    (a sweep over folders, a long-lived server switching models): the cache keeps every model it loaded."""
    with _LOAD_LOCK:
        for key in [k for k, v in _LOADED.items() if v is loaded]:
            del _LOADED[key]


def non_finite_error(loaded: LoadedModel) -> ModelError:
    """The error for NaN/inf logits from a forward pass: names a damaged file when the hashes find one.

    The model is also dropped from this process' memory, so the next load reads the (rebuilt) folder again."""
    release_model(loaded)
    cause = " (the first forward pass gave NaN or inf logits)"
    folder = loaded.folder
    if folder is None:
        return ModelError(f"model '{loaded.name}' gave NaN or inf logits on the prompt; its weights are damaged.")
    try:
        check_model_folder(loaded.name, folder, hashes=True, cause=cause)
    except ModelError as damaged:
        return damaged
    dtype = dtype_name(loaded.dtype)
    what = (
        f"model '{loaded.name}' ({folder}, {dtype} on {loaded.device}) gave NaN or inf logits on the prompt's "
        "first forward pass, so it cannot answer."
    )
    restore, steps = rebuild(folder)
    if loaded.dtype != torch.float16:
        return ModelError(f"{what} {restore}".rstrip(), steps)
    # float16 overflows in some models: another precision is the first thing to try, a rebuilt cache the next.
    return ModelError(
        f"{what} float16 overflows in some models; if another precision gives NaN too, the weights are damaged. "
        f"{restore}".rstrip(),
        remedies=[Remedy("dtype", "bfloat16"), Remedy("dtype", "float32"), *steps],
    )
