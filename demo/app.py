"""`midlens demo`: a Gradio page on 127.0.0.1 over rag.pipeline.Pipeline.

Ask a question over the embedded HotpotQA corpus (or an uploaded one), read the answer, see each
retrieved passage in prompt order shaded by how much attention it received, and run baseline and a
position-aware method side by side on the same passages. The page is a thin shell: every number it
shows comes from `Pipeline.retrieve` / `Pipeline.answer`; one model is loaded once and methods share it.

    demo = create_demo(pipeline)                  # reuse a Pipeline you already have
    launch(demo, port=7860)                       # blocks; prevent_thread_lock=True for tests
"""

from __future__ import annotations

import argparse
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from midlens.core.names import DEFAULT_MAX_NEW_TOKENS

if TYPE_CHECKING:  # gradio and torch load slowly: only the demo itself imports them
    import gradio as gr

    from midlens.core.passage import Passage
    from midlens.generators.evidence import Answer, EvidenceConfig
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.base import Retriever

HOST = "127.0.0.1"
MAX_TOP_K = 10
MAX_QUESTION_CHARS = 1000
MAX_NEW_TOKENS = 128
DEFAULT_MAX_UPLOAD_MB = 2.0
UPLOAD_SUFFIXES = (".txt", ".md", ".jsonl")
UPLOADED_INDEXES_KEPT = 4  # each holds its passages and vectors in memory
DEFAULT_CORPUS = "default"

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


class UserError(Exception):
    """Bad input from the page; shown as a message, never as a traceback."""


class DemoBackend:
    """Models, retrievers and per-method pipelines, each built once and shared by every visitor.

    Results are never stored here: each request gets its own Answer objects (kept in that browser
    session's gr.State), so two visitors see their own results. Generation on one model is serialised
    by `LoadedModel.lock`; everything else runs concurrently under the Gradio queue.
    """

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        corpus: str | Path | None = None,
        model: str | None = None,
        method: str = "baseline",
        top_k: int = 5,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        evidence: EvidenceConfig | None = None,
        max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
        device: str = "auto",
        dtype: str = "auto",
    ):
        from midlens.generators.models import DEFAULT_MODEL, REGISTRY
        from midlens.generators.registry import method_config

        self._lock = threading.RLock()
        self._bases: dict[str, Pipeline] = {}  # model name -> baseline-or-given pipeline on the startup corpus
        self._methods: dict[tuple[str, str], Pipeline] = {}
        self._retrievers: OrderedDict[str, Retriever] = OrderedDict()
        self.corpus = corpus
        self.evidence = evidence
        self.device, self.dtype = device, dtype
        self.max_upload_bytes = int(max_upload_mb * 1024 * 1024)
        if pipeline is not None:
            name = pipeline.generator.loaded.name
            self._bases[name] = pipeline
            self._retrievers[DEFAULT_CORPUS] = pipeline.retriever
            self.model = name
            self.top_k = pipeline.top_k
            self.max_new_tokens = pipeline.max_new_tokens
            self.evidence = pipeline.generator.evidence_config
            method = pipeline.generator.method
        else:
            self.model = model or DEFAULT_MODEL
            self.top_k = top_k
            self.max_new_tokens = max_new_tokens
        self.models = list(dict.fromkeys([self.model, *REGISTRY]))
        # The startup spec's options (e.g. `ms-poe(ratio_max=1.4)`) apply whenever that method is picked.
        self.startup_method = method_config(method)
        self.method = self.startup_method.name

    # -- shared parts, built on first use -------------------------------------------------------

    def corpus_label(self) -> str:
        return "embedded HotpotQA paragraphs" if self.corpus is None else str(self.corpus)

    def retriever(self, corpus_file: str | None, progress: Any = None) -> tuple[Retriever, str]:
        """The startup corpus' retriever, or one for an uploaded file (indexed once, kept by content hash)."""
        from midlens.retrievers.build import build_retriever
        from midlens.retrievers.corpus import default_corpus_path

        if not corpus_file:
            with self._lock:
                if DEFAULT_CORPUS not in self._retrievers:
                    _progress(progress, 0.05, f"building the retrieval index for {self.corpus_label()}")
                    self._retrievers[DEFAULT_CORPUS] = build_retriever(self.corpus or default_corpus_path())
                return self._retrievers[DEFAULT_CORPUS], self.corpus_label()
        path = Path(corpus_file)
        name = path.name
        if path.suffix.lower() not in UPLOAD_SUFFIXES:
            raise UserError(f"corpus upload {name}: unsupported file type; upload a .txt, .md or .jsonl file.")
        size = path.stat().st_size
        if size > self.max_upload_bytes:
            raise UserError(
                f"corpus upload {name} is {_size(size)}; the demo indexes at most {_size(self.max_upload_bytes)} "
                "per upload. Upload a smaller file, or start `midlens demo --corpus PATH` (or raise "
                "--max-upload-mb) for a larger corpus."
            )
        key = hashlib.sha256(path.read_bytes()).hexdigest() + path.suffix.lower()
        with self._lock:
            if key not in self._retrievers:
                _progress(progress, 0.05, f"building the retrieval index for {name}")
                self._retrievers[key] = build_retriever(path)
                uploads = [k for k in self._retrievers if k != DEFAULT_CORPUS]
                for old in uploads[:-UPLOADED_INDEXES_KEPT]:
                    del self._retrievers[old]
            self._retrievers.move_to_end(key)
            return self._retrievers[key], f"uploaded {name}"

    def methods_of(self, model: str) -> list[str]:
        """The methods offered with `model`: one trained per model (MuDAF, MoICE) only where it ships for it."""
        from midlens.generators.registry import available

        return available(model)

    def pipeline(self, model: str, method: str, corpus_file: str | None = None, progress: Any = None) -> Pipeline:
        """A pipeline for (model, method) on the chosen corpus; methods share the model's weights."""
        from midlens.generators.generator import Generator
        from midlens.generators.models import load_model
        from midlens.rag.pipeline import Pipeline

        if model not in self.models:
            raise UserError(f"model {model!r} is not offered here; choose one of {', '.join(self.models)}.")
        offered = self.methods_of(model)
        if method not in offered:
            raise UserError(f"method {method!r} is not available with {model}; choose one of {', '.join(offered)}.")
        retriever, _ = self.retriever(corpus_file, progress)
        with self._lock:
            if model not in self._bases:
                _progress(progress, 0.15, f"loading model {model} (first use only)")
                loaded = load_model(model, self.device, self.dtype)
                generator = Generator(loaded, method="baseline", evidence=self.evidence)
                self._bases[model] = Pipeline(retriever, generator, self.top_k, self.max_new_tokens)
            base = self._bases[model]
            if (model, method) not in self._methods:
                config = self.startup_method if method == self.startup_method.name else method
                self._methods[(model, method)] = base.with_method(config)
            chosen = self._methods[(model, method)]
        return Pipeline(retriever, chosen.generator, chosen.top_k, chosen.max_new_tokens, chosen.truncate)

    def prepare(self, progress: Any = None) -> str:
        """Load the startup model and index (on page load, so the first question does not wait)."""
        pipe = self.pipeline(self.model, self.method, None, progress)
        cfg = pipe.generator.evidence_config
        layers = cfg.layers if isinstance(cfg.layers, str) else ",".join(map(str, cfg.layers))
        return (
            f"Ready: model **{self.model}**, corpus: {self.corpus_label()} ({len(pipe.retriever)} passages). "
            f"Evidence = attention mass a passage receives (query: {cfg.query} tokens, layers: {layers})."
        )

    # -- one request ---------------------------------------------------------------------------

    def ask(
        self,
        question: str,
        model: str,
        method: str,
        compare: bool,
        top_k: float,
        corpus_file: str | None = None,
        max_new_tokens: float | None = None,
        progress: Any = None,
    ) -> dict:
        """Retrieve once, answer with `method` (and with baseline on the same passages when comparing)."""
        from midlens.core.errors import MidlensError, PromptTooLongError
        from midlens.demo.views import gold_titles

        question = (question or "").strip()
        if not question:
            raise UserError("The question is empty: type a question (or click an example), then press Ask.")
        if len(question) > MAX_QUESTION_CHARS:
            raise UserError(f"The question is {len(question)} characters; keep it under {MAX_QUESTION_CHARS}.")
        k = _int_in_range("top-k", top_k, 1, MAX_TOP_K)
        new_tokens = _int_in_range("max new tokens", max_new_tokens or self.max_new_tokens, 1, MAX_NEW_TOKENS)
        try:
            pipe = self.pipeline(model, method, corpus_file, progress)
            _progress(progress, 0.3, "retrieving passages")
            passages = pipe.retrieve(question, k)
            answers = [self._answer(pipe, question, passages, new_tokens, progress)]
            if compare and method != "baseline":
                base = self.pipeline(model, "baseline", corpus_file, progress)
                answers.append(self._answer(base, question, passages, new_tokens, progress))
        except PromptTooLongError as err:
            raise UserError(f"The prompt is too long for {model}: {err} In the demo: lower top-k.") from None
        except (MidlensError, ValueError) as err:
            raise UserError(str(err)) from None
        return {
            "question": question,
            "answers": answers,
            "gold": gold_titles(question) if not corpus_file and self.corpus is None else [],
            "compared": len(answers) > 1,
        }

    def _answer(self, pipe: Pipeline, question: str, passages: list[Passage], new_tokens: int, progress: Any) -> Answer:
        method = pipe.generator.method.name
        done = [0]

        def on_token(_piece: str) -> None:
            done[0] += 1
            _progress(progress, (done[0], new_tokens), f"generating with {method}", unit="tokens")

        _progress(progress, (0, new_tokens), f"reading the prompt ({method}; waits if the model is busy)", "tokens")
        return pipe.answer(question, passages, max_new_tokens=new_tokens, on_token=on_token)


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KB"


def _progress(progress: Any, value: Any, desc: str, unit: str = "steps") -> None:
    if progress is not None:
        progress(value, desc=desc, unit=unit)


def _int_in_range(name: str, value: Any, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (number.is_integer() and lo <= number <= hi):
        raise UserError(f"{name} must be a whole number from {lo} to {hi}, got {value!r}.")
    return int(number)


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


def launch(demo: gr.Blocks, port: int | None = None, prevent_thread_lock: bool = False, max_upload_mb: float = 0):
    """Serve on 127.0.0.1 only. Gradio's own upload cap is a backstop well above the demo's message limit."""
    import gradio as gr

    cap = max(max_upload_mb, DEFAULT_MAX_UPLOAD_MB) * 8
    return demo.launch(
        server_name=HOST,
        server_port=port,
        prevent_thread_lock=prevent_thread_lock,
        theme=gr.themes.Soft(),
        css=CSS,
        max_file_size=f"{cap:.0f}mb",
        footer_links=["api"],
    )


def add_demo_parser(sub) -> None:
    from midlens.rag.options import add_model_args

    demo = sub.add_parser("demo", help="Gradio demo on 127.0.0.1: ask, see per-passage evidence, compare methods")
    demo.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    demo.add_argument("--top-k", type=int, default=5)
    demo.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    demo.add_argument("--port", type=int, help="default: the first free port from 7860")
    demo.add_argument("--max-upload-mb", type=float, default=DEFAULT_MAX_UPLOAD_MB, help="corpus upload size limit")
    add_model_args(demo)
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from midlens.core.errors import MidlensError
    from midlens.rag.options import check_device, chosen_model, evidence_config, method_spec

    model = chosen_model(args, method_spec(args))  # refuse a bad method spec or device before starting a server
    check_device(args)
    if not 1 <= args.top_k <= MAX_TOP_K:
        raise MidlensError(f"--top-k {args.top_k}: the demo offers 1 to {MAX_TOP_K} passages.")
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise MidlensError(f"--max-new-tokens {args.max_new_tokens}: the demo allows 1 to {MAX_NEW_TOKENS}.")
    if args.max_upload_mb <= 0:
        raise MidlensError(f"--max-upload-mb {args.max_upload_mb}: must be positive.")
    if args.corpus and not os.path.exists(args.corpus):
        raise MidlensError(f"--corpus {args.corpus}: no such file or folder.")
    demo = create_demo(
        corpus=args.corpus,
        model=model,
        method=args.method,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        evidence=evidence_config(args),
        max_upload_mb=args.max_upload_mb,
        device=args.device,
        dtype=args.dtype,
    )
    launch(demo, port=args.port, max_upload_mb=args.max_upload_mb)
    return 0
