"""podman runs ponytail through the shipped hooks.d file, installed by `ponytail install-hook`:
containers annotated com.example.gpu=true get the GPUs, every other container is untouched. Debian 12's
podman 4.3 with runc 1.1; under `make test-engines` also Debian sid's podman 5.8 with runc 1.3, and with
crun 1.28 where the engine sees only cgroup v2 (crun refuses this host's v1 hybrid layout): there crun
attaches its eBPF device program, which ponytail's hook widens by exactly the injected nodes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Podman, console_script
from support.fakehost import FakeHost, make_rootfs
from support.sidroot import sid_root

SHIPPED = Path(__file__).resolve().parents[2] / "hooks.d" / "ponytail.json"
# (Debian sid's?, runtime, cgroup v2 only?)
ENGINES = [pytest.param((False, "runc", False), id="podman 4.3"),
           pytest.param((True, "runc", False), id="podman 5.8 runc 1.3", marks=pytest.mark.current_engines),
           pytest.param((True, "crun", True), id="podman 5.8 crun 1.28 cgroup v2", marks=pytest.mark.current_engines)]


@pytest.fixture(params=ENGINES)
def podman(host: FakeHost, tmp_path: Path, request: pytest.FixtureRequest):
    sid, runtime, v2 = request.param
    if sid:
        sid_root()  # built here, or the test skipped saying why
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
    engine = Podman(hooks_dir, pure_v2_cgroups=v2, sid=sid, runtime=runtime)
    yield engine
    engine.close()


def test_annotated_container_gets_the_selected_gpu(podman: Podman, host: FakeHost, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    result = podman.run(rootfs, CUDACHECK_GPU0, annotations={"com.example.gpu": "true"}, env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    log = host.log.read_text()
    assert "allowed c 195:2 rw, c 195:255 rw" in log and f"injected into {rootfs}: GPUs [0]" in log
    assert ("replaced device program(s)" in log) == podman.pure_v2, log  # cgroup v2: the engine's eBPF program widened


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
    if podman.runtime == "crun":  # crun sends a hook's stderr to /dev/null: the reason is in ponytail's log alone
        assert "error executing hook" in result.stderr, result.stderr
    else:
        assert reason in result.stderr, result.stderr
    assert "error container=" in host.log.read_text() and "unknown GPU '7'" in host.log.read_text()
