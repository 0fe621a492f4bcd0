"""A method from another package: one module and one entry point, then `ask`, `eval`, `methods` and the demo
offer it like a built-in one.

The package is real and really installed (`pip install --target`, then found on PYTHONPATH by its metadata);
its method is a training-free score change, a linear recency bias on the keys (ALiBi-like), written only
against the method contract (`Method`, `MethodParts`, `RotaryScheme.key_bias`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip and subprocess runs of the command line

PLUGIN = '''
"""Keys further from the query lose `slope` logits per token: a training-free recency bias."""

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method
from midlens.generators.attention.rope import RotaryScheme


class RecencyScheme(RotaryScheme):
    def __init__(self, inv_freq, num_heads, num_kv_heads, slope):
        super().__init__(inv_freq, num_heads, num_kv_heads)
        self.slope = slope

    def key_bias(self, past, length, total):
        queries = torch.arange(past, past + length, device=self.inv_freq.device)[:, None]
        keys = torch.arange(total, device=self.inv_freq.device)[None, :]
        return (-self.slope * (queries - keys).clamp(min=0).float())[None, None]


def check(options):
    if not isinstance(options["slope"], (int, float)) or options["slope"] < 0:
        raise MethodConfigError(f"recency-bias slope={options['slope']!r}: a number >= 0.")


def build(loaded, options):
    cfg = loaded.model.config
    inv_freq = loaded.model.model.rotary_emb.inv_freq
    schemes = [
        RecencyScheme(inv_freq, cfg.num_attention_heads, cfg.num_key_value_heads, float(options["slope"]))
        for _ in range(cfg.num_hidden_layers)
    ]
    return MethodParts(schemes)


METHOD = Method("recency-bias", "keys lose slope logits per token of distance", build=build,
                defaults={"slope": 0.01}, check=check)
'''

PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "midlens-recency-bias"
version = "0.1.0"

[project.entry-points."midlens.methods"]
recency-bias = "midlens_recency_bias:METHOD"
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("plugin-src")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "midlens_recency_bias.py").write_text(textwrap.dedent(PLUGIN))
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, source],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def run(plugin_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(plugin_path)}
    return subprocess.run([*args], capture_output=True, text=True, env=env, timeout=900, check=False)


def test_an_installed_method_is_offered_everywhere(plugin_path):
    listed = run(
        plugin_path,
        sys.executable,
        "-c",
        "from midlens.demo.backend import DemoBackend; from midlens.core.method_spec import method_names;"
        "print(method_names()); print(DemoBackend().methods_of('smollm2-135m'))",
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    names, offered = listed.stdout.strip().splitlines()[-2:]
    assert "recency-bias" in names  # the command line accepts it, read without importing torch
    assert "recency-bias" in offered  # the demo's menu for a packaged model

    shown = run(plugin_path, sys.executable, "-m", "midlens.cli", "methods")
    assert shown.returncode == 0 and "recency-bias" in shown.stdout and "slope" in shown.stdout, shown.stderr[-2000:]


def test_ask_and_eval_run_an_installed_method(plugin_path, tmp_path):
    cli = (sys.executable, "-m", "midlens.cli")
    question = "What film is a sequel to a German romantic fantasy film featuring Bruno Ganz and Solveig Dommartin?"
    common = ("--model", "smollm2-135m", "--max-new-tokens", "8")
    spec = "recency-bias(slope=0.05)"
    asked = run(plugin_path, *cli, "ask", question, "--json", "--top-k", "3", "--method", spec, *common)
    assert asked.returncode == 0, asked.stderr[-2000:]
    answer = json.loads(asked.stdout)
    assert answer["method"] == {"name": "recency-bias", "slope": 0.05} and len(answer["passages"]) == 3
    baseline = run(plugin_path, *cli, "ask", question, "--json", "--top-k", "3", *common)
    # A bias of 0.05 logits per token over a ~700-token prompt changes what the model reads: the evidence moves.
    assert json.loads(baseline.stdout)["passages"] != answer["passages"]

    bad = run(plugin_path, *cli, "ask", question, "--method", "recency-bias(slope=-1)", *common)
    assert bad.returncode != 0 and "recency-bias slope=-1" in bad.stderr and "Traceback" not in bad.stderr

    out = tmp_path / "sweep"
    swept = run(
        plugin_path, *cli, "eval", "sweep", "--dataset", "kv", "--k", "3", "--n", "1", "--positions", "1",
        "--methods", "baseline,recency-bias", "--out", str(out), "--no-progress", "--model", "smollm2-135m",
        "--max-new-tokens", "8",
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr[-2000:]
    rows = [json.loads(line) for p in out.glob("*.jsonl") for line in p.read_text().splitlines() if line.strip()]
    assert {r["method"].split("(")[0] for r in rows} >= {"baseline", "recency-bias"}
