"""Docker runs GPU containers through ponytail-runtime, registered with
`dockerd --add-runtime ponytail=.../ponytail-runtime`, on a private dockerd: the shim adds the
hook and the device rules to GPU containers' bundles only; every other container is untouched."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.engines import CUDACHECK_GPU0, DOCKER_RELEASES, EXPECTED_GPU0, Dockerd, engines_for, unique
from support.fakehost import FakeHost, gpus, make_rootfs

UNKNOWN_GPU = "ponytail: error: unknown GPU '7' in NVIDIA_VISIBLE_DEVICES='7': this host has 3 GPUs"


@dataclass
class Docker:
    daemon: Dockerd
    image: str
    log: Path  # ponytail's log file

    def run(self, *args: str, env: tuple[str, ...] = (), detach: bool = False) -> tuple[str, subprocess.CompletedProcess]:
        """``docker run --runtime ponytail IMAGE ARGS`` with ``-e`` for each of ``env``; the container id too."""
        cidfile = self.daemon.state / unique("cid")
        options = ["-d" if detach else "--rm", "--cidfile", str(cidfile), "--network=none", "--runtime", "ponytail"]
        for item in env:
            options += ["-e", item]
        result = self.daemon.docker("run", *options, self.image, *args)
        return (cidfile.read_text().strip() if cidfile.exists() else ""), result

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture(scope="module", params=DOCKER_RELEASES)
def docker(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """A private dockerd with the shim registered: Debian 12's 20.10, and Debian sid's 28.5 (with
    containerd 2.1 and runc 1.3) under ``make test-engines``."""
    sid = engines_for(request.param)
    base = tmp_path_factory.mktemp("docker")
    host = FakeHost(base / "host", gpu_list=gpus(3, minors=[2, 0, 1]))
    daemon = Dockerd({"PONYTAIL_CONFIG": str(host.write_config())}, sid=sid)  # the shim reads its config from there
    try:
        yield Docker(daemon, daemon.import_rootfs(make_rootfs(base / "rootfs")), host.log)
    finally:
        daemon.close()


def test_gpu_container_gets_the_selected_gpu_and_nvidia_smi_runs(docker: Docker) -> None:
    container_id, result = docker.run(*CUDACHECK_GPU0, env=("NVIDIA_VISIBLE_DEVICES=0",))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    assert f"container={container_id} allowed c 195:2 rw" in docker.log_text()
    _, smi = docker.run("nvidia-smi", env=("NVIDIA_VISIBLE_DEVICES=0",))
    assert smi.returncode == 0, smi.stderr
    assert "Driver Version: 550.54.15" in smi.stdout and "GPU node /dev/nvidia2" in smi.stdout


def test_shim_adds_the_hook_and_device_rules_to_gpu_bundles_only(docker: Docker) -> None:
    gpu = _running_bundle(docker, ("NVIDIA_VISIBLE_DEVICES=1",))  # GPU index 1 has minor 0
    hooks = [h for h in gpu["hooks"]["prestart"] if h["path"].endswith("/ponytail")]
    assert len(hooks) == 1 and hooks[0]["args"][:2] == ["ponytail", "-config"]
    rules = [(r["major"], r["minor"], r["access"]) for r in gpu["linux"]["resources"]["devices"] if r.get("major") in (195, 511)]
    assert rules == [(195, 0, "rwm"), (195, 255, "rwm"), (511, 0, "rwm"), (511, 1, "rwm")]
    for env in ((), ("NVIDIA_VISIBLE_DEVICES=void",), ("NVIDIA_VISIBLE_DEVICES=",)):
        plain = _running_bundle(docker, env)
        assert not any(h["path"].endswith("/ponytail") for h in plain.get("hooks", {}).get("prestart", [])), env  # Docker 28 writes no hooks
        assert not any(r.get("major") in (195, 511) for r in plain["linux"]["resources"]["devices"]), env


@pytest.mark.parametrize("env", [(), ("NVIDIA_VISIBLE_DEVICES=void",)])
def test_non_gpu_containers_start_untouched(docker: Docker, env: tuple[str, ...]) -> None:
    container_id, result = docker.run("sh", "-c", "ls /dev; /usr/local/bin/cudacheck", env=env)
    assert result.returncode == 2, result.stdout + result.stderr  # cudacheck: no libcuda.so.1
    assert "dlopen libcuda.so.1 failed" in result.stdout and "nvidia" not in result.stdout
    assert len(container_id) == 64 and container_id not in docker.log_text()


def test_hook_failure_stops_the_container_with_the_reason(docker: Docker) -> None:
    container_id, result = docker.run(*CUDACHECK_GPU0, env=("NVIDIA_VISIBLE_DEVICES=7",))
    assert result.returncode != 0 and "cuDriverGetVersion" not in result.stdout
    assert UNKNOWN_GPU in result.stderr, result.stderr
    assert f"error container={container_id} unknown GPU '7'" in docker.log_text()


def _running_bundle(docker: Docker, env: tuple[str, ...]) -> dict:
    """The config.json the real runtime got for a running container started with ``env``."""
    container_id, started = docker.run("/bin/busybox", "sleep", "60", env=env, detach=True)
    assert started.returncode == 0, started.stderr
    try:
        return docker.daemon.bundle_config(container_id)
    finally:
        docker.daemon.docker("rm", "-f", container_id)
