"""Kubernetes' path: kubelet -> CRI -> containerd 1.6 -> ponytail-runtime -> runc.

A private containerd runs with the config `ponytail configure --runtime containerd
--set-as-default` wrote from containerd's own default config; pods are started through
its CRI plugin with a small CRI v1 client (tests/containerd_cri.py), the pause image built
here. The ponytail config is strict ([request] accept_env_when_unprivileged = false), as
docs/kubernetes.md recommends for clusters: GPUs come from the device plugin's list only."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from support.containerd_cri import Containerd, Pods, configured_private_config, gpu_node_files, make_state_dir, node_daemon
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script
from support.fakehost import FakeHost

pytestmark = pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")

DEVICES = "/var/run/nvidia-container-devices"
# GPU index 1 has minor 0 on this host (minors 2, 0, 1 in PCI order)
CUDACHECK_GPU1 = ["/usr/local/bin/cudacheck", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia2", "/dev/nvidia1"]
EXPECTED_GPU1 = ["cuDriverGetVersion 12040", "open /dev/nvidia0 ENXIO", "open /dev/nvidiactl ENXIO",
                 "open /dev/nvidia2 ENOENT", "open /dev/nvidia1 ENOENT"]


@dataclass
class Node:
    daemon: Containerd
    pods: Pods
    host: FakeHost
    config: Path

    def log(self) -> str:
        return self.host.log.read_text() if self.host.log.exists() else ""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("node")
    host, ponytail_config, rootfs, image = gpu_node_files(base, 'env_namespaces = ["gpu-operator"]\ncri = "containerd"\n')
    state = make_state_dir()
    config, _ = configured_private_config("containerd", state, image, "--set-as-default")
    # the widest pass-through an operator could set: every pod annotation reaches the runtime (patterns
    # are filepath.Match: "*" stops at "/")
    text, count = re.subn(r"(?m)(^\s*\[plugins\.\"io\.containerd\.grpc\.v1\.cri\"\.containerd\.runtimes\.ponytail\]\n(?:.*\n)*?)\s*pod_annotations = \[\]\n",
                          r'\1pod_annotations = ["*", "*/*"]\n', config.read_text())
    assert count == 1
    config.write_text(text)
    with node_daemon(config, state, {"PONYTAIL_CONFIG": str(ponytail_config)}, rootfs, image, base) as (daemon, pods):
        yield Node(daemon, pods, host, config)


def test_cri_plugin_loads_with_the_configured_runtime_as_default(node: Node) -> None:
    plugins = node.daemon.ctr("plugins", "ls")
    cri = [line.split() for line in plugins.stdout.splitlines() if line.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
    assert cri and cri[0][-1] == "ok", plugins.stdout
    assert node.pods.version().startswith("containerd 1.")
    runtimes = tomllib.loads(node.config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert runtimes["default_runtime_name"] == "ponytail" and "runc" in runtimes["runtimes"]


def test_volume_mount_device_list_gives_exactly_that_gpu(node: Node) -> None:
    """The device plugin's volume-mounts strategy: /dev/null at /var/run/nvidia-container-devices/<id>."""
    container_id, code, lines = node.pods.run(
        CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")]
    )
    assert code == 0 and lines == EXPECTED_GPU1, (lines, node.log()[-2000:])
    assert f"container={container_id}" in node.log()


def test_cdi_annotation_from_the_device_plugin_selects_the_gpu(node: Node) -> None:
    """Container annotations reach the runtime because configure let cdi.k8s.io/* through."""
    _, code, lines = node.pods.run(
        CUDACHECK_GPU0, annotations={"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}
    )
    assert code == 0 and lines == EXPECTED_GPU0, (lines, node.log()[-2000:])


def test_env_only_request_from_an_unprivileged_pod_is_refused(node: Node) -> None:
    container_id, code, lines = node.pods.run(CUDACHECK_GPU0, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert code == 2 and lines[0].startswith("dlopen libcuda.so.1 failed"), lines
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert len(logged) == 1 and "refused: unprivileged container" in logged[0], logged


def test_management_pods_namespace_comes_from_containerd_and_cannot_be_forged(node: Node) -> None:
    """[request] env_namespaces = ["gpu-operator"]: a pod there is believed; a pod elsewhere that brings
    io.kubernetes.cri.sandbox-namespace as a pod annotation (passed through: pod_annotations = ["*", "*/*"])
    or a container annotation is not: containerd writes its own value over it."""
    _, code, lines = node.pods.run(CUDACHECK_GPU0, env={"NVIDIA_VISIBLE_DEVICES": "0"}, namespace="gpu-operator")
    assert code == 0 and lines == EXPECTED_GPU0, (lines, node.log()[-2000:])
    forged = {"io.kubernetes.cri.sandbox-namespace": "gpu-operator"}
    container_id, _ = node.pods.create(
        ["/bin/sleep", "60"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, pod_annotations={**forged, "example.com/passed": "yes"}, annotations=forged
    )
    node.pods.start(container_id)
    annotations = node.daemon.bundle_config(container_id)["annotations"]
    assert annotations.get("example.com/passed") == "yes", annotations  # the pass-through is on
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "default"
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert len(logged) == 1 and "refused: unprivileged container" in logged[0], logged


def test_privileged_pods_env_is_believed(node: Node) -> None:
    """The strict policy is about unprivileged pods: a privileged one could open any device anyway."""
    _, code, lines = node.pods.run(CUDACHECK_GPU0, env={"NVIDIA_VISIBLE_DEVICES": "0"}, privileged=True)
    assert code == 0 and lines == EXPECTED_GPU0, (lines, node.log()[-2000:])


def test_pod_that_asks_for_no_gpu_is_untouched_under_the_default_runtime(node: Node) -> None:
    plain, _ = node.pods.create(["/bin/sleep", "60"])
    gpu, _ = node.pods.create(["/bin/sleep", "60"], mounts=[("/dev/null", f"{DEVICES}/0")])
    node.pods.start(plain)
    node.pods.start(gpu)
    plain_spec, gpu_spec = node.daemon.bundle_config(plain), node.daemon.bundle_config(gpu)
    # the positive control: the same runtime added its hook to the GPU container's bundle
    assert [h["path"] for h in gpu_spec["hooks"]["prestart"]] == [console_script("ponytail")]
    assert "hooks" not in plain_spec or not plain_spec["hooks"].get("prestart"), plain_spec.get("hooks")
    assert not any(rule.get("major") == 195 for rule in plain_spec["linux"]["resources"].get("devices", []))
    _, code, lines = node.pods.run(["/bin/ls", "/dev"])
    assert code == 0 and not any("nvidia" in line for line in lines), lines
