"""Probe the host once: driver version, GPUs, device nodes, driver files. Plain data out.

Never opens a GPU device node and never loads NVML: reading a few /proc and
/sys files is all it takes, which is why a container start stays fast.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ponytail.config import Config
from ponytail.host.driver import (
    NVIDIA_MAJOR,
    read_char_majors,
    read_driver_version,
    read_gpu_informations,
)
from ponytail.host.files import DriverFile, GlobReport, SkippedFile, find_binary, find_libraries
from ponytail.host.pci import nvidia_gpu_bus_ids

BINARIES = ("nvidia-smi",)
LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/bin/ldconfig")


@dataclass(frozen=True)
class Gpu:
    """A GPU as users name it: ``index`` is its position in PCI bus order (nvidia-smi's),
    ``minor`` the N of /dev/nvidiaN, which the driver assigns and need not follow that order."""

    index: int
    minor: int
    pci_bus_id: str
    uuid: str
    model: str


@dataclass(frozen=True)
class DeviceNode:
    """A character device under the host's dev root, and what it should be."""

    name: str  # relative to /dev, e.g. "nvidia0", "nvidia-uvm"
    host_path: str
    major: int
    minor: int
    problem: str | None  # None when the node exists and is the expected character device


@dataclass(frozen=True)
class Gpus:
    driver_version: str
    gpus: tuple[Gpu, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Host:
    driver_version: str
    gpus: tuple[Gpu, ...]
    gpu_nodes: dict[int, DeviceNode]  # by minor
    control_nodes: tuple[DeviceNode, ...]
    libraries: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    glob_reports: tuple[GlobReport, ...]
    skipped: tuple[SkippedFile, ...]
    notes: tuple[str, ...]


def probe_gpus(config: Config) -> Gpus:
    """Driver version and GPUs in PCI bus order, without touching any driver file."""
    version = read_driver_version(config.proc_root)
    infos = read_gpu_informations(config.proc_root)
    on_bus = set(nvidia_gpu_bus_ids(config.sys_root))
    notes = []
    for bus_id in sorted(on_bus - infos.keys()):
        notes.append(f"GPU {bus_id} is on the PCI bus but the NVIDIA driver does not manage it (bound to another driver?)")
    for bus_id in sorted(infos.keys() - on_bus):
        notes.append(f"GPU {bus_id} is known to the driver but not found under {config.sys_root}/bus/pci")
    gpus = []
    for bus_id in sorted(infos):
        info = infos[bus_id]
        if info.excluded:
            notes.append(f"GPU {bus_id} is excluded by the driver (GPU Excluded: Yes); not offered")
            continue
        gpus.append(Gpu(len(gpus), info.minor, bus_id, info.uuid, info.model))
    return Gpus(version, tuple(gpus), tuple(notes))


def probe_host(config: Config, library_globs: tuple[str, ...]) -> Host:
    """Everything a plan needs, read once."""
    found = probe_gpus(config)
    majors = read_char_majors(config.proc_root)
    nvidia_major = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))
    uvm_major = majors.get("nvidia-uvm")
    gpu_nodes = {g.minor: _node(config, f"nvidia{g.minor}", nvidia_major, g.minor) for g in found.gpus}
    control = [_node(config, "nvidiactl", nvidia_major, 255)]
    if uvm_major is None:
        missing = "the nvidia-uvm module is not loaded (no nvidia-uvm in /proc/devices): CUDA needs it; run 'nvidia-modprobe -u -c0' or 'modprobe nvidia-uvm'"
        control += [DeviceNode(n, os.path.join(config.dev_root, n), 0, m, missing) for n, m in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1))]
    else:
        control += [_node(config, "nvidia-uvm", uvm_major, 0), _node(config, "nvidia-uvm-tools", uvm_major, 1)]
    libraries, reports, skipped = find_libraries(config.driver_root, library_globs, found.driver_version)
    binaries = []
    notes = list(found.notes)
    for name in BINARIES:
        binary = find_binary(config.driver_root, name)
        if binary is None:
            notes.append(f"{name} not found in the driver root's bin directories ({config.driver_root})")
        else:
            binaries.append(binary)
    return Host(
        driver_version=found.driver_version,
        gpus=found.gpus,
        gpu_nodes=gpu_nodes,
        control_nodes=tuple(control),
        libraries=tuple(libraries),
        binaries=tuple(binaries),
        glob_reports=tuple(reports),
        skipped=tuple(skipped),
        notes=tuple(notes),
    )


def _node(config: Config, name: str, major: int, minor: int) -> DeviceNode:
    path = os.path.join(config.dev_root, name)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return DeviceNode(name, path, major, minor, f"{path} does not exist (create it with nvidia-modprobe, or check dev_root)")
    except OSError as e:
        return DeviceNode(name, path, major, minor, f"cannot stat {path}: {e.strerror}")
    if not stat.S_ISCHR(st.st_mode):
        return DeviceNode(name, path, major, minor, f"{path} is not a character device")
    actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if actual != (major, minor):
        return DeviceNode(name, path, major, minor, f"{path} is c {actual[0]}:{actual[1]}, expected c {major}:{minor}")
    return DeviceNode(name, path, major, minor, None)


def find_ldconfig(configured: str) -> str | None:
    """The host's ldconfig: the configured one, or the first of the usual places."""
    for candidate in (configured,) if configured else LDCONFIG_CANDIDATES:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
