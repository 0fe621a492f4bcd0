"""`midlens demo`'s page: a Gradio page on 127.0.0.1 over the demo backend (`midlens.demo.backend`).

Ask a question over the embedded HotpotQA corpus (or an uploaded one), read the answer, see each
retrieved passage in prompt order shaded by how much attention it received, and run baseline and a
position-aware method side by side on the same passages. The "Check an answer" tab reads an answer written
elsewhere over pasted or retrieved passages (`Pipeline.check`) and links each sentence to the passage it rests on.
The page is a thin shell: every number it shows comes from `Pipeline.retrieve` / `Pipeline.answer` /
`Pipeline.check`; one model is loaded once and methods share it.

    demo = create_demo(pipeline)                  # reuse a Pipeline you already have
    launch(demo, port=7860)                       # blocks; prevent_thread_lock=True for tests
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from midlens.demo.backend import (
    DEFAULT_MAX_UPLOAD_MB,
    HOST,
    MAX_TOP_K,
    UPLOAD_SUFFIXES,
    DemoBackend,
    _size,
)

if TYPE_CHECKING:  # gradio and torch load slowly: only the demo itself imports them
    import gradio as gr

    from midlens.demo.handlers import Handlers
    from midlens.rag.pipeline import Pipeline

CSS = """
#examples { gap: 6px; }
#examples button.example { white-space: normal; text-align: left; justify-content: flex-start; height: auto; }
#scores-table th .header { word-break: normal; overflow-wrap: normal; hyphens: none; }
#answer, #baseline-answer {
  border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 4px 14px;
  background: var(--block-background-fill);
}
.heat-legend { display: flex; align-items: flex-start; gap: 10px; flex-wrap: wrap; font-size: 0.92em; }
.heat-legend .legend-title { font-weight: 600; margin-right: 6px; }
.heat-legend .legend-end { display: inline-flex; flex-direction: column; align-items: center; }
.heat-legend .legend-end small { color: var(--body-text-color-subdued); font-size: 0.8em; }
.heat-legend .legend-bar { width: 180px; height: 14px; margin-top: 3px; border: 1px solid #ccc; border-radius: 3px; }
.passage-list { font-size: 0.92em; line-height: 1.5; padding-top: 30px; }  /* clear of the block's label */
.passage { margin-bottom: 10px; }
.passage-head { font-weight: 600; margin-bottom: 2px; }
.passage-text { padding: 2px 4px; border-radius: 3px; overflow-wrap: anywhere; }
.psent.cited { border-bottom: 1px dotted #6b7280; }
.psent.cite-hl, .psent.cite-picked {
  background: rgba(250, 204, 21, 0.8); outline: 2px solid #a16207; border-radius: 2px; border-bottom: none;
}
.asent { cursor: pointer; border-radius: 3px; text-underline-offset: 4px; text-decoration-thickness: 2px; }
.asent.cite-ok { text-decoration: underline solid #15803d; }
.asent.cite-shapes { text-decoration: underline double #b45309; }
.asent.cite-unchecked { text-decoration: underline dashed #6b7280; }
.asent.cite-failed { text-decoration: underline dotted #b91c1c; }
.asent:hover, .asent:focus-visible, .asent.cite-selected { background: rgba(250, 204, 21, 0.45); outline: none; }
sup.cite { font-size: 0.8em; margin-left: 2px; padding: 0 1px; font-weight: 600; }
sup.cite.cite-ok { color: #15803d; border-bottom: 2px solid #15803d; }
sup.cite.cite-shapes { color: #b45309; border-bottom: 3px double #b45309; }
sup.cite.cite-unchecked { color: #4b5563; border-bottom: 2px dashed #9ca3af; }
sup.cite.cite-failed { color: #b91c1c; border-bottom: 2px dotted #b91c1c; }
.cite-legend {
  display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.85em; color: var(--body-text-color-subdued);
}
"""
# Answer sentences name the passage sentences they cite (`data-cites`, ids from views.sentence_id). Pointing at or
# focusing one marks them (cite-hl); clicking one keeps them marked (cite-picked) until another click, and brings
# the first into view, since the passages sit below the answer. One listener on the document survives every
# re-render of the answer and passages.
HEAD = """<script>
(() => {
  const mark = (s, cls, on) => {
    for (const id of (s.dataset.cites || "").split(" ").filter(Boolean)) {
      document.querySelectorAll(`[data-sid="${id}"]`).forEach((e) => e.classList.toggle(cls, on));
    }
  };
  const sentence = (e) => (e.target instanceof Element ? e.target.closest(".asent") : null);
  const point = (on) => (e) => {
    const s = sentence(e);
    if (s && !(e.relatedTarget instanceof Node && s.contains(e.relatedTarget))) mark(s, "cite-hl", on);
  };
  document.addEventListener("mouseover", point(true));
  document.addEventListener("mouseout", point(false));
  document.addEventListener("focusin", point(true));
  document.addEventListener("focusout", point(false));
  document.addEventListener("click", (e) => {
    const s = sentence(e);
    for (const old of document.querySelectorAll(".asent.cite-selected")) {
      if (old !== s) { old.classList.remove("cite-selected"); mark(old, "cite-picked", false); }
    }
    if (!s) return;
    const on = s.classList.toggle("cite-selected");
    mark(s, "cite-picked", on);
    const first = on && document.querySelector(".cite-picked");
    if (first) first.scrollIntoView({ block: "nearest", behavior: "smooth" });
  });
  document.addEventListener("keydown", (e) => {
    const s = sentence(e);
    if (s && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); s.click(); }
  });
})();
</script>"""
POSITIONS = [str(i) for i in range(1, MAX_TOP_K + 1)]  # explicit order: "10" must not sort before "2"
INTRO = (
    "# What did the model read, and can you trust its answer?\n"
    "Ask a question about the corpus. midlens finds the passages that match it, gives them all to a small "
    "language model in one prompt, and shows which passages the model actually read while answering: the darker "
    "the shading, the more it read. Each answer opens with whether to trust it: how often answers scored like it "
    "are right, and the passage it rests on. Its [n] markers name the passages each sentence rests on; point at a "
    "sentence to mark them. "
    "Small models tend to overlook passages in the middle of a long prompt; **side by side** compares a method "
    "built against this with the plain model (baseline) on the very same passages."
)

CHECK_INTRO = (
    "Paste an answer written elsewhere (another model, a person) and the question it replies to. The model reads "
    "the answer over the passages, pasted or retrieved from the corpus, and links each sentence to the passage it "
    'rests on; with "Check citations" it reads the answer again without each of them, and a sentence none of '
    "whose passages it needs is named."
)
CHECK_EXAMPLE_LABEL = "Example: one sentence from the passages, one made up"  # check_views.example()


def create_demo(pipeline: Pipeline | None = None, **backend_options: Any) -> gr.Blocks:
    """The page, with its queue set up. Pass an existing Pipeline to share its model and index."""
    return build_blocks(DemoBackend(pipeline, **backend_options))


@dataclass
class Controls:
    """What a visitor sets: the question and how it is answered (Handlers.ask takes them in `_wire`'s order)."""

    question: gr.Textbox
    ask: gr.Button
    model: gr.Dropdown
    method: gr.Dropdown
    compare: gr.Checkbox
    top_k: gr.Slider
    corpus: gr.File
    max_new: gr.Slider
    check: gr.Checkbox
    restack: gr.Checkbox
    abstain: gr.Checkbox


@dataclass
class Results:
    """What a question shows, hidden until the first answer so no empty table or plot greets a visitor."""

    shown: gr.Column
    base_cols: list[gr.Column]  # the baseline's answer and passages, shown when comparing
    view: gr.Radio
    outputs: list[gr.components.Component]  # in handlers.render()'s order


def build_blocks(backend: DemoBackend) -> gr.Blocks:
    """The page over `backend`: intro, controls, status line, then the results (hidden until an answer)."""
    import gradio as gr

    from midlens.demo.handlers import Handlers

    with gr.Blocks(title="midlens demo") as demo:
        gr.Markdown(INTRO)
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Ask a question", id="ask-tab", elem_id="ask-tab"):
                controls = _controls(backend)
                status = gr.Markdown(f"Loading model {backend.model} and the retrieval index...", elem_id="status")
                results = _results()
            with gr.Tab("Check an answer", id="check-tab", elem_id="check-tab"):
                check = _check_tab(backend)
        handlers = Handlers(backend)
        _wire(demo, handlers, controls, results, status)
        _wire_check(handlers, check, controls.corpus)
    # Generation is serialised per model by its lock; two workers let a second visitor's retrieval,
    # rendering and queue position proceed meanwhile, each with its own result.
    demo.queue(default_concurrency_limit=2, max_size=32)
    return demo


def _controls(backend: DemoBackend) -> Controls:
    """The question with its example buttons on the left, the settings on the right."""
    import gradio as gr

    from midlens.demo import controls, views

    with gr.Row():
        with gr.Column(scale=3):
            question = gr.Textbox(label="Question", lines=2, placeholder="Ask about the corpus...", elem_id="question")
            # Buttons, not gr.Examples: its textbox samples are cut at 60 characters, and a question
            # that cannot be read whole is no example.
            with gr.Column(elem_id="examples"):
                gr.Markdown("Example questions (from HotpotQA, whose answers are known):")
                for q, note in views.example_questions():
                    button = gr.Button(f"{q} — {note}", size="sm", variant="secondary", elem_classes="example")
                    button.click(lambda q=q: q, None, question, api_visibility="private", queue=False)
            ask = gr.Button("Ask", variant="primary", elem_id="ask")
        with gr.Column(scale=2):
            with gr.Row():
                model = gr.Dropdown(backend.models, value=backend.model, label="Model")
                method = gr.Dropdown(backend.methods_of(backend.model), value=backend.method, label="Method")
            compare = gr.Checkbox(label="Side by side: compare with the plain model (baseline), same passages")
            # The answering options' controls start where the demo's options do (AnswerOptions' defaults unless it
            # was started with others), so a default changed there is the page's too; the Re-order switch is set
            # again when the model or method changes (what re-ordering gains, per model: docs/results/restack/).
            options = backend.options
            check = controls.control(options, "verify", elem_id="check-citations")
            restack = controls.control(
                options, "restack", backend.restacks(backend.model, backend.method), elem_id="restack"
            )
            abstain = controls.control(options, "abstain", elem_id="abstain")
            top_k = controls.control(options, "top_k", elem_id="top-k")
            with gr.Accordion("Corpus and answer length", open=False):
                corpus = gr.File(
                    label=f"Your own corpus (.txt, .md or .jsonl, up to {_size(backend.max_upload_bytes)})",
                    file_types=list(UPLOAD_SUFFIXES),
                    type="filepath",
                )
                max_new = controls.control(options, "max_new_tokens", elem_id="max-new-tokens")
    return Controls(question, ask, model, method, compare, top_k, corpus, max_new, check, restack, abstain)


@dataclass
class CheckTab:
    """The "Check an answer" tab: an answer written elsewhere, read over pasted or retrieved passages
    (Handlers.check takes `inputs` in this order, with the Ask tab's corpus after top-k)."""

    question: gr.Textbox
    answer: gr.Textbox
    passages: gr.Textbox
    model: gr.Dropdown
    top_k: gr.Slider
    verify: gr.Checkbox
    button: gr.Button
    example: gr.Button
    shown: gr.Column
    outputs: list[gr.components.Component]  # in handlers.render_check()'s order


def _check_tab(backend: DemoBackend) -> CheckTab:
    """The form (question, the pasted answer, optional passages, the reading model) and, hidden until the first
    check, the answer with its links, the passages and the per-sentence table."""
    import gradio as gr

    from midlens.demo import controls
    from midlens.rag.check_options import CheckOptions

    gr.Markdown(CHECK_INTRO)
    with gr.Row():
        with gr.Column(scale=3):
            question = gr.Textbox(label="Question", lines=1, elem_id="check-question")
            answer = gr.Textbox(
                label="The answer to check (written by another model, or a person)", lines=4, elem_id="check-answer"
            )
            passages = gr.Textbox(
                label="Passages it should rest on, separated by a blank line (leave empty to retrieve them from the "
                "corpus)",
                lines=6,
                elem_id="check-passages",
            )
            with gr.Row():
                example = gr.Button(CHECK_EXAMPLE_LABEL, size="sm", variant="secondary", elem_id="check-example")
                button = gr.Button("Check", variant="primary", elem_id="check-button")
        with gr.Column(scale=2):
            model = gr.Dropdown(backend.models, value=backend.model, label="Model that reads it", elem_id="check-model")
            # CheckOptions' controls (rag/check_options.py): verify on by default, as everywhere a check runs.
            check = CheckOptions.like(backend.options)
            top_k = controls.control(check, "top_k", label="Passages to retrieve (when none are pasted)")
            verify = controls.control(
                check,
                "verify",
                label="Check citations: read the answer again without each cited passage (slower)",
                elem_id="check-verify",
            )
    with gr.Column(visible=False, elem_id="check-results") as shown:
        answer_md = gr.Markdown(elem_id="checked-answer", sanitize_html=False)  # data-cites, as the Ask tab's
        passages_html = gr.HTML(
            label="Passages the answer was read over, in prompt order",
            show_label=True,
            container=True,
            padding=True,
            elem_id="checked-passages",
            js_on_load=None,
        )
        table = gr.Dataframe(
            label="Which passage each sentence rests on", interactive=False, wrap=True, elem_id="checked-table"
        )
    outputs = [answer_md, passages_html, table]
    return CheckTab(question, answer, passages, model, top_k, verify, button, example, shown, outputs)


def _results() -> Results:
    """Answers (one column per method), the shading's legend, the passages, and the numbers under Details."""
    import gradio as gr

    with gr.Column(visible=False, elem_id="results") as shown:
        with gr.Row():
            # Unsanitised: the sanitiser drops data-* attributes, which carry what each answer sentence cites;
            # views.answer_markdown escapes every text it puts in (the answer, titles, names).
            main_md = gr.Markdown(elem_id="answer", sanitize_html=False)
            with gr.Column(visible=False) as base_answer:
                base_md = gr.Markdown(elem_id="baseline-answer", sanitize_html=False)
        legend = gr.HTML(elem_id="heat-legend")
        with gr.Row():
            main_ht = _passages_block("Passages, in the order the model was given them", "passages")
            with gr.Column(visible=False) as base_passages:
                base_ht = _passages_block("Baseline: the same passages", "baseline-passages")
        with gr.Accordion("Details (scores)", open=False, elem_id="details"):
            view, details = _details_header()
            compare_md, table, position_plot, attribution_plot = _details_numbers()
    outputs = [main_md, main_ht, base_md, base_ht, compare_md, table, position_plot, attribution_plot, legend, details]
    return Results(shown, [base_answer, base_passages], view, outputs)


def _passages_block(label: str, elem_id: str) -> gr.HTML:
    """Passages as HTML (views.passages_html): every sentence its own span for the citations to point at."""
    import gradio as gr

    # js_on_load=None: the component's default click listener would send an event no handler takes.
    return gr.HTML(label=label, show_label=True, container=True, padding=True, elem_id=elem_id, js_on_load=None)


def _details_header() -> tuple[gr.Radio, gr.Markdown]:
    """Which score the shading, plots and table use, and what each number means."""
    import gradio as gr

    from midlens.demo import views

    view = gr.Radio(views.SCORE_VIEW_CHOICES, value="calibrated", label="Evidence scores", elem_id="score-view")
    return view, gr.Markdown(elem_id="details-text")


def _details_numbers() -> tuple[gr.Markdown, gr.Dataframe, gr.LinePlot, gr.BarPlot]:
    """The ranks of the tracked passage, evidence and attribution by prompt position, and every score."""
    import gradio as gr

    from midlens.demo import views

    compare_md = gr.Markdown(elem_id="ranks")
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
    return compare_md, table, position_plot, attribution_plot


def _wire(demo: gr.Blocks, on: Handlers, controls: Controls, results: Results, status: gr.Markdown) -> None:
    """Events: asking (button or Enter) fills and reveals the results; the rest re-render or update settings."""
    import gradio as gr

    c = controls
    inputs = [
        *(c.question, c.model, c.method, c.compare, c.top_k, results.view, c.corpus, c.max_new, c.check, c.restack),
        c.abstain,
    ]
    state = gr.State(None)
    outputs = [*results.outputs, state]
    asked = [
        c.ask.click(on.ask, inputs, outputs, api_name="ask"),
        c.question.submit(on.ask, inputs, outputs, api_visibility="private"),  # Enter: same call, one API name
    ]
    for event in asked:  # revealed only on success: a refused question leaves the page as it was
        event.success(lambda: gr.Column(visible=True), None, results.shown, api_visibility="private", queue=False)
    results.view.change(on.view, [state, results.view], results.outputs, api_visibility="private", queue=False)
    c.model.change(on.model, [c.model, c.method], c.method, api_visibility="private", queue=False)
    for choice in (c.model, c.method):  # a model change that keeps the method name changes no method
        choice.change(on.restack_default, [c.model, c.method], c.restack, api_visibility="private", queue=False)
    c.compare.change(
        lambda shown: [gr.Column(visible=shown)] * len(results.base_cols),
        c.compare,
        results.base_cols,
        api_visibility="private",
        queue=False,
    )
    c.corpus.upload(on.upload, c.corpus, status, api_visibility="private")
    c.corpus.clear(on.cleared, None, status, api_visibility="private")
    demo.load(on.load, None, status, api_visibility="private")


def _wire_check(on: Handlers, tab: CheckTab, corpus: gr.File) -> None:
    """Checking (the button) fills and reveals the check tab's results; the example fills its form."""
    import gradio as gr

    inputs = [tab.question, tab.answer, tab.passages, tab.model, tab.top_k, corpus, tab.verify]
    checked = tab.button.click(on.check, inputs, tab.outputs, api_name="check")
    checked.success(lambda: gr.Column(visible=True), None, tab.shown, api_visibility="private", queue=False)
    from midlens.demo.check_views import example

    tab.example.click(example, None, [tab.question, tab.answer, tab.passages], api_visibility="private", queue=False)


def launch(
    demo: gr.Blocks,
    port: int | None = None,
    prevent_thread_lock: bool = False,
    max_upload_mb: float = 0,
    host: str = HOST,
    auth: tuple[str, str] | None = None,
):
    """Serve on `host` (127.0.0.1 unless asked), behind Gradio's login page when `auth` (user, password) is given.
    Gradio's own upload cap is a backstop well above the demo's message limit."""
    import gradio as gr

    cap = max(max_upload_mb, DEFAULT_MAX_UPLOAD_MB) * 8
    return demo.launch(
        server_name=host,
        server_port=port,
        prevent_thread_lock=prevent_thread_lock,
        theme=gr.themes.Soft(),
        css=CSS,
        head=HEAD,
        max_file_size=f"{cap:.0f}mb",
        footer_links=["api"],
        auth=auth,
    )
