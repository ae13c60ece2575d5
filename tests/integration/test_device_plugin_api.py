"""The device-plugin API between the project's kubelet stand-in and its stand-in for NVIDIA's device plugin
(tests/support/device_plugin.py): the kubelet makes every call a real kubelet makes (GetPreferredAllocation
included: a kubelet 1.36 asks it of NVIDIA's plugin before Allocate), and Allocate answers each strategy as
NVIDIA's plugin v0.20.0 was seen to (../shared/nvidia/README.md); in the CDI strategies the plugin's spec
names the GPUs by UUID and ponytail finds it true for the host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.device_plugin import ANNOTATION_PREFIX, STRATEGIES, VOLUME_ROOT, DevicePlugin, Kubelet, cri_request
from support.engines import console_script
from support.fakehost import FakeHost
from support.harness import run_ponytail
from support.nvidia_tools import DEVICE_PLUGIN_KIND, captured_host


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    return captured_host(tmp_path_factory.mktemp("plugin-host"))


@pytest.fixture(params=STRATEGIES)
def plugin(request: pytest.FixtureRequest, host: FakeHost, tmp_path: Path) -> Iterator[tuple[Kubelet, DevicePlugin]]:
    plugins, cdi = tmp_path / "device-plugins", tmp_path / "cdi"
    plugins.mkdir()
    cdi.mkdir()
    hook = tmp_path / "usr-bin/nvidia-ctk"  # the plugin's default hook path, served by ponytail
    hook.parent.mkdir()
    hook.symlink_to(console_script("ponytail"))
    kubelet = Kubelet(plugins, tmp_path / "pb")
    device_plugin = DevicePlugin(host, plugins, cdi, request.param, str(hook))
    try:
        yield kubelet, device_plugin
    finally:
        device_plugin.stop()
        kubelet.close()


def test_the_kubelet_admits_a_gpu_through_every_call_and_gets_nvidias_answer(plugin: tuple[Kubelet, DevicePlugin], host: FakeHost) -> None:
    kubelet, device_plugin = plugin
    devices = kubelet.devices()
    assert [d.ID for d in devices] == [g.uuid for g in sorted(host.gpu_list, key=lambda g: g.bus_id)]
    assert {d.health for d in devices} == {"Healthy"}
    chosen = host.gpu_list[1].uuid
    request = cri_request(kubelet.allocate([chosen]))
    named = f"{DEVICE_PLUGIN_KIND}={chosen}"
    strategy = device_plugin.strategy
    expected = {
        "envvar": {"env": {"NVIDIA_VISIBLE_DEVICES": chosen}, "mounts": [], "annotations": {}, "cdi_devices": ()},
        "volume-mounts": {"env": {"NVIDIA_VISIBLE_DEVICES": VOLUME_ROOT}, "mounts": [("/dev/null", f"{VOLUME_ROOT}/{chosen}")],
                          "annotations": {}, "cdi_devices": ()},
        "cdi-cri": {"env": {}, "mounts": [], "annotations": {}, "cdi_devices": (named,)},
    }
    if strategy == "cdi-annotations":
        [(key, value)] = request.pop("annotations").items()
        assert key.startswith(ANNOTATION_PREFIX) and len(key) == len(ANNOTATION_PREFIX) + 36 and value == named, (key, value)
        assert request == {"env": {}, "mounts": [], "cdi_devices": ()}, request
    else:
        assert request == expected[strategy], request
    if strategy.startswith("cdi-"):
        spec = yaml.safe_load(device_plugin.spec.read_text())
        assert spec["kind"] == DEVICE_PLUGIN_KIND and chosen in [d["name"] for d in spec["devices"]]
        assert {tuple(h["args"][:2]) for h in spec["containerEdits"]["hooks"]} == {("nvidia-ctk", "hook")}
        checked = run_ponytail(["cdi", "check", "-config", str(host.write_config()), str(device_plugin.spec)])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    else:
        assert not device_plugin.spec.exists()


def test_a_gpu_the_plugin_does_not_have_fails_the_admission(plugin: tuple[Kubelet, DevicePlugin]) -> None:
    import grpc

    kubelet, _ = plugin
    with pytest.raises((AssertionError, grpc.RpcError)):
        kubelet.allocate(["GPU-00000000-0000-0000-0000-000000000000"])
