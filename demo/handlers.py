"""The demo page's event handlers and its one rendering step. Imported only by `midlens.demo.app` while it
builds a page: it imports gradio at the top, which loads slowly."""

from __future__ import annotations

from typing import Any

import gradio as gr

from midlens.demo import check_views, views
from midlens.demo.backend import DemoBackend, UserError
from midlens.rag.check_options import CheckOptions

# Gradio spots progress-reporting handlers by a gr.Progress default and gives each call its own tracker.
TRACKED = gr.Progress(track_tqdm=True)
OUTPUTS = 10  # render()'s values, in the order of app.Results.outputs


def render(result: dict | None, view: str) -> tuple:
    """A request's result -> the values of the page's result components, in app.Results.outputs order."""
    if not result:
        return tuple(gr.skip() for _ in range(OUTPUTS))
    answers, gold, known = result["answers"], result["gold"], result.get("known", [])
    main = answers[0]
    base = answers[1] if result["compared"] else None
    scale = views.heat_scale(answers, view)  # one scale for both columns: the same colour is the same score
    # Each column's prefix keeps its sentence ids apart, so pointing at one answer marks only its own passages.
    return (
        views.answer_markdown(main, view, known, "m"),
        views.passages_html(main, view, gold, scale, "m"),
        "" if base is None else views.answer_markdown(base, view, known, "b"),
        "" if base is None else views.passages_html(base, view, gold, scale, "b"),
        views.comparison_markdown(answers, view, gold),
        gr.Dataframe(views.evidence_table(answers, view), column_widths=views.table_column_widths(len(answers))),
        gr.LinePlot(
            views.position_frame(answers, view),
            y_lim=views.evidence_limits(answers, view),
            y_title=views.EVIDENCE_AXIS_TITLES[view],
        ),
        gr.BarPlot(views.attribution_frame(main), y_lim=views.share_limits(main)),
        views.legend_html(scale, len(main.passages)),
        views.details_markdown(answers),
    )


def render_check(result: dict) -> tuple:
    """A checked answer -> the check tab's values: the answer with its links and verdicts, the passages it was read
    over (each sentence a span its links point at), and one row per (answer sentence, passage it rests on)."""
    answer = result["answer"]
    return (
        check_views.checked_markdown(answer),
        views.passages_html(answer, "calibrated", result["gold"], None, check_views.PREFIX),
        gr.Dataframe(check_views.sentence_table(answer), column_widths=check_views.TABLE_WIDTHS),
    )


def _user_error(err: UserError) -> gr.Error:
    return gr.Error(str(err), title="Cannot answer", print_exception=False)


class Handlers:
    """One backend's handlers. A backend UserError becomes a message in the page, never a traceback."""

    def __init__(self, backend: DemoBackend):
        self.backend = backend

    def load(self, progress: gr.Progress = TRACKED) -> str:
        try:
            return self.backend.prepare(progress)
        except UserError as err:
            raise _user_error(err) from None
        except Exception as err:  # model or index missing on this machine: say so in the page
            raise gr.Error(f"Startup failed: {err}", title="Cannot start", print_exception=False) from None

    def model(self, model: str, method: str) -> gr.Dropdown:
        offered = self.backend.methods_of(model)
        chosen = method if method in offered else self.backend.default_method_of(model)
        return gr.Dropdown(choices=offered, value=chosen)

    def restack_default(self, model: str, method: str) -> bool:
        """The "Re-order" switch for a newly chosen model or method: on where the demo's options restack (by default
        where restacking was measured to help)."""
        return self.backend.restacks(model, method)

    def upload(self, corpus_file: str | None, progress: gr.Progress = TRACKED) -> str:
        try:
            retriever, label = self.backend.retriever(corpus_file, progress)
        except UserError as err:
            raise _user_error(err) from None
        except Exception as err:  # CorpusError, RetrievalIndexError: a message about the file
            raise gr.Error(str(err), title="Cannot use this corpus", print_exception=False) from None
        return f"Corpus: {label} ({len(retriever)} passages). Questions now retrieve from it."

    def view(self, result: dict | None, view: str) -> tuple:
        return render(result, view)

    def cleared(self) -> str:
        return f"Corpus: {self.backend.corpus_label()}."

    def check(
        self,
        question: str,
        answer: str,
        pasted: str,
        model: str,
        top_k: float,
        corpus_file: str | None,
        verify: bool = CheckOptions.verify,
        progress: gr.Progress = TRACKED,
    ) -> tuple[Any, ...]:
        try:
            result = self.backend.check(
                question, answer, pasted, model, top_k, corpus_file, verify=bool(verify), progress=progress
            )
        except UserError as err:
            raise gr.Error(str(err), title="Cannot check", print_exception=False) from None
        return render_check(result)

    def ask(
        self,
        question: str,
        model: str,
        method: str,
        compare: bool,
        top_k: float,
        view: str,
        corpus_file: str | None,
        max_new_tokens: float,
        check_citations: bool = False,
        restack: bool = False,
        abstain: bool = False,
        progress: gr.Progress = TRACKED,
    ) -> tuple[Any, ...]:
        if compare and method == "baseline":
            gr.Warning("Side by side compares baseline with another method: pick any method but baseline to see both.")
        try:
            result = self.backend.ask(
                question,
                model,
                method,
                compare,
                top_k,
                corpus_file,
                max_new_tokens,
                check_citations=bool(check_citations),
                restack=bool(restack),
                abstain=bool(abstain),
                progress=progress,
            )
        except UserError as err:
            raise _user_error(err) from None
        return (*render(result, view), result)
