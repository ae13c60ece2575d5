"""ponytail's commands against NVIDIA's real user-mode drivers (Debian 12's packages, in roots
built by scripts/debian-root.sh), with fake /proc, /sys and /dev around them: info, -debug,
check and manual mode; in the rootfs the real libcuda answers cuDriverGetVersion with the
driver's CUDA version, the real CUDA 11.8 runtime sees it, and the real nvidia-smi finds its
libnvidia-ml (and, without a kernel module, exits 9 with NVIDIA's words)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.commands import PONYTAIL
from support.fakehost import LIB_DIR
from support.harness import in_private_mount_ns, run_ponytail
from support.realdriver import DriverRoot, RealDriverHost, real_host, real_rootfs

NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
GLIBC_PARTS = ("libdl.so.2", "libpthread.so.0", "librt.so.1")


def ponytail(host: RealDriverHost, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PONYTAIL, "-config", str(host.write_config()), *args], capture_output=True, text=True, timeout=120)


def cuda_text(root: DriverRoot) -> str:
    return f"{root.cuda_version // 1000}.{root.cuda_version % 1000 // 10}"


def test_info_reads_the_real_driver_and_its_cuda_version(either: tuple[DriverRoot, RealDriverHost]) -> None:
    root, host = either
    result = ponytail(host, "info")
    assert result.returncode == 0, result.stderr
    assert f"driver version: {root.version}\ncuda version: {cuda_text(root)}\ngpus: 2\n" in result.stdout


def test_debug_finds_the_driver_through_debians_alternatives(either: tuple[DriverRoot, RealDriverHost], image: Path) -> None:
    root, host = either
    result = ponytail(host, "-debug", "-device", "0", "-root", str(image))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    libcuda = root.real(f"{LIB_DIR}/libcuda.so.1")
    assert f"mount {root.path}{libcuda} -> {libcuda}  (library, compute;" in out, out
    smi = root.real("/usr/bin/nvidia-smi")
    assert f"mount {root.path}{smi} -> /usr/bin/nvidia-smi  (binary, utility, in /usr/bin;" in out
    assert "warning:" not in out and out.rstrip().endswith("change(s)")


def test_check_says_the_host_and_the_image_are_ready(either: tuple[DriverRoot, RealDriverHost], image: Path) -> None:
    root, host = either
    out = ponytail(host, "check", "--rootfs", str(image)).stdout
    assert f"ok       host      driver: NVIDIA kernel module {root.version} loaded" in out
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert f"ok       host      {soname}: {root.file(f'{LIB_DIR}/{soname}')} matches the kernel module {root.version}" in out, out
        assert f", injected by ponytail (version {root.version})" in out
    assert "problem  container" not in out, out


def test_manual_mode_real_libcuda_cudart_and_nvidia_smi(either: tuple[DriverRoot, RealDriverHost], tmp_path: Path) -> None:
    root, host = either
    image = real_rootfs(tmp_path / "rootfs", cudart=root)
    result = in_private_mount_ns(
        f"""
        {' '.join(PONYTAIL)} -config {host.write_config()} -device 0 -root {image}
        chroot {image} /usr/local/bin/realcuda cudart
        chroot {image} /usr/bin/nvidia-smi || echo nvidia-smi=$?
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"cuDriverGetVersion {root.cuda_version}" in lines and "cuInit 100" in lines, result.stdout  # 100: no device
    # the CUDA 11.8 runtime sees the driver's version; 100 (no device), not 35 (driver too old): CUDA 11's
    # minor-version compatibility lets it run on 470 (CUDA 11.4)
    assert f"cudaDriverGetVersion {root.cuda_version} status 0" in lines and "cudaGetDeviceCount status 100" in lines, result.stdout
    assert NO_DRIVER in result.stdout and "nvidia-smi=9" in lines, result.stdout + result.stderr


def test_an_image_without_glibcs_split_out_libraries_is_named(host535: RealDriverHost, tmp_path: Path) -> None:
    image = real_rootfs(tmp_path / "rootfs", without=GLIBC_PARTS)
    lacks = "needs libdl.so.2, libpthread.so.0, librt.so.1, which the image lacks: it will fail to load in the container"
    debug = ponytail(host535, "-debug", "-root", str(image)).stdout
    assert f"warning: the injected libcuda.so.1 {lacks}" in debug, debug
    assert "warning: the injected /usr/bin/nvidia-smi needs" in debug
    check = ponytail(host535, "check", "--rootfs", str(image))
    assert f"problem  container libcuda.so.1: the injected libcuda.so.1 {lacks}" in check.stdout and check.returncode == 1, check.stdout
    started = in_private_mount_ns(f"{' '.join(PONYTAIL)} -config {host535.write_config()} -root {image}; chroot {image} /usr/local/bin/realcuda || true")
    assert started.returncode == 0 and f"ponytail: warning: the injected libcuda.so.1 {lacks}" in started.stderr, started.stderr
    assert "libdl.so.2: cannot open shared object file" in started.stdout  # what the warning foretold
    assert f"the injected libcuda.so.1 {lacks}" in host535.log.read_text()


def test_all_capabilities_summarise_the_other_architectures_skips(wide_host: RealDriverHost, image: Path) -> None:
    out = ponytail(wide_host, "-debug", "-capabilities", "all", "-root", str(image)).stdout
    skips = [line for line in out.splitlines() if "built for another architecture" in line]
    assert len(skips) == 1 and skips[0].startswith("  skip ") and "files built for another architecture" in skips[0], skips
    count = int(skips[0].split()[1])
    assert count > 20 and "/usr/lib/x86_64-linux-gnu/nvidia/current (" in skips[0]  # 26 with Debian's 535.309.01 set


def test_an_upgrade_without_a_reboot_is_refused_naming_the_library(root535: DriverRoot, root470: DriverRoot, tmp_path: Path, image: Path) -> None:
    host = real_host(tmp_path / "host", root535, kernel_version=root470.version)  # 535 installed, 470 still loaded
    line = "{soname} under {root} is version {new} ({path}) but the kernel module is {old} (Driver/library version mismatch)"
    for caps, soname in (("compute,utility", "libcuda.so.1"), ("utility", "libnvidia-ml.so.1")):
        expected = line.format(
            soname=soname, root=root535.path, new=root535.version, old=root470.version,
            path=root535.real(f"{LIB_DIR}/{soname}"),
        )
        debug = ponytail(host, "-debug", "-capabilities", caps, "-root", str(image))
        assert debug.returncode == 1 and f"problem: {expected}" in debug.stdout, debug.stdout
        # the new nvidia-smi is the new driver's: not in the plan, skipped like the libraries beside it
        smi = root535.real("/usr/bin/nvidia-smi")
        assert f"skip {smi}: driver version {root535.version} (named in the program), but the running driver is {root470.version}" in debug.stdout
        assert "-> /usr/bin/nvidia-smi" not in debug.stdout
        start = run_ponytail(["-config", str(host.write_config()), "-capabilities", caps, "-root", str(image)])
        assert start.returncode == 1 and start.stderr.decode().strip() == f"ponytail: error: {expected}: reboot, or reload the module of the installed driver"
