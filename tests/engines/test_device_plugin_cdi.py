"""NVIDIA's device plugin (v0.20.0, ../shared/anchor) in its default CDI modes, served by ponytail, on containerd 2.3
and CRI-O 1.36 (`make test-engines`): no change to the plugin's strategy, only its hook binary is ponytail's
(``ponytail install-nvidia-hook --at`` the plugin's ``--nvidia-cdi-hook-path``; its default name, nvidia-ctk).

A kubelet stand-in (tests/support/device_plugin.py) serves the Registration service, lists the plugin's GPUs
with ListAndWatch, asks Allocate for one, and turns the answer into the CRI CreateContainer request as the
kubelet does: ``cdi-cri`` answers with CDI devices (the CRI CDIDevices field), ``cdi-annotations`` with a
``cdi.k8s.io/`` annotation. The engine resolves them from the plugin's own spec
(kind k8s.device-plugin.nvidia.com/gpu, written by the plugin into the engine's CDI directory) and runs its
hooks: the container gets exactly the allocated GPU, libcuda.so.1 loads, every node and library is mounted
once (never injected twice, also under ponytail's runtime handler), one ponytail run for the spec's five
hooks. Management pods (the GPU Operator's ``management.nvidia.com/gpu=all``, from nvidia-ctk's management
spec) get every GPU the same way."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_engine_containerd2 import mounted

from support.containerd_cri import (
    Pods,
    configured_private_config,
    gpu_node_files,
    make_state_dir,
    node_daemon,
    oci_archive,
    remove_state_dir,
)
from support.crio import CONMON, Crio
from support.device_plugin import DevicePlugin, Kubelet, cri_request
from support.engines import console_script, current_engines
from support.fakehost import FakeHost
from support.nvidia_tools import nvidia_tools

pytestmark = pytest.mark.current_engines

NODES = ["/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CHECK = ["/bin/busybox", "sh", "-c", "/usr/local/bin/cudacheck " + " ".join(NODES) + "; /bin/busybox cat /proc/self/mountinfo"]


@dataclass
class Node:
    pods: Pods
    host: FakeHost
    cdi: Path
    base: Path
    hook: Path
    handlers: tuple[str, ...]


@pytest.fixture(scope="module", params=["containerd 2.3", "CRI-O 1.36"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    engines = current_engines()
    if engines is None:
        pytest.skip("current engines (containerd 2.3, CRI-O 1.36, crictl, runc 1.5): run make test-engines (ENGINES_DIR)")
    nvidia_tools()
    base = tmp_path_factory.mktemp("deviceplugin")
    host, ponytail_config, rootfs, image = gpu_node_files(base)
    state = make_state_dir()
    hook = base / "usr-bin" / "nvidia-ctk"  # the plugin's default --nvidia-cdi-hook-path is /usr/bin/nvidia-ctk
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(hook), "--config", str(ponytail_config)],
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    if request.param == "containerd 2.3":
        (state / "cdi").mkdir()
        _management_spec(host, state / "cdi", hook)
        config, _ = configured_private_config(str(engines / "containerd"), state, image)
        with node_daemon(config, state, {}, rootfs, image, base, engines) as (_, pods):
            yield Node(pods, host, state / "cdi", base, hook, ("", "ponytail"))
        return
    if not (engines / "crio").is_file() or not Path(CONMON).is_file():
        pytest.skip(f"CRI-O needs {engines}/crio and {CONMON}")
    crio = Crio(state, engines, pause_image=image)
    _management_spec(host, state / "cdi", hook)
    pods = None
    try:
        crio.load_image(oci_archive(rootfs, image, ["/bin/sleep", "100000"], base / "image.tar"))
        crio.start(ponytail_config.read_text())
        pods = Pods(crio, image, base / "stubs")  # type: ignore[arg-type]  # the same CRI as containerd's
        yield Node(pods, host, state / "cdi", base, hook, ("",))
    finally:
        if pods is not None:
            pods.close()
        crio.stop()
        remove_state_dir(state)


def _management_spec(host: FakeHost, cdi: Path, hook: Path) -> None:
    """The GPU Operator's spec for its own pods: nvidia-ctk's, vendor management.nvidia.com, device ``all``."""
    from support.nvidia_tools import install_fake_nvml

    install_fake_nvml(host)
    made = subprocess.run([str(nvidia_tools() / "bin/nvidia-ctk"), "cdi", "generate", "--driver-root", str(host.driver), "--dev-root",
                           str(host.base), "--nvidia-cdi-hook-path", str(hook), "--vendor", "management.nvidia.com",
                           "--device-name-strategy", "index", "--output", str(cdi / "management.nvidia.com-gpu.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]


@pytest.fixture(params=["cdi-cri", "cdi-annotations"])
def plugin(request: pytest.FixtureRequest, node: Node) -> Iterator[tuple[Kubelet, str]]:
    plugins = node.base / f"plugins-{request.param}"
    plugins.mkdir()
    kubelet = Kubelet(plugins, node.base / "pb")
    device_plugin = DevicePlugin(node.host, plugins, node.cdi, request.param, str(node.hook))
    try:
        yield kubelet, request.param
    finally:
        device_plugin.stop()
        kubelet.close()


def test_the_device_plugins_cdi_modes_give_exactly_the_allocated_gpu(node: Node, plugin: tuple[Kubelet, str]) -> None:
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
    for handler in node.handlers:
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


def test_a_management_pod_gets_every_gpu_through_the_same_hook(node: Node) -> None:
    request = {"annotations": {"cdi.k8s.io/gpu-operator": "management.nvidia.com/gpu=all"}}
    before = node.host.log.read_text() if node.host.log.exists() else ""
    _, code, lines = node.pods.run(CHECK, namespace="gpu-operator", **request)
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and "cuDriverGetVersion 12040" in lines, (lines[:12], log[-3000:])
    assert [line for line in lines if line.startswith("open ")] == [f"open {n} ENXIO" for n in NODES], lines[:12]
    assert log.count("NVIDIA hook(s)") == 1, log[-3000:]
