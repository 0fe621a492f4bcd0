"""A model folder's first load: midlens' attention module against transformers' own forward of the same weights.

A family whose layers do something the anatomy reader misses (a config field it ignores, a norm it does not see)
loads and answers with wrong logits unless something compares. So the first time a folder is loaded, keyed by its
weights and config, a fixed pseudo-random prompt (`PROMPT_TOKENS` in-vocabulary ids, then `DECODE_STEPS` cached
decode steps) runs through transformers' own modules and then through `PositionalAttention` on the same weights
(no second copy: the stock modules are put back afterwards), in the dtype the model will run in. Above the
tolerance the model is refused, naming the folder, the difference, where it appears and the first layer whose
hidden state departs. The result is recorded under the cache (`load-checks/`), so later loads cost a hash lookup;
`midlens cache verify` runs it again.

Tolerances (docs/results/load-check/README.md measures them):
- float32: `FP32_TOLERANCE` absolute on logits, as tests/test_families.py: the two paths compute the same products
  with different kernels, which moves the last bits; a wrong mask, scale, norm or rotation moves logits by 1e-2+
  (a 1 % scale error in one layer of SmolLM2: 6e-2).
- bfloat16 (and float16) is checked twice on the same weights. Upcast to float32 (exact), both paths must agree
  within `FP32_TOLERANCE`: what the module computes is judged as sharply as at float32, which rounding in 8
  mantissa bits could not (SmolLM2's bf16 logits are 1.2 from its float32 ones, transformers' own as much as
  ours). In the model's dtype, midlens' logits must be no farther from transformers' float32 logits than
  `SPREAD_MULTIPLE` times transformers' own low-precision logits are, plus `SPREAD_FLOOR`: this catches what goes
  wrong in low precision only (a dtype mismatch, a lost upcast).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from torch import nn

from midlens.core.device import dtype_name
from midlens.core.errors import ModelError, Remedy
from midlens.core.files import load_checks_dir, read_manifest, sha256_json, sha256_of, write_atomic
from midlens.generators.attention.anatomy import decoder_of, model_anatomy
from midlens.generators.attention.positional_attention import (
    PositionalAttention,
    install_positional_attention,
    new_cache,
)

# Every forward of the check reads all the weights, and a first load pays each prompt token and decode step 2 times
# (float32) or 4 (low precision): on SmolLM2 (one CPU thread, float32) a decode step costs 0.06 s, a 24-token prefill
# 0.14 s, a 64-token one 0.28 s (docs/results/load-check/README.md, "Cost of the check"). 24 positions still turn
# RoPE through many angles and mask across positions, and outrun tests/tiny.py's 16-key windows; no affordable prompt
# outruns a real model's window (512+), which tests/test_families.py covers. Two decode steps: the second reads keys
# the first appended, where a slot or position bug of one-token cache updates shows.
PROMPT_TOKENS = 24
DECODE_STEPS = 2
FP32_TOLERANCE = 1e-4
SPREAD_MULTIPLE = 5.0
SPREAD_FLOOR = 1e-3
# A layer's hidden state departs when its difference, relative to the state's largest value, exceeds this (fp32),
# or (lower precisions) the same multiple of transformers' own spread at that layer as the logits' rule.
FP32_LAYER_TOLERANCE = 1e-5
SEED = 0
# The code whose behaviour the check vouches for is this module and every module of this package it imports,
# directly or not (`checked_modules`): an edit to any of them runs it again for every model.
_CHECKED_PACKAGE = "midlens.generators"  # the attention room and this one: every module the checked forward runs


@dataclass(frozen=True)
class LoadCheck:
    """What the check measured on one model folder in one dtype and device type. The reported comparison is the
    first that failed, else the one in the model's dtype; below float32 `float32_difference` is the other one."""

    model: str
    folder: str
    arch: str
    dtype: str
    device: str
    compared_in: str  # the precision of the reported comparison: float32, or the model's dtype
    difference: float  # largest |ours - reference| over the logits of the step below
    tolerance: float  # what that step was allowed
    spread: float | None  # in a low precision: transformers' own logits against its float32 ones
    step: int  # 0: the prefill; k: decode step k (the worst step, or the first that failed)
    layer: int | None  # the first layer whose hidden state departs at that step (None: none does)
    float32_difference: float  # midlens against transformers with both in float32 (the same weights)
    seconds: float
    passed: bool
    judged: bool = True  # False when transformers' own logits were not finite (damaged weights are named later)

    def where(self) -> str:
        return "prefill" if self.step == 0 else f"decode step {self.step}"

    def describe(self) -> str:
        text = (
            f"{self.dtype} on {self.device}: largest difference {self.difference:.2e} at {self.where()} "
            f"(tolerance {self.tolerance:.2e}"
        )
        if self.spread is not None:
            text += f"; transformers' own {self.dtype} logits are {self.spread:.2e} from its float32 ones"
        if self.dtype != "float32":
            text += f"; in float32 on the same weights {self.float32_difference:.2e}"
        return f"{text}), {self.seconds:.1f} s"

    def error(self) -> ModelError:
        layer = (
            f"first at layer {self.layer}"
            if self.layer is not None
            else "no layer's hidden state departs, so after the last layer (final norm or output head)"
        )
        if self.spread is not None:
            reference = f"transformers' float32 forward of the same weights by {self.difference:.2e}"
            bound = (
                f"tolerance {self.tolerance:.2e}: {SPREAD_MULTIPLE:g} x the {self.spread:.2e} transformers' own "
                f"{self.dtype} logits are from it, + {SPREAD_FLOOR:g}"
            )
            # The layers compute right in float32 (checked first): the low-precision path is what differs.
            remedies = [Remedy("dtype", "float32", "to run it in float32, where it matches")]
        else:
            upcast = " with both in float32 (the parameters upcast)" if self.dtype != "float32" else ""
            reference = f"transformers' forward of the same weights{upcast} by {self.difference:.2e}"
            bound = f"tolerance {self.tolerance:.2e}"
            remedies = []
        return ModelError(
            f"{_where(self.model, self.arch, self.dtype, self.folder)}: midlens' attention differs from "
            f"{reference} ({bound}) at {self.where()}; {layer}. midlens refuses a model it would answer with wrong "
            "logits: its layers do something the attention module does not implement. Use another model, or "
            "report the model's config.json (docs/guide.md, 'Model families').",
            remedies=remedies,
        )


def _where(name: str, arch: str, dtype: str, folder: Path | str) -> str:
    """model 'NAME' (ARCH, DTYPE, FOLDER): the folder left out where the name is that folder's path."""
    place = "" if str(folder) == name else f", {folder}"
    return f"model '{name}' ({arch}, {dtype}{place})"


def check_model(model: nn.Module, name: str, folder: Path, vocab_size: int, rerun: bool = False) -> LoadCheck:
    """The recorded check of `model` (just loaded from `folder`, stock attention modules in place), run and
    recorded first when there is none (or `rerun`); ModelError when midlens' attention differs from transformers'.

    A model whose own (transformers') logits are not finite is not judged, nor recorded: its damaged weights are
    named by the first forward pass (`loading.non_finite_error`)."""
    device = model.get_input_embeddings().weight.device
    dtype = model.get_input_embeddings().weight.dtype
    record = _record_path(folder, dtype, device)
    if not rerun and record.is_file():
        try:
            result = LoadCheck(**json.loads(record.read_text(encoding="utf-8"))["check"])
        except (OSError, ValueError, KeyError, TypeError):
            result = None  # unreadable or from another layout: measured again and rewritten
        if result is not None:
            if not result.passed:
                raise result.error()
            return result
    if not rerun:  # the one line a first load shows: the check takes a few forward passes, later loads none
        arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
        print(
            f"note: {_where(name, arch, dtype_name(dtype), folder)}: checking midlens' attention against "
            f"transformers' forward (once per weights, config and dtype on {device.type})",
            file=sys.stderr,
            flush=True,
        )
    result = measure(model, name, folder, vocab_size)
    if result.judged:
        write_atomic(record, json.dumps({"key": _key_fields(folder, dtype, device), "check": asdict(result)}, indent=2))
    if not result.passed:
        raise result.error()
    return result


def measure(model: nn.Module, name: str, folder: Path | str, vocab_size: int) -> LoadCheck:
    """Run the check on `model` (stock attention modules in place), nothing recorded."""
    start = time.perf_counter()
    embeddings = model.get_input_embeddings().weight
    dtype, device = embeddings.dtype, embeddings.device
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    ids = _prompt_ids(model, vocab_size).to(device)
    low = dtype != torch.float32
    try:
        with _reference_attention(model):
            stock = _run(model, ids, ours=False)
        if not all(torch.isfinite(step[0]).all() for step in stock):
            return _unjudged(name, folder, arch, dtype, device, start)
        ours = _run(model, ids, ours=True)
        if low:
            try:
                with _float32_parameters(model):
                    with _reference_attention(model):
                        stock_full = _run(model, ids, ours=False)
                    ours_full = _run(model, ids, ours=True)
            except torch.OutOfMemoryError:
                # A float32 copy of the parameters does not fit beside the rest: a model that runs in its own dtype
                # is not refused for that. Said, not recorded, so a load with more memory free checks it.
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(
                    f"note: {_where(name, arch, dtype_name(dtype), folder)}: not compared with transformers' forward "
                    "(its float32 reference does not fit in memory); a float32 load checks its layers.",
                    file=sys.stderr,
                    flush=True,
                )
                return _unjudged(name, folder, arch, dtype, device, start)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # a layer midlens' module cannot run (or transformers cannot): refused, not a traceback
        raise ModelError(
            f"{_where(name, arch, dtype_name(dtype), folder)}: comparing midlens' attention with "
            f"transformers' forward failed ({type(err).__name__}: {err}). midlens refuses a model it cannot check. "
            "Use another model, or report the model's config.json (docs/guide.md, 'Model families')."
        ) from None
    full = _compare(ours_full, stock_full, None) if low else _compare(ours, stock, None)
    reported, compared_in = full, "float32"
    if low and full.passed:
        reported, compared_in = _compare(ours, stock_full, stock), dtype_name(dtype)
    return LoadCheck(
        name, str(folder), arch, dtype_name(dtype), device.type, compared_in, reported.difference,
        reported.tolerance, reported.spread, reported.step, reported.layer, full.difference,
        time.perf_counter() - start, passed=reported.passed,
    )  # fmt: skip


def _unjudged(name: str, folder: Path | str, arch: str, dtype: torch.dtype, device: torch.device, start: float):
    nan = float("nan")
    return LoadCheck(
        name, str(folder), arch, dtype_name(dtype), device.type, dtype_name(dtype), nan, nan, None, 0, None, nan,
        time.perf_counter() - start, passed=True, judged=False,
    )  # fmt: skip


@dataclass(frozen=True)
class _Comparison:
    step: int
    difference: float
    tolerance: float
    spread: float | None
    layer: int | None

    @property
    def passed(self) -> bool:
        return self.difference <= self.tolerance  # NaN fails


# One forward's logits [L, V] (float32) and hidden states [layers + 1, L, D] (float32), per step.
Step = tuple[torch.Tensor, torch.Tensor]


def _run(model: nn.Module, ids: torch.Tensor, ours: bool) -> list[Step]:
    """Prefill of all but the last DECODE_STEPS ids, then one cached step per remaining id: through transformers'
    modules with its own cache (it builds the one the model needs), or through midlens' with `new_cache()`."""
    prompt = ids.shape[1] - DECODE_STEPS
    with torch.inference_mode(), _midlens_attention(model, ours):
        cache = new_cache() if ours else None
        steps = []
        for start, end in [(0, prompt)] + [(t, t + 1) for t in range(prompt, ids.shape[1])]:
            out = model(input_ids=ids[:, start:end], past_key_values=cache, use_cache=True, output_hidden_states=True)
            cache = out.past_key_values
            hidden = torch.stack([h[0].float() for h in out.hidden_states])
            steps.append((out.logits[0].float(), hidden))
    return steps


def _compare(ours: list[Step], reference: list[Step], low: list[Step] | None) -> _Comparison:
    """The first step over its tolerance, else the step closest to it. `low`: transformers' own forward in the
    model's dtype, whose distance from `reference` (the float32 forward) sets the tolerance; None when both
    sides run in float32, where the tolerance is FP32_TOLERANCE."""
    worst = None
    for k, (ours_k, ref_k) in enumerate(zip(ours, reference, strict=True)):
        difference = (ours_k[0] - ref_k[0]).abs().max().item()
        spread = None if low is None else (low[k][0] - ref_k[0]).abs().max().item()
        tolerance = FP32_TOLERANCE if spread is None else SPREAD_MULTIPLE * spread + SPREAD_FLOOR
        entry = _Comparison(k, difference, tolerance, spread, None)
        if not entry.passed:
            layer = _first_layer(ours_k[1], ref_k[1], None if low is None else low[k][1])
            return _Comparison(k, difference, tolerance, spread, layer)
        if worst is None or difference / tolerance > worst.difference / worst.tolerance:
            worst = entry
    return worst


def _first_layer(ours: torch.Tensor, reference: torch.Tensor, low: torch.Tensor | None) -> int | None:
    """The first decoder layer whose output departs from the reference's. Hidden state i + 1 is layer i's output
    (0 is the embeddings); differences are taken relative to each state's largest value, since the residual
    stream grows through the layers."""
    scale = reference.flatten(1).abs().amax(dim=1).clamp_min(1e-30)
    relative = (ours - reference).flatten(1).abs().amax(dim=1) / scale
    if low is None:
        allowed = torch.full_like(relative, FP32_LAYER_TOLERANCE)
    else:
        spread = (low - reference).flatten(1).abs().amax(dim=1) / scale
        allowed = SPREAD_MULTIPLE * spread + FP32_LAYER_TOLERANCE
    departed = [i for i in range(1, len(relative)) if not relative[i] <= allowed[i]]
    return departed[0] - 1 if departed else None


def _prompt_ids(model: nn.Module, vocab_size: int) -> torch.Tensor:
    """PROMPT_TOKENS + DECODE_STEPS fixed pseudo-random ids from the tokenizer's vocabulary (ids the embedding
    has rows for), fewer when the model's positions are fewer."""
    positions = int(getattr(model.config, "max_position_embeddings", 0) or PROMPT_TOKENS + DECODE_STEPS)
    length = min(PROMPT_TOKENS + DECODE_STEPS, positions)
    high = min(vocab_size, model.get_input_embeddings().weight.shape[0])
    low = 3 if high > 3 else 0  # the first ids are special tokens in most vocabularies
    return torch.randint(low, high, (1, length), generator=torch.Generator().manual_seed(SEED))


@contextmanager
def _midlens_attention(model: nn.Module, install: bool) -> Iterator[None]:
    """midlens' attention on every layer for the block (baseline RoPE), the stock modules put back after."""
    layers = decoder_of(model).layers
    originals = [layer.self_attn for layer in layers]
    if any(isinstance(a, PositionalAttention) for a in originals):
        raise ValueError("the load check needs the stock attention modules; this model runs midlens' already")
    if not install:
        yield
        return
    try:
        install_positional_attention(model)
        yield
    finally:
        for layer, original in zip(layers, originals, strict=True):
            layer.self_attn = original


@contextmanager
def _reference_attention(model: nn.Module) -> Iterator[None]:
    """transformers' eager attention for soft-capped models (its SDPA path leaves the soft-cap out), else the
    implementation the model was loaded with."""
    current = model.config._attn_implementation
    capped = any(a.softcap for a in model_anatomy(model))
    if not capped or current == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


@contextmanager
def _float32_parameters(model: nn.Module) -> Iterator[None]:
    """The model's parameters upcast to float32 in place for the block, and cast back after (exact: every
    bfloat16 and float16 value is a float32 value). Buffers keep their dtype: `model.to` would also round the
    float32 buffers some models keep (rotary frequencies), and the reference must use the same ones."""
    params = list(model.parameters())
    kept = [p.dtype for p in params]
    try:
        for p in params:
            p.data = p.data.float()
        yield
    finally:
        for p, dtype in zip(params, kept, strict=True):
            p.data = p.data.to(dtype)


# -- where results are recorded ------------------------------------------------------------------------------------


def checks_dir() -> Path:
    return load_checks_dir()


def is_recorded(folder: Path, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a load of `folder` in `dtype` on `device` reads a recorded check instead of running it."""
    return _record_path(folder, dtype, device).is_file()


def _record_path(folder: Path, dtype: torch.dtype, device: torch.device) -> Path:
    return checks_dir() / f"{sha256_json(_key_fields(folder, dtype, device))[:32]}.json"


def _key_fields(folder: Path, dtype: torch.dtype, device: torch.device) -> dict:
    return {
        "weights": weights_digest(folder),
        "config": sha256_of([folder / "config.json"]),
        "dtype": dtype_name(dtype),
        "device": device.type,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "attention_code": _code_digest(),
    }


@functools.cache
def checked_modules() -> dict[str, Path]:
    """Module name -> source file of the code the checked forward runs: this module and, transitively, every module
    of its package it imports (attention, anatomy, layer_trace, masks, rope, scores...). Read from the import
    statements, so a module a later edit imports is covered without a list here to keep."""
    found: dict[str, Path] = {}
    todo = [__name__]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = _source_of(name)
        for node in ast.walk(ast.parse(found[name].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            else:
                continue
            todo += [n for n in named if n.startswith(_CHECKED_PACKAGE + ".") and _is_module(n)]
    return dict(sorted(found.items()))


def _source_of(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError(f"no source file for module {name}")
    return Path(spec.origin)


def _is_module(name: str) -> bool:
    """Whether `name` is a module (`from package import module`) rather than a name defined in one."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a name inside a module: its parent has no __path__ to search
        return False


def _code_digest() -> str:
    digest = hashlib.sha256()
    for path in checked_modules().values():
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))


def weights_digest(folder: Path) -> str:
    """One hash of a folder's weight files, without reading them at every load: from MANIFEST.json where the
    folder has one (the load has just checked the files against it), else memoised by each file's stat (size,
    mtime, inode, ctime: any write through the file system changes one), so a multi-GB folder is hashed once."""
    files = _weight_files(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError:
        manifest = None
    if manifest is not None:
        entries = manifest["files"]
        names = [p.relative_to(folder).as_posix() for p in files]
        if names and all(n in entries for n in names):
            return sha256_json({n: entries[n]["sha256"] for n in names})
    stats = []
    for p in files:
        st = p.stat()
        stats.append([p.name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    memo = checks_dir() / "hashes" / f"{sha256_json([str(folder.resolve()), stats])[:32]}.json"
    try:
        return json.loads(memo.read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = sha256_of(files)
    write_atomic(memo, json.dumps({"folder": str(folder.resolve()), "sha256": digest}))
    return digest


def forget(folder: Path) -> None:
    """Remove the recorded checks of `folder`'s weights and config (every dtype and device), so the next load
    runs the check again."""
    if not checks_dir().is_dir():
        return
    weights, config = weights_digest(folder), sha256_of([folder / "config.json"])
    for record in checks_dir().glob("*.json"):
        try:
            key = json.loads(record.read_text(encoding="utf-8"))["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if key.get("weights") == weights and key.get("config") == config:
            record.unlink(missing_ok=True)
