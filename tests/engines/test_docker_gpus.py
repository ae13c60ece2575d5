"""`docker run --gpus` with ponytail alone: `ponytail install-docker-gpus` links
nvidia-container-runtime-hook to ponytail; a private dockerd (Debian 12's 20.10, Debian sid's 28.5) that finds it on its
PATH offers --gpus, sets NVIDIA_VISIBLE_DEVICES and runs it as a prestart hook, and the container
gets exactly the GPUs asked for. A file of that name that is not ponytail's is never replaced."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.engines import CUDACHECK_GPU0, DOCKER_RELEASES, EXPECTED_GPU0, Dockerd, engines_for
from support.fakehost import FakeHost, gpus, make_rootfs

HOOK = "nvidia-container-runtime-hook"
CUDACHECK = "/usr/local/bin/cudacheck"
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]


def install(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PONYTAIL, "install-docker-gpus", *args], capture_output=True, text=True, timeout=60)


@dataclass
class GpuDocker:
    daemon: Dockerd
    image: str
    host: FakeHost

    def run(self, *args: str) -> subprocess.CompletedProcess:
        """``docker run --rm ARGS`` (docker options, the image, then the command)."""
        return self.daemon.docker("run", "--rm", "--network=none", *args)


@pytest.fixture(scope="module", params=DOCKER_RELEASES)
def gpu_docker(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """A private dockerd that finds the hook on its PATH: Debian 12's 20.10, and Debian sid's 28.5 (with
    containerd 2.1 and runc 1.3) under ``make test-engines``."""
    sid = engines_for(request.param)
    base = tmp_path_factory.mktemp("docker-gpus")
    host = FakeHost(base / "host", gpu_list=gpus(3, minors=[2, 0, 1]))
    bin_dir = base / "bin"
    result = install("--bin-dir", str(bin_dir))
    assert result.returncode == 0, result.stderr
    # dockerd 20.10 gives the hook no environment: it reads /etc/ponytail/config.toml, which this
    # dockerd (alone, in its own mount namespace) sees as the fake host's config
    config = host.write_config().read_text()
    daemon = Dockerd({"PATH": f"{bin_dir}:{os.environ['PATH']}"}, etc_files={"ponytail/config.toml": config}, sid=sid)
    try:
        yield GpuDocker(daemon, daemon.import_rootfs(make_rootfs(base / "rootfs")), host)
    finally:
        daemon.close()


def test_gpus_all_gives_every_gpu_and_libcuda_loads(gpu_docker: GpuDocker) -> None:
    result = gpu_docker.run("--gpus", "all", gpu_docker.image, CUDACHECK, *NODES)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["cuDriverGetVersion 12040"] + [f"open {node} ENXIO" for node in NODES], result.stdout


def test_gpus_count_gives_the_first_gpus_by_index(gpu_docker: GpuDocker) -> None:
    result = gpu_docker.run("--gpus", "1", gpu_docker.image, *CUDACHECK_GPU0)  # index 0 is /dev/nvidia2
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout


def test_gpus_device_by_uuid_gives_that_gpu_only(gpu_docker: GpuDocker) -> None:
    uuid = gpu_docker.host.gpu_list[0].uuid
    result = gpu_docker.run("--gpus", f'"device={uuid}"', gpu_docker.image, *CUDACHECK_GPU0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout


def test_gpus_device_unknown_stops_the_container_with_the_reason(gpu_docker: GpuDocker) -> None:
    result = gpu_docker.run("--gpus", '"device=7"', gpu_docker.image, CUDACHECK)
    assert result.returncode != 0 and "cuDriverGetVersion" not in result.stdout
    assert "unknown GPU '7'" in result.stderr, result.stderr


def test_a_container_without_gpus_is_untouched(gpu_docker: GpuDocker) -> None:
    result = gpu_docker.run(gpu_docker.image, "sh", "-c", f"ls /dev; {CUDACHECK}")
    assert result.returncode == 2, result.stdout + result.stderr  # cudacheck: no libcuda.so.1
    assert "nvidia" not in result.stdout


def test_install_is_idempotent_and_uninstall_removes_only_its_link(tmp_path: Path) -> None:
    first = install("--bin-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    link = tmp_path / HOOK
    assert link.is_symlink() and os.access(link, os.X_OK)
    again = install("--bin-dir", str(tmp_path))
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout
    removed = install("--bin-dir", str(tmp_path), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert not os.path.lexists(link)


@pytest.mark.parametrize("kind", ["file", "foreign-link"])
def test_another_vendors_hook_is_never_replaced_nor_removed(tmp_path: Path, kind: str) -> None:
    path = tmp_path / HOOK
    if kind == "file":
        path.write_text("#!/bin/sh\n# NVIDIA's hook\n")
        path.chmod(0o755)
    else:
        path.symlink_to("/usr/bin/nvidia-container-toolkit")
    before = os.readlink(path) if path.is_symlink() else path.read_text()
    for args in ((), ("--uninstall",)):
        result = install("--bin-dir", str(tmp_path), *args)
        assert result.returncode == 1, result.stdout
        assert result.stderr.count("\n") == 1 and "does not" in result.stderr and "another vendor's file" in result.stderr, result.stderr
        assert (os.readlink(path) if path.is_symlink() else path.read_text()) == before


def test_the_hook_name_runs_prestart_only(tmp_path: Path) -> None:
    link = tmp_path / HOOK
    link.symlink_to(PONYTAIL[0])
    for stage in ("poststart", "poststop"):
        result = subprocess.run([str(link), stage], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), stage
    bad = subprocess.run([str(link), "create"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert bad.returncode == 2 and bad.stderr.startswith("ponytail: error:") and "prestart" in bad.stderr, bad.stderr
