"""The device cgroup step: parsers on real samples and garbage, and a hook run that
allows exactly the injected nodes in a real cgroup v1 devices hierarchy."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from ponytail.apply.cgroup import devices_cgroup_path, devices_directory
from ponytail.errors import InjectionError

from support.fakehost import FakeHost, make_rootfs
from support.harness import Sleeper, bundle_for, run_ponytail, state_for

HYBRID_RUNC = """12:pids:/eng-test-3
11:devices:/eng-test-3
10:cpu,cpuacct:/eng-test-3
1:name=systemd:/eng-test-3
0::/
"""
SYSTEMD_DOCKER = """5:devices:/system.slice/docker-4f1c0e.scope
4:memory:/system.slice/docker-4f1c0e.scope
0::/system.slice/docker-4f1c0e.scope
"""
UNIFIED = "0::/user.slice/user-1000.slice/session-3.scope\n"

THIS_MACHINE = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
SYSTEMD_HOST = """29 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
35 29 0:32 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,devices
36 29 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
"""


def test_devices_cgroup_path_reads_v1_lines_and_says_none_on_v2() -> None:
    assert devices_cgroup_path(HYBRID_RUNC) == "/eng-test-3"
    assert devices_cgroup_path(SYSTEMD_DOCKER) == "/system.slice/docker-4f1c0e.scope"
    assert devices_cgroup_path(UNIFIED) is None
    assert devices_cgroup_path("") is None
    assert devices_cgroup_path("garbage\n:::\n7:devicesx:/a\n") is None


def test_devices_cgroup_path_refuses_a_relative_path() -> None:
    with pytest.raises(InjectionError):
        devices_cgroup_path("5:devices:../../etc\n")


def test_devices_directory_finds_the_hierarchy_mount() -> None:
    assert devices_directory(THIS_MACHINE, "/eng-test-3") == "/sys/fs/cgroup/devices/eng-test-3"
    assert devices_directory(SYSTEMD_HOST, "/system.slice/docker-1.scope") == (
        "/sys/fs/cgroup/devices/system.slice/docker-1.scope"
    )
    assert devices_directory(THIS_MACHINE, "/") == "/sys/fs/cgroup/devices"


def test_devices_directory_with_a_partial_mount_escapes_and_garbage() -> None:
    partial = "50 40 0:33 /docker/abc /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    assert devices_directory(partial, "/docker/abc/inner") == "/sys/fs/cgroup/devices/inner"
    assert devices_directory(partial, "/docker/abcdef") is None  # another part of the hierarchy
    escaped = "50 40 0:33 / /mnt/my\\040cgroups rw - cgroup cgroup rw,devices\n"
    assert devices_directory(escaped, "/c1") == "/mnt/my cgroups/c1"
    assert devices_directory("not a mountinfo line\n- - -\n" + UNIFIED, "/c1") is None
    assert devices_directory(THIS_MACHINE.replace("devices", "freezer"), "/c1") is None
    with pytest.raises(InjectionError):
        devices_directory(THIS_MACHINE, "/../../etc")


@pytest.fixture
def contained_sleeper():
    """A stand-in container in a fresh devices cgroup that denies every device."""
    cgroup = Path("/sys/fs/cgroup/devices") / f"ponytail-test-{uuid.uuid4().hex[:12]}"
    cgroup.mkdir()
    sleeper = Sleeper()
    try:
        (cgroup / "devices.deny").write_text("a")
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        yield sleeper, cgroup
    finally:
        sleeper.stop()
        cgroup.rmdir()


def test_hook_allows_exactly_the_injected_nodes_in_the_devices_cgroup(host: FakeHost, tmp_path: Path, contained_sleeper) -> None:
    sleeper, cgroup = contained_sleeper
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=1"])  # GPU index 1 has minor 0
    assert (cgroup / "devices.list").read_text() == ""
    result = run_ponytail(["-config", str(host.write_config())], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 0, result.stderr
    assert (cgroup / "devices.list").read_text().split("\n")[:-1] == [
        "c 195:0 rw", "c 195:255 rw", "c 511:0 rw", "c 511:1 rw",
    ]
    # a process in that cgroup and in the container's mount namespace reaches the nodes it was given
    check = f"echo $$ > {cgroup}/cgroup.procs && exec nsenter -t {sleeper.pid} -m chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia0 /dev/nvidiactl /dev/nvidia2"
    inside = subprocess.run(["sh", "-c", check], capture_output=True, text=True, timeout=60).stdout
    assert "open /dev/nvidia0 ENXIO" in inside and "open /dev/nvidiactl ENXIO" in inside, inside
    assert "open /dev/nvidia2 ENOENT" in inside, inside
    assert f"allowed c 195:0 rw, c 195:255 rw, c 511:0 rw, c 511:1 rw in {cgroup}/devices.allow" in host.log.read_text()


def test_debug_shows_the_device_rules(host: FakeHost, rootfs: Path) -> None:
    result = run_ponytail(["-config", str(host.write_config()), "-root", str(rootfs), "-device", "0", "-debug"])
    assert result.returncode == 0, result.stderr
    assert "allow c 195:2 rw, c 195:255 rw, c 511:0 rw, c 511:1 rw" in result.stdout.decode()
