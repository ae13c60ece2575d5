"""The device plugin's answers through the kubelet's path on containerd 1.6 (Debian's), the default runtime
ponytail-runtime: the kubelet stand-in admits a GPU from the stand-in of NVIDIA's device plugin (every call a
kubelet makes, GetPreferredAllocation included) and creates the container through CRI with the answer, as the
kubelet does. The plugin's volume-mounts strategy (a /dev/null mount per GPU UUID) and its cdi-annotations
strategy (``cdi.k8s.io/nvidia-device-plugin_<uuid>`` naming k8s.device-plugin.nvidia.com/gpu=<UUID>, read by
ponytail-runtime: containerd 1.6 has no CDI) give exactly the allocated GPU."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_engine_containerd import CUDACHECK_GPU1, EXPECTED_GPU1, Node, node  # noqa: F401 - node: the fixture

from support.device_plugin import DevicePlugin, Kubelet, cri_request

pytestmark = pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")


@pytest.fixture(params=["volume-mounts", "cdi-annotations"])
def plugin(request: pytest.FixtureRequest, node: Node, tmp_path: Path) -> Iterator[tuple[Kubelet, DevicePlugin]]:  # noqa: F811
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    kubelet = Kubelet(plugins, tmp_path / "pb")
    device_plugin = DevicePlugin(node.host, plugins, tmp_path / "cdi", request.param, "/usr/bin/nvidia-ctk")
    try:
        yield kubelet, device_plugin
    finally:
        device_plugin.stop()
        kubelet.close()


def test_the_device_plugins_answer_gives_exactly_the_allocated_gpu(node: Node, plugin: tuple[Kubelet, DevicePlugin]) -> None:  # noqa: F811
    kubelet, device_plugin = plugin
    second = sorted(node.host.gpu_list, key=lambda g: g.bus_id)[1]  # GPU index 1: /dev/nvidia0 on this host
    request = cri_request(kubelet.allocate([second.uuid]))
    assert second.uuid in str(request), request
    container_id, code, lines = node.pods.run(CUDACHECK_GPU1, **request)
    assert code == 0 and lines == EXPECTED_GPU1, (device_plugin.strategy, lines, node.log()[-2000:])
    assert f"container={container_id}" in node.log()
