"""The demo page's answering controls, spelt from AnswerOptions (rag/options.py) as the command line's flags are
(rag/option_fields.py): each option the demo spells (`spelt_by("demo")`) is a control that starts at the demo's
options (AnswerOptions' defaults, unless the demo was started with others) and keeps within the option's bounds. A
changed default or bound reaches the page as it reaches `midlens ask --help`; what the page keeps is its own words
for each control (LABELS): the options' help is written for a command line and an API ("a method spec, or None"),
which a visitor of the page should not have to read under a tick-box. Imported only while a page is built (it
imports gradio)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from midlens.demo.backend import MAX_NEW_TOKENS, MAX_TOP_K
from midlens.rag.check_options import CheckOptions
from midlens.rag.options import AnswerOptions, option_info

# The page's name for each option it spells: a visitor reads what the control does, not `top_k`. The page's other
# words (the citation legend's 'tick "Check citations"') and docs/guide.md name the controls by these.
LABELS = {
    "top_k": "How many passages to give the model",
    "max_new_tokens": "Longest answer (tokens)",
    "restack": "Re-order the passages first: the ones the model judges most relevant go where it reads best",
    "verify": "Check citations: answer again without each cited passage (slower)",
    "abstain": "Say so instead of answering when the passages do not seem to support an answer",
}
# The page's range for a number where it is narrower than the option's: each passage and each answer token costs a
# shared machine time, and the page always answers (no new tokens would only score the passages, which it does not
# show). None: the option's own bound.
PAGE_RANGES: dict[str, tuple[int | None, int]] = {"top_k": (None, MAX_TOP_K), "max_new_tokens": (1, MAX_NEW_TOKENS)}


def control(
    options: AnswerOptions | CheckOptions,
    name: str,
    value: Any = None,
    label: str | None = None,
    elem_id: str | None = None,
) -> gr.Checkbox | gr.Slider | gr.Dropdown:
    """The control for the option `name`, starting at `value` (None: the demo's options' own; for `restack`, whether
    they restack): a switch for yes or no, a menu for a word from a list, a whole-number slider within the option's
    bounds and the page's (PAGE_RANGES). `label`: the page's name for it
    (LABELS unless given, e.g. the check tab's own words)."""
    info = option_info(name, type(options))
    value = getattr(options, name) if value is None else value
    shown = {"label": label or LABELS[name], "elem_id": elem_id}
    if isinstance(value, bool):
        return gr.Checkbox(value=value, **shown)
    if info.choices:
        return gr.Dropdown(list(info.choices), value=value, **shown)
    low, high = PAGE_RANGES[name]
    lowest = max(b for b in (info.ge, low) if b is not None)
    return gr.Slider(int(lowest), high, value=value, step=1, **shown)
