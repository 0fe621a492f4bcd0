"""What an evaluation run is: from its options, the plan (config and units, loading no model) and the evaluators
(the loaded model, one generator per method, the functions that evaluate units). Every answer goes through the
library's one answer path (rag.answering: Pipeline's for end-to-end units, the position sweep's own), a restacked
system being its method's generator with a restack in its options.

The in-process engine (`eval.runner`) builds a run once; the Ray engine (`eval.ray_engine`) plans in one light
task and builds the evaluators once per worker from the same options, so a worker evaluates exactly what an
in-process run would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.eval.options import RunOptions


@dataclass
class Plan:
    """A run laid out: its config (what defines it), its units, the data they index, the device type the model
    will run on, and how many units a batch groups (the batch size resolved once, for that device)."""

    config: dict
    units: list[dict]
    data: list
    device: str
    group_size: int

    def prefix_sha256(self, count: int) -> str:
        """The data hash a run of this plan's first `count` examples recorded (a smaller --n: `runner.prepare_dir`
        checks it before growing that run to this plan)."""
        from midlens.core.files import sha256_json
        from midlens.eval.datasets import data_sha256

        head = self.data[:count]
        return sha256_json(head) if self.config["kind"] == "e2e" else data_sha256(head)


@dataclass
class Run:
    """A plan with its evaluators: how to evaluate one unit or a group of them (one method's)."""

    plan: Plan
    evaluate: Callable[[dict], dict]
    evaluate_many: Callable[[list[dict]], list[dict]]


def examples_of(options: RunOptions) -> tuple[str, list]:
    """The dataset name a run records and the examples it reads (a sweep's or a rerank run's; not e2e)."""
    from midlens.eval.datasets import kv_retrieval, load_hotpotqa, load_litm, load_squad

    max_words = None if options.max_words <= 0 else options.max_words
    if options.dataset == "hotpotqa":
        mode = "mdqa" if options.mode == "sweep" else "rerank"
        # Another split is another dataset name, so a report never pools tuning rows with evaluation rows.
        split = options.split or "eval"
        name = "hotpotqa" if split == "eval" else f"hotpotqa-{split}"
        examples = load_hotpotqa(options.n, options.seed, mode=mode, k=options.k, max_words=max_words, split=split)
        return name, examples
    if options.dataset == "squad":
        if options.mode != "sweep":
            raise MidlensError("squad has one relevant paragraph per question: use it with `eval sweep`.")
        name = "squad-v2-dev" if options.split is None else f"squad-v2-dev-{options.split}"
        return name, load_squad(options.n, options.seed, k=options.k, max_words=max_words, split=options.split)
    if options.dataset == "kv":
        if options.mode != "sweep":
            raise MidlensError("kv retrieval has one relevant pair and no retriever order: use it with `eval sweep`.")
        return f"kv{options.k}", kv_retrieval(options.n or 100, pairs=options.k, seed=options.seed)
    return Path(options.dataset).name, load_litm(options.dataset, options.n, options.seed)


def plan_run(options: RunOptions) -> Plan:
    """The config and units of the run `options` ask for, and the data they index; no model is loaded (the
    device and dtype are resolved here, where the model would run)."""
    from midlens.core.batch_size import units_per_group
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.core.files import sha256_json
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.model_cache import content_sha256
    from midlens.generators.models.packaged_models import canonical_name

    configs = options.configs
    device = resolve_device(options.device)
    if device.type == "cuda" and device.index is None:  # named as the loaded weights will name it: cuda:0
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
    model = canonical_name(options.model)
    orderings = set(options.orderings)
    restacked = options.restacked
    config = {
        "kind": options.mode,
        "model": model,
        "model_sha256": content_sha256(model),
        "device": str(device),
        "dtype": dtype_name(resolve_dtype(options.dtype, device)),
        "methods": {m: _system(m, c, orderings, restacked, options.restack_slots) for m, c in configs.items()},
        "evidence": asdict(options.evidence or EvidenceConfig()),
        "seed": options.seed,
        "n": options.n,
        "max_new_tokens": options.max_new_tokens,
        "prompt_style": options.prompt_style,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    config["methods_sha256"] = {m: sha256_json(c) for m, c in config["methods"].items()}
    if options.mode == "e2e":
        units, data = _e2e_units(options, config)
    else:
        from midlens.eval.datasets import data_sha256

        name, data = examples_of(options)
        config.update(max_words=options.max_words, dataset=name, data_sha256=data_sha256(data), examples=len(data))
        if options.mode == "sweep":
            units = _sweep_units(options, name, data, config)
        else:
            units = [
                {
                    "key": f"{ex.id}|{m}",
                    "order": i * len(configs) + j,
                    "example": i,
                    "example_id": ex.id,
                    "kind": "rerank",
                    "dataset": name,
                    "method": m,
                }
                for i, ex in enumerate(data)
                for j, m in enumerate(configs)
            ]
    config["units"] = len(units)
    # The batch size is not part of the config: rows are the same at any size, so a run may resume with another.
    return Plan(config, units, data, device.type, units_per_group(options.batch_size, device.type))


def _system(
    label: str, config, orderings: set[str], restacked: dict[str, tuple[str, str, int]], slots: str = "measured"
) -> dict:
    """What a row label runs, as the run's config records it; a restacked system also records its scorer and rounds
    (only then: the records of runs made before restacking, and their hashes, stay as they were), and its slot
    policy where it is not the measured order (likewise)."""
    system = {**config.to_dict(), "ordering": label if label in orderings else None}
    if label in restacked:
        _, scorer, rounds = restacked[label]
        system["restack"] = {"scorer": scorer, "rounds": rounds} | ({} if slots == "measured" else {"slots": slots})
    return system


def _sweep_units(options: RunOptions, name: str, examples: list, config: dict) -> list[dict]:
    k, positions = options.k, options.gold_positions
    config.update(k=k, positions=positions, logprob=options.logprob)
    if options.stop_at_line_end:  # recorded only when set, so runs started before the option still resume
        config["stop_at_line_end"] = True
    methods = list(options.configs)
    per = len(methods) * len(positions)
    return [
        {
            "key": f"{ex.id}|{m}|{p}",
            "order": i * per + j * len(positions) + q,
            "example": i,
            "example_id": ex.id,
            "kind": "sweep",
            "dataset": name,
            "k": k,
            "method": m,
            "position": p,
        }
        for i, ex in enumerate(examples)
        for j, m in enumerate(methods)
        for q, p in enumerate(positions)
    ]


def _e2e_units(options: RunOptions, config: dict) -> tuple[list[dict], list[dict]]:
    from midlens.core.files import sha256_json
    from midlens.eval.datasets import load_questions
    from midlens.retrievers.corpus import default_corpus_path, default_questions_path
    from midlens.retrievers.dense import corpus_fingerprint

    questions_path = options.questions or default_questions_path()
    questions = load_questions(questions_path, options.n, options.seed)
    config.update(
        dataset=Path(questions_path).name,
        top_k=options.top_k,
        retrieval=options.retrieval,
        data_sha256=sha256_json(questions),
        corpus_fingerprint=corpus_fingerprint(options.corpus or default_corpus_path()),
        examples=len(questions),
    )
    methods = list(options.configs)
    units = [
        {
            "key": f"{q['id']}|{m}",
            "order": i * len(methods) + j,
            "example": i,
            "example_id": q["id"],
            "kind": "e2e",
            "dataset": config["dataset"],
            "method": m,
        }
        for i, q in enumerate(questions)
        for j, m in enumerate(methods)
    ]
    return units, questions


def build_run(options: RunOptions) -> Run:
    """The plan and its evaluators: the model loaded (once per process and device) and one generator per system.
    A bad option that needs the model's shape (e.g. a layer index) fails here, before any unit runs. The rerank
    branch stays inline: its evaluators differ from the others only in which generators they hold."""
    from midlens.eval import runner
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack
    from midlens.generators.models.loading import load_model

    plan = plan_run(options)
    loaded = load_model(options.model, options.device, options.dtype)
    restacked = options.restacked
    gens = {
        m: Generator(loaded, method=c, evidence=options.evidence)
        for m, c in options.configs.items()
        if m not in restacked
    }
    # Every system by its row label: its method's generator, and the restack a restacked system answers with.
    restacks = {
        label: Restack(scorer, rounds, slots=options.restack_slots) for label, (_, scorer, rounds) in restacked.items()
    }
    systems = {**gens, **{label: gens[m] for label, (m, _, _) in restacked.items()}}
    style, data = options.prompt_style, plan.data
    if options.mode == "e2e":
        from midlens.eval.e2e import evaluate_e2e, evaluate_e2e_many
        from midlens.rag.pipeline import Pipeline
        from midlens.retrievers.build import build_retriever
        from midlens.retrievers.corpus import default_corpus_path

        retriever = build_retriever(options.corpus or default_corpus_path(), options.retrieval, options.index_dir)
        pipes = {
            m: Pipeline(
                retriever,
                gen,
                top_k=options.top_k,
                max_new_tokens=options.max_new_tokens,
                prompt_style=style,
                restack=restacks.get(m),
            )
            for m, gen in systems.items()
        }

        def evaluate(u: dict) -> dict:
            return evaluate_e2e(pipes[u["method"]], data[u["example"]])

        def many(method: str, units: list[dict]) -> list[dict]:
            return evaluate_e2e_many(pipes[method], [data[u["example"]] for u in units], options.batch_size)

    elif options.mode == "sweep":
        from midlens.eval.sweep import PositionSweep

        sweep = PositionSweep(
            systems,
            options.k,
            options.max_new_tokens,
            logprob=options.logprob,
            style=style,
            stop_at_line_end=options.stop_at_line_end,
            orderings={name: name for name in options.orderings},
            restacks=restacks,
        )

        def evaluate(u: dict) -> dict:
            return sweep(data[u["example"]], u["position"], u["method"])

        def many(method: str, units: list[dict]) -> list[dict]:
            return sweep.many(method, [(data[u["example"]], u["position"]) for u in units], options.batch_size)

    else:
        from midlens.eval.rerank import evaluate_rerank, evaluate_rerank_many

        def evaluate(u: dict) -> dict:
            return evaluate_rerank(gens[u["method"]], data[u["example"]], style=style)

        def many(method: str, units: list[dict]) -> list[dict]:
            chosen = [data[u["example"]] for u in units]
            return evaluate_rerank_many(gens[method], chosen, options.batch_size, style=style)

    # Each row says the precision it was computed in (the config does too): rows of runs that differ only in dtype
    # are compared row by row (docs/results/cpu-bf16/).
    precision = {"dtype": plan.config["dtype"]}

    def evaluate_one(u: dict) -> dict:
        return {**evaluate(u), **precision}

    def evaluate_many(group: list[dict]) -> list[dict]:
        return [{**row, **precision} for row in runner.per_method(group, many)]

    return Run(plan, evaluate_one, evaluate_many)
