"""Kubernetes' path on a current node: kubelet -> CRI -> containerd 2.3 -> ponytail-runtime -> runc 1.5.

Binaries from $ENGINES_DIR (`make test-engines`: containerd 2.3.4, ctr, containerd-shim-runc-v2,
crictl 1.36, runc 1.5.1). A private containerd (own root, state, sockets, /run, CDI spec directory,
NRI off) runs with containerd 2.3's own `config default` (config version 4) as `ponytail configure
--runtime containerd` left it: the runtime handler `ponytail`, not the default. ponytail's CDI spec
(`ponytail cdi generate`) is in the private CDI directory, as the installer keeps it in /var/run/cdi.
containerd 2.x resolves CDI itself, from the CRI CDIDevices field and from `cdi.k8s.io/*`
annotations: each GPU node and library must then be in the container once, from CDI, never
injected a second time by ponytail's hook. The ponytail config is strict ([request]
accept_env_when_unprivileged = false), as docs/kubernetes.md recommends for clusters."""

from __future__ import annotations

import collections
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from test_engine_containerd import CUDACHECK_GPU1, DEVICES, EXPECTED_GPU1
from test_engine_containerd import Node as ContainerdNode

from support.cdi_support import generate
from support.containerd_cri import configured_private_config, gpu_node_files, make_state_dir, node_daemon
from support.engines import BUSY_DEADLINE, CUDACHECK_GPU0, EXPECTED_GPU0, TIMEOUT, console_script, current_engines

pytestmark = pytest.mark.current_engines

RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
PASSING = "ponytail-annotations"
MOUNTINFO = ["/bin/busybox", "sh", "-c", " ".join(CUDACHECK_GPU0) + "; /bin/busybox cat /proc/self/mountinfo"]


@dataclass
class Node(ContainerdNode):
    engines: Path
    image: str
    configure_said: str

    def crictl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.engines / "crictl"), "--runtime-endpoint", f"unix://{self.daemon.socket}", "--timeout", "60s", *args],
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    engines = current_engines()
    if engines is None:
        pytest.skip("current engines (containerd 2.3, crictl, runc 1.5): run make test-engines (ENGINES_DIR)")
    base = tmp_path_factory.mktemp("node2")
    host, ponytail_config, rootfs, image = gpu_node_files(base, 'cri = "containerd"\n')  # annotations believed only where the CRI is known
    state = make_state_dir()
    config, configure_said = configured_private_config(str(engines / "containerd"), state, image)
    # a handler that does pass the annotations to ponytail-runtime, as configure wrote it for containerd 1.x
    # (a config migrated from 1.x keeps it): ponytail-runtime must see that CDI has injected the devices
    with config.open("a") as f:
        f.write(f"\n[plugins.'{RUNTIME_PLUGIN}'.containerd.runtimes.{PASSING}]\n  runtime_type = 'io.containerd.runc.v2'\n"
                f"  container_annotations = ['cdi.k8s.io/*']\n  [plugins.'{RUNTIME_PLUGIN}'.containerd.runtimes.{PASSING}.options]\n"
                f"    BinaryName = '{console_script('ponytail-runtime')}'\n")
    (state / "cdi").mkdir()
    spec = generate(host, state / "cdi" / "ponytail.yaml", "-config", str(ponytail_config))
    assert spec["kind"] == "nvidia.com/gpu"
    with node_daemon(config, state, {"PONYTAIL_CONFIG": str(ponytail_config)}, rootfs, image, base, engines) as (daemon, pods):
        yield Node(daemon, pods, host, config, engines, image, configure_said)


def mounted(lines: list[str]) -> collections.Counter:
    """Mount points of /proc/self/mountinfo lines that name the driver (nodes, libraries, files)."""
    return collections.Counter(line.split()[4] for line in lines if line[:1].isdigit() and "nvidia" in line.split()[4].lower()
                               or line[:1].isdigit() and "libcuda" in line.split()[4])


def test_containerd_2_3_loads_the_configured_handler_and_crictl_sees_it(node: Node) -> None:
    assert node.pods.version().startswith("containerd v2.3"), node.pods.version()
    info = node.crictl("info")
    assert info.returncode == 0, info.stderr
    runtimes = json.loads(info.stdout)["config"]["containerd"]["runtimes"]
    assert runtimes["ponytail"]["options"]["BinaryName"] == console_script("ponytail-runtime"), runtimes["ponytail"]
    entry = tomllib.loads(node.config.read_text())["plugins"][RUNTIME_PLUGIN]["containerd"]
    assert entry["default_runtime_name"] == "runc"
    # containerd 2.x resolves CDI itself: the annotations are not passed to ponytail-runtime, and configure says so
    assert "cdi.k8s.io/*" not in entry["runtimes"]["ponytail"].get("container_annotations", []), entry["runtimes"]["ponytail"]
    assert "containerd resolves CDI itself" in node.configure_said and "ponytail cdi generate" in node.configure_said, node.configure_said


def test_gpu_pod_via_crictl_through_the_ponytail_handler(node: Node, tmp_path: Path) -> None:
    """crictl runp --runtime ponytail, then a container with the device plugin's volume-mount list."""
    name = uuid.uuid4().hex[:8]
    namespaces = {"network": 2, "pid": 1}  # NODE (no CNI here), CONTAINER
    pod = {"metadata": {"name": f"crictl-{name}", "namespace": "default", "uid": name, "attempt": 0},
           "log_directory": str(tmp_path / "logs"),
           "linux": {"cgroup_parent": node.daemon.cgroup_parent, "security_context": {"namespace_options": namespaces}}}
    container = {"metadata": {"name": "main"}, "image": {"image": node.image}, "command": CUDACHECK_GPU1, "log_path": "main.log",
                 "envs": [{"key": "NVIDIA_VISIBLE_DEVICES", "value": DEVICES}],
                 "mounts": [{"host_path": "/dev/null", "container_path": f"{DEVICES}/1", "readonly": True}],
                 "linux": {"security_context": {"namespace_options": namespaces}}}
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    (tmp_path / "container.json").write_text(json.dumps(container))
    sandbox = node.crictl("runp", "--runtime", "ponytail", str(tmp_path / "pod.json"))
    assert sandbox.returncode == 0, sandbox.stderr
    pod_id = sandbox.stdout.strip()
    try:
        created = node.crictl("create", pod_id, str(tmp_path / "container.json"), str(tmp_path / "pod.json"))
        assert created.returncode == 0, created.stderr
        container_id = created.stdout.strip()
        assert node.crictl("start", container_id).returncode == 0
        deadline = time.monotonic() + BUSY_DEADLINE
        while "EXITED" not in json.loads(node.crictl("inspect", "-o", "json", container_id).stdout or "{}").get("status", {}).get("state", ""):
            assert time.monotonic() < deadline, "the container did not exit"
            time.sleep(0.1)
        logs = node.crictl("logs", container_id)
        assert logs.stdout.splitlines() == EXPECTED_GPU1, (logs.stdout, logs.stderr, node.log()[-2000:])
        assert f"container={container_id}" in node.log()
    finally:
        node.crictl("stopp", pod_id)
        node.crictl("rmp", pod_id)


def test_volume_mount_device_list_through_the_handler(node: Node) -> None:
    _, code, lines = node.pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")],
                                   runtime_handler="ponytail")
    assert code == 0 and lines == EXPECTED_GPU1, (lines, node.log()[-2000:])


@pytest.mark.parametrize("how, handler", [("CDI annotation", "ponytail"), ("CRI CDIDevices", "ponytail"),
                                          ("CDI annotation", PASSING), ("CRI CDIDevices", PASSING)])
def test_cdi_request_injects_each_node_and_library_once(node: Node, how: str, handler: str) -> None:
    """containerd 2.3 resolves the device from ponytail's spec; ponytail-runtime must not inject it again,
    also where the annotations reach it (``PASSING``): the hook is not added, the log says why."""
    request: dict = ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}} if how == "CDI annotation"
                     else {"cdi_devices": ("nvidia.com/gpu=0",)})
    container_id, code, lines = node.pods.run(MOUNTINFO, runtime_handler=handler, **request)
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, node.log()[-2000:])
    counts = mounted(lines)
    assert any("libcuda.so" in target for target in counts), lines
    assert all(n == 1 for n in counts.values()), {t: n for t, n in counts.items() if n > 1}
    inspected = node.crictl("inspect", "-o", "json", container_id)
    spec = json.loads(inspected.stdout)["info"]["runtimeSpec"]  # as containerd made it, before ponytail-runtime
    nodes = [d["path"] for d in spec["linux"].get("devices", [])]
    assert nodes.count("/dev/nvidia2") == 1 and "/dev/nvidia0" not in nodes, nodes
    assert "/dev/nvidia2" not in counts  # the engine made the node (CDI deviceNodes), nothing was mounted over it
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert not any(" ponytail-runtime: GPU container" in line for line in logged), logged
    if handler == PASSING and how == "CDI annotation":
        assert any("not adding the hook: CDI annotations (cdi.k8s.io/*) already resolved" in line for line in logged), logged
