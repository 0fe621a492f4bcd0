"""`midlens eval ... --engine ray`: the units of a run through Ray Data, on as many machines as the cluster has.

    describe   one remote task plans the run (the same `plan_run` as in-process, loading no model, on a worker
               of the actors' shape, so `auto` resolves to the device they have) and returns its config, units
               and group size; the driver prepares the run directory and keeps the units its results file lacks
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

import json
import os

from midlens.core.errors import MidlensError, Remedy
from midlens.eval.options import RunOptions


class UnitEvaluator:
    """A Ray Data actor: the run built once (model loaded once), then one group of units per call."""

    def __init__(self, options: RunOptions, threads: int):
        import torch

        torch.set_num_threads(threads)
        from midlens.eval.plan import build_run

        self.run = build_run(options)

    def __call__(self, batch: dict) -> dict:
        rows = []
        for text in batch["group"]:
            group = json.loads(text)
            results = self.run.evaluate_many(group)  # a group is whole examples: a reused prompt is marked as such
            for unit, result in zip(group, results, strict=True):
                rows.append(json.dumps({**unit, **result, "worker": os.getpid()}, ensure_ascii=False))
        return {"row": rows}


def _describe(options: RunOptions, grown_from: int | None) -> tuple[dict, list[dict], int, str | None]:
    """The plan where the data is; with `grown_from` (the size of the run the out folder holds), also the hash of
    that many first examples, so the driver can grow the run without the data."""
    from midlens.eval.plan import plan_run

    plan = plan_run(options)
    prefix = plan.prefix_sha256(grown_from) if grown_from is not None else None
    return plan.config, plan.units, plan.group_size, prefix


# How long the head node gets to accept a plain TCP connection before --address is called unreachable. Ray itself
# retries an unreachable GCS for minutes (about 40 s per attempt, ~20 attempts in Ray 2.60), printing only its own
# "Failed to connect to GCS" warnings; a live head accepts within milliseconds, a slow network within seconds.
CONNECT_TIMEOUT_S = 10.0


def _host_port(address: str) -> tuple[str, int]:
    """The host and port Ray would dial for `address` (HOST:PORT or ray://HOST:PORT)."""
    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    if not client:
        try:  # Ray dials a loopback name at this node's own IP: probe what it will dial
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address(address) or target
        except Exception:  # an address Ray cannot parse either: the check below names it
            pass
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise MidlensError(
            "expected HOST:PORT of the Ray head node (e.g. 10.0.0.5:6379, the address `ray start --head` printed), "
            "ray://HOST:PORT for Ray Client, or no address to start a local cluster.",
            about=Remedy("address", address),
        )
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse `address` with an error that names it when nothing accepts a TCP connection there within `timeout_s`
    (before ray.init, which would otherwise retry for minutes). "auto" and "local" are Ray's to resolve."""
    import socket

    if address in ("auto", "local"):
        return
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        dialled = "" if f"{host}:{port}" in address else f" (Ray dials it as {host}:{port})"
        if address.startswith("ray://"):
            service = "the head node's Ray Client server (port 10001 unless `ray start --ray-client-server-port`)"
        else:
            service = "the GCS address `ray start --head` printed (port 6379 unless `--port`)"
        raise MidlensError(
            f"no Ray cluster answers there{dialled}: connecting to {host}:{port} failed ({why}, within "
            f"{timeout_s:g} s). Check that the head node is running (`ray status` on it; `ray start --head` starts "
            f"one), that the address is {service}, and that no firewall blocks that port from this machine; or give "
            "no address to start a local cluster.",
            about=Remedy("address", address),
        ) from None


def _connect(address: str | None, workers: int, threads: int) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        check_reachable(address)
        ray.init(address=address, log_to_driver=False)
        return
    # A local cluster sized for the pool: Ray schedules by the CPUs an actor asks for, not by the cores there are.
    cpus = max(os.cpu_count() or 1, workers * threads + 1)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20)


def run_on_ray(options: RunOptions) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise MidlensError("the Ray engine needs Ray Data: pip install 'midlens[ray]' (make setup does).") from None
    from midlens.eval import runner

    threads, workers, gpus = options.threads_per_worker, options.workers, options.gpus_per_worker
    _connect(options.address, workers, threads)
    describe = ray.remote(num_cpus=threads, num_gpus=gpus)(_describe)
    grown_from = runner.recorded_examples(options.out)
    config, units, size, prefix = ray.get(describe.remote(options, grown_from))
    path, mine, done, todo = runner.pending_units(
        options.out, config, units, options.shard, options.limit, lambda count: prefix if count == grown_from else ""
    )
    if todo:
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
        runner.write_rows(path, config, arriving, len(mine), done, progress=options.progress)
    return runner.read_rows(path)
