"""The plan says what apply does: each mount's options are in the plan (MOUNT_OPTIONS by kind), the
executor sets exactly those, -debug prints them; every control node a capability names is in the one
registry the probe reads (capabilities.CONTROL_NODES)."""

from __future__ import annotations

from pathlib import Path

from ponytail.capabilities import CAPABILITIES, CONTROL_NODES
from ponytail.plan.operations import MOUNT_OPTIONS

from support.commands import PONYTAIL, shell
from support.fakehost import FakeHost, gpus
from support.harness import in_private_mount_ns, run_ponytail

V = "550.54.15"
LIB = "/usr/lib/x86_64-linux-gnu"


def test_every_node_a_capability_names_is_in_the_registry() -> None:
    named = {node for capability in CAPABILITIES.values() for node in capability.nodes}
    assert named and named <= set(CONTROL_NODES)
    assert "nvidiactl" in CONTROL_NODES  # every plan has it


HOST_SHAPE = {"gpu_list": gpus(1), "daemons": True}  # host's


def test_the_executor_sets_exactly_the_plans_mount_options(host: FakeHost, rootfs: Path) -> None:
    config = host.write_config()
    debug = run_ponytail(["-config", str(config), "-root", str(rootfs), "-capabilities", "utility,compute,display", "-debug"])
    assert debug.returncode == 0, debug.stderr
    printed = debug.stdout.decode()
    assert f"-> {LIB}/libcuda.so.{V}  (library, " in printed and "; ro,nosuid,nodev)" in printed
    assert "-> /dev/nvidia0  (c 195:0, GPU 0" in printed and "; nosuid,noexec)" in printed
    command = shell([*PONYTAIL, "-config", str(config), "-root", str(rootfs), "-capabilities", "utility,compute,display"])
    result = in_private_mount_ns(f"{command}\ncat /proc/self/mountinfo")
    assert result.returncode == 0, result.stderr
    options = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[4].startswith(f"{rootfs}/"):
            options[fields[4][len(str(rootfs)):]] = set(fields[5].split(","))
    expected = {
        f"{LIB}/libcuda.so.{V}": "library", "/usr/bin/nvidia-smi": "binary", f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin": "file",
        "/dev/nvidia0": "device", "/dev/nvidia-modeset": "device", "/run/nvidia-persistenced/socket": "ipc", "/tmp/nvidia-mps": "ipc",
    }
    for target, kind in expected.items():
        wanted = set(MOUNT_OPTIONS[kind])
        flags = {"ro", "nosuid", "nodev", "noexec"}
        assert options[target] & flags == wanted, (target, options[target])
        assert ("ro" in options[target]) == ("ro" in wanted) and ("rw" in options[target]) == ("ro" not in wanted)
