"""NVIDIA's real user-mode drivers, as Debian 12 packages them (non-free), for the real-driver
tier (tests/realdriver, make test-real-driver): Debian roots built by scripts/debian-root.sh
(cached outside the checkout, keyed by the package list), and fake hosts whose /proc, /sys and
/dev are made as fakehost.FakeHost makes them, around such a root as the driver root.

Nothing here names a driver's version: it is read from what got installed (the library's file
name, the package's version, the CUDA versions Debian's libcuda package provides)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.commands import REPO
from support.fakehost import LIB_DIR, FakeGpu, FakeHost, compile_program, gpus, make_rootfs

DEBIAN_ROOT = REPO / "scripts/debian-root.sh"
UNREACHABLE = 3  # debian-root.sh: Debian's archive cannot be reached

# name -> Debian packages (dependencies come with them): the current 535 driver's CUDA and NVML
# libraries and nvidia-smi; the 470 Tesla branch's; and every 535 library, ICD, Xorg and firmware
# package. libcudart11.0 is the CUDA 11.8 runtime, which the tests copy into an image.
ROOTS: dict[str, tuple[str, ...]] = {
    "driver-535": ("libcuda1", "libnvidia-ml1", "nvidia-smi", "libcudart11.0"),
    "driver-470": ("libnvidia-tesla-470-cuda1", "libnvidia-tesla-470-ml1", "nvidia-tesla-470-smi", "libcudart11.0"),
    "driver-535-wide": (
        "libcuda1", "libnvidia-ml1", "nvidia-smi", "libcudart11.0", "libcudadebugger1", "libnvcuvid1", "libnvidia-encode1",
        "libnvidia-opticalflow1", "libnvidia-allocator1", "libnvidia-api1", "libnvidia-cfg1", "libnvidia-eglcore",
        "libnvidia-glcore", "libnvidia-glvkspirv", "libnvidia-fbc1", "libnvidia-ngx1", "libnvidia-nvvm4",
        "libnvidia-ptxjitcompiler1", "libnvidia-rtcore", "libnvoptix1", "libglx-nvidia0", "libegl-nvidia0",
        "libgles-nvidia1", "libgles-nvidia2", "libgl1-nvidia-glvnd-glx", "nvidia-egl-icd", "nvidia-vulkan-icd",
        "nvidia-opencl-icd", "nvidia-vdpau-driver", "nvidia-cuda-mps", "nvidia-driver-libs", "xserver-xorg-video-nvidia",
        "firmware-nvidia-gsp",
    ),
}
TESLA = "Tesla T4"
GEFORCE = "NVIDIA GeForce RTX 3090"


@dataclass(frozen=True)
class DriverRoot:
    """A pristine Debian root with a real driver installed by apt (never written to)."""

    name: str
    path: Path
    packages: dict[str, str]  # name -> Debian version

    @functools.cached_property
    def libcuda(self) -> Path:
        """The real libcuda.so.<version>, found through Debian's alternatives link."""
        return _in_root(self.path, f"{LIB_DIR}/libcuda.so.1")

    @property
    def version(self) -> str:
        """The driver's version, from the file name of its libcuda (libcuda.so.535.309.01)."""
        return self.libcuda.name.removeprefix("libcuda.so.")

    @property
    def cuda_version(self) -> int:
        """What cuDriverGetVersion returns (12020 for CUDA 12.2): the newest libcuda-X.Y-1 that
        Debian's libcuda package provides."""
        provided = re.findall(r"libcuda-(\d+)\.(\d+)-1", _provides_libcuda(self.path))
        major, minor = max((int(a), int(b)) for a, b in provided)
        return major * 1000 + minor * 10

    def file(self, path: str) -> Path:
        """``path`` inside the root, its links resolved inside the root."""
        return _in_root(self.path, path)

    def real(self, path: str) -> str:
        """Where ``path`` leads inside the root, as a path of the root (Debian's alternatives
        followed): /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01."""
        return "/" + str(self.file(path).relative_to(self.path))


def snapshot(root: Path) -> str:
    """Names, types, modes, sizes and mtimes of everything in a root (without following links):
    a cached root must be the same after the tier as before it."""
    h = hashlib.sha256()
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + names):
            st = os.lstat(os.path.join(directory, name))
            h.update(f"{directory}/{name}:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _in_root(root: Path, path: str) -> Path:
    """Resolve ``path`` inside ``root`` (Debian's alternatives links are absolute)."""
    current = root
    parts = [p for p in path.split("/") if p]
    hops = 0
    while parts:
        part = parts.pop(0)
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            assert hops < 40, f"link loop at {candidate}"
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            current = root if target.startswith("/") else current
        else:
            current = candidate
    assert current.exists(), f"{path} is not in {root}"
    return current


def _provides_libcuda(root: Path) -> str:
    """The Provides line of the installed package that provides libcuda.so.1 (libcuda1,
    libnvidia-tesla-470-cuda1, ...)."""
    status = (root / "var/lib/dpkg/status").read_text()
    lines = [line for line in status.splitlines() if line.startswith("Provides:") and "libcuda.so.1 (=" in line]
    assert len(lines) == 1, lines
    return lines[0]


@functools.cache
def driver_root(name: str) -> DriverRoot:
    """The cached root ``name`` of ROOTS, built on first use (scripts/debian-root.sh); the test is
    skipped, saying why, where Debian's archive cannot be reached."""
    # the system's PATH: the script's python3 is Debian's, not the tests' stand-in (support.guard),
    # which made the script's reachability check fail and the whole tier skip on a machine without the roots
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
    result = subprocess.run([str(DEBIAN_ROOT), name, *ROOTS[name]], capture_output=True, text=True, timeout=1800, env=env)
    if result.returncode == UNREACHABLE:
        reason = f"the real-driver roots need Debian's archive, which cannot be reached: {result.stderr.strip()}"
        if os.environ.get("CI") == "true":  # CI reaches the archive: a skip there would hide the whole tier
            pytest.fail(reason)
        pytest.skip(reason)
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    packages = dict(line.split(" ", 1) for line in (path / ".ponytail-root-packages").read_text().splitlines() if line)
    return DriverRoot(name, path, packages)


@dataclass
class RealDriverHost(FakeHost):
    """A fake host (its /proc, /sys, /dev made by FakeHost) whose driver root is a real Debian
    driver root. ``driver_version`` is what the kernel module says: the root's own version,
    or another one for a node upgraded but not rebooted."""

    root: Path = field(default_factory=Path)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.driver = self.root

    def _install_driver_files(self) -> None:
        """The driver's files are the real root's, as apt installed them."""


def real_host(base: Path, root: DriverRoot, gpu_list: list[FakeGpu] | None = None, kernel_version: str = "") -> RealDriverHost:
    return RealDriverHost(base, driver_version=kernel_version or root.version, gpu_list=gpu_list or gpus(2), root=root.path, stale_versions=())


def mixed_gpus() -> list[FakeGpu]:
    """A Tesla and a GeForce card."""
    first, second = gpus(2)
    return [FakeGpu(first.bus_id, first.minor, first.uuid, TESLA), FakeGpu(second.bus_id, second.minor, second.uuid, GEFORCE)]


def real_rootfs(path: Path, cudart: DriverRoot | None = None, without: tuple[str, ...] = ()) -> Path:
    """A busybox image with the host's loader and libc (libdl, libpthread, librt but those in
    ``without``) and realcuda; with ``cudart``, the CUDA 11.8 runtime of that root's libcudart11.0
    copied in, as a CUDA image ships it."""
    make_rootfs(path, programs=())
    shutil.copy(compile_program("realcuda.c"), path / "usr/local/bin/realcuda")
    libdir = path / LIB_DIR.lstrip("/")
    for name in without:
        (libdir / name).unlink()
    if cudart is not None:
        real = cudart.file(f"{LIB_DIR}/libcudart.so.11.0")
        shutil.copy(real, libdir / real.name)
        (libdir / "libcudart.so.11.0").symlink_to(real.name)
    return path
