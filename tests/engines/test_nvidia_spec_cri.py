"""NVIDIA's own CDI spec (``nvidia-ctk cdi generate`` 1.20, ../shared/anchor) with its hooks served by ponytail
(the nvidia-cdi-hook script ``ponytail install-nvidia-hook`` writes) on
Kubernetes' engines: containerd 2.3 and CRI-O 1.36 (from $ENGINES_DIR, `make test-engines`) resolve the
spec themselves from the CRI CDIDevices field or a ``cdi.k8s.io/*`` annotation, under their default runc
handler. In every container: exactly its GPU, libcuda.so.1 loads, each node and library mounted once, and
one hook process did the work of the spec's five (the log says so once per container)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_engine_containerd2 import MOUNTINFO, mounted

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
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, console_script, current_engines
from support.fakehost import FakeHost
from support.nvidia_tools import dra_specs, nvidia_spec

pytestmark = pytest.mark.current_engines
CLAIM = "5d2c9a4e-7b1f-4c3a-9e8d-0f6a1b2c3d4e"  # a ResourceClaim's UID


@dataclass
class NvidiaNode:
    pods: Pods
    host: FakeHost


def _spec_into(cdi_dir: Path, host: FakeHost, config: Path, base: Path) -> None:
    links = base / "bin"
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(links / "nvidia-cdi-hook")],
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    cdi_dir.mkdir(exist_ok=True)
    spec = nvidia_spec(host, cdi_dir / "nvidia.yaml", str(links / "nvidia-cdi-hook"), {"PONYTAIL_CONFIG": str(config)})
    # the DRA driver's specs, its hook path configured elsewhere: the same script, installed there too
    dra_hook = base / "dra/nvidia-cdi-hook"
    installed = subprocess.run([console_script("ponytail"), "install-nvidia-hook", "--at", str(dra_hook)], capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    for name, content in zip(("k8s.gpu.nvidia.com-device_base.yaml", f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml"), dra_specs(spec, CLAIM, str(dra_hook)), strict=True):
        (cdi_dir / name).write_text(yaml.safe_dump(content))


@pytest.fixture(scope="module", params=["containerd 2.3", "CRI-O 1.36"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvidiaNode]:
    engines = current_engines()
    if engines is None:
        pytest.skip("current engines (containerd 2.3, CRI-O 1.36, crictl, runc 1.5): run make test-engines (ENGINES_DIR)")
    base = tmp_path_factory.mktemp("nvidiacri")
    host, ponytail_config, rootfs, image = gpu_node_files(base)
    state = make_state_dir()
    if request.param == "containerd 2.3":
        config, _ = configured_private_config(str(engines / "containerd"), state, image)
        _spec_into(state / "cdi", host, ponytail_config, base)
        with node_daemon(config, state, {}, rootfs, image, base, engines) as (_, pods):
            yield NvidiaNode(pods, host)
        return
    if not (engines / "crio").is_file() or not Path(CONMON).is_file():
        pytest.skip(f"CRI-O needs {engines}/crio and {CONMON}")
    crio = Crio(state, engines, pause_image=image)
    pods = None
    try:
        crio.load_image(oci_archive(rootfs, image, ["/bin/sleep", "100000"], base / "image.tar"))
        _spec_into(state / "cdi", host, ponytail_config, base)
        crio.start(ponytail_config.read_text())
        pods = Pods(crio, image, base / "stubs")  # type: ignore[arg-type]  # the same CRI as containerd's
        yield NvidiaNode(pods, host)
    finally:
        if pods is not None:
            pods.close()
        crio.stop()
        remove_state_dir(state)


@pytest.mark.parametrize("how", ["CDI annotation", "CRI CDIDevices"])
def test_nvidias_spec_with_ponytails_hook_gives_exactly_the_gpu(node: NvidiaNode, how: str) -> None:
    request: dict = ({"annotations": {"cdi.k8s.io/nvidia-device-plugin_test": "nvidia.com/gpu=0"}} if how == "CDI annotation"
                     else {"cdi_devices": ("nvidia.com/gpu=0",)})
    before = node.host.log.read_text() if node.host.log.exists() else ""
    container_id, code, lines = node.pods.run(MOUNTINFO, **request)
    log = node.host.log.read_text()[len(before):]
    assert code == 0 and lines[:len(EXPECTED_GPU0)] == EXPECTED_GPU0, (lines, log[-3000:])
    counts = mounted(lines)
    assert any("libcuda.so" in target for target in counts), lines
    assert all(n == 1 for n in counts.values()) and "/dev/nvidia2" not in counts, counts
    assert log.count("5 NVIDIA hook(s): create-symlinks, enable-cuda-compat, update-ldcache") == 1, log[-3000:]
    assert "nvidia-cdi-hook in " in log, log[-3000:]


def test_an_unknown_hook_subcommand_in_the_spec_stops_the_start(node: NvidiaNode) -> None:
    """Not NVIDIA's silent success: a hook ponytail cannot serve fails the container with its reason."""
    spec_file = next(p for p in _cdi_dirs(node) if p.name == "nvidia.yaml")
    original = spec_file.read_text()
    spec_file.write_text(original.replace("disable-device-node-modification", "frobnicate-devices"))
    try:
        _, code, lines = node.pods.run(MOUNTINFO, cdi_devices=("nvidia.com/gpu=0",))
    except Exception as e:  # noqa: BLE001 - the engine reports the hook's failure as the create's error
        assert "unknown hook subcommand 'frobnicate-devices'" in str(e), str(e)[-2000:]
    else:
        pytest.fail(f"the container started (exit {code}): {lines}")
    finally:
        spec_file.write_text(original)


def _cdi_dirs(node: NvidiaNode) -> list[Path]:
    return list((node.pods.daemon.state / "cdi").iterdir())  # type: ignore[attr-defined]



def test_a_dra_claims_devices_run_ponytails_hook_the_same_way(node: NvidiaNode) -> None:
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
