"""Where this install's ponytail commands are: the path hooks.d files, runtime configs and CDI
specs name (``ponytail hooksd install``, ``ponytail configure``, ``ponytail cdi generate``,
ponytail-runtime's hook)."""

from __future__ import annotations

import os
import sys


def installed_command(name: str = "ponytail") -> str | None:
    """The absolute path of this install's console script ``name``: beside the running
    command first (a venv, /usr/local/bin), then the interpreter's scripts directory."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), name)
    if _executable(beside):
        return beside
    import sysconfig  # not on `cdi generate`'s usual path: the command is beside the running one

    for candidate in (os.path.join(sysconfig.get_path("scripts"), name), os.path.join(os.path.dirname(sys.executable), name)):
        if _executable(candidate):
            return candidate
    return None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


CHECKOUT_VENV = "in the virtual environment of a checkout"  # the warning's words, for tests to recognise


def transient_warning(command: str) -> str | None:
    """A warning when ``command`` lies in a virtual environment inside a source checkout (``make
    setup``'s ``.venv``): an engine configured with it breaks when the checkout is cleaned."""
    parts = os.path.abspath(command).split(os.sep)
    for end in range(len(parts) - 1, 1, -1):
        venv = os.sep.join(parts[:end])
        if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
            if not os.path.isfile(os.path.join(os.path.dirname(venv), "pyproject.toml")):
                return None  # a venv of its own (/opt/ponytail): it stays
            return (f"{command} is {CHECKOUT_VENV} ({venv}): the engine stops working when it goes (make clean); "
                    "for a lasting setup install ponytail outside the checkout (pip install ., or the binary)")
    return None
