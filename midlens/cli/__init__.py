"""The `midlens` command line: one module per command, each with `add_parser(sub)` and the function it runs.

The top of the stack: it composes the shells below (pipeline, eval, training, demo) and nothing imports it.
Building the parser imports only argparse-level modules, so `midlens --help` takes a fraction of a second;
torch loads inside the commands.
"""

from __future__ import annotations

import sys

from midlens import __version__
from midlens.cli import ask, bench, cache, check, demo, heads, index, methods, serve, train
from midlens.cli import eval as eval_command
from midlens.cli.options import Parser, cli_message
from midlens.core.errors import MidlensError

DESCRIPTION = (
    "RAG that stacks retrieved passages into one prompt, answers with a small RoPE model, and shows how much "
    "attention the answer paid to each passage. `midlens COMMAND --help` for a command's options and examples."
)
EXAMPLES = """examples:
  midlens ask "Who directed Wings of Desire?"
  midlens methods
  midlens eval sweep --dataset hotpotqa --n 50 --out runs/h
  midlens demo
  midlens serve --port 8000
"""
COMMANDS = (ask, check, methods, bench, eval_command, demo, heads, train, cache, index, serve)


def build_parser() -> Parser:
    # Parser shows defaults in every --help (subparsers inherit the class).
    parser = Parser(prog="midlens", description=DESCRIPTION, epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (MidlensError, ValueError) as err:
        # A library error names the options that fix it by their Python keywords: here they read as flags, and the
        # steps to run as commands.
        print(f"midlens: error: {cli_message(err)}", file=sys.stderr)
        return 2
