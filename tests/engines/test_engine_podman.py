"""podman runs ponytail through the shipped hooks.d file, installed by `ponytail install-hook`:
containers annotated com.example.gpu=true get the GPUs, every other container is untouched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Podman, console_script
from support.fakehost import FakeHost, make_rootfs

SHIPPED = Path(__file__).resolve().parents[2] / "hooks.d" / "ponytail.json"


@pytest.fixture
def podman(host: FakeHost, tmp_path: Path):
    hooks_dir = tmp_path / "hooks.d"
    config = host.write_config()
    installed = subprocess.run(
        [console_script("ponytail"), "install-hook", "--dir", str(hooks_dir), "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    written = json.loads((hooks_dir / "ponytail.json").read_text())
    assert written["hook"]["path"] == console_script("ponytail")
    # the installed file is the shipped one, with this install's command and the given config
    shipped = json.loads(SHIPPED.read_text())
    shipped["hook"]["path"] = written["hook"]["path"]
    shipped["hook"]["args"] += ["-config", str(config)]
    assert written == shipped
    engine = Podman(hooks_dir)
    yield engine
    engine.close()


def test_annotated_container_gets_the_selected_gpu(podman: Podman, host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    result = podman.run(rootfs, CUDACHECK_GPU0, annotations={"com.example.gpu": "true"}, env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    log = host.log.read_text()
    assert "allowed c 195:2 rw, c 195:255 rw" in log and f"injected into {rootfs}: GPUs [0]" in log


@pytest.mark.parametrize("annotations", [{}, {"com.example.gpu": "nottrue"}, {"com.example.gpu.other": "true"}])
def test_other_containers_start_untouched(podman: Podman, host: FakeHost, tmp_path: Path, annotations: dict) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    args = ["/usr/local/bin/cudacheck", "/dev/nvidia2", "/dev/nvidiactl"]
    result = podman.run(rootfs, args, annotations=annotations, env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert result.returncode == 2, result.stdout + result.stderr  # cudacheck: no libcuda.so.1
    assert "dlopen libcuda.so.1 failed" in result.stdout
    assert not (rootfs / "dev/nvidia2").exists() and not (rootfs / "etc/ld.so.conf.d").exists()
    assert not host.log.exists(), "the hook ran for a container that did not ask for GPUs"


def test_hook_failure_stops_the_container_with_the_reason(podman: Podman, host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    result = podman.run(rootfs, CUDACHECK_GPU0, annotations={"com.example.gpu": "true"}, env=["NVIDIA_VISIBLE_DEVICES=7"])
    assert result.returncode != 0 and "cuDriverGetVersion" not in result.stdout
    reason = "ponytail: error: unknown GPU '7' in NVIDIA_VISIBLE_DEVICES='7': this host has 3 GPUs"
    assert reason in result.stderr, result.stderr
    assert "error container=" in host.log.read_text() and "unknown GPU '7'" in host.log.read_text()
