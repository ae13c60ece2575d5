"""Debian sid's podman 5.8 (`make test-engines`, in the sid root of support.sidroot) with CDI: `--device
nvidia.com/gpu=...` from ponytail's spec in the root's /etc/cdi (the engine makes the nodes and mounts the files,
`ponytail cdi-hook` makes the links and the linker cache), with runc 1.3 on this cgroup v1 host and with crun
1.28 where the engine sees only cgroup v2. Its hooks.d route is in test_engine_podman."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cdi_support import generate
from support.engines import CUDACHECK_GPU0, EXPECTED_GPU0, Podman
from support.fakehost import FakeHost, make_rootfs
from support.sidroot import sid_root

pytestmark = pytest.mark.current_engines


@pytest.fixture(params=[("runc", False), ("crun", True)], ids=["runc 1.3", "crun 1.28 cgroup v2"])
def podman(request: pytest.FixtureRequest, host: FakeHost, tmp_path: Path) -> Iterator[Podman]:
    sid_root()
    runtime, v2 = request.param
    spec = tmp_path / "nvidia.yaml"
    generate(host, spec)
    (tmp_path / "hooks.d").mkdir()  # none: CDI alone
    engine = Podman(tmp_path / "hooks.d", pure_v2_cgroups=v2, sid=True, runtime=runtime, etc_files={"cdi/nvidia.yaml": spec.read_text()})
    yield engine
    engine.close()


@pytest.mark.parametrize("device", ["nvidia.com/gpu=0", "uuid"])
def test_a_cdi_device_gets_exactly_its_gpu(podman: Podman, host: FakeHost, tmp_path: Path, device: str) -> None:
    name = f"nvidia.com/gpu={host.gpu_list[0].uuid}" if device == "uuid" else device
    result = podman.run(make_rootfs(tmp_path / "rootfs"), CUDACHECK_GPU0, devices=[name])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED_GPU0, result.stdout
    log = host.log.read_text()
    assert "cdi-hook in " in log and "injected into" not in log, log[-2000:]
