"""Device selection and the container's request, table by table: which GPUs and MIG devices a
selector names (indices, UUIDs, PCI bus ids, MIG indices and UUIDs, all/none/void), the one-line
error for anything else, and where each part of a request comes from. Pure: GPUs are plain
records (support.hostdata); no root, no files (pytest -m unit runs these as any user)."""

from __future__ import annotations

import pytest

from ponytail.container.request import DeviceRequest, build_request, device_request
from ponytail.errors import InputError
from ponytail.plan.select import names_by_identity, select_devices, select_gpus

from support.hostdata import gpu_list, uuid

# 3 GPUs in bus order 0000:18, 0000:28, 0000:38 with minors 2, 0, 1; GPU 2 has MIG devices 2:1:0 and 2:2:0
GPUS = gpu_list(3, minors=[2, 0, 1], mig={2: [(1, 0), (2, 0)]})
MIG_UUIDS = {"MIG-aaaa": (1, 1, 0), "MIG-bbbb": (1, 2, 0), "MIG-elsewhere": (7, 1, 0)}  # NVML's: UUID -> (minor, gi, ci)


def select(selector: str, mig_uuids: dict | None = None) -> tuple[list[int], list[str]]:
    """(indices of the whole GPUs, names of the MIG devices) that ``selector`` selects."""
    chosen = select_devices(GPUS, DeviceRequest(selector, "NVIDIA_VISIBLE_DEVICES"), lambda: dict(mig_uuids or MIG_UUIDS))
    return [g.index for g in chosen.gpus], [m.name for m in chosen.migs]


@pytest.mark.parametrize(
    ("selector", "gpus", "migs"),
    [
        ("all", [0, 1, 2], []),
        ("ALL", [0, 1, 2], []),
        ("none", [], []),
        ("void", [], []),
        ("", [], []),
        ("  ", [], []),
        ("0", [0], []),
        ("2,0", [2, 0], []),  # in the order named
        ("0,0, 0", [0], []),  # once each
        (" 1 , ,2 ", [1, 2], []),  # spaces and empty items ignored
        (uuid(1), [1], []),
        (uuid(1).lower().replace("gpu-", "GPU-"), [1], []),
        (uuid(2).upper().replace("GPU-", "gpu-"), [2], []),  # UUIDs in any case
        ("0000:28:00.0", [1], []),
        ("00000000:28:00.0", [1], []),  # 32-bit domain, as nvidia-smi writes it
        ("28:00.0", [1], []),  # no domain
        ("0000:38:00.0,0", [2, 0], []),
        ("2:1:0", [], ["2:1:0"]),
        ("2:2:0,2:1:0", [], ["2:2:0", "2:1:0"]),
        ("MIG-aaaa", [], ["2:1:0"]),
        ("mig-BBBB", [], ["2:2:0"]),
        ("0,MIG-aaaa,2:1:0", [0], ["2:1:0"]),  # one MIG device named twice, once each
    ],
)
def test_a_selector_selects(selector: str, gpus: list[int], migs: list[str]) -> None:
    assert select(selector) == (gpus, migs)


def test_nvml_is_asked_for_mig_uuids_only_when_one_is_named() -> None:
    asked = []

    def mig_uuids() -> dict[str, tuple[int, int, int]]:
        asked.append(1)
        return MIG_UUIDS

    for selector in ("all", "0,1", uuid(0), "2:1:0", "0000:18:00.0"):
        select_devices(GPUS, DeviceRequest(selector, "test"), mig_uuids)
    assert asked == []
    select_devices(GPUS, DeviceRequest("MIG-aaaa,MIG-bbbb", "test"), mig_uuids)
    assert asked == [1]  # once for both


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("3", "unknown GPU '3' in NVIDIA_VISIBLE_DEVICES='3': this host has 3 GPUs (indices 0-2; see 'ponytail info')"),
        ("0,7", "unknown GPU '7' in NVIDIA_VISIBLE_DEVICES='0,7': this host has 3 GPUs"),
        ("-1", "unknown GPU '-1'"),
        ("²", "unknown GPU '²'"),  # a digit to str.isdigit, not to int()
        ("GPU-nope", "unknown GPU 'GPU-nope'"),
        ("0000:99:00.0", "unknown GPU '0000:99:00.0'"),
        ("0000:18:00.8", "unknown GPU '0000:18:00.8'"),  # not a bus id: functions are 0-7
        ("first", "unknown GPU 'first'"),
        ("0:1:0", "unknown MIG device '0:1:0' in NVIDIA_VISIBLE_DEVICES='0:1:0': this host has MIG devices 2:1:0, 2:2:0"),
        ("2:9:0", "unknown MIG device '2:9:0'"),
        ("5:1:0", "unknown MIG device '5:1:0'"),
        ("MIG-cccc", "unknown MIG device 'MIG-cccc'"),
        ("MIG-elsewhere", "unknown MIG device 'MIG-elsewhere'"),  # NVML knows it, on no GPU of ours
    ],
)
def test_a_bad_selector_is_one_clear_error_naming_it(selector: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        select(selector)
    assert raised.value.message.startswith(message)
    assert "\n" not in raised.value.message


def test_the_error_on_a_one_gpu_host_names_the_gpu() -> None:
    with pytest.raises(InputError) as raised:
        select_devices(gpu_list(1), DeviceRequest("1", "-device"))
    assert raised.value.message == f"unknown GPU '1' in -device='1': this host has 1 GPU (index 0, 0000:18:00.0, {uuid(0)})"


def test_a_host_without_mig_says_so() -> None:
    with pytest.raises(InputError) as raised:
        select_devices(gpu_list(2), DeviceRequest("0:0:0", "NVIDIA_VISIBLE_DEVICES"))
    assert raised.value.message.endswith("this host has no MIG devices")


def test_select_gpus_leaves_mig_devices_out() -> None:
    assert [g.index for g in select_gpus(GPUS, DeviceRequest("1,2:1:0", "NVIDIA_MIG_CONFIG_DEVICES"))] == [1]


ENV = {"NVIDIA_VISIBLE_DEVICES": "1"}
PLUGIN = ("0", "device plugin volume mounts")


@pytest.mark.parametrize(
    ("cli", "env", "plugin", "accept_env", "selector", "source"),
    [
        ("2", ENV, PLUGIN, True, "2", "-device"),  # the command line wins
        (None, ENV, PLUGIN, True, "0", "device plugin volume mounts"),  # then the device plugin
        (None, ENV, None, True, "1", "NVIDIA_VISIBLE_DEVICES"),  # then the env
        (None, {}, None, True, "all", "default"),  # then all
        (None, None, None, True, "all", "default"),
        (None, ENV, PLUGIN, False, "0", "device plugin volume mounts"),  # the plugin counts even then
        (None, ENV, None, False, "void", "NVIDIA_VISIBLE_DEVICES='1' refused: unprivileged container"),
        (None, {}, None, False, "void", "the default (all) refused: unprivileged container"),
    ],
)
def test_who_decides_which_devices(
    cli: str | None, env: dict | None, plugin: tuple | None, accept_env: bool, selector: str, source: str
) -> None:
    request = device_request(cli, env, plugin, accept_env)
    assert request.selector == selector
    assert request.source.startswith(source)


@pytest.mark.parametrize(
    ("selector", "void"),
    [("void", True), ("VOID ", True), ("", True), ("/var/run/nvidia-container-devices", True), ("none", False), ("all", False), ("0", False)],
)
def test_void_means_not_a_gpu_container(selector: str, void: bool) -> None:
    assert DeviceRequest(selector, "NVIDIA_VISIBLE_DEVICES").is_void is void


@pytest.mark.parametrize(
    ("cli", "env", "capabilities", "source", "unknown"),
    [
        (None, {}, ("compute", "utility"), "default", ()),
        (None, {"NVIDIA_DRIVER_CAPABILITIES": "graphics"}, ("graphics",), "NVIDIA_DRIVER_CAPABILITIES", ()),
        ("utility", {"NVIDIA_DRIVER_CAPABILITIES": "graphics"}, ("utility",), "--capabilities", ()),
        (None, {"NVIDIA_DRIVER_CAPABILITIES": "utility,warp"}, ("utility",), "NVIDIA_DRIVER_CAPABILITIES", ("warp",)),
    ],
)
def test_where_the_capabilities_come_from(cli: str | None, env: dict, capabilities: tuple, source: str, unknown: tuple) -> None:
    request = build_request(cli_capabilities=cli, env=env)
    assert (request.capabilities, request.capabilities_source, request.unknown_capabilities) == (capabilities, source, unknown)


@pytest.mark.parametrize("var", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_mig_config_and_monitor_are_for_privileged_containers_only(var: str) -> None:
    privileged = build_request(env={var: "all"}, privileged=True)
    asked = privileged.mig_config if var.endswith("CONFIG_DEVICES") else privileged.mig_monitor
    assert asked == DeviceRequest("all", var)
    with pytest.raises(InputError) as raised:
        build_request(env={var: "all"}, privileged=False)
    assert raised.value.message == f"{var}='all' is only honoured for privileged containers (with CAP_SYS_ADMIN)"
    for nothing in ("", "void", "none"):  # asking for nothing is fine anywhere
        request = build_request(env={var: nothing}, privileged=False)
        assert request.mig_config is None and request.mig_monitor is None


def test_an_unprivileged_container_without_accept_env_gets_the_plugins_devices_only() -> None:
    refused = build_request(env={"NVIDIA_VISIBLE_DEVICES": "all"}, privileged=False, accept_env_when_unprivileged=False)
    assert refused.devices.is_void
    allowed = build_request(env={"NVIDIA_VISIBLE_DEVICES": "all"}, privileged=False)
    assert allowed.devices == DeviceRequest("all", "NVIDIA_VISIBLE_DEVICES")


@pytest.mark.parametrize("selector, by_identity", [
    ("GPU-8f6e0000-1111-2222-3333-444455556666", True), ("0000:3b:00.0", True), ("3b:00.0", True),
    ("MIG-aaaa", True), ("GPU-aaaa,0000:3b:00.0", True), ("none", True), ("void", True),
    ("0", False), ("all", False), ("1:0:0", False), ("GPU-aaaa,1", False), ("", True), (" , ", True),
])
def test_which_requests_name_gpus_by_what_survives_renumbering(selector: str, by_identity: bool) -> None:
    """With a GPU lost by the driver only these may start (indices, all and GPU:GI:CI are ambiguous)."""
    assert names_by_identity(DeviceRequest(selector, "test")) is by_identity
