"""`midlens demo`: its options, checked before a server starts, then the page served."""

from __future__ import annotations

import argparse
import os

from midlens.cli.options import add_cite_evidence_arg, add_model_args, check_cite_evidence
from midlens.core.names import DEFAULT_MAX_NEW_TOKENS
from midlens.demo.backend import DEFAULT_MAX_UPLOAD_MB, HOST, MAX_NEW_TOKENS, MAX_TOP_K

EXAMPLES = """examples:
  midlens demo
  midlens demo --corpus docs/ --method ms-poe --port 7861
"""


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo", help="Gradio demo on 127.0.0.1: ask, see per-passage evidence, compare methods", epilog=EXAMPLES
    )
    demo.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    demo.add_argument("--top-k", type=int, default=5)
    demo.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    demo.add_argument("--port", type=int, help="default: the first free port from 7860")
    demo.add_argument(
        "--host",
        default=HOST,
        help="address to serve on; 0.0.0.0 serves every interface (the demo has no login: only on a trusted network)",
    )
    demo.add_argument("--max-upload-mb", type=float, default=DEFAULT_MAX_UPLOAD_MB, help="corpus upload size limit")
    add_cite_evidence_arg(
        demo,
        "every method's citations choose their passages with this method's evidence of the prompt (one more prefill "
        "per answer), as ask's option",
    )
    add_model_args(demo)
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from midlens.cli.options import check_device, chosen_model, evidence_config, method_spec
    from midlens.core.errors import MidlensError

    model = chosen_model(args, method_spec(args))  # refuse a bad method spec or device before starting a server
    check_device(args)
    check_cite_evidence(args)
    if not 1 <= args.top_k <= MAX_TOP_K:
        raise MidlensError(f"--top-k {args.top_k}: the demo offers 1 to {MAX_TOP_K} passages.")
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise MidlensError(f"--max-new-tokens {args.max_new_tokens}: the demo allows 1 to {MAX_NEW_TOKENS}.")
    if args.max_upload_mb <= 0:
        raise MidlensError(f"--max-upload-mb {args.max_upload_mb}: must be positive.")
    if args.corpus and not os.path.exists(args.corpus):
        raise MidlensError(f"--corpus {args.corpus}: no such file or folder.")
    from midlens.demo.app import create_demo, launch

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
        cite_evidence=args.cite_evidence,
    )
    launch(demo, port=args.port, max_upload_mb=args.max_upload_mb, host=args.host)
    return 0
