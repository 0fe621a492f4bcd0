"""`midlens demo`: its options, checked before a server starts, then the page served."""

from __future__ import annotations

import argparse
import os

from midlens.cli.options import add_cite_evidence_arg, add_model_args, check_cite_evidence
from midlens.demo.backend import DEFAULT_MAX_UPLOAD_MB, HOST, MAX_NEW_TOKENS, MAX_TOP_K

EXAMPLES = """examples:
  midlens demo
  midlens demo --corpus docs/ --method ms-poe --port 7861
  MIDLENS_DEMO_AUTH=ana:s3cret midlens demo --host 0.0.0.0      # every interface, behind a login
"""
AUTH_ENV = "MIDLENS_DEMO_AUTH"


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo", help="Gradio demo on 127.0.0.1: ask, see per-passage evidence, compare methods", epilog=EXAMPLES
    )
    demo.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    # AnswerOptions' fields, spelt from their OptionInfo (rag/option_fields.py) as every shell spells them.
    from midlens.rag.option_fields import add_arguments

    add_arguments(demo, only=("top_k", "max_new_tokens"))
    demo.add_argument("--port", type=int, help="default: the first free port from 7860")
    demo.add_argument(
        "--host",
        default=HOST,
        help="address to serve on; 0.0.0.0 serves every interface (then a login is needed: --auth)",
    )
    demo.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        default=os.environ.get(AUTH_ENV),
        help=f"require this login on the page (default: ${AUTH_ENV}; the variable keeps the password out of the "
        "process list); needed when --host is not a loopback address",
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
    auth = login(args.auth, args.host)
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
    launch(demo, port=args.port, max_upload_mb=args.max_upload_mb, host=args.host, auth=auth)
    return 0


def login(auth: str | None, host: str) -> tuple[str, str] | None:
    """The (user, password) Gradio asks visitors for, from USER:PASSWORD; refused (before any model loads) where the
    page would listen beyond this machine without one, as `midlens serve` refuses to without a key."""
    from midlens.cli.serve import is_loopback
    from midlens.core.errors import MidlensError

    if not auth:
        if not is_loopback(host):
            raise MidlensError(
                f"--host {host} serves the demo beyond this machine, and anyone who reaches it could use the model: "
                f"give it a login (--auth USER:PASSWORD, or {AUTH_ENV}=USER:PASSWORD), or serve on 127.0.0.1."
            )
        return None
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise MidlensError(f"--auth: expected USER:PASSWORD, both parts non-empty (got {len(auth)} characters).")
    return user, password
