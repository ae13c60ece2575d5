"""Fake NVIDIA hosts for tests: /proc and /sys trees, real character nodes made with
mknod, a driver root with real ELF libraries built by gcc (with their SONAMEs), an
ld.so.cache built by the host's ldconfig, and small rootfs images built from
busybox-static and the host's loader and libc.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

C_DIR = Path(__file__).parent.parent / "c"  # tests/c
BUILD_DIR = Path(tempfile.mkdtemp(prefix="ponytail-test-build-"))
atexit.register(shutil.rmtree, BUILD_DIR, ignore_errors=True)
# the fake NVML's tables: NVML is loaded by a child that runs as nobody, which must be able to read them
NVML_DIR = Path(tempfile.mkdtemp(prefix="ponytail-test-nvml-"))
NVML_DIR.chmod(0o755)
atexit.register(shutil.rmtree, NVML_DIR, ignore_errors=True)
NVIDIA_MAJOR = 195
UVM_MAJOR = 511
CAPS_MAJOR = 239
DRM_MAJOR = 226
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# the opt-in multi-node features' nodes (FakeHost(fabrics=...)): module name in /proc/devices,
# its major (none of them this machine's), and the nodes (name under /dev, minor)
FABRICS: dict[str, tuple[str, int, tuple[tuple[str, int], ...]]] = {
    "imex": ("nvidia-caps-imex-channels", 237, tuple((f"nvidia-caps-imex-channels/channel{n}", n) for n in (0, 1, 2))),
    "gds": ("nvidia-fs", 241, tuple((f"nvidia-fs{n}", n) for n in range(4))),
    "mofed": ("infiniband_verbs", 231, (("infiniband/uverbs0", 192), ("infiniband/uverbs1", 193))),
    "rdma_cm": ("misc", 10, (("infiniband/rdma_cm", 58),)),  # with mofed
    "gdrcopy": ("gdrdrv", 242, (("gdrdrv", 0),)),
    "nvswitch": ("nvidia-nvswitch", 240, (("nvidia-nvswitchctl", 255), ("nvidia-nvswitch0", 0), ("nvidia-nvswitch1", 1))),
}


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


@functools.cache
def compile_library(
    source: str, soname: str, filename: str, driver_version: str, cuda_version: int = 12040, m32: bool = False, nvml_table: str = "",
    defines: tuple[str, ...] = (),
) -> Path:
    variant = f"{'m32' if m32 else 'm64'}-{cuda_version}-{abs(hash(nvml_table)):x}-{'-'.join(defines)}"
    out = BUILD_DIR / variant / soname / filename
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", f'-DDRIVER_VERSION="{driver_version}"',
        f"-DCUDA_VERSION_INT={cuda_version}", "-o", str(out), str(C_DIR / source),
    ]
    if nvml_table:
        cmd.insert(-3, f'-DNVML_TABLE="{nvml_table}"')
    cmd[-3:-3] = [f"-D{d}" for d in defines]
    if m32:  # no 32-bit libc here: a bare shared object with the right SONAME
        cmd[1:1] = ["-m32", "-nostdlib"]
    subprocess.run(cmd, check=True)
    return out


# (file name stem, SONAME; {v} is the driver version) of libraries beyond libcuda and libnvidia-ml
EXTRA_LIBRARIES = (
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"),  # compute
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4"),  # compute
    ("libnvidia-gpucomp", "libnvidia-gpucomp.so.{v}"),  # compute
    ("libnvidia-cfg", "libnvidia-cfg.so.1"),  # utility
    ("libnvcuvid", "libnvcuvid.so.1"),  # video
    ("libnvidia-encode", "libnvidia-encode.so.1"),  # video
    ("libGLX_nvidia", "libGLX_nvidia.so.0"),  # graphics
    ("libEGL_nvidia", "libEGL_nvidia.so.0"),  # graphics
    ("libnvidia-glcore", "libnvidia-glcore.so.{v}"),  # graphics
    ("libnvidia-ngx", "libnvidia-ngx.so.1"),  # ngx
)


# the libraries of the graphics_files opt-in (NVIDIA's recent additions), and its files
GRAPHICS_LIBRARIES = (
    ("libnvidia-tileiras", "libnvidia-tileiras.so.1"),  # compute
    ("libnvidia-nvvm70", "libnvidia-nvvm70.so.4"),  # compute
    ("libnvidia-egl-xcb", "libnvidia-egl-xcb.so.1"),  # graphics
    ("libnvidia-egl-xlib", "libnvidia-egl-xlib.so.1"),  # graphics
    ("libnvidia-egl-wayland2", "libnvidia-egl-wayland2.so.1"),  # graphics
    ("libnvidia-vulkan-producer", "libnvidia-vulkan-producer.so.1"),  # graphics
    ("libnvidia-cbl", "libnvidia-cbl.so.1"),  # graphics
)
GRAPHICS_FILES = (  # {machine}, {version}: as in ponytail.capabilities
    "/usr/share/vulkan/icd.d/nvidia_icd.{machine}.json",  # graphics
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",  # graphics
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",  # graphics
    "/usr/lib/xorg/modules/drivers/nvidia_drv.so",  # display
    "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",  # display
    "/usr/share/X11/xorg.conf.d/10-nvidia.conf",  # display
)


@functools.cache
def compile_program(source: str, defines: tuple[str, ...] = ()) -> Path:
    out = BUILD_DIR / "bin" / Path(source).stem
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = [f"-D{d}" for d in defines]
    subprocess.run(["gcc", "-O1", *flags, "-o", str(out), str(C_DIR / source), "-ldl"], check=True)
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
    extra_libraries: bool = False  # EXTRA_LIBRARIES, graphics JSON files, MPS binaries
    compat32: bool = False  # a 32-bit libcuda in /usr/lib/i386-linux-gnu
    mig: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # GPU minor -> [(GI, CI)]
    daemons: bool = False  # persistenced socket, MPS pipe directory, GSP firmware
    cuda_blocks: int = 0  # 1: cuDriverGetVersion never returns (a wedged GPU); 2: and forks a helper first
    fabrics: tuple[str, ...] = ()  # keys of FABRICS: their modules in /proc/devices, their nodes; gds adds cufile.json and /run/udev
    dri: bool = False  # each GPU's DRM device in sysfs (drm/card<N+1>, renderD<128+N>) and its /dev/dri nodes
    graphics_files: bool = False  # GRAPHICS_LIBRARIES, the arch-specific Vulkan ICD, EGL platform and Xorg files
    firmware_dir: str = ""  # GSP firmware of the running driver under this directory's nvidia/<version> only
    firmware_class_path: str = ""  # the firmware loader's custom path (/sys/module/firmware_class/parameters/path)
    filelist: str = ""  # the driver's /usr/share/nvidia/files.d/sandboxutils-filelist.json, as written
    uvm_major: int = UVM_MAJOR  # nvidia-uvm's major in /proc/devices and on its nodes
    caps_major: int = CAPS_MAJOR  # nvidia-caps's

    def __post_init__(self) -> None:
        self.proc = self.base / "proc"
        self.sys = self.base / "sys"
        self.dev = self.base / "dev"
        self.driver = self.base / "driver"
        self.log = self.base / "ponytail.log"
        self.ipc = self.base / "ipc"
        fd, table = tempfile.mkstemp(prefix="table-", dir=NVML_DIR)
        os.close(fd)
        self.nvml_table = Path(table)
        self._build()

    @staticmethod
    def mig_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
        """The nvidia-caps minors granting access to a GPU instance and a compute instance."""
        base = 100 + gpu_minor * 40 + gi * 5
        return base, base + 1 + ci

    @staticmethod
    def mig_uuid(gpu_minor: int, gi: int, ci: int) -> str:
        return f"MIG-{gpu_minor:08x}-{gi:04x}-{ci:04x}-aaaa-bbbbccccdddd"

    # -- building -------------------------------------------------------
    def _build(self) -> None:
        for d in (self.proc, self.sys, self.dev, self.driver):
            d.mkdir(parents=True, exist_ok=True)
        self._write_proc()
        self._write_sys()
        self._make_nodes()
        self._write_nvml_table()
        self._install_driver_files()
        if "gds" in self.fabrics:
            self._write_fabric_files()
        if "imex" in self.fabrics or "nvswitch" in self.fabrics:
            self.install_fabric_daemons(self.driver_version)
        if self.daemons:
            self._start_daemons()
        if self.dri:
            self._make_dri()
        if self.graphics_files:
            self._install_graphics_files()
        if self.firmware_dir:
            fw = self.driver / self.firmware_dir.lstrip("/") / "nvidia" / self.driver_version
            fw.mkdir(parents=True, exist_ok=True)
            (fw / "gsp_ga10x.bin").write_bytes(b"GSP" + self.driver_version.encode())
        if self.filelist:
            path = self.driver / "usr/share/nvidia/files.d/sandboxutils-filelist.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.filelist)
        if self.firmware_class_path:
            params = self.sys / "module/firmware_class/parameters"
            params.mkdir(parents=True, exist_ok=True)
            (params / "path").write_text(self.firmware_class_path + "\n")

    def _write_proc(self) -> None:
        nv = self.proc / "driver/nvidia"
        nv.mkdir(parents=True, exist_ok=True)
        if self.open_module:
            line = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {self.driver_version}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct  5 21:15:33 UTC 2023"
        else:
            line = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.driver_version}  Tue Mar  5 22:23:56 UTC 2024"
        (nv / "version").write_text(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        (nv / "params").write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileMode: 438\n")
        (nv / "registry").write_text("Binary: \"\"\n")
        caps = nv / "capabilities"
        for name, minor in (("config", 1), ("monitor", 2)):
            (caps / "mig").mkdir(parents=True, exist_ok=True)
            (caps / "mig" / name).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
        for gpu_minor, instances in self.mig.items():
            mig_dir = caps / f"gpu{gpu_minor}" / "mig"
            mig_dir.mkdir(parents=True, exist_ok=True)
            for gi, ci in instances:
                gi_minor, ci_minor = self.mig_minors(gpu_minor, gi, ci)
                (mig_dir / f"gi{gi}" / f"ci{ci}").mkdir(parents=True, exist_ok=True)
                (mig_dir / f"gi{gi}" / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
                (mig_dir / f"gi{gi}" / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")
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
            devices += f"{self.uvm_major} nvidia-uvm\n"
        devices += f"{self.caps_major} nvidia-caps\n"
        devices += "".join(f"{FABRICS[f][1]} {FABRICS[f][0]}\n" for f in self._fabrics() if FABRICS[f][1] != 10)
        devices += "\nBlock devices:\n  7 loop\n{NVIDIA_MAJOR + 1} fakeblock\n"
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
        nodes["nvidia-modeset"] = (NVIDIA_MAJOR, 254)
        (self.dev / "nvidia-caps").mkdir(exist_ok=True)
        nodes["nvidia-caps/nvidia-cap1"] = (self.caps_major, 1)
        nodes["nvidia-caps/nvidia-cap2"] = (self.caps_major, 2)
        for gpu_minor, instances in self.mig.items():
            for gi, ci in instances:
                for minor in self.mig_minors(gpu_minor, gi, ci):
                    nodes[f"nvidia-caps/nvidia-cap{minor}"] = (self.caps_major, minor)
        if self.with_uvm:
            nodes["nvidia-uvm"] = (self.uvm_major, 0)
            nodes["nvidia-uvm-tools"] = (self.uvm_major, 1)
        for fabric in self._fabrics():
            _, major, fabric_nodes = FABRICS[fabric]
            nodes.update({name: (major, minor) for name, minor in fabric_nodes})
        for name, (major, minor) in nodes.items():
            path = self.dev / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))

    def _fabrics(self) -> tuple[str, ...]:
        return self.fabrics + (("rdma_cm",) if "mofed" in self.fabrics else ())

    def _write_fabric_files(self) -> None:
        """What GPUDirect Storage reads besides its nodes: /etc/cufile.json, udev's database."""
        (self.driver / "etc").mkdir(parents=True, exist_ok=True)
        (self.driver / "etc/cufile.json").write_text('{"logging": {"level": "ERROR"}}\n')
        (self.ipc / "run/udev/data").mkdir(parents=True, exist_ok=True)
        (self.ipc / "run/udev/data/c241:0").write_text("E:DEVNAME=/dev/nvidia-fs0\n")
        control = self.ipc / "run/udev/control"  # udevd's control socket beside its database: never for a container
        if not control.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.bind(str(control))

    def install_fabric_daemons(self, version: str) -> None:
        """nv-fabricmanager and nvidia-imex of driver ``version`` in the driver root (programs that
        name their version, as the real ones do)."""
        bindir = self.driver / "usr/bin"
        bindir.mkdir(parents=True, exist_ok=True)
        for name, says in (("nv-fabricmanager", "Fabric Manager version is : "), ("nvidia-imex", "IMEX version is: ")):
            (bindir / name).unlink(missing_ok=True)
            shutil.copy(compile_program("fake_nvidia_smi.c"), bindir / name)
            with open(bindir / name, "ab") as f:
                f.write(f"\0{says}{version}\0".encode())

    def _write_nvml_table(self) -> None:
        lines = [f"gpu {g.minor} {1 if g.minor in self.mig else 0}" for g in self.gpu_list]
        for gpu_minor, instances in self.mig.items():
            lines += [f"mig {gpu_minor} {gi} {ci} {self.mig_uuid(gpu_minor, gi, ci)}" for gi, ci in instances]
        self.nvml_table.write_text("\n".join(lines) + "\n")
        self.nvml_table.chmod(0o644)

    def _install_driver_files(self) -> None:
        libdir = self.driver / self.lib_dir.lstrip("/")
        libdir.mkdir(parents=True, exist_ok=True)
        for version in (self.driver_version, *self.stale_versions):
            blocks = (f"BLOCK_VERSION={self.cuda_blocks}",) if self.cuda_blocks else ()
            built = compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{version}", version, self.cuda_version, defines=blocks)
            shutil.copy(built, libdir / f"libcuda.so.{version}")
            built = compile_library("fake_libnvidia_ml.c", "libnvidia-ml.so.1", f"libnvidia-ml.so.{version}", version, nvml_table=str(self.nvml_table))
            shutil.copy(built, libdir / f"libnvidia-ml.so.{version}")
        if self.extra_libraries:
            self._install_extra_libraries(libdir)
        if self.compat32:
            lib32 = self.driver / "usr/lib/i386-linux-gnu"
            lib32.mkdir(parents=True, exist_ok=True)
            built = compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{self.driver_version}", self.driver_version, m32=True)
            shutil.copy(built, lib32 / f"libcuda.so.{self.driver_version}")
            _symlink(f"libcuda.so.{self.driver_version}", lib32 / "libcuda.so.1")
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
        dirs = self.lib_dir + "\n" + ("/usr/lib/i386-linux-gnu\n" if self.compat32 else "")
        (etc / "ld.so.conf.d/nvidia.conf").write_text(dirs)
        subprocess.run(["ldconfig", "-r", str(self.driver)], check=True)

    def _install_extra_libraries(self, libdir: Path) -> None:
        v = self.driver_version
        for stem, soname in EXTRA_LIBRARIES:
            soname = soname.format(v=v)
            shutil.copy(compile_library("fake_plain.c", soname, f"{stem}.so.{v}", v), libdir / f"{stem}.so.{v}")
            if soname != f"{stem}.so.{v}":
                _symlink(f"{stem}.so.{v}", libdir / soname)
        for path in ("usr/share/glvnd/egl_vendor.d/10_nvidia.json", "usr/share/vulkan/icd.d/nvidia_icd.json"):
            (self.driver / path).parent.mkdir(parents=True, exist_ok=True)
            (self.driver / path).write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0"}}\n')
        bindir = self.driver / "usr/bin"
        bindir.mkdir(parents=True, exist_ok=True)
        for name in ("nvidia-cuda-mps-control", "nvidia-debugdump"):
            shutil.copy(compile_program("fake_nvidia_smi.c"), bindir / name)

    def _start_daemons(self) -> None:
        """What running driver daemons leave on a host: sockets, the MPS pipe directory, and
        the GSP firmware of the running driver (and of an older one, which must not be used)."""
        import socket

        for path in ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket"):
            sock_path = self.ipc / path
            sock_path.parent.mkdir(parents=True, exist_ok=True)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(sock_path))
        (self.ipc / "tmp/nvidia-mps").mkdir(parents=True, exist_ok=True)
        (self.ipc / "tmp/nvidia-mps/control").write_text("")
        for version in (self.driver_version, "535.104.05"):
            fw = self.driver / "lib/firmware/nvidia" / version
            fw.mkdir(parents=True, exist_ok=True)
            for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
                (fw / name).write_bytes(b"GSP" + version.encode())

    def dri_names(self, gpu: FakeGpu) -> tuple[str, str]:
        """The card and render node names of a GPU's DRM device (card0 is another vendor's)."""
        i = self.gpu_list.index(gpu)
        return f"card{i + 1}", f"renderD{128 + i}"

    def _make_dri(self) -> None:
        (self.dev / "dri").mkdir(exist_ok=True)
        for gpu in self.gpu_list:
            for name in self.dri_names(gpu):
                minor = int(name.removeprefix("card").removeprefix("renderD"))
                (self.sys / "bus/pci/devices" / gpu.bus_id / "drm" / name).mkdir(parents=True, exist_ok=True)
                (self.sys / "bus/pci/devices" / gpu.bus_id / "drm" / name / "dev").write_text(f"{DRM_MAJOR}:{minor}\n")
                if not (self.dev / "dri" / name).exists():
                    os.mknod(self.dev / "dri" / name, 0o666 | 0o020000, os.makedev(DRM_MAJOR, minor))
        # another vendor's card: on the host, never in a container
        os.mknod(self.dev / "dri/card0", 0o666 | 0o020000, os.makedev(DRM_MAJOR, 0))

    def _install_graphics_files(self) -> None:
        libdir = self.driver / self.lib_dir.lstrip("/")
        libdir.mkdir(parents=True, exist_ok=True)
        v = self.driver_version
        for stem, soname in GRAPHICS_LIBRARIES:
            shutil.copy(compile_library("fake_plain.c", soname, f"{stem}.so.{v}", v), libdir / f"{stem}.so.{v}")
            _symlink(f"{stem}.so.{v}", libdir / soname)
        for path in GRAPHICS_FILES:
            path = path.format(machine=os.uname().machine, version=v)
            (self.driver / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            if path.endswith(".so") or ".so." in path:
                shutil.copy(compile_library("fake_plain.c", os.path.basename(path), os.path.basename(path), v), self.driver / path.lstrip("/"))
            else:
                (self.driver / path.lstrip("/")).write_text('{"file_format_version": "1.0.0"}\n')

    def add_driver_tree(self, name: str, version: str, cuda_version: int) -> Path:
        """A second user-mode driver build under ``base/umd/NAME``: its own libcuda (reporting
        ``cuda_version``) and libnvidia-ml of ``version``, nvidia-smi and ld.so.cache."""
        root = self.base / "umd" / name
        return install_driver_tree(root, version, cuda_version, str(self.nvml_table))

    # -- using -----------------------------------------------------------
    def config_text(self, **extra: str) -> str:
        text = (  # a probe cache of the host's own (ponytail.host.probecache), not this machine's /run/ponytail
            f'[cache]\ndir = "{self.base}/cache"\n'
            f'[host]\ndriver_root = "{self.driver}"\nproc_root = "{self.proc}"\n'
            f'sys_root = "{self.sys}"\ndev_root = "{self.dev}"\nipc_root = "{self.ipc}"\n'
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


def install_driver_tree(root: Path, version: str, cuda_version: int, nvml_table: str = "", lib_dir: str = LIB_DIR) -> Path:
    """A driver root with libcuda and libnvidia-ml of ``version`` (and their SONAME links),
    nvidia-smi, and an ld.so.cache made by the host's ldconfig."""
    libdir = root / lib_dir.lstrip("/")
    libdir.mkdir(parents=True, exist_ok=True)
    for stem, source, soname in (("libcuda", "fake_libcuda.c", "libcuda.so.1"), ("libnvidia-ml", "fake_libnvidia_ml.c", "libnvidia-ml.so.1")):
        table = nvml_table if stem == "libnvidia-ml" else ""
        shutil.copy(compile_library(source, soname, f"{stem}.so.{version}", version, cuda_version, nvml_table=table), libdir / f"{stem}.so.{version}")
        _symlink(f"{stem}.so.{version}", libdir / soname)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(compile_program("fake_nvidia_smi.c"), root / "usr/bin/nvidia-smi")
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text(lib_dir + "\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    return root


def add_cuda_compat(rootfs: Path, version: str, cuda_version: int, directory: str = "/usr/local/cuda/compat") -> Path:
    """What NVIDIA's cuda-compat package puts in an image: a newer (or older) libcuda and
    its libcuda.so.1 link under /usr/local/cuda/compat."""
    compat = rootfs / directory.lstrip("/")
    compat.mkdir(parents=True, exist_ok=True)
    shutil.copy(compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{version}", version, cuda_version), compat / f"libcuda.so.{version}")
    _symlink(f"libcuda.so.{version}", compat / "libcuda.so.1")
    return compat


def add_stale_libcuda(rootfs: Path, version: str, cuda_version: int, lib_dir: str = LIB_DIR) -> Path:
    """An image that ships its own (old) libcuda.so.1 as a regular file in the usual library
    directory (or ``lib_dir``), with a linker cache that names it."""
    libdir = rootfs / lib_dir.lstrip("/")
    libdir.mkdir(parents=True, exist_ok=True)
    built = compile_library("fake_libcuda.c", "libcuda.so.1", f"libcuda.so.{version}", version, cuda_version)
    shutil.copy(built, libdir / "libcuda.so.1")
    (rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ld.so.conf.d/libc.conf").write_text(lib_dir + "\n")
    subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)
    return libdir / "libcuda.so.1"


def _symlink(target: str, link: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def make_rootfs(path: Path, programs: tuple[str, ...] = ("cudacheck.c",), busybox: str = "/bin/busybox") -> Path:
    """A small image: the host's busybox (static or not: the libraries it links against
    come along) with relative symlinks, the host's loader and libc, /etc/ld.so.conf,
    and the given test programs in /usr/local/bin."""
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "lib64", "usr/bin", "usr/local/bin", LIB_DIR.lstrip("/")):
        (path / d).mkdir(parents=True, exist_ok=True)
    copy_program(busybox, path, "/bin/busybox")
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


def shared_libraries(program: str) -> list[Path]:
    """The shared libraries ``program`` loads, as the host's loader finds them (none for a
    static program)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1 and words[words.index("=>") + 1].startswith("/"):
            found.append(Path(words[words.index("=>") + 1]))
        elif words and words[0].startswith("/"):
            found.append(Path(words[0]))  # the loader itself
    return found


def copy_program(program: str, rootfs: Path, target: str) -> None:
    """Copy a host program into ``rootfs`` at ``target`` with every shared library it links
    against at the same path, so that it runs there whether it is static or not (Debian's
    plain busybox, unlike busybox-static, needs libresolv)."""
    destination = rootfs / target.lstrip("/")
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(program, destination)
    for library in shared_libraries(program):
        copy = rootfs / str(library).lstrip("/")
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(library.resolve(), copy)


MUSL_LIBC = Path("/usr/lib/x86_64-linux-musl/libc.so")  # Debian's musl package: the loader and libc in one file


def make_musl_rootfs(path: Path, path_file: str | None = None) -> Path:
    """An Alpine-like image: busybox, musl's loader at /lib/ld-musl-x86_64.so.1 (a regular file,
    as Alpine has it), no glibc, and cudacheck built with musl-gcc; ``path_file`` is written as the
    image's own /etc/ld-musl-x86_64.path."""
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "lib", "usr/lib", "usr/local/bin"):
        (path / d).mkdir(parents=True, exist_ok=True)
    copy_program("/bin/busybox", path, "/bin/busybox")
    for applet in ("sh", "cat", "ls"):
        _symlink("busybox", path / "bin" / applet)
    shutil.copy(MUSL_LIBC, path / "lib/ld-musl-x86_64.so.1")
    _symlink("ld-musl-x86_64.so.1", path / "lib/libc.musl-x86_64.so.1")
    out = BUILD_DIR / "musl" / "cudacheck"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["musl-gcc", "-O1", "-o", str(out), str(C_DIR / "cudacheck.c")], check=True)
    shutil.copy(out, path / "usr/local/bin/cudacheck")
    if path_file is not None:
        (path / "etc/ld-musl-x86_64.path").write_text(path_file)
    return path
