"""Behaviour fingerprint of the answer path: every answer, evidence value, citation and support value, hashed.

Run before and after a change that must not change behaviour (a move, a rename) and compare the digests:

    python docs/results/house/identity.py --out before.json   # on the old commit
    python docs/results/house/identity.py --out after.json    # on the new one
    python docs/results/house/identity.py --compare before.json after.json

Cases: every tiny family of tests/tiny.py (random weights, baseline and ms-poe) and the packaged SmolLM2-135M
(baseline, ms-poe, finetuned, moice; generated with citations and support, a given answer checked with
verification, a restacked answer), each in fp32 and bf16. Timings are left out; everything else an Answer holds,
its per-token log-probabilities and its evidence maps included, is hashed exactly (floats by their bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the repository root, for tests/tiny.py

PASSAGES = [
    ("Kessler Bridge", "The Kessler Bridge opened in 1931. It spans the Ashwood river."),
    ("Pelican film", "The pelican film was directed by Mara Lind in 1988."),
    ("Zorbland", "The Zorbland expedition reached the river city in 1902."),
]
QUESTION = "When did the Kessler Bridge open?"
GIVEN = "The Kessler Bridge opened in 1931."
TINY_QUESTION = "what is the secret code word"


def _digest(value) -> str:
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(f"K{k}".encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(f"L{len(v)}".encode())
            for x in v:
                feed(x)
        elif hasattr(v, "__dataclass_fields__"):
            feed({f: getattr(v, f) for f in v.__dataclass_fields__})
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()


def _answer_record(answer) -> dict:
    record = answer.to_dict()
    record.pop("timings", None)
    for name in ("answer_ids", "token_logprobs", "token_margins", "reference_token_logprobs"):
        record[name] = getattr(answer, name)
    record["maps"] = answer.maps
    return record


def _passages():
    from midlens.core.passage import Passage

    return [Passage(text=text, title=title, id=str(i)) for i, (title, text) in enumerate(PASSAGES)]


def tiny_cases(dtype: str) -> dict[str, str]:
    from midlens.generators import Generator
    from tests.tiny import FAMILIES, save_tiny

    out = {}
    # One fixed folder per family: an answer records its model's path, so a temporary name would differ per run.
    tmp = Path(tempfile.gettempdir()) / "midlens-identity"
    for family in FAMILIES:
        folder = save_tiny(family, tmp / family)
        for method in ("baseline", "ms-poe"):
            try:
                gen = Generator(str(folder), method=method, dtype=dtype, citations=None)
                prompt = gen.prompt(TINY_QUESTION, _passages()[:2], max_new_tokens=8)
                answer = gen.generate(prompt, max_new_tokens=8, ignore_eos=True)
                out[f"tiny/{family}/{method}/{dtype}"] = _digest(_answer_record(answer))
            except Exception as err:  # a refusal is behaviour too: its message is fingerprinted
                out[f"tiny/{family}/{method}/{dtype}"] = "refused: " + _digest(f"{type(err).__name__}: {err}")
    return out


def smollm2_cases(dtype: str) -> dict[str, str]:
    from midlens.generators import Generator, Restacker

    out = {}
    for method in ("baseline", "ms-poe", "finetuned", "moice"):
        gen = Generator("smollm2-135m", method=method, dtype=dtype)
        prompt = gen.prompt(QUESTION, _passages(), max_new_tokens=16)
        key = f"smollm2/{method}/{dtype}"
        out[f"{key}/generate"] = _digest(_answer_record(gen.generate(prompt, max_new_tokens=16)))
        out[f"{key}/attribute+verify"] = _digest(_answer_record(gen.attribute(prompt, GIVEN, verify=True)))
        out[f"{key}/score"] = _digest(_answer_record(gen.score(prompt)))
    restacker = Restacker(Generator("smollm2-135m", method="baseline", dtype=dtype), "baseline")
    prompt = restacker.prompt(QUESTION, list(reversed(_passages())), max_new_tokens=16)
    out[f"smollm2/restack/{dtype}"] = _digest(_answer_record(restacker.generate(prompt, max_new_tokens=16)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path)
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text())["cases"] for p in args.compare)
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        print(f"{len(a)} cases before, {len(b)} after, {len(differ)} differ" + "".join(f"\n  {k}" for k in differ))
        sys.exit(1 if differ else 0)
    torch.manual_seed(0)
    cases: dict[str, str] = {}
    for dtype in ("float32", "bfloat16"):
        cases |= tiny_cases(dtype)
        cases |= smollm2_cases(dtype)
    record = {"cases": cases, "all": _digest(cases), "torch": torch.__version__}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text)
    print(f"{len(cases)} cases, digest {record['all']}")


if __name__ == "__main__":
    main()
