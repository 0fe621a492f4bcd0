"""The house rules that keep the layers apart, checked on the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from midlens.core.defaults import METHODS

# The baseline is the identity every method is measured against (reports pair with it, the demo shows it beside
# another method); comparing with it is not branching on a method's behaviour.
BRANCHED = set(METHODS) - {"baseline"}
ROOT = Path(__file__).resolve().parent.parent
SHELLS = ["midlens", "eval", "demo", "serve", "training", "rag"]


def _branches_on_a_method_name(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants naming a method inside a comparison (`x == "ms-poe"`, `name in ("mudaf", ...)`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                for const in ast.walk(part):
                    if isinstance(const, ast.Constant) and const.value in BRANCHED:
                        found.append((node.lineno, const.value))
        elif isinstance(node, ast.match_case):
            for const in ast.walk(node.pattern):
                if isinstance(const, ast.Constant) and const.value in BRANCHED:
                    found.append((node.pattern.lineno, const.value))
    return found


def test_no_shell_branches_on_a_method_name():
    """A method's behaviour lives in its registry entry; shells ask the registry instead of testing names."""
    offenders = []
    for folder in SHELLS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, name in _branches_on_a_method_name(ast.parse(path.read_text(encoding="utf-8"))):
                offenders.append(f"{path.relative_to(ROOT)}:{line} tests for {name!r}")
    assert not offenders, "\n".join(offenders)


def test_the_builtin_method_names_are_the_registry_s():
    """core.defaults.METHODS lets `--help` list methods without loading torch; it must be the registry's list."""
    from midlens.generators.methods.registry import REGISTRY

    assert tuple(name for name in REGISTRY if name in METHODS) == METHODS
    assert set(METHODS) <= set(REGISTRY)


def test_lower_layers_never_import_higher_ones():
    order = {
        **{"core": 0, "retrievers": 1, "generators": 1, "rag": 2},
        **{"training": 3, "eval": 3, "demo": 3, "serve": 3, "midlens": 4},
    }
    offenders = []
    for folder, level in order.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[0] != "midlens" or len(parts) < 2 or parts[1] not in order:
                        continue
                    target = parts[1]
                    if order[target] > level or (order[target] == level and target != folder and level > 0):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports midlens.{target}")
    assert not offenders, "\n".join(offenders)


# generators/ in rooms, bottom up: the attention module and its arithmetic; a model loaded and checked against
# transformers, its prompts; the methods installed on the attention; answering (decoding, evidence per passage,
# citations, support, checking). A room imports its own modules and the rooms below it, never one above.
ROOMS = ("attention", "models", "methods", "answering")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def test_generators_rooms_import_only_their_own_and_lower_rooms():
    """Every generators module lives in one of the four rooms, and its imports (type-only ones included) reach its
    own room or a lower one."""
    rooms = {room: level for level, room in enumerate(ROOMS)}
    offenders, homeless = [], []
    for path in sorted((ROOT / "generators").rglob("*.py")):
        parts = path.relative_to(ROOT / "generators").parts
        if len(parts) == 1:  # the package's own __init__: the public API over every room
            assert parts == ("__init__.py",), parts
            continue
        if parts[0] not in rooms:
            homeless.append(str(path.relative_to(ROOT)))
            continue
        level = rooms[parts[0]]
        for line, name in _imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            target = name.split(".")
            if target[:2] == ["midlens", "generators"] and len(target) > 2 and target[2] in rooms:
                if rooms[target[2]] > level:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not homeless, f"modules outside the rooms {ROOMS}: {homeless}"
    assert not offenders, "\n".join(offenders)


def test_the_import_graph_inside_each_room_has_no_cycle():
    """Within a room imports flow one way: the module graph (runtime and type-only imports) is acyclic."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "generators").rglob("*.py")):
        module = "midlens." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        graph[module.removesuffix(".__init__")] = set()
    for path in sorted((ROOT / "generators").rglob("*.py")):
        module = ("midlens." + ".".join(path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for _line, name in _imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            if name in graph and name != module and not module.endswith("generators"):
                graph[module].add(name)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*trail, node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            raise AssertionError(" -> ".join(cycle))


def test_shells_reach_a_method_only_through_the_registry():
    """No shell imports a method's own module (generators/methods/<name>.py); the one exception is the training
    module its registry entry names as its trainer, which is that method's code."""
    from midlens.generators.methods.registry import REGISTRY

    trainers = {m.trainer for m in REGISTRY.values() if m.trainer}
    offenders = []
    for folder in SHELLS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts if parts[0] == "midlens" else ("midlens", *parts))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("midlens.generators.methods."):
                    if node.module != "midlens.generators.methods.registry" and module not in trainers:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert not offenders, "\n".join(offenders)


def test_experiment_scripts_under_docs_results_import_what_exists():
    """The scripts that produced docs/results import the installed package: every module and name they import
    from midlens exists (they once imported top-level `eval.`, `rag.` paths that no longer do)."""
    import importlib

    missing = []
    for path in sorted((ROOT / "docs" / "results").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                continue
            for module in modules:
                if module.split(".")[0] in {"eval", "rag", "generators", "retrievers", "core", "demo", "training"}:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module} (not midlens.{module})")
                    continue
                if not module.startswith("midlens"):
                    continue
                loaded = importlib.import_module(module)
                missing += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {module}.{n}" for n in names if not hasattr(loaded, n)
                ]
    assert not missing, "\n".join(missing)


def _library_strings(folder: str) -> list[tuple[str, str]]:
    """(file:line, text) of every string in a folder's source but its docstrings: what its messages are made of."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.value))
    return found


def test_no_layer_below_the_shells_names_a_command():
    """An error, a reason or a help text below the shells names the step to run as a `core.errors.Step`, which
    each shell words its own way; a `midlens <command>` written there would be the command line's words in every
    interface (a Python caller told to run a shell command). The commands are the parser's own, not a list here."""
    from midlens.cli import build_parser

    parser = build_parser()
    names = parser._subparsers._group_actions[0].choices  # argparse keeps the subcommands only there
    command = re.compile(rf"\bmidlens ({'|'.join(map(re.escape, names))})\b")
    offenders = [
        f"{where}: {text[:100]!r}"
        for folder in ("core", "retrievers", "generators", "training")
        for where, text in _library_strings(folder)
        if command.search(text)
    ]
    assert not offenders, "\n".join(offenders)
