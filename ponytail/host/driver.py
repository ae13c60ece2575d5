"""What the NVIDIA kernel driver says under /proc: its version, its GPUs, its device majors."""

from __future__ import annotations

import os
import re
from ponytail.records import dataclass

from ponytail.errors import ProbeError

_VERSION_RE = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
NVIDIA_MAJOR = 195


@dataclass(frozen=True)
class GpuInformation:
    """One GPU as /proc/driver/nvidia/gpus/<bus id>/information describes it."""

    pci_bus_id: str  # canonical: 0000:3b:00.0
    minor: int
    uuid: str
    model: str
    excluded: bool


def read_driver_version(proc_root: str) -> str:
    """The loaded kernel module's version, e.g. '550.54.15' (proprietary or open modules)."""
    path = os.path.join(proc_root, "driver/nvidia/version")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except FileNotFoundError:
        raise ProbeError(
            f"no NVIDIA driver loaded: {path} does not exist (load the kernel module: modprobe nvidia)"
        )
    except OSError as e:
        raise ProbeError(f"cannot read {path}: {e.strerror}")
    return parse_driver_version(text, path)


def parse_driver_version(text: str, where: str = "version file") -> str:
    m = _VERSION_RE.search(text + " ")
    if not m:
        first = text.splitlines()[0] if text.strip() else "(empty)"
        raise ProbeError(f"cannot find the driver version in {where}: first line is {first[:120]!r}")
    return m.group(1)


def canonical_bus_id(bus_id: str) -> str | None:
    """'00000000:3B:00.0', '0000:3b:00.0' or '3b:00.0' -> '0000:3b:00.0'; None if not a bus id."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])", bus_id.strip())
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def read_gpu_informations(proc_root: str) -> dict[str, GpuInformation]:
    """Every GPU the driver knows, keyed by canonical PCI bus id."""
    base = os.path.join(proc_root, "driver/nvidia/gpus")
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ProbeError(f"cannot list {base}: {e.strerror}")
    result: dict[str, GpuInformation] = {}
    for name in names:
        bus_id = canonical_bus_id(name)
        if bus_id is None:
            continue
        path = os.path.join(base, name, "information")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                info = parse_information(f.read(16384), bus_id, path)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ProbeError(f"cannot read {path}: {e.strerror}")
        result[bus_id] = info
    return result


def parse_information(text: str, bus_id: str, where: str) -> GpuInformation:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    minor_text = fields.get("Device Minor", "")
    if not minor_text.isdigit():
        raise ProbeError(f"{where}: no valid 'Device Minor' line (found {minor_text!r})")
    return GpuInformation(
        pci_bus_id=bus_id,
        minor=int(minor_text),
        uuid=fields.get("GPU UUID", ""),
        model=fields.get("Model", "unknown"),
        excluded=fields.get("GPU Excluded", "No").lower().startswith("y"),
    )


def read_char_majors(proc_root: str) -> dict[str, int]:
    """Character device majors by driver name, from /proc/devices."""
    path = os.path.join(proc_root, "devices")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(65536)
    except OSError as e:
        raise ProbeError(f"cannot read {path}: {e.strerror}")
    return parse_char_majors(text)


def parse_char_majors(text: str) -> dict[str, int]:
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            in_char = stripped.startswith("Character")
            continue
        if in_char:
            number, _, name = stripped.partition(" ")
            if number.isdigit() and name:
                majors.setdefault(name.strip(), int(number))
    return majors
