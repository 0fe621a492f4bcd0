"""`midlens eval ... --engine ray`: the units of a run through Ray Data, on as many machines as the cluster has.

    describe   one remote task builds the run (the same `build_run` as in-process) and returns its config and
               units; the driver prepares the run directory and keeps the units its results file lacks
    evaluate   `Dataset.map_batches(UnitEvaluator, ...)` over groups of units (one method, whole examples, as
               the in-process batches are): an actor pool, each actor loading the model once and evaluating
               a group per call, through `build_run`'s evaluators
    write      the driver is the one writer: it appends each row as it arrives, once per key

A killed run resumes like an in-process one (the results file is the state). A killed worker is restarted
by Ray and its unfinished group retried (max_restarts / max_task_retries = -1); a group's rows reach the
driver only when the group is done, and the driver drops a key it has already written, so every unit lands
exactly once. Rows equal the in-process engine's; `worker` (the actor's process id) is volatile.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from midlens.core.errors import MidlensError


class UnitEvaluator:
    """A Ray Data actor: the run built once (model loaded once), then one group of units per call."""

    def __init__(self, options: dict, threads: int):
        import torch

        torch.set_num_threads(threads)
        from midlens.eval.plan import build_run

        self.run = build_run(argparse.Namespace(**options))

    def __call__(self, batch: dict) -> dict:
        rows = []
        for text in batch["group"]:
            group = json.loads(text)
            if self.run.evaluate_many is not None:  # a group is whole examples: a reused prompt is marked as such
                results = self.run.evaluate_many(group)
            else:
                results = [self.run.evaluate(u) for u in group]
            for unit, result in zip(group, results, strict=True):
                rows.append(json.dumps({**unit, **result, "worker": os.getpid()}, ensure_ascii=False))
        return {"row": rows}


def _batch_size(options: dict, device: str) -> int:
    from midlens.core.batch_size import parse_batch_size, units_per_group

    return units_per_group(parse_batch_size(options.get("batch_size", "1")), device)


def _describe(options: dict) -> tuple[dict, list[dict], str]:
    from midlens.eval.plan import build_run

    run = build_run(argparse.Namespace(**options))
    return run.config, run.units, run.device


def _connect(address: str | None, workers: int, threads: int) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    # A local cluster sized for the pool: Ray schedules by the CPUs an actor asks for, not by the cores there are.
    cpus = max(os.cpu_count() or 1, workers * threads + 1)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20)


def run_on_ray(args: argparse.Namespace, shard: tuple[int, int]) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise MidlensError("--engine ray needs Ray Data: pip install 'midlens[ray]' (make setup does).") from None
    from midlens.eval import runner

    options = {k: v for k, v in vars(args).items() if k != "func"}
    threads, workers, gpus = args.threads_per_worker, args.workers, args.gpus_per_worker
    if gpus < 0:
        raise MidlensError(f"--gpus-per-worker {gpus}: expected a number >= 0, e.g. 1 or 0.5.")
    _connect(args.address, workers, threads)
    describe = ray.remote(num_cpus=threads, num_gpus=gpus)(_describe)
    config, units, device = ray.get(describe.remote(options))
    path, mine, done, todo = runner.pending_units(Path(args.out), config, units, shard, args.limit)
    if todo:
        size = _batch_size(options, device)
        groups = runner.unit_groups(todo, size)  # one method, whole examples per group, as in-process
        dataset = ray.data.from_items([{"group": json.dumps(g, ensure_ascii=False)} for g in groups])
        # One group per block, so the pool spreads groups over actors instead of handing one actor them all.
        dataset = dataset.repartition(len(groups))
        rows = dataset.map_batches(
            UnitEvaluator,
            fn_constructor_kwargs={"options": options, "threads": threads},
            batch_size=1,
            concurrency=workers,
            num_cpus=threads,
            num_gpus=gpus,
            max_restarts=-1,  # a killed worker is started again (its model loaded again) ...
            max_task_retries=-1,  # ... and its unfinished group retried there
        )
        arriving = (json.loads(r["row"]) for r in rows.iter_rows())
        runner.write_rows(path, config, arriving, len(mine), done, progress=not args.no_progress)
    return runner.read_rows(path)
