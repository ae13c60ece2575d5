"""`make demo` (scripts/demo.py) on the simulated driver: it leaves its rootfs as it was built,
and the commands it prints to run ponytail against the same host again work as printed, a
second time too, with --reset putting back the rootfs a run by hand left mount points in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.commands import PONYTAIL

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"

pytestmark = pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="a real driver: the demo uses it, not the simulated one")


def empty_files(rootfs: Path) -> list[str]:
    """What a run leaves in the rootfs: the empty files its bind mounts were made on."""
    return sorted(str(p.relative_to(rootfs)) for p in rootfs.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size == 0)


def run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_demo_prints_commands_that_work_again(tmp_path: Path) -> None:
    env = {**os.environ, "PONYTAIL_DEMO_DIR": str(tmp_path / "demo")}
    demo = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=600, env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "NVIDIA-SMI stand-in" in demo.stdout and "cuDriverGetVersion 12040" in demo.stdout
    rootfs = tmp_path / "demo" / "rootfs"
    assert empty_files(rootfs) == [], "the demo left mount points in its rootfs"
    lines = demo.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("== to run ponytail against this host"))
    commands = [line.strip() for line in lines[start + 1 :]]
    assert len(commands) == 3, commands
    info, inject, reset = commands
    config = str(tmp_path / "demo" / "simulated-host" / "config.toml")
    assert info == f"{PONYTAIL[0]} info -config {config}"
    assert f"{PONYTAIL[0]} -config {config} -root {rootfs} -device 0" in inject
    for attempt in (1, 2):
        shown = run(info)
        assert shown.returncode == 0 and "gpus: 2" in shown.stdout, (attempt, shown.stdout + shown.stderr)
        injected = run(inject)
        assert injected.returncode == 0, (attempt, injected.stdout + injected.stderr)
        assert "NVIDIA-SMI stand-in  Driver Version: 550.54.15" in injected.stdout and "GPU node /dev/nvidia1" in injected.stdout
        assert "dev/nvidia1" in empty_files(rootfs)  # the mount points of a run by hand
        cleaned = run(reset)
        assert cleaned.returncode == 0, cleaned.stderr
        assert empty_files(rootfs) == [] and "as it was built again" in cleaned.stdout
    # the next manual run with another GPU sees only that GPU's node: nothing stale from before
    other = run(inject.replace("-device 0", "-device 1").replace("/usr/bin/nvidia-smi", "/bin/ls /dev"))
    assert other.returncode == 0, other.stderr
    assert "nvidia0" in other.stdout.split() and "nvidia1" not in other.stdout.split(), other.stdout
