"""What midlens shows while a model loads: its own one-line notes, not transformers' per-tensor bars.

transformers 5 draws a "Loading weights" bar over every tensor of every load, cached or not: on a command line
that is two or three bars per run saying nothing a user can act on (a 135M model loads in under a second). Inside
`quiet_weight_loading` those bars are not drawn; other bars (a download, a conversion's own steps) still are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# transformers' description of its per-tensor bar (transformers/core_model_loading.py).
WEIGHT_BAR = "Loading weights"

_QUIET: ContextVar[bool] = ContextVar("midlens_quiet_weight_loading", default=False)
_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def _install_hook() -> None:
    """Chains one hook, once per process, in front of whatever tqdm hook transformers already has: it hides the
    weight bar only in a block that asked for it, so loads elsewhere in the process draw theirs as before."""
    global _INSTALLED
    from transformers.utils import logging as hf_logging

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    with _INSTALL_LOCK:
        if _INSTALLED or set_hook is None:  # a transformers without the hook draws its bars
            return

        def hook(factory: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
            if _QUIET.get() and kwargs.get("desc") == WEIGHT_BAR:
                return hf_logging.EmptyTqdm(*args, **kwargs)
            return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

        previous = set_hook(hook)
        _INSTALLED = True


@contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """transformers' "Loading weights" bars are not drawn for loads in this block (this thread or task only)."""
    _install_hook()
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)
