"""What a method is: the one value each method module exports (`METHOD = Method(...)`).

A method changes attention through the parts it builds for the one attention module (`MethodParts`: a
`RotaryScheme` per layer, whose `rotate`, `key_bias`, `mixing_weights` and `attend` are the seams, an optional
weight delta, an optional answering hook). Everything else a shell needs to offer it is declared here, typed,
so nothing about a method is read from a module by attribute name:

    METHOD = Method(
        name="my-method", summary="what it does, in one line",
        defaults={"strength": 1.0}, check=check_options, build=build,
    )

Built-in methods are listed in `generators.methods.registry`; a method in another package registers through
the entry point group `midlens.methods` (`my-method = "my_package.module:METHOD"`) and is then offered by
`ask`, `eval`, `methods` and the demo like a built-in one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from midlens.generators.methods.install import MethodParts
    from midlens.generators.models.loading import LoadedModel

Options = dict[str, Any]


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    build: Callable[[LoadedModel, Options], MethodParts]  # (loaded model, merged options) -> parts
    defaults: Options = field(default_factory=dict)
    check: Callable[[Options], None] | None = None  # raises MethodConfigError on a bad combination of options
    # Methods with an `artefact` option: the folder under generators/trained/<name>/ that (model name, options)
    # reads when no artefact is given. None: the model's name (MuDAF keeps one folder per alpha).
    shipped_name: Callable[[str, Options], str] | None = None
    # Methods with an `artefact` option that some options make unnecessary (channel-scaling given its channel,
    # layers and scale): whether these options, with no artefact given, still read one, and which options spare
    # it (for messages). None: options without an artefact always read the shipped one.
    reads_artefact: Callable[[Options], bool] | None = None
    artefact_free: str | None = None
    # `midlens bench NAME`: the specs timed against the baseline, and the default prompt sizes (tokens).
    bench_variants: tuple[str, ...] = ()
    bench_tokens: tuple[int, ...] = (2048,)
    # `midlens methods NAME`: what the method shows of itself on a loaded model, (Generator, prompts, out folder or
    # None) -> lines to print; it may write figures into the folder. None: its options say all there is.
    inspect: Callable[[Any, list, Path | None], list[str]] | None = None
    # `midlens train NAME`: the module holding the method's training recipe (`RECIPE`, midlens.training.recipe),
    # named, not imported: training sits above this layer. None: the method learns nothing.
    trainer: str | None = None
    # Why the method cannot run on a loaded model (a reason naming what the model's layers do that the method's
    # parts do not handle), or None when it can: read from the layers' anatomy (`generators.attention.anatomy`), never
    # from a family name. `build_parts` refuses with it; `midlens methods --model` lists it. None: runs on every model.
    unsupported: Callable[[Any], str | None] | None = None
    # Where on a loaded model the method acts when it runs but not on every layer (RoPE methods leave NoPE layers as
    # they are), for `midlens methods --model`; None: wherever it runs, on every layer.
    scope: Callable[[Any], str | None] | None = None
    # About how many plain answers' compute one answer costs, from the options alone (Attention Buckets: one per
    # RoPE base), so a server can refuse a request's options before building anything. None: about one.
    cost: Callable[[Options], float] | None = None
