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
