"""cgroup v2 hosts: runc (and podman through hooks.d) attach an eBPF device program to the
container's cgroup before the hooks run; ponytail's hook must widen it by exactly the
injected nodes. The engines run with a pure cgroup v2 view (engines.pure_v2)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Podman, console_script, hook_entry, oci_bundle, run_bundle, unique
from support.fakehost import FakeHost, make_rootfs

# c 195:200 is a GPU minor nobody injected: the engine's program denies it, and so must ponytail's
DENIED = "/denied-nvidia200"
CHECKS = CUDACHECK_GPU0 + [DENIED, "/dev/null"]
EXPECTED = EXPECTED_GPU0 + [f"open {DENIED} EPERM", "open /dev/null OK"]


def _plant_denied_node(rootfs: Path) -> None:
    os.mknod(rootfs / DENIED.lstrip("/"), 0o666 | 0o020000, os.makedev(195, 200))


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
def test_runc_on_cgroup_v2_lets_the_container_open_exactly_the_injected_nodes(stage: str, host: FakeHost, tmp_path: Path) -> None:
    bundle = oci_bundle(tmp_path, CHECKS, env=["NVIDIA_VISIBLE_DEVICES=0"], hooks={stage: [hook_entry(host.write_config())]})
    _plant_denied_node(bundle / "rootfs")
    container_id = unique()
    result = run_bundle("runc-v2", bundle, container_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED, result.stdout
    log = host.log.read_text()
    assert f"container={container_id} allowed c 195:2 rw, c 195:255 rw, c 511:0 rw, c 511:1 rw: replaced device program(s)" in log
    assert "atomically" in log


def test_runc_on_cgroup_v2_without_the_hook_denies_the_nodes(host: FakeHost, tmp_path: Path) -> None:
    """The control: the same container, the nodes bind-mounted but the program left alone."""
    # libcuda is not there without the hook (cudacheck would stop before opening): the shell opens
    bundle = oci_bundle(tmp_path, ["/bin/sh", "-c", "cat /dev/nvidia2; cat /dev/null && echo null-ok"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["mounts"].append({"destination": "/dev/nvidia2", "source": str(host.dev / "nvidia2"), "type": "bind", "options": ["bind"]})
    (bundle / "config.json").write_text(json.dumps(spec))
    result = run_bundle("runc-v2", bundle)
    assert "Operation not permitted" in result.stdout + result.stderr, result.stdout + result.stderr
    assert "null-ok" in result.stdout


def _crun_can_attach_programs() -> bool:
    # crun raises RLIMIT_MEMLOCK to infinity before loading a program and fails when it may not
    return resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] == resource.RLIM_INFINITY


@pytest.mark.skipif(not _crun_can_attach_programs(), reason="crun needs RLIMIT_MEMLOCK raisable to infinity (CAP_SYS_RESOURCE) on cgroup v2")
def test_crun_on_cgroup_v2_lets_the_container_open_exactly_the_injected_nodes(host: FakeHost, tmp_path: Path) -> None:
    bundle = oci_bundle(tmp_path, CHECKS, env=["NVIDIA_VISIBLE_DEVICES=0"], hooks={"createRuntime": [hook_entry(host.write_config())]})
    _plant_denied_node(bundle / "rootfs")
    result = run_bundle("crun-v2", bundle)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED, result.stdout


def test_podman_hooksd_on_cgroup_v2_lets_the_container_open_exactly_the_injected_nodes(host: FakeHost, tmp_path: Path) -> None:
    hooks_dir = tmp_path / "hooks.d"
    installed = subprocess.run(
        [console_script("ponytail"), "install-hook", "--dir", str(hooks_dir), "--config", str(host.write_config())],
        capture_output=True, text=True, timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    podman = Podman(hooks_dir, pure_v2_cgroups=True)
    try:
        rootfs = make_rootfs(tmp_path / "rootfs")
        _plant_denied_node(rootfs)
        result = podman.run(rootfs, CHECKS, annotations={"com.example.gpu": "true"}, env=["NVIDIA_VISIBLE_DEVICES=0"])
    finally:
        podman.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED, result.stdout
    assert "allowed c 195:2 rw, c 195:255 rw, c 511:0 rw, c 511:1 rw: replaced device program(s)" in host.log.read_text()


def test_runc_s_own_program_denying_a_gpu_node_on_purpose_wins(host: FakeHost, tmp_path: Path) -> None:
    """config.json allows every device but c 195:*: runc's program then denies the GPU nodes on
    purpose (it allows what it does not name), and the hook does not widen it: exit 1, one line."""
    bundle = oci_bundle(tmp_path, CHECKS, env=["NVIDIA_VISIBLE_DEVICES=0"], hooks={"prestart": [hook_entry(host.write_config())]})
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"] = {"devices": [
        {"allow": True, "access": "rwm"}, {"allow": False, "type": "c", "major": 195, "access": "rwm"},
    ]}
    (bundle / "config.json").write_text(json.dumps(spec))
    container_id = unique()
    result = run_bundle("runc-v2", bundle, container_id)
    assert result.returncode != 0
    assert "denies /dev/nvidia2 (c 195:2) on purpose" in result.stderr, result.stderr
    assert f"error container={container_id} device program" in host.log.read_text()
