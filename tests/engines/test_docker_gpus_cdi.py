"""`docker run --gpus` through CDI on Docker 29.7 (`make test-engines`): from Docker 29.2 dockerd resolves --gpus
to the CDI devices ``nvidia.com/gpu=<index|UUID|all>`` when a program named ``nvidia-cdi-hook`` is on its PATH
(moby daemon/devices_nvidia_linux.go), and falls back to the ``nvidia-container-runtime-hook`` prestart hook
when CDI cannot serve the request. With ponytail's own spec in /etc/cdi and ponytail's ``nvidia-cdi-hook``
(``ponytail install-nvidia-hook``) and ``nvidia-container-runtime-hook`` (``ponytail install-docker-gpus``) on
dockerd's PATH: the CDI route (the engine makes the nodes, mounts the files, runs ``ponytail cdi-hook``; no
prestart hook); without a spec, the legacy hook. Either way exactly the GPUs asked for, libcuda loads."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from support.cdi_support import generate
from support.commands import PONYTAIL
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Dockerd, current_engines
from support.fakehost import FakeHost, gpus, make_rootfs

pytestmark = pytest.mark.current_engines

NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CUDACHECK = "/usr/local/bin/cudacheck"


@dataclass
class GpuDocker:
    daemon: Dockerd
    image: str
    host: FakeHost
    route: str

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return self.daemon.docker("run", "--rm", "--network=none", *args)


@pytest.fixture(scope="module", params=["CDI", "legacy"])
def gpu_docker(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[GpuDocker]:
    engines = current_engines()
    if engines is None:
        pytest.skip("current engines (Docker 29.7): run make test-engines (ENGINES_DIR)")
    base = tmp_path_factory.mktemp("docker-gpus-cdi")
    host = FakeHost(base / "host", gpu_list=gpus(3, minors=[2, 0, 1]))
    bin_dir = base / "bin"
    for args in (["install-docker-gpus", "--bin-dir", str(bin_dir)], ["install-nvidia-hook", "--at", str(bin_dir / "nvidia-cdi-hook")]):
        installed = subprocess.run([*PONYTAIL, *args], capture_output=True, text=True, timeout=60)
        assert installed.returncode == 0, installed.stderr
    etc = {"ponytail/config.toml": host.write_config().read_text()}
    if request.param == "CDI":  # ponytail's spec where dockerd looks (/etc/cdi, seen only by this dockerd)
        etc["cdi/nvidia.yaml"] = (lambda path: (generate(host, path), path.read_text())[1])(base / "nvidia.yaml")
    daemon = Dockerd({"PATH": f"{bin_dir}:{os.environ['PATH']}"}, etc_files=etc, engines_dir=engines)
    try:
        yield GpuDocker(daemon, daemon.import_rootfs(make_rootfs(base / "rootfs")), host, request.param)
    finally:
        daemon.close()


def _route(gpu_docker: GpuDocker, before: str) -> str:
    log = gpu_docker.host.log.read_text()[len(before):]
    if "cdi-hook in " in log and "injected into" not in log:
        return "CDI"
    if "injected into" in log and "cdi-hook" not in log:
        return "legacy"
    return f"unclear: {log[-2000:]}"


@pytest.mark.parametrize("gpus_flag, expected", [
    ("all", ["cuDriverGetVersion 12040"] + [f"open {node} ENXIO" for node in NODES]),
    ("1", EXPECTED_GPU0),  # the first GPU by index: /dev/nvidia2
])
def test_gpus_takes_cdi_when_ponytails_hook_and_spec_are_there_else_the_legacy_hook(
    gpu_docker: GpuDocker, gpus_flag: str, expected: list[str]
) -> None:
    before = gpu_docker.host.log.read_text() if gpu_docker.host.log.exists() else ""
    args = [CUDACHECK, *NODES] if gpus_flag == "all" else CUDACHECK_GPU0
    result = gpu_docker.run("--gpus", gpus_flag, gpu_docker.image, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected, result.stdout
    assert _route(gpu_docker, before) == gpu_docker.route


def test_gpus_device_by_uuid_takes_the_same_route(gpu_docker: GpuDocker) -> None:
    before = gpu_docker.host.log.read_text() if gpu_docker.host.log.exists() else ""
    result = gpu_docker.run("--gpus", f'"device={gpu_docker.host.gpu_list[0].uuid}"', gpu_docker.image, *CUDACHECK_GPU0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    assert _route(gpu_docker, before) == gpu_docker.route



