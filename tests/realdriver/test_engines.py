"""Real engine starts on NVIDIA's real drivers: runc with ponytail's prestart hook, podman with
a spec from ``ponytail cdi generate``; driver trees switching between the real 535 and 470
drivers; NVIDIA_REQUIRE_CUDA as real nvidia/cuda images set it, on one GPU and on a Tesla and a
GeForce card together (NVIDIA evaluates it per GPU, and so does ponytail)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cdi_support import CdiPodman, generate
from support.cudaimages import CUDA_11_8, CUDA_12_2, CUDA_12_2_SBSA
from support.engines import hook_entry, oci_bundle, run_bundle, unique
from support.harness import bundle_for, run_ponytail, state_for
from support.realdriver import GEFORCE, TESLA, DriverRoot, RealDriverHost, real_host, real_rootfs

CHECK = ["sh", "-c", "/usr/local/bin/realcuda cudart; nvidia-smi; echo nvidia-smi=$?"]
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"


def start(host: RealDriverHost, tmp_path: Path, env: list[str], root: DriverRoot, config: Path | None = None) -> subprocess.CompletedProcess:
    """runc runs CHECK in a busybox image with the CUDA 11.8 runtime, ponytail as its prestart hook."""
    hooks = {"prestart": [hook_entry(config or host.write_config())]}
    bundle = oci_bundle(tmp_path, CHECK, env=env, hooks=hooks)
    shutil.rmtree(bundle / "rootfs")
    real_rootfs(bundle / "rootfs", cudart=root)
    return run_bundle("runc", bundle, unique())


def assert_real_driver_inside(out: str, root: DriverRoot) -> None:
    lines = out.splitlines()
    assert f"cuDriverGetVersion {root.cuda_version}" in lines, out
    assert f"cudaDriverGetVersion {root.cuda_version} status 0" in lines and "cudaGetDeviceCount status 100" in lines, out
    assert NO_DRIVER in out and "nvidia-smi=9" in lines, out


def test_the_prestart_hook_gives_a_runc_container_the_real_driver(either: tuple[DriverRoot, RealDriverHost], tmp_path: Path) -> None:
    root, host = either
    result = start(host, tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], root)
    assert result.returncode == 0, result.stderr
    assert_real_driver_inside(result.stdout, root)


@pytest.fixture(scope="module")
def podman(host535: RealDriverHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiPodman]:
    base = tmp_path_factory.mktemp("cdi")
    generate(host535, base / "nvidia.yaml")
    (base / "hooks.d").mkdir()
    engine = CdiPodman(base / "nvidia.yaml", base / "hooks.d")
    yield engine
    engine.close()


def test_a_cdi_spec_gives_a_podman_container_the_real_driver(podman: CdiPodman, root535: DriverRoot, tmp_path: Path) -> None:
    spec = (podman.spec).read_text()
    assert f"{root535.path}{root535.real('/usr/lib/x86_64-linux-gnu/libcuda.so.1')}" in spec
    result = podman.run(real_rootfs(tmp_path / "rootfs", cudart=root535), CHECK, devices=["nvidia.com/gpu=0"])
    assert result.returncode == 0, result.stderr
    assert_real_driver_inside(result.stdout, root535)


def test_driver_trees_switch_between_the_real_drivers(root535: DriverRoot, root470: DriverRoot, tmp_path: Path) -> None:
    host = real_host(tmp_path / "host", root535)  # the 535 module loaded; 470's user-mode driver as a tree
    config = host.write_config()
    config.write_text(config.read_text() + f'[drivers.tesla-470]\nroot = "{root470.path}"\nkernel_modules = ["{root535.version}"]\n')
    for env, root in (([], root535), (["PONYTAIL_DRIVER=tesla-470"], root470)):
        result = start(host, tmp_path / (env[0] if env else "host"), ["NVIDIA_VISIBLE_DEVICES=0", *env], root, config)
        assert result.returncode == 0, result.stderr
        assert f"cuDriverGetVersion {root.cuda_version}" in result.stdout.splitlines(), result.stdout
    assert f"driver tree 'tesla-470' at {root470.path}, version {root470.version}" in host.log.read_text()


def _debug(host: RealDriverHost, tmp_path: Path, env: list[str]) -> str:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", *env])
    result = run_ponytail(["-config", str(host.write_config()), "-debug"], stdin=state_for(bundle, 1))
    return result.stdout.decode()


@pytest.mark.parametrize(("which", "devices", "require", "met"), [
    ("driver-535", "0", CUDA_11_8, True),
    ("driver-535", "0", CUDA_12_2, True),
    ("driver-535", "all", CUDA_12_2_SBSA, True),
    ("driver-470", "0", CUDA_11_8, True),  # the Tesla card, by its brand row
    ("driver-470", "1", CUDA_11_8, True),  # the GeForce card, by its own
    ("driver-470", "all", CUDA_11_8, True),  # both: each by its own row, as NVIDIA evaluates it
    ("driver-470", "all", CUDA_12_2, True),
    ("driver-470", "0", CUDA_12_2_SBSA, False),
])
def test_real_images_requirements_on_one_gpu_and_on_two_brands(
    which: str, devices: str, require: str, met: bool, host535: RealDriverHost, host470: RealDriverHost, tmp_path: Path
) -> None:
    host = {"driver-535": host535, "driver-470": host470}[which]
    out = _debug(host, tmp_path, [f"NVIDIA_VISIBLE_DEVICES={devices}", f"NVIDIA_REQUIRE_CUDA={require}"])
    assert ("a real run would FAIL" not in out) is met, out
    if not met:
        assert f"problem: this host does not meet NVIDIA_REQUIRE_CUDA='{require}': unmet cuda>=12.2 (driver 470.256.02, CUDA 11.4)" in out


def test_a_real_11_8_image_starts_on_a_tesla_and_a_geforce_card_with_the_470_driver(
    host470: RealDriverHost, root470: DriverRoot, tmp_path: Path
) -> None:
    result = start(host470, tmp_path, ["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_REQUIRE_CUDA={CUDA_11_8}"], root470)
    assert result.returncode == 0, result.stderr
    assert_real_driver_inside(result.stdout, root470)
    info = json.loads(run_ponytail(["-config", str(host470.write_config()), "info", "--json"]).stdout or b"{}")
    assert sorted(g["model"] for g in info.get("gpus", [])) == sorted([GEFORCE, TESLA])
