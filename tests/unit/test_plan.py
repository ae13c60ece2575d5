"""build_plan, table by table: for host data built as plain records (support.hostdata), a
request and a selection, exactly which mounts, device nodes, links, /proc mask, linker cache
and device-cgroup rules the plan holds, each with its reason, and which warnings and problems.
Pure: no root, no files (pytest -m unit runs these as any user)."""

from __future__ import annotations

import pytest

from ponytail.plan.operations import (
    LD_CONF_FILE,
    MOUNT_OPTIONS,
    AllowDevices,
    LinkerCache,
    Mount,
    Plan,
    ProcMask,
    Symlink,
)

from support.hostdata import (
    DRIVER,
    LDCONFIG,
    LIB_DIR,
    LIBCUDA,
    LIBNVML,
    MAJORS,
    MIG_GPUS,
    library,
    make_host,
    plan_for,
)


def device_targets(plan: Plan) -> list[str]:
    return [op.target for op in plan.operations if isinstance(op, Mount) and op.kind == "device"]


def of_type(plan: Plan, kind: type) -> list:  # the operations of one type, in plan order
    return [op for op in plan.operations if isinstance(op, kind)]


@pytest.mark.parametrize(
    ("selector", "gpu_nodes"),
    [
        ("0", ["/dev/nvidia2"]),  # index 0 is minor 2: indices follow the bus, minors the driver
        ("1", ["/dev/nvidia0"]),
        ("2,0", ["/dev/nvidia1", "/dev/nvidia2"]),  # in the order asked
        ("all", ["/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia1"]),
        ("GPU-00000001-1111-2222-3333-444455556666", ["/dev/nvidia0"]),
        ("0000:38:00.0", ["/dev/nvidia1"]),
        ("none", []),
    ],
)
def test_the_selected_gpus_nodes_and_nothing_else(selector: str, gpu_nodes: list[str]) -> None:
    plan = plan_for(selector)
    assert device_targets(plan) == [*gpu_nodes, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert [g.index for g in plan.gpus] == [g.index for g in plan.selection.gpus]
    assert plan.problems == () and plan.warnings == ()


@pytest.mark.parametrize(
    ("capabilities", "control_nodes"),
    [
        ("utility", ["/dev/nvidiactl"]),
        ("compute", ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]),
        ("graphics", ["/dev/nvidiactl"]),
        ("display", ["/dev/nvidiactl", "/dev/nvidia-modeset"]),
        ("video", ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]),  # video implies compute
        ("all", ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]),
    ],
)
def test_each_capability_brings_its_control_nodes(capabilities: str, control_nodes: list[str]) -> None:
    plan = plan_for("0", capabilities)
    assert device_targets(plan) == ["/dev/nvidia2", *control_nodes]


def test_every_operation_says_why_and_mounts_have_their_kinds_options() -> None:
    plan = plan_for("0")
    assert all(op.reason for op in plan.operations)
    for op in of_type(plan, Mount):
        assert op.options == MOUNT_OPTIONS[op.kind], op
        assert (op.rdev is not None) == (op.kind == "device"), op
    reasons = {op.target: op.reason for op in of_type(plan, Mount)}
    assert reasons["/dev/nvidia2"] == "GPU 0 0000:18:00.0 Tesla T4"
    assert reasons["/dev/nvidiactl"] == "control device"
    assert reasons["/dev/nvidia-uvm"] == "compute"


def test_libraries_get_soname_links_a_linker_cache_and_the_order_of_operations() -> None:
    lib32 = library(f"libcuda.so.{DRIVER}", "libcuda.so.1", bits=32)
    plan = plan_for("0", host=make_host(libraries=(LIBCUDA, LIBNVML, lib32)))
    kinds = [type(op).__name__ if not isinstance(op, Mount) else op.kind for op in plan.operations]
    # devices, libraries, their links, binaries, the /proc mask, the linker cache, the cgroup rules
    assert kinds == ["device"] * 4 + ["library"] * 3 + ["Symlink"] * 3 + ["binary", "ProcMask", "LinkerCache", "AllowDevices"]
    links = {op.target: op.link_to for op in of_type(plan, Symlink)}
    assert links == {
        f"{LIB_DIR}/libcuda.so.1": f"libcuda.so.{DRIVER}",
        f"{LIB_DIR}/libnvidia-ml.so.1": f"libnvidia-ml.so.{DRIVER}",
        "/usr/lib/i386-linux-gnu/libcuda.so.1": f"libcuda.so.{DRIVER}",
    }
    assert [m.reason for m in of_type(plan, Mount) if m.kind == "library"][2].endswith(", 32-bit")
    (cache,) = of_type(plan, LinkerCache)
    assert cache.conf_file == LD_CONF_FILE and cache.ldconfig == LDCONFIG
    assert cache.directories == ("/usr/lib/i386-linux-gnu", LIB_DIR)
    # checked after ldconfig: the 64-bit SONAMEs only
    assert cache.sonames == (("libcuda.so.1", f"{LIB_DIR}/libcuda.so.1"), ("libnvidia-ml.so.1", f"{LIB_DIR}/libnvidia-ml.so.1"))


def test_a_library_whose_name_is_its_soname_gets_no_link() -> None:
    plain = library("libnvidia-ml.so.1", "libnvidia-ml.so.1")
    plan = plan_for("0", "utility", host=make_host(libraries=(plain,)))
    assert of_type(plan, Symlink) == []


def test_the_cgroup_rules_are_exactly_the_injected_nodes() -> None:
    plan = plan_for("2,1", "all")
    (allow,) = of_type(plan, AllowDevices)
    assert allow.rules == ("c 195:1 rw", "c 195:0 rw", "c 195:255 rw", "c 511:0 rw", "c 511:1 rw", "c 195:254 rw")
    assert allow.devices == tuple(op.rdev for op in of_type(plan, Mount) if op.kind == "device")


def test_the_proc_mask_shows_only_the_selected_gpus_and_stops_device_file_changes() -> None:
    plan = plan_for("1")
    (mask,) = of_type(plan, ProcMask)
    files = dict(mask.files)
    assert sorted(files) == ["gpus/0000:28:00.0/information", "params", "version"]
    assert b"ModifyDeviceFiles: 0\n" in files["params"] and b"ModifyDeviceFiles: 1" not in files["params"]
    assert b"EnableMSI: 1" in files["params"]  # the other parameters as the driver has them


def test_no_known_capability_means_no_proc_mask() -> None:
    plan = plan_for("0", "telepathy")
    assert of_type(plan, ProcMask) == []
    assert device_targets(plan) == ["/dev/nvidia2", "/dev/nvidiactl"]


def test_a_mig_device_brings_its_parent_and_its_two_access_nodes() -> None:
    host = make_host(gpus=MIG_GPUS)
    plan = plan_for("2:1:0", host=host)
    gi_minor, ci_minor = 3 * 100 + 10, 3 * 100 + 10 + 1  # support.hostdata's numbering for GPU 2, gi 1, ci 0
    assert device_targets(plan) == [
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    reasons = {op.target: op.reason for op in of_type(plan, Mount)}
    assert reasons["/dev/nvidia1"] == "parent of MIG device 2:1:0"
    assert reasons[f"/dev/nvidia-caps/nvidia-cap{gi_minor}"] == "MIG device 2:1:0: GPU instance 1 access"
    assert [g.index for g in plan.gpus] == [2] and plan.selection.gpus == ()
    (allow,) = of_type(plan, AllowDevices)
    assert (MAJORS["nvidia-caps"], ci_minor) in allow.devices
    files = dict(of_type(plan, ProcMask)[0].files)
    assert "capabilities/gpu1/mig/gi1/access" in files and "capabilities/gpu1/mig/gi1/ci0/access" in files
    assert "capabilities/gpu1/mig/gi2/access" not in files  # the other MIG device stays hidden
    assert "gpus/0000:38:00.0/information" in files


def test_two_mig_devices_of_one_gpu_share_its_node() -> None:
    plan = plan_for("2:1:0,2:2:0", host=make_host(gpus=MIG_GPUS))
    assert device_targets(plan).count("/dev/nvidia1") == 1
    assert len([t for t in device_targets(plan) if t.startswith("/dev/nvidia-caps/")]) == 4


@pytest.mark.parametrize(("what", "minor"), [("config", 1), ("monitor", 2)])
def test_mig_config_and_monitor_access_for_a_privileged_container(what: str, minor: int) -> None:
    host = make_host(gpus=MIG_GPUS)
    plan = plan_for("none", host=host, mig_gpus={what: (host.gpus[2],)})
    assert device_targets(plan)[:2] == [f"/dev/nvidia-caps/nvidia-cap{minor}", "/dev/nvidia1"]
    reasons = {op.target: op.reason for op in of_type(plan, Mount)}
    assert reasons[f"/dev/nvidia-caps/nvidia-cap{minor}"] == f"MIG {what} access (privileged container)"
    assert reasons["/dev/nvidia1"] == f"GPU 2 0000:38:00.0 Tesla T4, for MIG {what}"
    assert f"capabilities/mig/{what}" not in dict(of_type(plan, ProcMask)[0].files)  # the host has no such file here


def test_mig_access_without_a_device_file_minor_is_a_problem() -> None:
    host = make_host(gpus=MIG_GPUS, mig_global_minors={})
    plan = plan_for("none", host=host, mig_gpus={"config": (host.gpus[2],)})
    assert plan.problems == (
        "MIG config access requested but config has no DeviceFileMinor under /proc/driver/nvidia/capabilities/mig",
    )


@pytest.mark.parametrize(
    ("broken", "capabilities", "problem", "warning"),
    [
        # a selected GPU's node, nvidiactl and a capability's required node stop the start
        ("nvidia2", "utility", "GPU 0 0000:18:00.0 Tesla T4: not a character device", None),
        ("nvidiactl", "utility", "control device: not a character device", None),
        ("nvidia-uvm", "compute", "compute: not a character device", None),
        ("nvidia-modeset", "display", "display: not a character device",  # and this host has no DRM device at all
         "display: GPU 0 0000:18:00.0 Tesla T4 has no DRM device in sysfs (nvidia-drm not loaded? 'modprobe nvidia-drm'): "
         "no /dev/dri nodes injected for it"),
        # an optional node is left out with a warning
        ("nvidia-uvm-tools", "compute", None, "/dev/nvidia-uvm-tools not injected: not a character device"),
        # a node of a GPU that is not selected does not matter
        ("nvidia0", "utility", None, None),
    ],
)
def test_a_broken_node_is_a_problem_or_a_warning(broken: str, capabilities: str, problem: str | None, warning: str | None) -> None:
    plan = plan_for("0", capabilities, host=make_host(node_problems={broken: "not a character device"}))
    assert plan.problems == ((problem,) if problem else ())
    assert plan.warnings == ((warning,) if warning else ())
    if problem or warning:
        assert f"/dev/{broken}" not in device_targets(plan)


def test_no_library_at_all_is_one_problem_naming_the_searches() -> None:
    plan = plan_for("0", host=make_host(libraries=()))
    assert len(plan.problems) == 1
    assert plan.problems[0].startswith(f"no library of driver {DRIVER} found (searched libcuda.so.* (compute), libnvidia-ml.so.* (utility)")
    assert of_type(plan, LinkerCache) == [] and of_type(plan, Symlink) == []


@pytest.mark.parametrize(
    ("libraries", "capabilities", "missing"),
    [
        ((LIBNVML,), "utility,compute", ["compute needs libcuda.so.1"]),
        ((LIBCUDA,), "utility,compute", ["utility needs libnvidia-ml.so.1"]),
        ((LIBNVML,), "utility", []),  # libcuda is not asked for
        ((LIBCUDA, LIBNVML), "all", []),
    ],
)
def test_a_capability_without_its_required_library_is_a_problem(libraries: tuple, capabilities: str, missing: list[str]) -> None:
    plan = plan_for("0", capabilities, host=make_host(libraries=libraries, reports=None))
    assert [p.split(",")[0] for p in plan.problems] == missing


def test_no_ldconfig_is_a_problem() -> None:
    plan = plan_for("0", ldconfig=None)
    assert plan.problems == ("no ldconfig on the host (looked in /sbin and /usr/sbin): set [host] ldconfig in the config",)
    assert of_type(plan, LinkerCache) == []


def test_unknown_capabilities_and_probe_notes_are_warnings() -> None:
    plan = plan_for("0", "utility,telepathy", host=make_host(notes=("GPU 0000:99:00.0 is excluded by the driver",)))
    assert plan.warnings == (
        "GPU 0000:99:00.0 is excluded by the driver",
        "unknown driver capability 'telepathy' in NVIDIA_DRIVER_CAPABILITIES ignored",
    )
    assert plan.problems == ()


@pytest.mark.parametrize(
    ("host_change", "problem"),
    [
        ({"node_problems": {"nvidia-caps/nvidia-cap310": "missing"}}, "MIG device 2:1:0: GPU instance 1 access: missing"),
        ({"caps_major": None}, "MIG device 2:1:0: GPU instance 1 access: no nvidia-caps in /proc/devices (MIG access nodes need it)"),
    ],
)
def test_a_mig_device_without_its_access_node_is_a_problem(host_change: dict, problem: str) -> None:
    plan = plan_for("2:1:0", host=make_host(gpus=MIG_GPUS, **host_change))
    assert plan.problems[0] == problem
    assert "/dev/nvidia-caps/nvidia-cap310" not in device_targets(plan)


def test_a_tree_missing_a_library_is_named_with_its_version_not_the_hosts_driver_root() -> None:
    from ponytail.lite.records import replace

    tree = "the driver tree at /opt/umd/build-a, version 560.28.03,"
    in_tree = {"tree_root": "/opt/umd/build-a", "tree_version": "560.28.03"}
    plan = plan_for("0", "utility,compute", host=replace(make_host(libraries=(LIBNVML,), reports=None), **in_tree))
    assert plan.problems[0].startswith(f"compute needs libcuda.so.1, and {tree} has none:"), plan.problems
    assert "[host] driver_root" not in plan.problems[0] and DRIVER not in plan.problems[0]
    none = plan_for("0", host=replace(make_host(libraries=()), **in_tree))
    assert none.problems[0].startswith(f"no library of {tree} found") and "reinstall the tree" in none.problems[0]
    assert "[host] driver_root" not in none.problems[0]


@pytest.mark.parametrize("selector", ["0", "2,0", "all", "none"])
@pytest.mark.parametrize("capabilities", ["utility,compute", "graphics,display", "all"])
@pytest.mark.parametrize("host_change", [{}, {"node_problems": {"nvidia2": "not a character device"}}, {"libraries": ()}])
def test_a_nodes_only_plan_is_the_full_plans_device_nodes(selector: str, capabilities: str, host_change: dict) -> None:
    # what a CDI spec's device entry is planned with (ponytail.cdi.files): the same nodes, and
    # the problems and warnings of the nodes, which come first in the full plan's
    host = make_host(**host_change)
    full = plan_for(selector, capabilities, host=host)
    nodes = plan_for(selector, capabilities, host=host, nodes_only=True)
    assert nodes.operations == tuple(op for op in full.operations if isinstance(op, Mount) and op.kind == "device")
    assert nodes.problems == full.problems[: len(nodes.problems)] and nodes.warnings == full.warnings[: len(nodes.warnings)]
    assert nodes.gpus == full.gpus and nodes.selection == full.selection
    assert not of_type(nodes, ProcMask) and not of_type(nodes, LinkerCache)
