"""`midlens demo`'s page: a Gradio page on 127.0.0.1 over the demo backend (`midlens.demo.backend`).

Ask a question over the embedded HotpotQA corpus (or an uploaded one), read the answer, see each
retrieved passage in prompt order shaded by how much attention it received, and run baseline and a
position-aware method side by side on the same passages. The page is a thin shell: every number it
shows comes from `Pipeline.retrieve` / `Pipeline.answer`; one model is loaded once and methods share it.

    demo = create_demo(pipeline)                  # reuse a Pipeline you already have
    launch(demo, port=7860)                       # blocks; prevent_thread_lock=True for tests
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from midlens.demo.backend import (
    DEFAULT_MAX_UPLOAD_MB,
    HOST,
    MAX_NEW_TOKENS,
    MAX_TOP_K,
    UPLOAD_SUFFIXES,
    DemoBackend,
    UserError,
    _size,
)

if TYPE_CHECKING:  # gradio and torch load slowly: only the demo itself imports them
    import gradio as gr

    from midlens.rag.pipeline import Pipeline

CSS = """
#passages, #baseline-passages { font-size: 0.92em; line-height: 1.5; }
#passages .text, #baseline-passages .text { word-break: normal; overflow-wrap: anywhere; }
#passages .score-token:not(.highlighted) .text, #baseline-passages .score-token:not(.highlighted) .text {
  font-weight: 600;
}
#examples { gap: 6px; }
#examples button.example { white-space: normal; text-align: left; justify-content: flex-start; height: auto; }
#scores-table th .header { word-break: normal; overflow-wrap: normal; hyphens: none; }
"""
POSITIONS = [str(i) for i in range(1, MAX_TOP_K + 1)]  # explicit order: "10" must not sort before "2"


def render(result: dict | None, view: str) -> tuple:
    """A request's result -> the values of the page's result components, in OUTPUT order."""
    import gradio as gr

    from midlens.demo import views

    if not result:
        return tuple(gr.skip() for _ in range(8))
    answers, gold = result["answers"], result["gold"]
    main = answers[0]
    base = answers[1] if result["compared"] else None
    return (
        views.answer_markdown(main),
        views.highlighted(main, view, gold),
        "" if base is None else views.answer_markdown(base),
        None if base is None else views.highlighted(base, view, gold),
        views.comparison_markdown(answers, view, gold),
        gr.Dataframe(views.evidence_table(answers, view), column_widths=views.table_column_widths(len(answers))),
        gr.LinePlot(
            views.position_frame(answers, view),
            y_lim=views.evidence_limits(answers, view),
            y_title=views.EVIDENCE_AXIS_TITLES[view],
        ),
        gr.BarPlot(views.attribution_frame(main), y_lim=views.share_limits(main)),
    )


def create_demo(pipeline: Pipeline | None = None, **backend_options: Any) -> gr.Blocks:
    """The page, with its queue set up. Pass an existing Pipeline to share its model and index."""
    return build_blocks(DemoBackend(pipeline, **backend_options))


def build_blocks(backend: DemoBackend) -> gr.Blocks:
    import gradio as gr

    from midlens.demo import views

    # Gradio spots progress-reporting handlers by a gr.Progress default and gives each call its own tracker.
    tracked = gr.Progress(track_tqdm=True)

    def user_error(err: UserError) -> gr.Error:
        return gr.Error(str(err), title="Cannot answer", print_exception=False)

    def on_load(progress: gr.Progress = tracked) -> str:
        try:
            return backend.prepare(progress)
        except UserError as err:
            raise user_error(err) from None
        except Exception as err:  # model or index missing on this machine: say so in the page
            raise gr.Error(f"Startup failed: {err}", title="Cannot start", print_exception=False) from None

    def on_model(model: str, method: str) -> gr.Dropdown:
        offered = backend.methods_of(model)
        return gr.Dropdown(choices=offered, value=method if method in offered else "baseline")

    def on_upload(corpus_file: str | None, progress: gr.Progress = tracked) -> str:
        try:
            retriever, label = backend.retriever(corpus_file, progress)
        except UserError as err:
            raise user_error(err) from None
        except Exception as err:  # CorpusError, RetrievalIndexError: a message about the file
            raise gr.Error(str(err), title="Cannot use this corpus", print_exception=False) from None
        return f"Corpus: {label} ({len(retriever)} passages). Questions now retrieve from it."

    def on_ask(
        question: str,
        model: str,
        method: str,
        compare: bool,
        top_k: float,
        view: str,
        corpus_file: str | None,
        max_new_tokens: float,
        progress: gr.Progress = tracked,
    ) -> tuple:
        if compare and method == "baseline":
            gr.Warning("Side by side compares baseline with another method: pick any method but baseline to see both.")
        try:
            result = backend.ask(question, model, method, compare, top_k, corpus_file, max_new_tokens, progress)
            return (*render(result, view), result)
        except UserError as err:
            raise user_error(err) from None

    def on_view(result: dict | None, view: str) -> tuple:
        return render(result, view)

    examples = views.example_questions()
    with gr.Blocks(title="midlens demo") as demo:
        gr.Markdown(
            "# midlens: what did the model read?\n"
            "Ask a question: midlens retrieves passages, stacks them into one prompt and answers. Each passage "
            "below is shaded by the attention it received (red = more than a content-free question gives it, "
            "purple = less, per query). Small models lose passages in the middle of the prompt; "
            "**side by side** runs a position-aware method against baseline on the very same passages."
        )
        with gr.Row():
            with gr.Column(scale=3):
                question = gr.Textbox(
                    label="Question", lines=2, placeholder="Ask about the corpus...", elem_id="question"
                )
                # Buttons, not gr.Examples: its textbox samples are cut at 60 characters, and a question
                # that cannot be read whole is no example.
                with gr.Column(elem_id="examples"):
                    gr.Markdown("Example questions (embedded HotpotQA):")
                    for q, note in examples:
                        button = gr.Button(f"{q} — {note}", size="sm", variant="secondary", elem_classes="example")
                        button.click(lambda q=q: q, None, question, api_visibility="private", queue=False)
                ask = gr.Button("Ask", variant="primary", elem_id="ask")
            with gr.Column(scale=2):
                with gr.Row():
                    model = gr.Dropdown(backend.models, value=backend.model, label="Model")
                    method = gr.Dropdown(backend.methods_of(backend.model), value=backend.method, label="Method")
                compare = gr.Checkbox(label="Side by side: baseline vs this method, same passages", value=False)
                top_k = gr.Slider(1, MAX_TOP_K, value=backend.top_k, step=1, label="Passages (top-k)")
                view = gr.Radio(list(views.SCORE_VIEWS), value="calibrated", label="Evidence scores")
                with gr.Accordion("Corpus and answer length", open=False):
                    corpus = gr.File(
                        label=f"Corpus (.txt, .md or .jsonl, up to {_size(backend.max_upload_bytes)})",
                        file_types=list(UPLOAD_SUFFIXES),
                        type="filepath",
                    )
                    max_new = gr.Slider(1, MAX_NEW_TOKENS, value=backend.max_new_tokens, step=1, label="Max new tokens")
        status = gr.Markdown(f"Loading model {backend.model} and the retrieval index...", elem_id="status")
        with gr.Row():
            with gr.Column():
                main_md = gr.Markdown(label="Answer", elem_id="answer")
                main_ht = gr.HighlightedText(
                    label="Passages in prompt order, shaded by evidence (normalised per query)",
                    show_legend=True,
                    elem_id="passages",
                )
            with gr.Column(visible=False) as base_col:
                base_md = gr.Markdown(label="Baseline answer", elem_id="baseline-answer")
                base_ht = gr.HighlightedText(
                    label="Baseline on the same passages", show_legend=True, elem_id="baseline-passages"
                )
        compare_md = gr.Markdown(label="Gold or top passage rank", elem_id="ranks")
        # No fixed plot heights: a fixed one is shared by the label, the axes and the legend, and cuts off
        # whatever comes last (the method legend, the position labels). Sized to content, nothing is clipped.
        with gr.Row(equal_height=True):
            position_plot = gr.LinePlot(
                x="position",
                y="evidence",
                color="method",
                sort=POSITIONS,
                x_title="prompt position",
                y_title=views.EVIDENCE_AXIS_TITLES["calibrated"],
                color_title="method",
                label="Evidence by prompt position",
                elem_id="position-plot",
            )
            attribution_plot = gr.BarPlot(
                x="position",
                y="share",
                sort=POSITIONS,
                tooltip=["position", "passage", "share"],
                y_lim=[0, None],  # bars start at zero to compare by length (render sets the top)
                x_title="prompt position",
                y_title="share of the answer's attention",
                label="Answer attribution: share of the answer tokens' attention per passage",
                elem_id="attribution-plot",
            )
        table = gr.Dataframe(label="Scores per passage", interactive=False, wrap=True, elem_id="scores-table")
        state = gr.State(None)

        outputs = [main_md, main_ht, base_md, base_ht, compare_md, table, position_plot, attribution_plot]
        inputs = [question, model, method, compare, top_k, view, corpus, max_new]
        ask.click(on_ask, inputs, [*outputs, state], api_name="ask")
        question.submit(on_ask, inputs, [*outputs, state], api_visibility="private")
        view.change(on_view, [state, view], outputs, api_visibility="private", queue=False)
        model.change(on_model, [model, method], method, api_visibility="private", queue=False)
        compare.change(lambda c: gr.Column(visible=c), compare, base_col, api_visibility="private", queue=False)
        corpus.upload(on_upload, corpus, status, api_visibility="private")
        corpus.clear(lambda: f"Corpus: {backend.corpus_label()}.", None, status, api_visibility="private")
        demo.load(on_load, None, status, api_visibility="private")
    # Generation is serialised per model by its lock; two workers let a second visitor's retrieval,
    # rendering and queue position proceed meanwhile, each with its own result.
    demo.queue(default_concurrency_limit=2, max_size=32)
    return demo


def launch(
    demo: gr.Blocks,
    port: int | None = None,
    prevent_thread_lock: bool = False,
    max_upload_mb: float = 0,
    host: str = HOST,
):
    """Serve on `host` (127.0.0.1 unless asked). Gradio's own upload cap is a backstop well above the demo's
    message limit."""
    import gradio as gr

    cap = max(max_upload_mb, DEFAULT_MAX_UPLOAD_MB) * 8
    return demo.launch(
        server_name=host,
        server_port=port,
        prevent_thread_lock=prevent_thread_lock,
        theme=gr.themes.Soft(),
        css=CSS,
        max_file_size=f"{cap:.0f}mb",
        footer_links=["api"],
    )
