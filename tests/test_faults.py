"""Faults: a wedged GPU, a slow ldconfig, closed pipes, full filesystems, broken caches,
inconsistent hosts. Under each, ponytail must never inject the wrong GPU, never report
a broken start as success, and never run past the engine's deadline."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import in_private_mount_ns, run_ponytail, state_for, bundle_for
from engines import RUNTIMES, console_script, hook_entry, oci_bundle, unique
from fakehost import FakeHost, gpus, make_rootfs


def processes_mapping(path: Path) -> list[int]:
    """Processes that have a file under ``path`` mapped (the driver's libcuda, say)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/maps", "rb") as f:
                    if str(path).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def processes_named(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_until_gone(find, *args) -> list[int]:
    """What ``find`` still finds after up to 5 s (a killed process takes a moment to go)."""
    for _ in range(100):
        left = find(*args)
        if not left:
            return []
        time.sleep(0.05)
    return left


def run_runc(bundle: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    container_id = unique()
    try:
        return subprocess.run(
            RUNTIMES["runc"] + ["run", "--bundle", str(bundle), container_id],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(RUNTIMES["runc"] + ["delete", "-f", container_id], capture_output=True, timeout=60)


# -- 1. deadlines ---------------------------------------------------------------------


def test_a_wedged_libcuda_fails_the_start_within_the_probe_deadline(tmp_path: Path) -> None:
    """cuDriverGetVersion never returns (and its library started a helper process): the
    requirement check's child is killed with its process group at [timeouts] probe, the
    start fails with one line, and runc returns long before its own hook timeout."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), cuda_blocks=2)
    config = host.base / "config.toml"
    config.write_text(host.config_text() + "[timeouts]\nprobe = 1\n")
    hook = {**hook_entry(config), "timeout": 30}
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=11.0"], hooks={"prestart": [hook]})
    result = run_runc(bundle, timeout=25)
    assert result.returncode != 0
    assert "cuDriverGetVersion did not answer within 1 s (killed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert wait_until_gone(processes_mapping, host.driver) == []


def test_runc_killing_the_hook_at_its_deadline_leaves_no_child_and_is_not_kept_waiting(tmp_path: Path) -> None:
    """runc's hook timeout comes first: runc kills the hook and must not wait for the
    child (which never holds runc's pipes), and the child dies with the hook."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1), cuda_blocks=1)
    config = host.base / "config.toml"
    config.write_text(host.config_text() + "[timeouts]\nprobe = 300\n")
    hook = {**hook_entry(config), "timeout": 2}
    bundle = oci_bundle(tmp_path, ["true"], env=["NVIDIA_REQUIRE_CUDA=cuda>=11.0"], hooks={"prestart": [hook]})
    result = run_runc(bundle, timeout=25)  # before: runc waited as long as the child lived
    assert result.returncode != 0
    assert "hook ran past specified timeout" in result.stderr, result.stderr
    assert wait_until_gone(processes_mapping, host.driver) == []


def test_ldconfig_past_its_deadline_is_killed_with_its_process_group(host: FakeHost, rootfs: Path, tmp_path: Path) -> None:
    marker = f"98765{os.getpid() % 1000}"
    slow = tmp_path / "slow-ldconfig"
    slow.write_text(f"#!/bin/sh\nsleep {marker} &\nexec sleep {marker}\n")
    slow.chmod(0o755)
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace("[log]", f'ldconfig = "{slow}"\n[log]') + "[timeouts]\nldconfig = 1\n")
    result = run_ponytail(["-config", str(config), "-root", str(rootfs)])
    assert result.returncode == 1, result.stderr
    assert result.stderr.decode().startswith(f"ponytail: error: {slow} -r ") and "did not finish within 1 s (killed)" in result.stderr.decode()
    assert result.stderr.decode().count("\n") == 1
    assert wait_until_gone(processes_named, f"sleep {marker}") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("[timeouts]\nprobe = 0\n", "'timeouts.probe' must be a number of seconds above 0"),
        ("[timeouts]\nldconfig = \"5\"\n", "'timeouts.ldconfig' must be a number of seconds"),
        ("[timeouts]\nlock = true\n", "'timeouts.lock' must be a number of seconds"),
        ("[timeouts]\nprobe = 601\n", "at most 600"),
        ("[timeouts]\nchild = 1\n", "unknown key 'timeouts.child'"),
    ],
)
def test_timeouts_are_validated(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = run_ponytail(["-config", str(config), "-debug"])
    assert result.returncode == 2 and message in result.stderr.decode(), result.stderr
