"""Loading a model into memory once per process, and naming the damage when its weights fail to load or compute.

A folder transformers cannot read, or a first forward pass that gives non-finite logits, has its files hashed
against MANIFEST.json, so the error names a damaged file instead of surfacing as an empty answer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from midlens.core.device import dtype_name, resolve_device, resolve_dtype
from midlens.core.errors import ModelError, Remedy
from midlens.core.files import read_manifest
from midlens.core.progress import quiet_weight_loading
from midlens.generators.attention.anatomy import UnsupportedAttention, model_anatomy
from midlens.generators.models.model_cache import check_model_folder, content_sha256, rebuild, resolve_model_dir
from midlens.generators.models.packaged_models import DEFAULT_MODEL, REGISTRY, canonical_name
from midlens.generators.models.transformers_parity import LoadCheck, check_model


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
            raise _load_failure(name_or_path, model_dir, err, config_read=False) from err
        implementation = check_attention(name_or_path, model_dir, config)
        window = int(config.max_position_embeddings)
        _check_tokenizer_files(name_or_path, model_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            with quiet_weight_loading():
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
    (`generators.attention.anatomy`), so what is accepted is what runs: there is no list of family names to keep. The
    implementation only shapes the masks transformers builds (every layer's attention is replaced): SDPA where the
    class allows it, eager where it refuses SDPA (Gemma 2, whose soft-cap SDPA cannot apply)."""
    from transformers import AutoModelForCausalLM

    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    where = f"model '{name}' ({arch}, {folder / 'config.json'})"
    problem = _family_problem(config)
    if problem is not None:
        raise ModelError(f"{where}: {problem}.")
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as err:
        raise ModelError(
            f"{where}: transformers cannot build a causal language model from this config ({one_line(err)}). "
            f"{DECODERS_ONLY}; check the config's model_type and architectures."
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
    that do slower work before loading (a corpus's index): a family the module cannot run, or a config transformers
    cannot read, is refused first. A packaged name, or a folder with a manifest (whose unreadable config may be a
    damaged file, which the hashes name), is left to `load_model` and its messages."""
    from transformers import AutoConfig

    name = canonical_name(name_or_path)
    folder = Path(name)
    if name in REGISTRY or not (folder / "config.json").is_file():
        return
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception as err:
        try:
            manifest = read_manifest(folder)
        except ValueError:
            return
        if manifest is None:
            raise _config_refusal(name, folder, err) from None
        return
    check_attention(name, folder, config)


# What every refusal of a model family ends with: what midlens does run.
DECODERS_ONLY = "midlens runs decoder-only RoPE models"


def one_line(err: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, cut to `limit` characters: transformers' errors run to several lines
    (an upgrade how-to, every config class it knows), which would bury the reason a refusal gives."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"


def config_problem(folder: Path) -> str | None:
    """Why `folder`'s config.json names no model transformers knows, in one clause; None when it names one. Read
    as plain JSON, so the reason is the file's (not valid JSON, no model_type, a model_type transformers lacks)
    rather than transformers' text about it."""
    from transformers import __version__ as transformers_version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = folder / "config.json"
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        return f"config.json could not be read ({one_line(err)})"
    except ValueError as err:
        return f"config.json is not valid JSON ({err})"
    if not isinstance(fields, dict):
        return f"config.json holds a JSON {type(fields).__name__}, not the object of a model's fields"
    model_type = fields.get("model_type")
    if not model_type:
        return "config.json names no model_type, the field transformers reads a model's family from"
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        own_code = " its own code (auto_map) is not run, and" if "auto_map" in fields else ""
        return (
            f"unknown model_type {model_type!r} (transformers {transformers_version} does not know it;{own_code} "
            f"{DECODERS_ONLY} that transformers implements)"
        )
    return None


def _family_problem(config) -> str | None:
    """Why a config transformers reads is no decoder-only causal LM, from the config alone; None when it may be one
    (its layers are read next)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        return f"model_type {model_type!r} is an encoder-decoder; {DECODERS_ONLY}"
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:  # classes registered at run time included
        return (
            f"model_type {model_type!r} has no causal language model in transformers (an encoder, or not a text "
            f"model); {DECODERS_ONLY}"
        )
    return None


def _config_refusal(name: str, folder: Path, err: Exception) -> ModelError:
    """The one-line refusal of a folder whose config.json transformers could not read."""
    problem = config_problem(folder) or f"transformers could not read its config ({one_line(err)})"
    return ModelError(f"model '{name}' ({folder / 'config.json'}): {problem}.")


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


def _load_failure(name: str, folder: Path, err: Exception, config_read: bool = True) -> ModelError:
    """The error for a folder transformers could not read: a damaged file when the hashes say so, else what is
    wrong with its config (`config_read` False: the config itself did not read) or the first line of the error."""
    cause = f" (loading failed with {one_line(err)})"
    try:
        check_model_folder(name, folder, hashes=True, cause=cause)
    except ModelError as damaged:
        return damaged
    problem = None if config_read else config_problem(folder)
    if problem is not None:
        return ModelError(f"model '{name}' ({folder / 'config.json'}): {problem}.")
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
