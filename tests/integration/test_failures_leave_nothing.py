"""Nothing lost, nothing left behind: a run that fails part-way takes back the mounts it made, a
second run for the same container stacks nothing, every failure is logged with the container's
id, and a container that has already pivoted into its image is refused before anything is done."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.commands import PONYTAIL, shell
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import bundle_for, in_private_mount_ns, run_ponytail, state_for, tree_digest
from support.hostile import CUDA_OK, Stage

PY = shell(PONYTAIL)


HOST_SHAPE = {"gpu_list": gpus(2)}  # shared_host's


@pytest.fixture
def stage(tmp_path: Path, shared_host: FakeHost) -> Iterator[Stage]:
    s = Stage(tmp_path, shared_host, container_id=f"ctr-{tmp_path.name}")
    yield s
    s.close()


def test_a_second_run_for_the_same_container_stacks_no_mount(stage: Stage) -> None:
    first = stage.inject()
    assert first.returncode == 0, first.stderr
    after_first = stage.container_mounts()
    assert len(after_first) > len(stage.mounts_before)
    second = stage.inject()
    assert second.returncode == 0, second.stderr
    assert stage.container_mounts() == after_first
    last = stage.host.log.read_text().splitlines()[-1]
    in_place = re.search(rf"container={stage.id} injected .* (\d+) already in place", last)
    assert in_place and int(in_place.group(1)) >= 8, last  # 5 nodes, 2 libraries, nvidia-smi
    assert CUDA_OK in stage.run_in_image("/usr/local/bin/cudacheck")


def test_a_failure_after_mounting_takes_the_mounts_back_in_hook_mode(stage: Stage) -> None:
    # everything is mounted, then the host's ldconfig fails on the image's planted temp file
    stage.symlink("/etc/ld.so.cache~", "/nowhere")
    result = stage.inject()
    assert result.returncode == 1
    assert "ld.so.cache~" in result.stderr.decode()
    assert stage.container_mounts() == stage.mounts_before
    stage.assert_host_untouched()


def test_a_failure_after_mounting_takes_the_mounts_back_in_manual_mode(shared_host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    os.symlink("/nowhere", rootfs / "etc/ld.so.cache~")
    result = in_private_mount_ns(
        f"""
        {PY} -config {shared_host.write_config()} -root {rootfs} && echo rc=0 || echo rc=$?
        grep -c ' {rootfs}/' /proc/self/mountinfo || true
        """
    )
    lines = result.stdout.split()
    assert lines == ["rc=1", "0"], result.stdout + result.stderr


def test_every_failure_is_logged_with_the_container_id(shared_host: FakeHost, tmp_path: Path) -> None:
    # the id is known, the bundle is not there: the log still names the container
    state = state_for(tmp_path / "no-bundle", os.getpid(), container_id="lost-bundle-ctr")
    result = run_ponytail(["-config", str(shared_host.write_config())], stdin=state)
    assert result.returncode == 2
    line = shared_host.log.read_text().splitlines()[-1]
    assert "error container=lost-bundle-ctr " in line and "config.json not found" in line, line


class PivotedSleeper:
    """A process that has already pivot_root'ed into the rootfs, as a container has once it runs."""

    def __init__(self, rootfs: Path) -> None:
        script = f"mount --bind {rootfs} {rootfs} && cd {rootfs} && mkdir -p .old && pivot_root . .old && exec /.old/bin/sleep 600"
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script], start_new_session=True)
        deadline = time.monotonic() + 60  # seconds on a busy machine
        while time.monotonic() < deadline and self.proc.poll() is None:
            if Path(f"/proc/{self.proc.pid}/comm").read_text().strip() == "sleep":
                return
            time.sleep(0.01)
        raise RuntimeError(f"the pivoted stand-in never started (exit status {self.proc.poll()})")

    def stop(self) -> None:
        os.killpg(self.proc.pid, 9)
        self.proc.wait()


def test_a_container_that_has_already_pivoted_is_refused(shared_host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    # the image recreates the host's path of its own rootfs inside itself, so that a hook that
    # trusted the pivoted namespace's / would find a "rootfs" there, and the image's files
    (rootfs / str(rootfs).lstrip("/")).mkdir(parents=True)
    sleeper = PivotedSleeper(rootfs)
    try:
        before = tree_digest(rootfs)
        state = state_for(bundle_for(tmp_path, rootfs), sleeper.proc.pid)
        result = run_ponytail(["-config", str(shared_host.write_config())], stdin=state, isolated=False)
        assert result.returncode == 1
        assert "has already switched its root to the rootfs" in result.stderr.decode()
        assert tree_digest(rootfs) == before
    finally:
        sleeper.stop()


def test_a_second_run_in_manual_mode_stacks_no_mount_either(shared_host: FakeHost, tmp_path: Path) -> None:
    """Also the read-only tmpfs that masks /proc/driver/nvidia, and the IPC sockets."""
    rootfs = make_rootfs(tmp_path / "rootfs")
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)
    result = in_private_mount_ns(
        f"""
        {PY} -config {shared_host.write_config()} -root {rootfs} -capabilities all
        grep -c ' {rootfs}/' /proc/self/mountinfo
        {PY} -config {shared_host.write_config()} -root {rootfs} -capabilities all
        grep -c ' {rootfs}/' /proc/self/mountinfo
        grep -c ' {rootfs}/proc/driver/nvidia ' /proc/self/mountinfo
        """
    )
    assert result.returncode == 0, result.stderr
    first, second, masks = (int(n) for n in result.stdout.split())
    assert first == second and masks == 1, result.stdout
