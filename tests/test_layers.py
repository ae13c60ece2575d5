"""The architecture of docs/architecture.md holds in the code: imports point one way down the layers (entry ->
cli -> engines -> hook -> apply -> plan -> container -> host -> fs, the shared modules below them
all), and no two modules import each other when they are loaded. scripts/relayout.py, which moved
the modules into these folders, reads every import of the tree (`--check`) and reports both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def test_imports_point_down_the_layers_and_no_module_cycle_at_import_time() -> None:
    report = subprocess.run([sys.executable, str(REPO / "scripts/relayout.py"), "--check"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines() + report.stderr.splitlines()
    assert "relayout: imports that point up the layers: none" in lines, lines
    assert "relayout: import cycles at import time: none" in lines, lines
