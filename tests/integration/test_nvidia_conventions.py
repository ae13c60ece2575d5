"""Images built for NVIDIA's toolkit work unchanged: NVIDIA_VISIBLE_DEVICES,
NVIDIA_DRIVER_CAPABILITIES, NVIDIA_REQUIRE_*, MIG, and what lands in the rootfs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.commands import PONYTAIL, shell
from support.fakehost import LIB_DIR, FakeHost, compile_library, gpus, make_rootfs
from support.harness import bundle_for, in_private_mount_ns, run_ponytail, state_for

PY = shell(PONYTAIL)
V = "550.54.15"


@pytest.fixture(scope="module")
def full_host(tmp_path_factory) -> FakeHost:
    """3 GPUs (minors out of PCI order), MIG on the GPU with minor 0, every capability's files,
    a 32-bit libcuda, daemons' sockets, GSP firmware."""
    return FakeHost(
        tmp_path_factory.mktemp("full") / "host",
        gpu_list=gpus(3, minors=[2, 0, 1]),
        extra_libraries=True,
        compat32=True,
        mig={0: [(1, 0), (2, 0), (2, 1)]},
        daemons=True,
    )


def listed(host: FakeHost, *args: str) -> list[str]:
    result = run_ponytail(["list", "-config", str(host.write_config()), *args])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().splitlines()


def names(paths: list[str]) -> set[str]:
    return {Path(p).name for p in paths}


def test_default_capabilities_are_utility_and_compute(full_host: FakeHost) -> None:
    got = names(listed(full_host))
    assert {f"libcuda.so.{V}", f"libnvidia-ml.so.{V}", f"libnvidia-ptxjitcompiler.so.{V}", f"libnvidia-cfg.so.{V}"} <= got
    assert {"nvidia-smi", "nvidia-cuda-mps-control", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"} <= got
    assert {"socket", "nvidia-mps", "gsp_ga10x.bin"} <= got
    assert f"libGLX_nvidia.so.{V}" not in got and f"libnvcuvid.so.{V}" not in got and "nvidia-modeset" not in got


@pytest.mark.parametrize(
    "capabilities, present, absent",
    [
        ("utility", {f"libnvidia-ml.so.{V}", "nvidia-smi"}, {f"libcuda.so.{V}", "nvidia-uvm", "nvidia-cuda-mps-control"}),
        ("compute", {f"libcuda.so.{V}", "nvidia-uvm", "nvidia-cuda-mps-control"}, {f"libnvidia-ml.so.{V}", "nvidia-smi"}),
        ("video", {f"libnvcuvid.so.{V}", f"libnvidia-encode.so.{V}", f"libcuda.so.{V}"}, {f"libnvidia-ml.so.{V}"}),
        ("graphics", {f"libGLX_nvidia.so.{V}", f"libEGL_nvidia.so.{V}", f"libnvidia-glcore.so.{V}", "10_nvidia.json", "nvidia_icd.json"}, {f"libcuda.so.{V}"}),
        ("display", {"nvidia-modeset"}, {f"libcuda.so.{V}"}),
        ("ngx", {f"libnvidia-ngx.so.{V}"}, {f"libcuda.so.{V}"}),
        ("all", {f"libcuda.so.{V}", f"libGLX_nvidia.so.{V}", "nvidia-modeset", f"libnvidia-ngx.so.{V}"}, set()),
    ],
)
def test_each_capability_brings_its_own_files(full_host: FakeHost, capabilities: str, present: set, absent: set) -> None:
    got = names(listed(full_host, "--capabilities", capabilities))
    assert present <= got, present - got
    assert not (absent & got), absent & got


def test_compat32_brings_32bit_copies_and_stale_firmware_stays(full_host: FakeHost) -> None:
    paths = listed(full_host, "--capabilities", "compute,compat32")
    assert str(full_host.driver / f"usr/lib/i386-linux-gnu/libcuda.so.{V}") in paths
    assert str(full_host.driver / f"usr/lib/x86_64-linux-gnu/libcuda.so.{V}") in paths
    assert not any("535.104.05" in p for p in paths)
    assert str(full_host.driver / f"lib/firmware/nvidia/{V}/gsp_ga10x.bin") in paths


def test_config_extends_a_capability(full_host: FakeHost, tmp_path: Path) -> None:
    libdir = full_host.driver / LIB_DIR.lstrip("/")
    shutil.copy(compile_library("fake_plain.c", "libnvidia-extra.so.1", f"libnvidia-extra.so.{V}", V), libdir / f"libnvidia-extra.so.{V}")
    config = tmp_path / "c.toml"
    config.write_text(full_host.config_text() + '[capabilities.compute]\nlibraries = ["libnvidia-extra"]\nbinaries = ["nvidia-debugdump"]\n')
    result = run_ponytail(["list", "-config", str(config), "--capabilities", "compute"])
    assert result.returncode == 0, result.stderr
    got = names(result.stdout.decode().splitlines())
    assert {f"libnvidia-extra.so.{V}", "nvidia-debugdump"} <= got


def test_injection_by_capability_lands_in_the_rootfs(full_host: FakeHost, rootfs: Path) -> None:
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)
    result = in_private_mount_ns(
        f"""
        {PY} -config {full_host.write_config()} -root {rootfs} -device 1 -capabilities graphics,utility
        cd {rootfs}
        ls usr/lib/x86_64-linux-gnu usr/share/vulkan/icd.d usr/bin dev run/nvidia-persistenced
        echo "--- params"; cat proc/driver/nvidia/params
        echo "--- gpus"; ls proc/driver/nvidia/gpus
        echo "--- information"; cat proc/driver/nvidia/gpus/*/information
        chroot {rootfs} /usr/bin/nvidia-smi
        """
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"libGLX_nvidia.so.{V}" in out and "libGLX_nvidia.so.0" in out and "nvidia_icd.json" in out
    assert f"libcuda.so.{V}" not in out and "nvidia-uvm" not in out
    assert "socket" in out  # the persistenced socket (utility)
    assert "ModifyDeviceFiles: 0" in out and "ModifyDeviceFiles: 1" not in out
    assert out.split("--- gpus")[1].split()[0] == "0000:28:00.0"  # only GPU index 1 is visible
    assert "Device Minor: \t 0" in out.split("--- information")[1]  # the host's own file, copied
    assert "Driver Version: 550.54.15" in out and "GPU node /dev/nvidia0" in out


def test_mig_devices_by_index_and_by_uuid(full_host: FakeHost, rootfs: Path) -> None:
    gi_minor, ci_minor = FakeHost.mig_minors(0, 2, 1)
    uuid = FakeHost.mig_uuid(0, 1, 0)
    uuid_gi, uuid_ci = FakeHost.mig_minors(0, 1, 0)
    # GPU index 1 is the one with minor 0, which has MIG enabled
    result = in_private_mount_ns(
        f"""
        {PY} -config {full_host.write_config()} -root {rootfs} -device 1:2:1,{uuid}
        ls {rootfs}/dev {rootfs}/dev/nvidia-caps
        """
    )
    assert result.returncode == 0, result.stderr
    listing = result.stdout.split()
    assert "nvidia0" in listing and "nvidia1" not in listing and "nvidia2" not in listing
    for minor in (gi_minor, ci_minor, uuid_gi, uuid_ci):
        assert f"nvidia-cap{minor}" in listing
    assert "nvidia-cap1" not in listing  # MIG config access is for privileged containers only


def test_unknown_mig_device_names_what_exists(full_host: FakeHost) -> None:
    result = run_ponytail(["-config", str(full_host.write_config()), "-device", "1:7:0", "-debug"])
    assert result.returncode == 2
    assert "unknown MIG device '1:7:0'" in result.stderr.decode() and "1:1:0, 1:2:0, 1:2:1" in result.stderr.decode()
    result = run_ponytail(["-config", str(full_host.write_config()), "-device", "MIG-nope", "-debug"])
    assert result.returncode == 2
    assert "unknown MIG device 'MIG-nope'" in result.stderr.decode()


def test_info_shows_cuda_version_and_mig(full_host: FakeHost) -> None:
    result = run_ponytail(["info", "--json", "-config", str(full_host.write_config())])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cuda_version"] == "12.4"
    mig_gpu = data["gpus"][1]
    assert mig_gpu["minor"] == 0 and mig_gpu["mig_enabled"] is True
    assert [m["name"] for m in mig_gpu["mig_devices"]] == ["1:1:0", "1:2:0", "1:2:1"]
    assert data["gpus"][0]["mig_enabled"] is False


def hook_env(tmp_path: Path, host: FakeHost, env: list[str], privileged: bool = False, rootfs: Path | None = None):
    rootfs = rootfs or make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=env)
    if privileged:
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN", "CAP_CHOWN"]}
        (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@pytest.mark.parametrize(
    "env, ok",
    [
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"], True),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470,driver<471"], False),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=nvidia,driver>=550,driver<551"], True),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.6", "NVIDIA_DISABLE_REQUIRE=true"], True),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_ARCH=arch>=9.0"], True),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_DRIVER=driver<550"], False),
        (["CUDA_VERSION=12.6.1"], False),
        (["CUDA_VERSION=12.2.0"], True),
    ],
)
def test_requirements(full_host: FakeHost, tmp_path: Path, sleeper, env: list[str], ok: bool) -> None:
    bundle = hook_env(tmp_path, full_host, env)
    result = run_ponytail(["-config", str(full_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    err = result.stderr.decode()
    if ok:
        assert result.returncode == 0, err
    else:
        assert result.returncode == 1, err
        assert "this host does not meet" in err and "driver 550.54.15" in err and len(err.strip().splitlines()) == 1
        assert "CUDA 12.4" in err or "driver<550" in err


def test_unmet_cuda_requirement_names_constraint_and_value(full_host: FakeHost, tmp_path: Path, sleeper) -> None:
    bundle = hook_env(tmp_path, full_host, ["NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470,driver<471"])
    result = run_ponytail(["-config", str(full_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    err = result.stderr.decode()
    assert "unmet cuda>=12.6 or brand=tesla" in err and "CUDA 12.4" in err
    assert "NVIDIA_DISABLE_REQUIRE=true" in err
    assert "this host does not meet" in full_host.log.read_text()


def test_malformed_requirement_is_bad_input(full_host: FakeHost, tmp_path: Path, sleeper) -> None:
    bundle = hook_env(tmp_path, full_host, ["NVIDIA_REQUIRE_CUDA=cuda~12"])
    result = run_ponytail(["-config", str(full_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 2
    assert "cannot parse constraint 'cuda~12'" in result.stderr.decode()


@pytest.mark.parametrize("privileged", [True, False])
def test_mig_config_devices_only_for_privileged_containers(full_host: FakeHost, tmp_path: Path, sleeper, privileged: bool) -> None:
    bundle = hook_env(tmp_path, full_host, ["NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_MIG_CONFIG_DEVICES=all"], privileged)
    result = run_ponytail(["-config", str(full_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    rootfs = bundle.parent / "bundle" / "rootfs"
    if privileged:
        assert result.returncode == 0, result.stderr
        nodes = sleeper.run(["ls", str(rootfs / "dev"), str(rootfs / "dev/nvidia-caps")]).stdout.split()
        assert "nvidia-cap1" in nodes and {"nvidia0", "nvidia1", "nvidia2"} <= set(nodes)
    else:
        assert result.returncode == 2
        assert "only honoured for privileged containers" in result.stderr.decode()


def test_none_gives_driver_files_but_no_gpu(full_host: FakeHost, tmp_path: Path, sleeper) -> None:
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    bundle = bundle_for(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=none"])
    result = run_ponytail(["-config", str(full_host.write_config())], stdin=state_for(bundle, sleeper.pid))
    assert result.returncode == 0, result.stderr
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck", "/dev/nvidiactl", "/dev/nvidia0"])
    assert "cuDriverGetVersion 12040" in inside.stdout
    assert "open /dev/nvidiactl ENXIO" in inside.stdout and "open /dev/nvidia0 ENOENT" in inside.stdout


def shadow_rootfs(tmp_path: Path, where: str) -> Path:
    """An image that bakes in its own (older) libcuda.so.1, as some CUDA images do."""
    rootfs = make_rootfs(tmp_path / "bundle" / "rootfs")
    stale = compile_library("fake_libcuda.c", "libcuda.so.1", "libcuda.so.520.61.05", "520.61.05", cuda_version=11080)
    if where == "same-dir-file":
        shutil.copy(stale, rootfs / LIB_DIR.lstrip("/") / "libcuda.so.1")
    elif where == "same-dir-newer-link":
        shutil.copy(stale, rootfs / LIB_DIR.lstrip("/") / "libcuda.so.999.0.0")
        (rootfs / LIB_DIR.lstrip("/") / "libcuda.so.1").symlink_to("libcuda.so.999.0.0")
    else:  # a compat directory listed first in the image's own linker config
        (rootfs / "usr/local/cuda/compat").mkdir(parents=True)
        shutil.copy(stale, rootfs / "usr/local/cuda/compat/libcuda.so.1")
        (rootfs / "etc/ld.so.conf").write_text("/usr/local/cuda/compat\ninclude /etc/ld.so.conf.d/*.conf\n")
    return rootfs


@pytest.mark.parametrize("where", ["same-dir-file", "same-dir-newer-link", "other-dir-first"])
def test_driver_libraries_baked_into_the_image_do_not_shadow_the_host(full_host: FakeHost, tmp_path: Path, sleeper, where: str) -> None:
    rootfs = shadow_rootfs(tmp_path, where)
    bundle = bundle_for(tmp_path, rootfs)
    config = full_host.write_config()
    result = run_ponytail(["-config", str(config)], stdin=state_for(bundle, sleeper.pid, container_id=f"shadow-{where}"))
    assert result.returncode == 0, result.stderr
    inside = sleeper.run(["chroot", str(rootfs), "/usr/local/bin/cudacheck"])
    assert "cuDriverGetVersion 12040" in inside.stdout, inside.stdout  # the host's, not the image's 11080
    log = [line for line in full_host.log.read_text().splitlines() if f"shadow-{where}" in line and "warning" in line]
    assert any("libcuda.so.1" in line and ("image ships its own" in line or "image's link" in line) for line in log), log


def test_masked_proc_shows_a_mig_container_its_own_access_files(full_host: FakeHost, rootfs: Path) -> None:
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)
    gi_minor, ci_minor = FakeHost.mig_minors(0, 2, 1)
    result = in_private_mount_ns(
        f"""
        {PY} -config {full_host.write_config()} -root {rootfs} -device 1:2:1
        cd {rootfs}/proc/driver/nvidia
        find capabilities -type f | sort
        cat capabilities/gpu0/mig/gi2/access capabilities/gpu0/mig/gi2/ci1/access
        """
    )
    assert result.returncode == 0, result.stderr
    files = [line for line in result.stdout.splitlines() if line.startswith("capabilities/")]
    assert files == ["capabilities/gpu0/mig/gi2/access", "capabilities/gpu0/mig/gi2/ci1/access"]
    assert f"DeviceFileMinor: {gi_minor}" in result.stdout and f"DeviceFileMinor: {ci_minor}" in result.stdout


def test_a_library_baked_into_the_image_is_mounted_over_in_manual_mode_too(full_host: FakeHost, tmp_path: Path) -> None:
    # manual mode never leaves this mount namespace: the library is cloned where the run is
    rootfs = shadow_rootfs(tmp_path, "same-dir-file")
    result = in_private_mount_ns(
        f"""
        {PY} -config {full_host.write_config()} -root {rootfs}
        chroot {rootfs} /usr/local/bin/cudacheck
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cuDriverGetVersion 12040" in result.stdout, result.stdout  # the host's, not the image's 11080
    assert any("image ships its own" in line for line in full_host.log.read_text().splitlines()), full_host.log.read_text()
