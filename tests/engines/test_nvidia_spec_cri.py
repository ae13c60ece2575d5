"""NVIDIA's own CDI spec (``nvidia-ctk cdi generate`` 1.20.0's, from the captured data) with its hooks served by ponytail
(the nvidia-cdi-hook script ``ponytail install-nvidia-hook`` writes) on
Kubernetes' engine: Debian sid's containerd 2.1 (`make test-engines`; no registry has CRI-O) resolves the
spec itself from the CRI CDIDevices field or a ``cdi.k8s.io/*`` annotation, under its default runc
handler and ponytail's (which must add nothing). In every container: exactly its GPU, libcuda.so.1 loads, each node and library mounted once, and
one hook process did the work of the spec's five (the log says so once per container)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_engine_containerd2 import MOUNTINFO, mounted

from support.cri_nodes import ENGINES, HANDLERS, CriNode, cri_node
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script
from support.fakehost import FakeHost
from support.nvidia_tools import dra_specs, nvidia_spec

pytestmark = pytest.mark.current_engines
CLAIM = "5d2c9a4e-7b1f-4c3a-9e8d-0f6a1b2c3d4e"  # a ResourceClaim's UID


def _specs(host: FakeHost, cdi_dir: Path, config: Path) -> None:
    """nvidia-ctk's spec and the DRA driver's, their hooks ponytail's scripts (install-nvidia-hook), at two paths."""
    for hook in (cdi_dir.parent / "bin/nvidia-cdi-hook", cdi_dir.parent / "dra/nvidia-cdi-hook"):
        installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(hook), "--config", str(config)],
                                   capture_output=True, text=True, timeout=60)
        assert installed.returncode == 0, installed.stderr
    spec = nvidia_spec(host, cdi_dir / "nvidia.yaml", str(cdi_dir.parent / "bin/nvidia-cdi-hook"))
    dra = dra_specs(spec, CLAIM, str(cdi_dir.parent / "dra/nvidia-cdi-hook"))
    for name, content in zip(("k8s.gpu.nvidia.com-device_base.yaml", f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml"), dra, strict=True):
        (cdi_dir / name).write_text(yaml.safe_dump(content))


@pytest.fixture(scope="module", params=ENGINES)
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriNode]:
    with cri_node(request.param, tmp_path_factory.mktemp("nvidiacri"), _specs) as engine:
        yield engine


@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("how", ["CDI annotation", "CRI CDIDevices"])
def test_nvidias_spec_with_ponytails_hook_gives_exactly_the_gpu(node: CriNode, how: str, handler: str) -> None:
    request: dict = ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}} if how == "CDI annotation"
                     else {"cdi_devices": ("nvidia.com/gpu=0",)})
    before = node.host.log.read_text() if node.host.log.exists() else ""
    container_id, code, lines = node.pods.run(MOUNTINFO, runtime_handler=handler, **request)
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, log[-3000:])
    counts = mounted(lines)
    assert any("libcuda.so" in target for target in counts), lines
    assert all(n == 1 for n in counts.values()) and "/dev/nvidia2" not in counts, counts
    assert log.count("5 NVIDIA hook(s): create-symlinks, enable-cuda-compat, update-ldcache") == 1, log[-3000:]
    assert "nvidia-cdi-hook in " in log and "injected into" not in log, log[-3000:]  # never a second injection


def test_an_unknown_hook_subcommand_in_the_spec_is_skipped_with_a_warning(node: CriNode) -> None:
    """As NVIDIA's own binary: a hook of a newer toolkit is a warning in the log, and the container starts."""
    spec_file = node.cdi / "nvidia.yaml"
    original = spec_file.read_text()
    spec_file.write_text(original.replace("disable-device-node-modification", "frobnicate-devices"))
    before = node.host.log.read_text() if node.host.log.exists() else ""
    try:
        _, code, lines = node.pods.run(MOUNTINFO, cdi_devices=("nvidia.com/gpu=0",))
    finally:
        spec_file.write_text(original)
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, log[-3000:])
    assert "unsupported CDI hook: frobnicate-devices" in log, log[-3000:]


def test_a_dra_claims_devices_run_ponytails_hook_the_same_way(node: CriNode) -> None:
    """The DRA driver's base device (k8s.gpu.nvidia.com/device=gpu-0, NVIDIA's common edits and hooks) and the
    claim's own device (k8s.gpu.nvidia.com/claim=<uid>-gpu-0, with a hook of its own), through the CRI
    CDIDevices field as the kubelet passes a prepared claim: one ponytail run serves the six hooks."""
    check = ["/bin/busybox", "sh", "-c", " ".join(CUDACHECK_GPU0) + "; echo claim=$DRA_CLAIM_UID; /bin/busybox readlink /etc/nvidia-dra-claim; "
             "/bin/busybox cat /proc/self/mountinfo"]
    before = node.host.log.read_text() if node.host.log.exists() else ""
    _, code, lines = node.pods.run(check, cdi_devices=("k8s.gpu.nvidia.com/device=gpu-0", f"k8s.gpu.nvidia.com/claim={CLAIM}-gpu-0"))
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, log[-3000:])
    assert lines[len(EXPECTED_GPU0):len(EXPECTED_GPU0) + 2] == [f"claim={CLAIM}", f"{CLAIM}-gpu-0"], lines
    counts = mounted(lines[len(EXPECTED_GPU0) + 2:])
    assert any("libcuda.so" in target for target in counts) and all(n == 1 for n in counts.values()), counts
    assert log.count("6 NVIDIA hook(s): create-symlinks, enable-cuda-compat, update-ldcache") == 1, log[-3000:]
