"""NVIDIA GPUs on the PCI bus: vendor 0x10de, class VGA (0x0300) or 3D controller (0x0302).

On the live ``/sys`` the bus is enumerated with pyudev; under a relocated sys root
(tests, unusual hosts) with plain sysfs reads. Both return the same thing.
"""

from __future__ import annotations

import os

from ponytail.lite.records import record

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller


@record(frozen=True)
class PciFunction:
    bus_id: str  # as sysfs names it, e.g. 0000:3b:00.0
    vendor: int
    pci_class: int  # full 24-bit class code, e.g. 0x030200
    driver: str = ""  # the kernel driver bound to it ("nvidia", "vfio-pci"), "" when none


def is_nvidia_gpu(function: PciFunction) -> bool:
    return function.vendor == NVIDIA_VENDOR and (function.pci_class >> 8) in GPU_CLASSES


def nvidia_gpus(sys_root: str, udev: bool = True) -> list[PciFunction]:
    """The NVIDIA GPUs under ``sys_root`` (bus ids in lower case), in PCI bus order.

    ``udev``: on the live /sys, ask pyudev. libudev reads the same sysfs files, so
    both give the same functions (a test checks it on a real bus); the hook's real
    runs read them directly, since pyudev's import and scan would weigh on every
    container start (bench/hookbench.py measures both), and keep pyudev for info,
    list and -debug."""
    live = udev and os.path.realpath(sys_root) == "/sys"
    functions = pci_functions_pyudev() if live else pci_functions_sysfs(sys_root, NVIDIA_VENDOR)
    found = [PciFunction(f.bus_id.lower(), f.vendor, f.pci_class, f.driver) for f in functions if is_nvidia_gpu(f)]
    return sorted(found, key=lambda f: f.bus_id)


def pci_functions_sysfs(sys_root: str, vendor: int | None = None) -> list[PciFunction]:
    """Every PCI function, from <sys_root>/bus/pci/devices/*/{vendor,class}; only ``vendor``'s
    when given (the hook: a host has dozens of other functions, bridges, NICs, disks, whose
    class and driver are then never read)."""
    base = os.path.join(sys_root, "bus/pci/devices")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    result = []
    for name in names:
        found = _read_hex(os.path.join(base, name, "vendor"))
        if found is None or vendor is not None and found != vendor:
            continue
        pci_class = _read_hex(os.path.join(base, name, "class"))
        if pci_class is not None:
            result.append(PciFunction(name, found, pci_class, _driver(os.path.join(base, name, "driver"))))
    return result


def _driver(link: str) -> str:
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return ""


def pci_functions_pyudev() -> list[PciFunction]:
    """Every PCI function the udev database knows, through pyudev (live /sys only)."""
    try:
        import pyudev  # noqa: PLC0415 - lazy: only the live-host path needs libudev
        context = pyudev.Context()
    except (ImportError, OSError):
        return pci_functions_sysfs("/sys")
    result = []
    for device in context.list_devices(subsystem="pci"):
        vendor = _parse_hex(device.attributes.get("vendor"))
        pci_class = _parse_hex(device.attributes.get("class"))
        if vendor is not None and pci_class is not None:
            result.append(PciFunction(device.sys_name, vendor, pci_class, device.driver or ""))
    return result


def _read_hex(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _parse_hex(os.read(fd, 64))
    except OSError:
        return None
    finally:
        os.close(fd)


def _parse_hex(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.strip(), 16)
    except ValueError:
        return None
