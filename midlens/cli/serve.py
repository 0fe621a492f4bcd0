"""`midlens serve`: the generator as an HTTP service (Ray Serve), OpenAI-compatible, with evidence per passage."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from midlens.cli.options import add_cite_evidence_arg, add_model_args, check_cite_evidence, positive_int
from midlens.core.errors import InvalidArgumentError

EXAMPLES = """examples:
  midlens serve --model smollm2-135m                      # local Ray cluster, http://127.0.0.1:8000
  midlens serve --method ms-poe --replicas 2 --max-batch-size 16 --batch-wait-timeout 0.02
  midlens serve --address auto --num-gpus 1 --host 0.0.0.0 --port 8080   # an existing cluster, every interface
  curl -s 127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Who wrote X?"}], "max_tokens": 16}'
"""


def add_parser(sub) -> None:
    serve = sub.add_parser(
        "serve", help="serve answers with evidence over HTTP (OpenAI-compatible, Ray Serve)", epilog=EXAMPLES
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--api-key",
        default=os.environ.get("MIDLENS_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /healthz and /readyz (default: $MIDLENS_API_KEY); "
        "needed when --host is not a loopback address",
    )
    serve.add_argument("--address", help="Ray cluster to deploy on (e.g. auto, ray://host:10001); default: a local one")
    serve.add_argument("--replicas", type=positive_int, default=1, help="model replicas (each loads the model)")
    serve.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (with --device auto: CUDA)")
    serve.add_argument("--num-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica")
    serve.add_argument("--threads", type=int, help="torch threads per replica (default: Ray's, one per CPU)")
    serve.add_argument("--max-batch-size", type=positive_int, default=8, help="most requests answered in one batch")
    serve.add_argument(
        "--batch-wait-timeout",
        type=float,
        default=0.1,
        help="seconds a batch waits for more requests to join (0.1: full batches at 4 and 8 clients, "
        "docs/results/serve/batch-wait/)",
    )
    serve.add_argument("--request-timeout", type=float, default=120.0, help="seconds before a request is answered 504")
    serve.add_argument(
        "--start-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="seconds the Ray cluster, the HTTP proxy and the model's load may take together; past them the start "
        "fails naming the stage it was in (default 180)",
    )
    serve.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger bodies are answered 413")
    # What one request may ask for: over any of these it is answered 400 before anything is computed.
    serve.add_argument("--max-passages", type=positive_int, default=64, help="most passages in one request")
    serve.add_argument("--max-prompt-tokens", type=positive_int, default=8192, help="longest stacked prompt, in tokens")
    serve.add_argument("--max-answer-tokens", type=positive_int, default=1024, help="most max_tokens a request may ask")
    serve.add_argument(
        "--max-restack-rounds", type=positive_int, default=3, help="most restack rounds a request may ask"
    )
    serve.add_argument(
        "--max-method-cost",
        type=float,
        default=8.0,
        help="costliest method a request may name, in plain answers per answer (Attention Buckets: one per base)",
    )
    # What a request leaves out: AnswerOptions' fields, spelt from their OptionInfo as every shell spells them.
    from midlens.rag.option_fields import add_arguments

    add_arguments(serve, only=("max_new_tokens", "prompt_style"))
    add_cite_evidence_arg(
        serve,
        "every answer's citations choose their passages with this method's evidence of the prompt (one more prefill "
        "per answer), as ask's option",
    )
    add_model_args(serve)
    serve.set_defaults(func=run)


def options_of(args: argparse.Namespace):
    """The parsed command line as ServeOptions, checked before Ray or the model start."""
    from midlens.cli.options import check_device, chosen_model, evidence_config, method_spec

    if args.batch_wait_timeout < 0 or args.request_timeout <= 0:
        raise InvalidArgumentError("--batch-wait-timeout must be >= 0 and --request-timeout > 0 (seconds).")
    if not args.start_timeout > 0:
        raise InvalidArgumentError(f"--start-timeout {args.start_timeout:g}: give the start some seconds (> 0).")
    if not 0 < args.port < 65536:
        raise InvalidArgumentError(f"--port {args.port}: use 1 to 65535.")
    if not args.api_key and not is_loopback(args.host):
        raise InvalidArgumentError(
            f"--host {args.host} listens beyond this machine, and the server would answer anyone who reaches it: "
            "give it a key (--api-key KEY, or MIDLENS_API_KEY=KEY), which clients send as `Authorization: Bearer "
            "KEY`, or listen on 127.0.0.1."
        )
    method = method_spec(args)
    args.model = chosen_model(args, method)
    check_device(args)
    evidence_config(args)
    check_cite_evidence(args)
    from midlens.serve.app import ServeOptions

    return ServeOptions(
        model=args.model,
        method=method.spec(),
        device=args.device,
        dtype=args.dtype,
        evidence_layers=args.evidence_layers,
        evidence_query=args.evidence_query,
        evidence_heads=args.evidence_heads,
        prompt_style=args.prompt_style,
        max_new_tokens=args.max_new_tokens,
        cite_evidence=args.cite_evidence,
        replicas=args.replicas,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_timeout,
        request_timeout_s=args.request_timeout,
        start_timeout_s=args.start_timeout,
        max_body_bytes=args.max_body_bytes,
        host=args.host,
        port=args.port,
        address=args.address,
        api_key=args.api_key or None,
        max_passages=args.max_passages,
        max_prompt_tokens=args.max_prompt_tokens,
        max_answer_tokens=args.max_answer_tokens,
        max_restack_rounds=args.max_restack_rounds,
        max_method_cost=args.max_method_cost,
    )


def is_loopback(host: str) -> bool:
    """Whether `host` listens on this machine only (a host name other than localhost may resolve anywhere)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def run(args: argparse.Namespace) -> int:
    options = options_of(args)
    from midlens.serve.app import start, stop

    url = start(options, progress=lambda stage: print(f"midlens serve: {stage}...", file=sys.stderr, flush=True))
    print(f"midlens serve: {options.model} / {options.method} at {url} (OpenAPI: {url}/docs); Ctrl-C stops it.")
    sys.stdout.flush()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(1.0):  # a timed wait, so Ctrl-C is seen promptly
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop()
    return 0
