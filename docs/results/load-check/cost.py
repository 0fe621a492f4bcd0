"""Where the load check's time goes, stage by stage, on one model in float32 and bfloat16.

    python docs/results/load-check/cost.py [MODEL] [--module FILE] [--repeat N]

MODEL (default smollm2-135m) is loaded once per dtype as `load_model` loads it; one plain 64-token prefill is
timed first, as the unit the check's cost is read in (measure.py's), and also warms the model up, so the check is
not charged the first forward's one-time costs, which a load without a check pays at its first answer instead.
Then `transformers_parity.measure` runs N times (median reported) with each stage timed: transformers' passes, midlens'
passes, the float32 upcast and downcast of the parameters (low precision only), the layers' anatomy reads, and the
rest (comparisons, prompt). `--module FILE` times another version of generators/models/transformers_parity.py the same
way, in the same process and alternating with the current one, so a before/after shares the machine's load, e.g.

    git show HEAD:generators/models/transformers_parity.py > /tmp/load_check_before.py
    python docs/results/load-check/cost.py --module /tmp/load_check_before.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from midlens.generators.models import transformers_parity
from midlens.generators.models.loading import check_attention
from midlens.generators.models.model_cache import resolve_model_dir

UNIT_TOKENS = 64


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"load_check_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def timed_measure(module, model, name: str, folder: Path, vocab: int) -> dict[str, float]:
    """One `module.measure` with its stages timed (seconds by stage, and 'total'), the module put back after."""
    spent: dict[str, float] = defaultdict(float)
    run, upcast, anatomy = module._run, module._float32_parameters, module.model_anatomy

    def timed_run(model, ids, ours):
        start = time.perf_counter()
        try:
            return run(model, ids, ours)
        finally:
            precision = "float32" if next(model.parameters()).dtype == torch.float32 else "low"
            spent[f"{'midlens' if ours else 'transformers'} passes ({precision})"] += time.perf_counter() - start

    @contextmanager
    def timed_upcast(model):
        start = time.perf_counter()
        with upcast(model):
            spent["upcast + downcast"] += time.perf_counter() - start
            yield
            start = time.perf_counter()
        spent["upcast + downcast"] += time.perf_counter() - start

    def timed_anatomy(model):
        start = time.perf_counter()
        try:
            return anatomy(model)
        finally:
            spent["anatomy reads"] += time.perf_counter() - start

    module._run, module._float32_parameters, module.model_anatomy = timed_run, timed_upcast, timed_anatomy
    try:
        start = time.perf_counter()
        check = module.measure(model, name, folder, vocab)
        spent["total"] = time.perf_counter() - start
    finally:
        module._run, module._float32_parameters, module.model_anatomy = run, upcast, anatomy
    assert check.passed, check.describe()
    spent["rest"] = spent["total"] - sum(v for k, v in spent.items() if k != "total")
    return dict(spent)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--module", type=Path, help="another transformers_parity.py to time beside the current one")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = resolve_model_dir(args.model)
    implementation = check_attention(args.model, folder, AutoConfig.from_pretrained(folder))
    vocab = len(AutoTokenizer.from_pretrained(folder))
    versions = {"current": transformers_parity}
    if args.module:
        versions = {f"{args.module.name}": load_module(args.module), **versions}
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    for dtype in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), attn_implementation=implementation
        ).eval()
        high = min(vocab, model.get_input_embeddings().weight.shape[0])
        ids = torch.randint(
            3, high, (1, UNIT_TOKENS), generator=torch.Generator().manual_seed(transformers_parity.SEED)
        )
        with torch.inference_mode():
            model(input_ids=ids)  # the model's first forward: one-time allocations and kernel choices
            prefills = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                model(input_ids=ids)
                prefills.append(time.perf_counter() - start)
        prefill = statistics.median(prefills)
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in versions}
        for _ in range(args.repeat):
            for label, module in versions.items():
                runs[label].append(timed_measure(module, model, args.model, folder, vocab))
        print(f"\n{args.model} {dtype}: one {UNIT_TOKENS}-token prefill {prefill:.3f} s")
        for label, timings in runs.items():
            stages = sorted({k for t in timings for k in t}, key=lambda k: (k == "total", k))
            print(f"  {label}:")
            for stage in stages:
                seconds = statistics.median(t.get(stage, 0.0) for t in timings)
                print(f"    {stage:32} {seconds:7.3f} s  {seconds / prefill:5.1f} prefills")
        print(f"  load average {os.getloadavg()[0]:.1f}")
        del model


if __name__ == "__main__":
    main()
