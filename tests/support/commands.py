"""The commands under test, exactly as a user runs them.

Every test that runs ponytail gets its command line here: the console scripts that
``pip install`` put beside the interpreter running the tests (``make setup`` installs
this checkout into ``.venv``), or the binary of ``make binary``. Never a bare
``python3`` from PATH: that is some other interpreter, with other packages (or none),
and finds ponytail only when the working directory happens to be the checkout.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/support/commands.py -> the checkout
VENV_BIN = Path(sys.executable).parent  # the environment under test
BINARY = REPO / "dist" / "ponytail" / "ponytail"


def installed(name: str) -> str:
    """The absolute path of an installed console script of the environment under test."""
    path = VENV_BIN / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: the tests run the installed command; run 'make setup' (pip install -e .) first")
    return str(path)


PONYTAIL = [installed("ponytail")]
PONYTAIL_RUNTIME = [installed("ponytail-runtime")]


def shell(command: list[str]) -> str:
    """``command`` quoted for a shell script."""
    return shlex.join(command)


def without_checkout_warning(stderr: str) -> str:
    """``stderr`` without the warning that a command registered with an engine lies in the
    checkout's .venv (ponytail.hooks.command.transient_warning): the tests run from there."""
    from ponytail.hooks.command import CHECKOUT_VENV

    return "".join(line for line in stderr.splitlines(keepends=True) if CHECKOUT_VENV not in line)
