"""The training loop every learned method shares: AdamW on the method's parameters only (the model stays
frozen), gradient accumulation, linear warmup then cosine decay, a tqdm bar with the running loss, and
checkpoints that a killed run resumes from.

A checkpoint is a folder (written to a temp folder and renamed) with `state.safetensors` (the trainable
tensors and AdamW's moments; no pickle) and `state.json` (step, the config it was made under). Resuming
with a different config is refused: the run would silently mix two trainings.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from midlens.core.errors import MidlensError
from midlens.core.files import replacing_folder, sha256_json


@dataclass(frozen=True)
class LoopConfig:
    examples: int  # how many training examples are consumed in total (one forward each)
    batch: int = 8  # examples per optimizer step (gradient accumulation)
    lr: float = 2e-4
    warmup: float = 0.05  # fraction of the optimizer steps
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 25  # optimizer steps

    @property
    def steps(self) -> int:
        return math.ceil(self.examples / self.batch)


def lr_factor(step: int, total: int, warmup: float) -> float:
    """Linear warmup over the first `warmup` of the steps, then cosine decay to 0."""
    warm = max(1, round(warmup * total))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class CheckpointError(MidlensError):
    """A checkpoint folder that cannot be resumed as asked."""


def _save_checkpoint(folder: Path, params: dict[str, torch.Tensor], opt: torch.optim.Optimizer, state: dict) -> None:
    from safetensors.torch import save_file

    tensors = {f"param.{k}": v.detach().cpu().contiguous() for k, v in params.items()}
    names = {id(p): k for k, p in params.items()}
    for p, s in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"adam.{names[id(p)]}.{key}"] = s[key].detach().cpu().contiguous()
        state.setdefault("adam_steps", {})[names[id(p)]] = float(s["step"])
    with replacing_folder(folder) as work:
        save_file(tensors, str(work / "state.safetensors"))
        (work / "state.json").write_text(json.dumps(state, indent=1) + "\n")


def _load_checkpoint(
    folder: Path, params: dict[str, torch.Tensor], opt: torch.optim.Optimizer, fingerprint: str
) -> int:
    from safetensors.torch import load_file

    state = json.loads((folder / "state.json").read_text())
    if state.get("fingerprint") != fingerprint:
        raise CheckpointError(
            f"checkpoint {folder} was made by a training run with other settings; delete it (or write to another "
            "folder) to start over, or rerun with the settings it was made under."
        )
    tensors = load_file(str(folder / "state.safetensors"))
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(tensors[f"param.{k}"].to(p.device, p.dtype))
    for k, p in params.items():
        if f"adam.{k}.exp_avg" in tensors:
            opt.state[p] = {
                "step": torch.tensor(state["adam_steps"][k]),
                "exp_avg": tensors[f"adam.{k}.exp_avg"].to(p.device),
                "exp_avg_sq": tensors[f"adam.{k}.exp_avg_sq"].to(p.device),
            }
    return int(state["step"])


def train(
    params: dict[str, torch.nn.Parameter],
    examples: Sequence,
    loss_of: Callable[[object], tuple[torch.Tensor, dict[str, float]]],
    config: LoopConfig,
    checkpoint: Path | None = None,
    run_fingerprint: dict | None = None,
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict:
    """Optimise `params` on `loss_of(example)` over `config.examples` examples (cycled in order). Returns a log.

    The example order is fixed (the caller shuffles with its seed), so after a resume at optimizer step s the
    run continues with example s * batch, exactly where the killed run would have gone on. `max_seconds`
    stops after the step that crosses it (checkpointed), for a fixed compute budget; the log says where.
    """
    if not examples:
        raise MidlensError("no training examples: check the data split and the number of examples asked for.")
    fingerprint = sha256_json({"loop": asdict(config), "run": run_fingerprint or {}})
    torch.manual_seed(config.seed)
    opt = torch.optim.AdamW(list(params.values()), lr=config.lr, weight_decay=config.weight_decay)
    start = 0
    if checkpoint is not None and (checkpoint / "state.json").is_file():
        start = _load_checkpoint(checkpoint, params, opt, fingerprint)
    log = {"losses": [], "parts": [], "seconds": 0.0, "resumed_at_step": start, "steps_done": start}
    t0 = time.perf_counter()
    bar = tqdm(total=config.steps, initial=start, desc="training", unit="step", disable=not progress)
    for step in range(start, config.steps):
        for group in opt.param_groups:
            group["lr"] = config.lr * lr_factor(step, config.steps, config.warmup)
        opt.zero_grad(set_to_none=True)
        total, parts = 0.0, {}
        first = step * config.batch
        count = min(config.batch, config.examples - first)
        for i in range(first, first + count):
            loss, logs = loss_of(examples[i % len(examples)])
            (loss / count).backward()
            total += loss.item() / count
            for k, v in logs.items():
                parts[k] = parts.get(k, 0.0) + v / count
        opt.step()
        log["losses"].append(total)
        log["parts"].append(parts)
        bar.update(1)
        bar.set_postfix(loss=f"{total:.3f}", **{k: f"{v:.3f}" for k, v in parts.items()})
        log["steps_done"] = step + 1
        out_of_time = max_seconds is not None and time.perf_counter() - t0 > max_seconds
        last = step + 1 == config.steps or out_of_time
        if checkpoint is not None and ((step + 1) % config.checkpoint_every == 0 or last):
            _save_checkpoint(checkpoint, params, opt, {"step": step + 1, "fingerprint": fingerprint})
        if out_of_time:
            break
    bar.close()
    log["seconds"] = time.perf_counter() - t0
    return log


def training_record(log: dict, config: LoopConfig, device, dtype) -> dict:
    """What an artefact's meta.json says about its training run: budget used, where, and the loss trend."""

    def mean(values: list[float]) -> float:
        return sum(values) / max(1, len(values))

    def mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
        return {k: mean([p.get(k, 0.0) for p in parts]) for k in sorted({k for p in parts for k in p})}

    return {
        **asdict(config),
        "seconds": log["seconds"],
        "steps_done": log["steps_done"],
        "examples_seen": min(config.examples, log["steps_done"] * config.batch),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "final_loss": log["losses"][-1],
        "loss_first_10": mean(log["losses"][:10]),
        "loss_last_10": mean(log["losses"][-10:]),
        "parts_first_10": mean_parts(log["parts"][:10]),
        "parts_last_10": mean_parts(log["parts"][-10:]),
    }


@dataclass(frozen=True)
class TrainingRun:
    """Where one training run's budget comes from and where it goes: the loop, the artefact folder, the data record."""

    loop: LoopConfig
    out: str | Path
    data: dict
    progress: bool = True
    max_seconds: float | None = None


def train_artefact(
    method: str,
    config,
    loaded,
    params: dict[str, torch.nn.Parameter],
    examples: Sequence,
    loss_of: Callable[[object], tuple[torch.Tensor, dict[str, float]]],
    run: TrainingRun,
    describe: Callable[[], dict],
    save: Callable[[Path, dict], Path],
) -> dict:
    """Train `params` and save them as a `method` artefact folder at `run.out` (checkpoints beside it, in
    `<out>.checkpoint`, so a cut run resumes).

    `config` is the method's training config (a dataclass, recorded in the checkpoint's fingerprint and the meta);
    `describe()` gives the method's own record (options, what it trained on), read after training; `save(folder,
    meta)` is the trained part's own save (`LoRADelta.save`, `MoiceRouters.save`), which adds its section."""
    out_path = Path(run.out)
    fingerprint = {method: asdict(config), "data": run.data, "model": loaded.sha256}
    checkpoint = out_path.with_name(out_path.name + ".checkpoint")
    log = train(params, examples, loss_of, run.loop, checkpoint, fingerprint, run.progress, run.max_seconds)
    meta = {
        "method": method,
        "base_model": loaded.name,
        "base_model_sha256": loaded.sha256,
        **describe(),
        "parameters": sum(p.numel() for p in params.values()),
        "training": {**asdict(config), **training_record(log, run.loop, loaded.device, loaded.dtype)},
        "data": run.data,
    }
    save(out_path, meta)
    return {"log": log, "meta": meta}
