"""Fake NVIDIA hosts for tests: /proc and /sys trees, real character nodes made with
mknod, a driver root with real ELF libraries built by gcc (with their SONAMEs), an
ld.so.cache built by the host's ldconfig, and small rootfs images built from
busybox-static and the host's loader and libc.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

C_DIR = Path(__file__).parent / "c"
BUILD_DIR = Path(tempfile.mkdtemp(prefix="ponytail-test-build-"))
NVIDIA_MAJOR = 195
UVM_MAJOR = 511
CAPS_MAJOR = 239
LIB_DIR = "/usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class FakeGpu:
    bus_id: str  # as sysfs names it: 0000:3b:00.0
    minor: int
    uuid: str
    model: str = "NVIDIA H100 80GB HBM3"
    proc_bus_id: str | None = None  # how /proc/driver/nvidia/gpus names it (e.g. 32-bit domain)


def gpus(count: int, minors: list[int] | None = None) -> list[FakeGpu]:
    minors = minors if minors is not None else list(range(count))
    return [
        FakeGpu(f"0000:{0x18 + 0x10 * i:02x}:00.0", minors[i], f"GPU-{i:08x}-1111-2222-3333-{minors[i]:012x}")
        for i in range(count)
    ]


@dataclass(frozen=True)
class PciExtra:
    bus_id: str
    vendor: int
    pci_class: int


NON_GPU_FUNCTIONS = (
    PciExtra("0000:18:00.1", 0x10DE, 0x040300),  # HD audio of a GPU
    PciExtra("0000:05:00.0", 0x10DE, 0x068000),  # NVSwitch
    PciExtra("0000:06:00.0", 0x1002, 0x030000),  # another vendor's VGA card
)


@functools.lru_cache(maxsize=None)
def compile_library(source: str, soname: str, filename: str, driver_version: str, cuda_version: int = 12040, m32: bool = False) -> Path:
    out = BUILD_DIR / ("m32" if m32 else "m64") / f"{cuda_version}" / filename
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", f'-DDRIVER_VERSION="{driver_version}"',
        f"-DCUDA_VERSION_INT={cuda_version}", "-o", str(out), str(C_DIR / source),
    ]
    if m32:
        cmd.insert(1, "-m32")
    subprocess.run(cmd, check=True)
    return out


@functools.lru_cache(maxsize=None)
def compile_program(source: str) -> Path:
    out = BUILD_DIR / "bin" / Path(source).stem
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O1", "-o", str(out), str(C_DIR / source), "-ldl"], check=True)
    return out


@dataclass
class FakeHost:
    """A fake host under ``base``: ``proc``, ``sys``, ``dev`` and ``driver`` (the driver root)."""

    base: Path
    driver_version: str = "550.54.15"
    gpu_list: list[FakeGpu] = field(default_factory=lambda: gpus(2))
    lib_dir: str = LIB_DIR
    stale_versions: tuple[str, ...] = ("535.104.05",)
    with_uvm: bool = True
    with_smi: bool = True
    open_module: bool = False
    cuda_version: int = 12040

    def __post_init__(self) -> None:
        self.proc = self.base / "proc"
        self.sys = self.base / "sys"
        self.dev = self.base / "dev"
        self.driver = self.base / "driver"
        self.log = self.base / "ponytail.log"
        self._build()

    # -- building -------------------------------------------------------
    def _build(self) -> None:
        for d in (self.proc, self.sys, self.dev, self.driver):
            d.mkdir(parents=True, exist_ok=True)
        self._write_proc()
        self._write_sys()
        self._make_nodes()
        self._install_driver_files()

    def _write_proc(self) -> None:
        nv = self.proc / "driver/nvidia"
        nv.mkdir(parents=True, exist_ok=True)
        if self.open_module:
            line = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {self.driver_version}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct  5 21:15:33 UTC 2023"
        else:
            line = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.driver_version}  Tue Mar  5 22:23:56 UTC 2024"
        (nv / "version").write_text(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        for gpu in self.gpu_list:
            d = nv / "gpus" / (gpu.proc_bus_id or gpu.bus_id)
            d.mkdir(parents=True, exist_ok=True)
            (d / "information").write_text(
                f"Model: \t\t {gpu.model}\nIRQ:   \t\t 16\nGPU UUID: \t {gpu.uuid}\n"
                f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {gpu.bus_id}\n"
                f"Device Minor: \t {gpu.minor}\nGPU Excluded:\t No\n"
            )
        devices = "Character devices:\n  1 mem\n  4 /dev/vc/0\n 10 misc\n"
        devices += f"{NVIDIA_MAJOR} nvidia-frontend\n"
        if self.with_uvm:
            devices += f"{UVM_MAJOR} nvidia-uvm\n"
        devices += f"{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  7 loop\n{NVIDIA_MAJOR + 1} fakeblock\n"
        (self.proc / "devices").write_text(devices)

    def _write_sys(self) -> None:
        functions = [PciExtra(g.bus_id, 0x10DE, 0x030200) for g in self.gpu_list] + list(NON_GPU_FUNCTIONS)
        for f in functions:
            d = self.sys / "bus/pci/devices" / f.bus_id
            d.mkdir(parents=True, exist_ok=True)
            (d / "vendor").write_text(f"0x{f.vendor:04x}\n")
            (d / "class").write_text(f"0x{f.pci_class:06x}\n")

    def _make_nodes(self) -> None:
        nodes = {f"nvidia{g.minor}": (NVIDIA_MAJOR, g.minor) for g in self.gpu_list}
        nodes["nvidiactl"] = (NVIDIA_MAJOR, 255)
        if self.with_uvm:
            nodes["nvidia-uvm"] = (UVM_MAJOR, 0)
            nodes["nvidia-uvm-tools"] = (UVM_MAJOR, 1)
        for name, (major, minor) in nodes.items():
            path = self.dev / name
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))

    def _install_driver_files(self) -> None:
        libdir = self.driver / self.lib_dir.lstrip("/")
        libdir.mkdir(parents=True, exist_ok=True)
        for version in (self.driver_version, *self.stale_versions):
            for source, stem in (("fake_libcuda.c", "libcuda"), ("fake_libnvidia_ml.c", "libnvidia-ml")):
                built = compile_library(source, f"{stem}.so.1", f"{stem}.so.{version}", version, self.cuda_version)
                shutil.copy(built, libdir / f"{stem}.so.{version}")
        for stem in ("libcuda", "libnvidia-ml"):
            _symlink(f"{stem}.so.{self.driver_version}", libdir / f"{stem}.so.1")
        _symlink("libcuda.so.1", libdir / "libcuda.so")
        if self.with_smi:
            bindir = self.driver / "usr/bin"
            bindir.mkdir(parents=True, exist_ok=True)
            shutil.copy(compile_program("fake_nvidia_smi.c"), bindir / "nvidia-smi")
        etc = self.driver / "etc"
        (etc / "ld.so.conf.d").mkdir(parents=True, exist_ok=True)
        (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (etc / "ld.so.conf.d/nvidia.conf").write_text(self.lib_dir + "\n")
        subprocess.run(["ldconfig", "-r", str(self.driver)], check=True)

    # -- using -----------------------------------------------------------
    def config_text(self, **extra: str) -> str:
        text = (
            f'[host]\ndriver_root = "{self.driver}"\nproc_root = "{self.proc}"\n'
            f'sys_root = "{self.sys}"\ndev_root = "{self.dev}"\n'
            f'[log]\nfile = "{self.log}"\n'
        )
        for key, value in extra.items():
            text += f"{key} = {value}\n"
        return text

    def write_config(self, name: str = "config.toml", library_paths: list[str] | None = None) -> Path:
        path = self.base / name
        text = self.config_text()
        if library_paths is not None:
            text += "[library]\npaths = [" + ", ".join(f'"{p}"' for p in library_paths) + "]\n"
        path.write_text(text)
        return path


def _symlink(target: str, link: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def make_rootfs(path: Path, programs: tuple[str, ...] = ("cudacheck.c",)) -> Path:
    """A small image: busybox-static (relative symlinks), the host's loader and libc,
    /etc/ld.so.conf, and the given test programs in /usr/local/bin."""
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "lib64", "usr/bin", "usr/local/bin", LIB_DIR.lstrip("/")):
        (path / d).mkdir(parents=True, exist_ok=True)
    shutil.copy("/bin/busybox", path / "bin/busybox")
    for applet in ("sh", "ls", "cat", "echo", "test", "readlink", "true", "grep", "stat"):
        _symlink("busybox", path / "bin" / applet)
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve()
    shutil.copy(loader, path / "lib64/ld-linux-x86-64.so.2")
    for lib in ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"):
        if Path(f"{LIB_DIR}/{lib}").exists():  # a real nvidia-smi links these too
            shutil.copy(Path(f"{LIB_DIR}/{lib}").resolve(), path / LIB_DIR.lstrip("/") / lib)
    (path / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    for source in programs:
        shutil.copy(compile_program(source), path / "usr/local/bin" / Path(source).stem)
    return path
