"""NVIDIA's own CDI spec (what ``nvidia-ctk cdi generate`` 1.20.0 wrote, captured in ../shared/nvidia, for a fake
host laid out as its manifest says) with its hooks served by ponytail, through podman: the hook paths lead to a
link named ``nvidia-cdi-hook`` (or ``nvidia-ctk``, the older ``nvidia-ctk hook SUBCOMMAND`` form) to the ponytail
command. The container gets exactly its GPU, libcuda.so.1 loads, every driver file and node is mounted once,
/proc/driver/nvidia is masked (where the host has it), the first hook did the work of all five and the others
did nothing; a hook of a newer toolkit is skipped with a warning, or stops the start where the config says so."""

from __future__ import annotations

import collections
import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from security.test_hostile_images import CASES, LIB, WORKS, Case
from support.cdi_support import CdiPodman
from support.engines import console_script
from support.fakehost import FakeHost, add_stale_libcuda, make_rootfs
from support.harness import tree_digest
from support.hostile import CUDA_OK, Stage
from support.nvidia_tools import captured_host, dra_specs, nvidia_spec, relocate

CLAIM = "0b7e4c1a-2f3d-4e5b-8a9c-1d2e3f4a5b6c"  # a ResourceClaim's UID
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
CHECK = ["sh", "-c", f"/usr/local/bin/cudacheck {' '.join(NODES)}; cat /proc/self/mountinfo; "
         "cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"]
# the captured host: device 0 is the GPU of minor 1 (/dev/nvidia1, NVML's index 0), device 1 the one of minor 0
FIRST, SECOND = "nvidia.com/gpu=0", "nvidia.com/gpu=1"


@pytest.fixture(scope="module", params=["nvidia-cdi-hook", "nvidia-ctk", "binary"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CdiPodman, FakeHost]]:
    """podman with nvidia-ctk's spec, its hooks: the script install-nvidia-hook writes (running the installed
    command, or the binary), or a plain link named nvidia-ctk to the ponytail command (the older form)."""
    base = tmp_path_factory.mktemp("nvidiaspec")
    host = captured_host(base)
    links = base / "bin"
    link = links / ("nvidia-ctk" if request.param == "nvidia-ctk" else "nvidia-cdi-hook")
    if request.param != "nvidia-ctk":  # the script install-nvidia-hook writes
        command = str(request.getfixturevalue("binary")) if request.param == "binary" else console_script("ponytail")
        installed = subprocess.run([command, "install-nvidia-hook", "--at", str(link), "--path", command], capture_output=True, text=True, timeout=60)
        assert installed.returncode == 0, installed.stderr
    else:  # a plain link to the ponytail command works too
        links.mkdir()
        link.symlink_to(console_script("ponytail"))
    spec = base / "nvidia.yaml"
    made = nvidia_spec(host, spec, str(links / "nvidia-cdi-hook"), {"PONYTAIL_CONFIG": str(host.write_config())},
                       ctk=str(link) if request.param == "nvidia-ctk" else "")
    assert request.param != "binary" or str(request.getfixturevalue("binary")) in link.read_text()
    extra = []
    if request.param != "nvidia-ctk":  # the DRA driver's specs (a base spec and one claim's), the same hook
        for name, content in zip(("dra-base.yaml", "dra-claim.yaml"), dra_specs(copy.deepcopy(made), CLAIM, str(link)), strict=True):
            (base / name).write_text(yaml.safe_dump(content))
            extra.append(base / name)
    podman = CdiPodman(spec, base / "hooks.d", extra)
    yield podman, host
    podman.close()


def _with_spec(podman: CdiPodman, spec: dict, path: Path) -> str:
    """podman's spec list with ``spec`` (written to ``path``, a file of the same name) in place of nvidia.yaml; the old list."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    before = podman.specs
    podman.specs = before.replace(str(podman.spec), str(path))
    return before


def test_a_dra_claims_devices_run_ponytails_hook_the_same_way(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    podman, host = engine
    if not podman.specs.count("dra-claim"):
        pytest.skip("the DRA driver writes nvidia-cdi-hook command lines")
    before = host.log.read_text() if host.log.exists() else ""
    result = podman.run(make_rootfs(tmp_path / "rootfs"), ["sh", "-c", "/usr/local/bin/cudacheck /dev/nvidia0 /dev/nvidia1; readlink /etc/nvidia-dra-claim"],
                        devices=["k8s.gpu.nvidia.com/device=gpu-0", f"k8s.gpu.nvidia.com/claim={CLAIM}-gpu-0"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [CUDA_OK, "open /dev/nvidia0 ENOENT", "open /dev/nvidia1 ENXIO", f"{CLAIM}-gpu-0"], result.stdout
    assert host.log.read_text()[len(before):].count("6 NVIDIA hook(s)") == 1


def test_nvidias_spec_with_ponytail_as_its_hook_gives_exactly_the_gpu(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    podman, host = engine
    rootfs = make_rootfs(tmp_path / "rootfs")
    before = host.log.read_text() if host.log.exists() else ""
    result = podman.run(rootfs, CHECK, devices=[FIRST])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert CUDA_OK in out, out
    opened = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("open ")}
    assert opened == {"/dev/nvidia0": "ENOENT", "/dev/nvidia1": "ENXIO", "/dev/nvidiactl": "ENXIO", "/dev/nvidia-uvm": "ENXIO"}, out
    targets = collections.Counter(line.split()[4] for line in out.splitlines() if line[:1].isdigit() and len(line.split()) > 4)
    driver = {t: n for t, n in targets.items() if "nvidia" in t or "libcuda" in t}
    assert any("libcuda.so" in t for t in driver) and all(n == 1 for n in driver.values()), driver
    assert '"EGLVisibleDGPUDevices",0x2]' in out, out  # update-application-profile: minor 1
    assert (rootfs / host.lib_dir.lstrip("/") / "libcuda.so.1").is_symlink()
    log = host.log.read_text()[len(before):]
    assert "5 NVIDIA hook(s): create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification, update-application-profile" in log, log[-3000:]
    assert log.count("NVIDIA hook(s)") == 1, log[-3000:]  # the four later hooks found their work done


def test_a_spec_for_another_driver_stops_the_start_with_one_line(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    podman, host = engine
    version = host.proc / "driver/nvidia/version"
    original = version.read_text()
    version.write_text(original.replace("550.54.15", "560.28.03"))
    try:
        result = podman.run(make_rootfs(tmp_path / "rootfs"), ["true"], devices=[FIRST])
    finally:
        version.write_text(original)
    assert result.returncode != 0
    assert "the CDI spec was generated for NVIDIA driver 550.54.15 but 560.28.03 is running" in result.stderr, result.stderr


RUNC_WRITES_THROUGH = {"dev-absolute", "dev-relative"}  # runc 1.1.5 itself writes through an image's /dev link (test_cdi_podman.py)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_image_under_nvidias_spec_served_by_ponytail_never_reaches_the_host(
    engine: tuple[CdiPodman, FakeHost], tmp_path: Path, case: Case
) -> None:
    """The prestart suite's traps under NVIDIA's spec: runc places the spec's mounts and nodes, ponytail
    (as nvidia-cdi-hook) the links, the masked /proc, the application profile and the linker cache. The
    host never changes, no traceback; the traps an image may set and still work (WORKS) start and load libcuda."""
    podman, host = engine
    stage = Stage(tmp_path, host, container_id=f"nvspec-{case.name}"[:60])
    # the captured spec with the driver's libraries where the suite sets its traps (the image's usual library directory)
    spec = relocate(yaml.safe_load(podman.spec.read_text()), host.lib_dir, LIB)
    before = _with_spec(podman, spec, tmp_path / "relocated/nvidia.yaml")
    try:
        case.build(stage)
        if case.name in RUNC_WRITES_THROUGH:
            plain = podman.run(stage.rootfs, ["/bin/true"])
            assert plain.returncode == 0, plain.stderr
            stage.victim_digest = tree_digest(stage.victim)
        result = podman.run(stage.rootfs, ["/usr/local/bin/cudacheck", "/dev/nvidia0", "/dev/nvidiactl"], devices=[SECOND])
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
        stage.assert_host_untouched()
        if case.expect == WORKS:
            assert result.returncode == 0, result.stderr[-600:]
            assert CUDA_OK in result.stdout and "open /dev/nvidia0 ENXIO" in result.stdout, result.stdout
    finally:
        podman.specs = before
        stage.close()


def test_an_images_own_old_libcuda_gives_way_to_the_drivers(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    """An image that ships an old libcuda.so.1 as a file where the spec links the driver's: the file is
    replaced by the link (as NVIDIA's create-symlinks does), said in the log, and the driver's libcuda loads."""
    podman, host = engine
    rootfs = make_rootfs(tmp_path / "rootfs")
    add_stale_libcuda(rootfs, "535.104.05", 12020, host.lib_dir)
    before = host.log.read_text() if host.log.exists() else ""
    result = podman.run(rootfs, ["/usr/local/bin/cudacheck", "/dev/nvidia1"], devices=[FIRST])
    assert result.returncode == 0, result.stderr
    assert CUDA_OK in result.stdout, result.stdout  # 12040: the running driver's, not the image's 12020
    assert f"the image's own {host.lib_dir}/libcuda.so.1 was replaced by the link" in host.log.read_text()[len(before):]


def _with_a_newer_toolkits_hook(podman: CdiPodman, host: FakeHost, tmp_path: Path, config: str) -> str:
    """The captured spec with a hook 1.20.0 does not know between its others (as a newer toolkit writes one),
    every hook run with ``config`` appended to the host's config; podman's old spec list."""
    spec = yaml.safe_load(podman.spec.read_text())
    hooks = spec["containerEdits"]["hooks"]
    newer = copy.deepcopy(hooks[-1])
    newer["args"] = [*newer["args"][:-1], "frobnicate-devices", "--folder", host.lib_dir]
    hooks.insert(2, newer)
    (tmp_path / "config.toml").write_text(host.config_text() + config)
    for entry in hooks:
        entry["env"] = [e if not e.startswith("PONYTAIL_CONFIG=") else f"PONYTAIL_CONFIG={tmp_path}/config.toml" for e in entry["env"]]
    return _with_spec(podman, spec, tmp_path / "newer/nvidia.yaml")


def test_a_hook_of_a_newer_toolkit_is_skipped_with_a_warning(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    """As NVIDIA's own binary: "Unsupported CDI hook", exit 0, the container starts with the others' work done."""
    podman, host = engine
    before = _with_a_newer_toolkits_hook(podman, host, tmp_path, "")
    log_before = host.log.read_text() if host.log.exists() else ""
    try:
        result = podman.run(make_rootfs(tmp_path / "rootfs"), ["/usr/local/bin/cudacheck", "/dev/nvidia1"], devices=[FIRST])
    finally:
        podman.specs = before
    assert result.returncode == 0, result.stderr
    assert CUDA_OK in result.stdout, result.stdout
    log = host.log.read_text()[len(log_before):]
    assert "unsupported CDI hook: frobnicate-devices" in log and log.count("5 NVIDIA hook(s)") == 1, log[-3000:]


def test_a_hook_of_a_newer_toolkit_stops_the_start_where_the_config_says_fail(engine: tuple[CdiPodman, FakeHost], tmp_path: Path) -> None:
    podman, host = engine
    before = _with_a_newer_toolkits_hook(podman, host, tmp_path, '[cdi]\nunknown_nvidia_hooks = "fail"\n')
    try:
        result = podman.run(make_rootfs(tmp_path / "rootfs"), ["true"], devices=[FIRST])
    finally:
        podman.specs = before
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if "frobnicate-devices" in line]
    assert said and 'unknown_nvidia_hooks = "fail"' in said[0] and "Traceback" not in result.stderr, result.stderr
