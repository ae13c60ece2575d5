"""Kubernetes' path on a current node: kubelet -> CRI -> containerd 2.1 -> ponytail-runtime -> runc 1.3.

Debian sid's packages (`make test-engines`: containerd 2.1, its containerd-shim-runc-v2 and ctr, runc 1.3,
run in the sid root of support.sidroot), pods through the project's own CRI client (support.containerd_cri).
A private containerd (own root, state, sockets, /run, CDI spec directory, NRI off) runs with containerd 2.1's
own `config default` (config version 3) as `ponytail configure --runtime containerd` left it: the runtime
handler `ponytail`, not the default. ponytail's CDI spec
(`ponytail cdi generate`) is in the private CDI directory, as the installer keeps it in /var/run/cdi.
containerd 2.x resolves CDI itself, from the CRI CDIDevices field and from `cdi.k8s.io/*`
annotations: each GPU node and library must then be in the container once, from CDI, never
injected a second time by ponytail's hook. The ponytail config is strict ([request]
accept_env_when_unprivileged = false), as docs/kubernetes.md recommends for clusters."""

from __future__ import annotations

import collections
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
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script
from support.sidroot import sid_binary

pytestmark = pytest.mark.current_engines

RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
PASSING = "ponytail-annotations"
MOUNTINFO = ["/bin/busybox", "sh", "-c", " ".join(CUDACHECK_GPU0) + "; /bin/busybox cat /proc/self/mountinfo"]


@dataclass
class Node(ContainerdNode):
    image: str
    configure_said: str


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    containerd = sid_binary("containerd")  # skips, saying why, where Debian's archive cannot be reached
    base = tmp_path_factory.mktemp("node2")
    host, ponytail_config, rootfs, image = gpu_node_files(base, 'cri = "containerd"\n')  # annotations believed only where the CRI is known
    state = make_state_dir()
    config, configure_said = configured_private_config(containerd, state, image)
    # a handler that does pass the annotations to ponytail-runtime, as configure wrote it for containerd 1.x
    # (a config migrated from 1.x keeps it): ponytail-runtime must see that CDI has injected the devices
    with config.open("a") as f:
        f.write(f"\n[plugins.'{RUNTIME_PLUGIN}'.containerd.runtimes.{PASSING}]\n  runtime_type = 'io.containerd.runc.v2'\n"
                f"  container_annotations = ['cdi.k8s.io/*']\n  [plugins.'{RUNTIME_PLUGIN}'.containerd.runtimes.{PASSING}.options]\n"
                f"    BinaryName = '{console_script('ponytail-runtime')}'\n")
    (state / "cdi").mkdir()
    spec = generate(host, state / "cdi" / "ponytail.yaml", "-config", str(ponytail_config))
    assert spec["kind"] == "nvidia.com/gpu"
    with node_daemon(config, state, {"PONYTAIL_CONFIG": str(ponytail_config)}, rootfs, image, base, sid=True) as (daemon, pods):
        yield Node(daemon, pods, host, config, image, configure_said)


def mounted(lines: list[str]) -> collections.Counter:
    """Mount points of /proc/self/mountinfo lines that name the driver (nodes, libraries, files)."""
    return collections.Counter(line.split()[4] for line in lines if line[:1].isdigit() and "nvidia" in line.split()[4].lower()
                               or line[:1].isdigit() and "libcuda" in line.split()[4])


def test_containerd_2_1_loads_the_configured_handler_and_reports_it(node: Node) -> None:
    assert node.pods.version().startswith("containerd 2.1."), node.pods.version()
    runtimes = node.pods.config()["containerd"]["runtimes"]  # the CRI plugin's own view (Status, verbose)
    assert runtimes["ponytail"]["options"]["BinaryName"] == console_script("ponytail-runtime"), runtimes["ponytail"]
    entry = tomllib.loads(node.config.read_text())["plugins"][RUNTIME_PLUGIN]["containerd"]
    assert entry["default_runtime_name"] == "runc"
    # containerd 2.x resolves CDI itself: the annotations are not passed to ponytail-runtime, and configure says so
    assert "cdi.k8s.io/*" not in entry["runtimes"]["ponytail"].get("container_annotations", []), entry["runtimes"]["ponytail"]
    assert "containerd resolves CDI itself" in node.configure_said and "ponytail cdi generate" in node.configure_said, node.configure_said


def test_volume_mount_device_list_through_the_handler(node: Node) -> None:
    """A pod sandbox of the runtime handler ``ponytail``, then a container with the device plugin's volume-mount list."""
    container_id, code, lines = node.pods.run(CUDACHECK_GPU1, env={"NVIDIA_VISIBLE_DEVICES": DEVICES}, mounts=[("/dev/null", f"{DEVICES}/1")],
                                              runtime_handler="ponytail")
    assert code == 0 and lines == EXPECTED_GPU1, (lines, node.log()[-2000:])
    assert f"container={container_id}" in node.log()


@pytest.mark.parametrize("how, handler", [("CDI annotation", "ponytail"), ("CRI CDIDevices", "ponytail"),
                                          ("CDI annotation", PASSING), ("CRI CDIDevices", PASSING)])
def test_cdi_request_injects_each_node_and_library_once(node: Node, how: str, handler: str) -> None:
    """containerd 2.1 resolves the device from ponytail's spec; ponytail-runtime must not inject it again,
    also where the annotations reach it (``PASSING``): the hook is not added, the log says why."""
    request: dict = ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}} if how == "CDI annotation"
                     else {"cdi_devices": ("nvidia.com/gpu=0",)})
    container_id, code, lines = node.pods.run(MOUNTINFO, runtime_handler=handler, **request)
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, node.log()[-2000:])
    counts = mounted(lines)
    assert any("libcuda.so" in target for target in counts), lines
    assert all(n == 1 for n in counts.values()), {t: n for t, n in counts.items() if n > 1}
    spec = node.pods.runtime_spec(container_id)  # as containerd made it, before ponytail-runtime
    nodes = [d["path"] for d in spec["linux"].get("devices", [])]
    assert nodes.count("/dev/nvidia2") == 1 and "/dev/nvidia0" not in nodes, nodes
    assert "/dev/nvidia2" not in counts  # the engine made the node (CDI deviceNodes), nothing was mounted over it
    logged = [line for line in node.log().splitlines() if f"container={container_id}" in line]
    assert not any(" ponytail-runtime: GPU container" in line for line in logged), logged
    if handler == PASSING and how == "CDI annotation":
        assert any("not adding the hook: CDI annotations (cdi.k8s.io/*) already resolved" in line for line in logged), logged


def test_a_spec_written_while_containerd_runs_is_resolved(tmp_path: Path) -> None:
    """A spec that appears in the CDI directory after containerd started (a DRA driver's claim, the device plugin's
    spec) resolves at the next request: containerd 2.1 watches its CDI spec directories."""
    from support.cri_nodes import cri_node

    with cri_node("containerd 2.1", tmp_path, lambda host, cdi, config: None) as node:
        generate(node.host, node.cdi / "ponytail.yaml", "-config", str(node.ponytail_config))
        _, code, lines = node.pods.run(MOUNTINFO, cdi_devices=("nvidia.com/gpu=0",))
        assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, node.daemon.log()[-2000:])
