"""The stand-in ``python3`` on the tests' PATH: a test (or a script it runs) that starts an
interpreter by name instead of the command under test fails loudly (see commands.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

BARE_PYTHON_EXIT = 97
BARE_PYTHON_MESSAGE = "a test ran a bare python from PATH instead of the command under test (see tests/support/commands.py)"


def guard_against_bare_python() -> Path:
    """Put stand-ins for ``python3`` and ``python`` first on PATH for this test run: a test
    (or a script it runs) that starts an interpreter by name instead of the installed
    command fails loudly here, whatever python3 this machine happens to have."""
    guard = Path(tempfile.mkdtemp(prefix="ponytail-test-python-guard-"))
    for name in ("python", "python3", f"python3.{sys.version_info.minor}"):  # the names it guards
        stub = guard / name
        stub.write_text(f"#!/bin/sh\necho 'ponytail tests: {BARE_PYTHON_MESSAGE}: '\"$0 $*\" >&2\nexit {BARE_PYTHON_EXIT}\n")
        stub.chmod(0o755)
    os.environ["PATH"] = f"{guard}{os.pathsep}{os.environ.get('PATH', '')}"
    atexit.register(shutil.rmtree, guard, True)
    return guard
