"""podman 4.3 with a spec from ``ponytail cdi generate`` (in a private /run/cdi): the engine creates
the nodes and mounts the files, ``ponytail cdi-hook`` makes the links and the linker cache; the
selected nodes open (ENXIO: visible and allowed), the others are absent, libcuda.so.1 loads,
nvidia-smi runs. Hostile images under the CDI hook touch nothing outside their rootfs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from security.test_hostile_images import CASES, WORKS, Case
from support.cdi_support import CdiPodman, generate
from support.engines import console_script
from support.fakehost import FakeHost, gpus, make_rootfs
from support.harness import tree_digest
from support.hostile import CUDA_OK, Stage

NODES = ["/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap145", "/dev/nvidia-caps/nvidia-cap150", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CHECK = ["sh", "-c", f"/usr/local/bin/cudacheck {' '.join(NODES)}; nvidia-smi; echo visible=$NVIDIA_VISIBLE_DEVICES"]


# shared_host's: 3 GPUs: index 0 is /dev/nvidia2, index 2 (/dev/nvidia1) has MIG devices 2:1:0 and 2:2:0
HOST_SHAPE = {"gpu_list": gpus(3, minors=[2, 0, 1]), "mig": {1: [(1, 0), (2, 0)]}}


@pytest.fixture(scope="module")
def podman(shared_host: FakeHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiPodman]:
    base = tmp_path_factory.mktemp("cdispec")
    spec = base / "nvidia.yaml"
    generate(shared_host, spec)  # the default names: index, UUID and all, as `cdi list` says and the README's examples use
    # the legacy hook is installed too, for every GPU-annotated container: CDI's void keeps it out
    hooks = base / "hooks.d"
    installed = subprocess.run([console_script("ponytail"), "install-hook", "--dir", str(hooks), "--config", str(shared_host.write_config())],
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    engine = CdiPodman(spec, hooks)
    yield engine
    engine.close()


def opened(out: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("open ")}


UUID0 = "GPU-00000000-1111-2222-3333-000000000002"


@pytest.mark.parametrize("device, visible", [
    ("0", {"/dev/nvidia2"}),
    (UUID0, {"/dev/nvidia2"}),
    ("all", {"/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap145", "/dev/nvidia-caps/nvidia-cap150"}),
    ("2:1:0", {"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap145"}),
    (FakeHost.mig_uuid(1, 2, 0), {"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap150"}),
])
def test_a_cdi_device_gives_its_nodes_the_driver_and_nvidia_smi(podman: CdiPodman, shared_host: FakeHost, tmp_path: Path, device: str, visible: set) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    result = podman.run(rootfs, CHECK, devices=[f"nvidia.com/gpu={device}"], annotations={"com.example.gpu": "true"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert CUDA_OK in out and "Driver Version: 550.54.15" in out, out
    expected = {node: "ENXIO" if node in visible or node in ("/dev/nvidiactl", "/dev/nvidia-uvm") else "ENOENT" for node in NODES}
    assert opened(out) == expected, out
    assert "visible=void" in out  # the legacy hook saw a non-GPU container: it injected nothing
    assert "not a GPU container (NVIDIA_VISIBLE_DEVICES='void'); nothing injected" in shared_host.log.read_text()
    assert "cdi-hook in" in shared_host.log.read_text()


def test_an_unknown_device_is_podmans_error_not_a_broken_container(podman: CdiPodman, tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    result = podman.run(rootfs, CHECK, devices=["nvidia.com/gpu=7"])
    assert result.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=7" in result.stderr, result.stderr
    assert CUDA_OK not in result.stdout and not (rootfs / "etc/ld.so.conf.d").exists()


@pytest.fixture
def stage(tmp_path: Path, shared_host: FakeHost, request: pytest.FixtureRequest) -> Iterator[Stage]:
    s = Stage(tmp_path, shared_host, container_id=f"cdi-{request.node.name}"[:60])
    yield s
    s.close()


# runc 1.1.5 (Debian 12) itself creates /dev/fd, /dev/stdin, ..., /dev/ptmx through an image's /dev
# symlink, on the host: a plain podman start with no GPU and no hook does it too. For these the victim
# is compared with what it was after such a plain start.
RUNC_WRITES_THROUGH = {"dev-absolute", "dev-relative"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_image_under_the_cdi_hook_never_reaches_the_host(podman: CdiPodman, stage: Stage, case: Case) -> None:
    """The prestart suite's traps, started by podman with a CDI device: runc places the spec's
    mounts and nodes (resolving in the rootfs itself), ponytail's hook the links and the linker
    cache. Whether the start succeeds is the engine's affair for some traps; the host never changes."""
    case.build(stage)
    if case.name in RUNC_WRITES_THROUGH:
        plain = podman.run(stage.rootfs, ["/bin/true"])  # no device: ponytail plays no part
        assert plain.returncode == 0, plain.stderr
        stage.victim_digest = tree_digest(stage.victim)  # runc's own writes; ponytail's must add none
    result = podman.run(stage.rootfs, ["/usr/local/bin/cudacheck", "/dev/nvidia2", "/dev/nvidiactl"], devices=["nvidia.com/gpu=0"])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    stage.assert_host_untouched()
    if result.returncode == 0 and case.expect == WORKS:
        assert CUDA_OK in result.stdout and "open /dev/nvidia2 ENXIO" in result.stdout, result.stdout


def test_podman_never_starts_a_container_with_a_spec_whose_gpus_were_renumbered(tmp_path: Path) -> None:
    """Same driver, but the two GPUs traded minors since the spec was written: gpu=0's node
    (/dev/nvidia0) is GPU 1 now. The hook stops the start, and the program never runs (before:
    it ran with the other GPU's node, exit 0)."""
    from integration.test_cdi_hook import _renumber

    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    spec = tmp_path / "nvidia.yaml"
    generate(host, spec)
    (tmp_path / "hooks.d").mkdir()
    engine = CdiPodman(spec, tmp_path / "hooks.d")
    try:
        rootfs = make_rootfs(tmp_path / "rootfs")
        fresh = engine.run(rootfs, ["/usr/local/bin/cudacheck", "/dev/nvidia0"], devices=["nvidia.com/gpu=0"])
        assert fresh.returncode == 0 and "open /dev/nvidia0 ENXIO" in fresh.stdout, fresh.stdout + fresh.stderr
        _renumber(host)
        stale = engine.run(make_rootfs(tmp_path / "again"), ["/usr/local/bin/cudacheck", "/dev/nvidia0"], devices=["nvidia.com/gpu=0"])
    finally:
        engine.close()
    assert stale.returncode != 0 and "cuDriverGetVersion" not in stale.stdout, stale.stdout
    assert "the CDI spec is stale: GPU 0000:18:00.0" in stale.stderr and "has minor 1 now, not 0" in stale.stderr, stale.stderr


def test_a_cdi_gpu_gets_its_own_dri_by_path_links_and_no_others(tmp_path: Path) -> None:
    """graphics: podman given GPU 1 by CDI creates its /dev/dri nodes, and its device's hook links
    /dev/dri/by-path/pci-<bus>-card and -render to them; GPU 0's nodes and links are absent
    (before: no by-path link at all under CDI)."""
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2), dri=True)
    spec = tmp_path / "nvidia.yaml"
    generate(host, spec)
    (tmp_path / "hooks.d").mkdir()
    engine = CdiPodman(spec, tmp_path / "hooks.d")
    show = "for f in /dev/dri/* /dev/dri/by-path/*; do test -c $f && echo chr $f $(readlink $f); done; true"
    try:
        result = engine.run(make_rootfs(tmp_path / "rootfs"), ["sh", "-c", show], devices=["nvidia.com/gpu=1"])
    finally:
        engine.close()
    assert result.returncode == 0, result.stderr
    bus0, bus1 = (g.bus_id for g in host.gpu_list)
    assert sorted(result.stdout.splitlines()) == sorted([
        "chr /dev/dri/card2", "chr /dev/dri/renderD129",
        f"chr /dev/dri/by-path/pci-{bus1}-card ../card2", f"chr /dev/dri/by-path/pci-{bus1}-render ../renderD129",
    ]), result.stdout
    assert bus0 not in result.stdout
