"""`docker run --gpus` and `docker run --device nvidia.com/gpu=...` on Debian sid's Docker 28.5 (`make test-engines`,
dockerd with the containerd 2.1 and runc 1.3 it starts, in the sid root of support.sidroot).

What Docker 28.5 does, seen here: its CDI support is on, so `--device nvidia.com/gpu=0` applies the spec in /etc/cdi
(ponytail's, `ponytail cdi generate`: the engine makes the nodes, mounts the files, runs `ponytail cdi-hook`).
`--gpus` has no CDI route in 28.5 (the CDI driver for `--gpus` came with Docker 29): dockerd registers its NVIDIA
driver only when `nvidia-container-runtime-hook` is on its PATH and then adds that program as a prestart hook,
whether or not a CDI spec and an `nvidia-cdi-hook` are there; with only `nvidia-cdi-hook` on its PATH, `--gpus` is
refused. With ponytail's link (`ponytail install-docker-gpus`) that hook is ponytail's. Either way exactly the GPUs
asked for, libcuda loads."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.cdi_support import generate
from support.commands import PONYTAIL
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Dockerd, engines_for
from support.fakehost import FakeHost, gpus, make_rootfs

pytestmark = pytest.mark.current_engines

NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CUDACHECK = "/usr/local/bin/cudacheck"


@dataclass
class GpuDocker:
    daemon: Dockerd
    image: str
    host: FakeHost

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return self.daemon.docker("run", "--rm", "--network=none", *args)

    def log(self) -> str:
        return self.host.log.read_text() if self.host.log.exists() else ""


def _docker(base: Path, hooks: tuple[str, ...]) -> tuple[Dockerd, FakeHost, Path]:
    """A sid dockerd whose PATH has ponytail's programs of ``hooks`` (nvidia-container-runtime-hook: the link of
    install-docker-gpus; nvidia-cdi-hook: the script of install-nvidia-hook), ponytail's spec in its /etc/cdi."""
    engines_for("sid")
    host = FakeHost(base / "host", gpu_list=gpus(3, minors=[2, 0, 1]))
    bin_dir = base / "bin"
    commands = {"nvidia-container-runtime-hook": ["install-docker-gpus", "--bin-dir", str(bin_dir)],
                "nvidia-cdi-hook": ["install-nvidia-hook", "--at", str(bin_dir / "nvidia-cdi-hook")]}
    for hook in hooks:
        installed = subprocess.run([*PONYTAIL, *commands[hook]], capture_output=True, text=True, timeout=60)
        assert installed.returncode == 0, installed.stderr
    spec = base / "nvidia.yaml"
    generate(host, spec)
    etc = {"ponytail/config.toml": host.write_config().read_text(), "cdi/nvidia.yaml": spec.read_text()}
    return Dockerd({"PATH": f"{bin_dir}:{os.environ['PATH']}"}, etc_files=etc, sid=True), host, bin_dir


@pytest.fixture(scope="module")
def gpu_docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuDocker]:
    base = tmp_path_factory.mktemp("docker-gpus-cdi")
    daemon, host, _ = _docker(base, ("nvidia-container-runtime-hook", "nvidia-cdi-hook"))
    try:
        assert daemon.docker("version", "--format", "{{.Server.Version}}").stdout.startswith("28.5."), daemon.docker("version").stdout
        yield GpuDocker(daemon, daemon.import_rootfs(make_rootfs(base / "rootfs")), host)
    finally:
        daemon.close()


def _route(gpu_docker: GpuDocker, before: str) -> str:
    log = gpu_docker.log()[len(before):]
    if "cdi-hook in " in log and "injected into" not in log:
        return "CDI"
    if "injected into" in log and "cdi-hook" not in log:
        return "legacy"
    return f"unclear: {log[-2000:]}"


@pytest.mark.parametrize("gpus_flag, expected", [
    ("all", ["cuDriverGetVersion 12040"] + [f"open {node} ENXIO" for node in NODES]),
    ("1", EXPECTED_GPU0),  # a count: the first GPU by index, /dev/nvidia2
    ("uuid", EXPECTED_GPU0),
])
def test_gpus_takes_ponytails_legacy_hook_even_beside_a_cdi_spec(gpu_docker: GpuDocker, gpus_flag: str, expected: list[str]) -> None:
    before = gpu_docker.log()
    args = [CUDACHECK, *NODES] if gpus_flag == "all" else CUDACHECK_GPU0
    flag = f'"device={gpu_docker.host.gpu_list[0].uuid}"' if gpus_flag == "uuid" else gpus_flag
    result = gpu_docker.run("--gpus", flag, gpu_docker.image, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected, result.stdout
    assert _route(gpu_docker, before) == "legacy"


@pytest.mark.parametrize("device", ["nvidia.com/gpu=0", "uuid"])
def test_a_cdi_device_takes_ponytails_spec(gpu_docker: GpuDocker, device: str) -> None:
    """`--device nvidia.com/gpu=...`: Docker's CDI applies ponytail's spec, whose hook is `ponytail cdi-hook`."""
    before = gpu_docker.log()
    name = f"nvidia.com/gpu={gpu_docker.host.gpu_list[0].uuid}" if device == "uuid" else device
    result = gpu_docker.run("--device", name, gpu_docker.image, *CUDACHECK_GPU0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    assert _route(gpu_docker, before) == "CDI"


def test_gpus_is_refused_with_only_nvidia_cdi_hook_on_the_path(tmp_path: Path) -> None:
    """Docker 28.5 has no CDI driver for --gpus: ponytail's nvidia-cdi-hook alone does not give it one."""
    daemon, host, bin_dir = _docker(tmp_path, ("nvidia-cdi-hook",))
    try:
        assert sorted(os.listdir(bin_dir)) == ["nvidia-cdi-hook"]
        image = daemon.import_rootfs(make_rootfs(tmp_path / "rootfs"))
        result = daemon.docker("run", "--rm", "--network=none", "--gpus", "all", image, *CUDACHECK_GPU0)
        assert result.returncode != 0 and 'could not select device driver "" with capabilities: [[gpu]]' in result.stderr, result.stderr
        assert not host.log.exists() or "injected into" not in host.log.read_text()
        by_cdi = daemon.docker("run", "--rm", "--network=none", "--device", "nvidia.com/gpu=0", image, *CUDACHECK_GPU0)
        assert by_cdi.returncode == 0 and by_cdi.stdout.splitlines() == EXPECTED_GPU0, by_cdi.stdout + by_cdi.stderr
    finally:
        daemon.close()
