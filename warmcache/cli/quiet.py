"""``--verbose``: the libraries' own chatter (weight-loading bars, transformers warnings, Trainer metrics) only on
request.

Warmup and verify load models and run Trainers in this process, in ``--jobs``
workers, under torchrun and in verify's replay process. The switch travels the
one way all of them share: the environment the libraries read when imported,
set here at the edge before any of them is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

#: What transformers and huggingface_hub read at import; a value the user set wins.
QUIET_ENVIRONMENT = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def verbose_option(func: F) -> F:
    return click.option(
        "--verbose",
        is_flag=True,
        help="Show the libraries' own output: weight-loading bars, transformers warnings, Trainer metrics.",
    )(func)


def quiet_libraries(verbose: bool) -> None:
    """Unless ``verbose``, ask transformers and huggingface_hub (here and in every child process) for errors only."""
    if verbose:
        return
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
