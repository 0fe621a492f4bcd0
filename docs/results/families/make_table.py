"""The model-family table of the README and guide, generated: each family of tests/tiny.py (the ones
tests/test_families.py verifies against transformers) and each registered method, read from the registry's own
`support_on`. `python docs/results/families/make_table.py` writes docs/results/families/table.md beside it;
tests/test_families.py fails when the committed table differs from what this makes.

"yes" cells run as the model comes (tests/test_families.py runs each of them through the probe = applied check);
"train" cells are trained methods, which run once `midlens train NAME --model PATH` made an artefact for the model
(MuDAF's training is run on two new families in the fast tier); "no" cells are refused with the reason given."""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for tests.tiny

from midlens.generators.attention.anatomy import model_anatomy  # noqa: E402
from midlens.generators.methods.registry import support_on  # noqa: E402
from midlens.generators.models.loading import load_model, release_model  # noqa: E402
from tests.tiny import FAMILIES, save_tiny  # noqa: E402


def rows() -> list[tuple[str, str, str, dict[str, str | None]]]:
    """(family, transformers class, what its layers do, method -> None or the reason it does not run)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in FAMILIES:
            loaded = load_model(str(save_tiny(name, Path(tmp) / name)), "cpu", "float32")
            kinds = list(dict.fromkeys(a.describe() for a in model_anatomy(loaded.model)))
            out.append((name, loaded.model.config.architectures[0], "; ".join(kinds), support_on(loaded)))
            release_model(loaded)
    return out


def table() -> str:
    found = rows()
    methods = list(found[0][3])
    reasons: dict[str, int] = {}
    lines = [
        "| family | class | what its attention does (tiny test shape) | " + " | ".join(methods) + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for name, cls, anatomy, support in found:
        cells = []
        for method in methods:
            why = support[method]
            if why is None or why.startswith("needs an artefact trained for this model"):
                cells.append("yes" if why is None else "train")
                continue
            number = reasons.setdefault(why, len(reasons) + 1)
            cells.append(f"no ({number})")
        lines.append(f"| {name} | {cls} | {anatomy} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"({n}) {why}." for why, n in reasons.items()]
    return "\n".join(lines) + "\n"


TABLE = Path(__file__).with_name("table.md")

if __name__ == "__main__":
    TABLE.write_text(table())
    print(f"wrote {TABLE}")
