"""NVIDIA's device plugin (v0.20.0's answers, captured: tests/support/device_plugin.py's stand-in) in its CDI modes,
served by ponytail, on Debian sid's containerd 2.1 (`make test-engines`): no change to the plugin's strategy, only its
hook binary is ponytail's (``ponytail install-nvidia-hook --at`` the plugin's ``--nvidia-cdi-hook-path``; its default
name, nvidia-ctk).

A kubelet stand-in (tests/support/device_plugin.py) serves the Registration service, lists the plugin's GPUs
with ListAndWatch, asks GetPreferredAllocation and Allocate for one, and turns the answer into the CRI
CreateContainer request as the kubelet does: ``cdi-cri`` answers with CDI devices (the CRI CDIDevices field), ``cdi-annotations`` with a
``cdi.k8s.io/`` annotation. The engine resolves them from the plugin's own spec
(kind k8s.device-plugin.nvidia.com/gpu, written by the plugin into the engine's CDI directory) and runs its
hooks: the container gets exactly the allocated GPU, libcuda.so.1 loads, every node and library is mounted
once (never injected twice, also under ponytail's runtime handler), one ponytail run for the spec's five
hooks. Management pods (the GPU Operator's ``management.nvidia.com/gpu=all``, from nvidia-ctk's management
spec) get every GPU the same way."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_engine_containerd2 import mounted

from support.cri_nodes import ENGINES, HANDLERS, CriNode, cri_node
from support.device_plugin import DevicePlugin, Kubelet, cri_request
from support.engines import console_script
from support.fakehost import FakeHost
from support.nvidia_tools import nvidia_spec

pytestmark = pytest.mark.current_engines

NODES = ["/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CHECK = ["/bin/busybox", "sh", "-c", "/usr/local/bin/cudacheck " + " ".join(NODES) + "; /bin/busybox cat /proc/self/mountinfo"]


@pytest.fixture(scope="module", params=ENGINES)
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriNode]:
    with cri_node(request.param, tmp_path_factory.mktemp("deviceplugin"), _hook_and_management_spec) as engine:
        yield engine


def _hook_and_management_spec(host: FakeHost, cdi: Path, config: Path) -> None:
    """ponytail's script at the plugin's hook path (its default name, nvidia-ctk), and the GPU Operator's
    spec for its own pods: nvidia-ctk's, vendor management.nvidia.com, device ``all``."""
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(_hook(cdi)), "--config", str(config)],
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    nvidia_spec(host, cdi / "management.nvidia.com-gpu.yaml", str(_hook(cdi)), ctk=str(_hook(cdi)), variant="management")


def _hook(cdi: Path) -> Path:
    return cdi.parent / "usr-bin" / "nvidia-ctk"  # the plugin's default --nvidia-cdi-hook-path is /usr/bin/nvidia-ctk


@pytest.fixture(params=["cdi-cri", "cdi-annotations"])
def plugin(request: pytest.FixtureRequest, node: CriNode) -> Iterator[tuple[Kubelet, str]]:
    plugins = node.cdi.parent / f"plugins-{request.param}"
    plugins.mkdir()
    kubelet = Kubelet(plugins, node.cdi.parent / "pb")
    device_plugin = DevicePlugin(node.host, plugins, node.cdi, request.param, str(_hook(node.cdi)))
    try:
        yield kubelet, request.param
    finally:
        device_plugin.stop()
        kubelet.close()


def test_the_device_plugins_cdi_modes_give_exactly_the_allocated_gpu(node: CriNode, plugin: tuple[Kubelet, str]) -> None:
    kubelet, strategy = plugin
    devices = kubelet.devices()
    assert sorted(d.ID for d in devices) == sorted(g.uuid for g in node.host.gpu_list) and {d.health for d in devices} == {"Healthy"}
    chosen = node.host.gpu_list[2]  # /dev/nvidia1
    request = cri_request(kubelet.allocate([chosen.uuid]))
    named = f"k8s.device-plugin.nvidia.com/gpu={chosen.uuid}"
    if strategy == "cdi-cri":
        assert request["cdi_devices"] == (named,) and not request["annotations"], request
    else:
        assert not request["cdi_devices"] and list(request["annotations"].values()) == [named], request
        assert all(key.startswith("cdi.k8s.io/") for key in request["annotations"]), request
    for handler in HANDLERS:
        before = node.host.log.read_text() if node.host.log.exists() else ""
        _, code, lines = node.pods.run(CHECK, runtime_handler=handler, **request)
        log = node.host.log.read_text()[len(before):]
        opened = [line for line in lines if line.startswith("open ")]
        expected = {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
        assert code == 0 and "cuDriverGetVersion 12040" in lines, (handler, lines[:12], log[-3000:])
        assert opened == [f"open {n} {'ENXIO' if n in expected else 'ENOENT'}" for n in NODES], (handler, opened)
        counts = mounted([line for line in lines if line[:1].isdigit() and " - " in line])
        assert any("libcuda.so" in target for target in counts) and all(n == 1 for n in counts.values()), (handler, counts)
        assert log.count("5 NVIDIA hook(s): create-symlinks, enable-cuda-compat, update-ldcache") == 1, (handler, log[-3000:])
        assert "injected into" not in log, (handler, log[-3000:])  # the engine's CDI only: never a second injection


def test_a_management_pod_gets_every_gpu_through_the_same_hook(node: CriNode) -> None:
    request = {"annotations": {"cdi.k8s.io/gpu-operator": "management.nvidia.com/gpu=all"}}
    before = node.host.log.read_text() if node.host.log.exists() else ""
    _, code, lines = node.pods.run(CHECK, namespace="gpu-operator", **request)
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and "cuDriverGetVersion 12040" in lines, (lines[:12], log[-3000:])
    assert [line for line in lines if line.startswith("open ")] == [f"open {n} ENXIO" for n in NODES], lines[:12]
    assert log.count("NVIDIA hook(s)") == 1, log[-3000:]
