"""runc and crun run ponytail from config.json (prestart or createRuntime): a real container
from a busybox rootfs on a fake driver, behind the device cgroup `runc spec` closes."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, hook_entry, oci_bundle, run_bundle, unique
from support.fakehost import FakeHost


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_hook_gives_the_container_the_selected_gpu(runtime: str, stage: str, host: FakeHost, tmp_path: Path) -> None:
    hooks = {stage: [hook_entry(host.write_config())]}
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=["NVIDIA_VISIBLE_DEVICES=0"], hooks=hooks)
    container_id = unique()
    result = run_bundle(runtime, bundle, container_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    log = host.log.read_text()
    assert f"container={container_id} allowed c 195:2 rw" in log
    assert f"container={container_id} injected into {bundle}/rootfs: GPUs [0]" in log


def test_runc_reports_a_hook_failure_with_its_reason(host: FakeHost, tmp_path: Path) -> None:
    hooks = {"prestart": [hook_entry(host.write_config())]}
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=["NVIDIA_VISIBLE_DEVICES=7"], hooks=hooks)
    container_id = unique()
    result = run_bundle("runc", bundle, container_id)
    assert result.returncode != 0
    assert "cuDriverGetVersion" not in result.stdout  # the container never ran
    reason = "ponytail: error: unknown GPU '7' in NVIDIA_VISIBLE_DEVICES='7': this host has 3 GPUs"
    assert "error running hook" in result.stderr and reason in result.stderr, result.stderr
    assert f"error container={container_id} unknown GPU '7'" in host.log.read_text()


def test_crun_reports_a_hook_failure_and_shows_the_reason_when_asked(host: FakeHost, tmp_path: Path) -> None:
    hooks = {"createRuntime": [hook_entry(host.write_config())]}
    env = ["NVIDIA_VISIBLE_DEVICES=GPU-nope"]
    reason = "ponytail: error: unknown GPU 'GPU-nope'"
    # crun sends a hook's stderr to /dev/null: the user sees the exit status, the log has the reason
    container_id = unique()
    result = run_bundle("crun", oci_bundle(tmp_path, CUDACHECK_GPU0, env=env, hooks=hooks), container_id)
    assert result.returncode != 0 and "cuDriverGetVersion" not in result.stdout
    assert "error executing hook" in result.stderr and "(exit code: 2)" in result.stderr, result.stderr
    assert f"error container={container_id} unknown GPU 'GPU-nope'" in host.log.read_text()
    # crun's annotation run.oci.hooks.stderr puts the hook's one line in front of the user
    bundle = oci_bundle(tmp_path, CUDACHECK_GPU0, env=env, hooks=hooks, annotations={"run.oci.hooks.stderr": "/dev/stderr"})
    result = run_bundle("crun", bundle)
    assert result.returncode != 0 and reason in result.stderr, result.stderr
