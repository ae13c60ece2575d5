"""What the NVIDIA kernel driver says under /proc: its version, its GPUs, its device majors."""

from __future__ import annotations

import os

from ponytail.capabilities import NVIDIA_MAJOR
from ponytail.errors import ProbeError
from ponytail.fs.hostfiles import read_head
from ponytail.lite.records import record

PROC_FILES = ("params", "version", "registry")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@record(frozen=True)
class GpuInformation:
    """One GPU as /proc/driver/nvidia/gpus/<bus id>/information describes it."""

    pci_bus_id: str  # canonical: 0000:3b:00.0
    minor: int
    uuid: str
    model: str
    excluded: bool
    proc_name: str = ""  # the directory's own name under gpus/ (16- or 32-bit domain)
    text: bytes = b""  # the file as read, for the container's masked /proc/driver/nvidia


def read_driver_version(proc_root: str) -> str:
    """The loaded kernel module's version, e.g. '550.54.15' (proprietary or open modules)."""
    path = os.path.join(proc_root, "driver/nvidia/version")
    try:
        text = read_head(path, 4096)
    except FileNotFoundError:
        raise ProbeError(
            f"no NVIDIA driver loaded: {path} does not exist (load the kernel module: modprobe nvidia)"
        ) from None
    except OSError as e:
        raise ProbeError(f"cannot read {path}: {e.strerror}") from e
    return parse_driver_version(text, path)


def parse_driver_version(text: str, where: str = "version file") -> str:
    """The first word after 'NVRM version:' on its line that is a version: two or three
    dot-separated numbers ('NVRM version: NVIDIA UNIX ... Module  550.54.15  Tue Mar ...')."""
    for line in text.splitlines():
        _, label, rest = line.partition("NVRM version:")
        words = rest.split()
        for word in words if rest[:1].isspace() else words[1:]:  # not a word glued to the label
            parts = word.split(".")
            if 2 <= len(parts) <= 3 and all(p.isdecimal() for p in parts):
                return word
    first = text.splitlines()[0] if text.strip() else "(empty)"
    raise ProbeError(f"cannot find the driver version in {where}: first line is {first[:120]!r}")


def canonical_bus_id(bus_id: str) -> str | None:
    """'00000000:3B:00.0', '0000:3b:00.0' or '3b:00.0' -> '0000:3b:00.0'; None if not a bus id."""
    fields = bus_id.strip().split(":")
    if not 2 <= len(fields) <= 3:
        return None
    domain = fields[0] if len(fields) == 3 else "0"
    bus, (device, dot, function) = fields[-2], fields[-1].partition(".")
    if not (_hex(domain, 8) and _hex(bus, 2) and _hex(device, 2) and dot and len(function) == 1 and function in "01234567"):
        return None
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def _hex(text: str, longest: int) -> bool:
    """1 to ``longest`` hexadecimal digits (ASCII only: int(..., 16) takes more)."""
    return 0 < len(text) <= longest and _HEX_DIGITS.issuperset(text)


@record(frozen=True)
class LostGpu:
    """A GPU the driver cannot number (the bus has it, or its directory, but not its information
    file): which, and what was found, for a plan's warning; ``message`` is the whole error."""

    bus_id: str
    found: str  # "inconsistent host: GPU 0000:18:00.0 has no .../information"

    @property
    def message(self) -> str:
        return f"{self.found}; refusing to number the GPUs without it: check 'nvidia-smi' and dmesg"


def read_gpu_informations(proc_root: str, lost: list[LostGpu] | None = None) -> dict[str, GpuInformation]:
    """Every GPU the driver knows, keyed by canonical PCI bus id. A GPU whose directory has no
    information file is an inconsistent host: an error, or added to ``lost``."""
    base = os.path.join(proc_root, "driver/nvidia/gpus")
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ProbeError(f"cannot list {base}: {e.strerror}") from e
    result: dict[str, GpuInformation] = {}
    for name in names:
        bus_id = canonical_bus_id(name)
        if bus_id is None:
            continue
        path = os.path.join(base, name, "information")
        try:
            with open(path, "rb") as f:
                raw = f.read(16384)
            info = parse_information(raw.decode("utf-8", "replace"), bus_id, path, name, raw)
        except FileNotFoundError:
            if not os.path.isdir(os.path.join(base, name)):
                continue  # gone meanwhile, with its directory: as if never listed
            gone = LostGpu(bus_id, f"inconsistent host: GPU {bus_id} has no {path}")
            if lost is None:
                raise ProbeError(gone.message) from None
            lost.append(gone)
            continue
        except OSError as e:
            raise ProbeError(f"cannot read {path}: {e.strerror}") from e
        result[bus_id] = info
    return result


def parse_information(text: str, bus_id: str, where: str, proc_name: str = "", raw: bytes = b"") -> GpuInformation:
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
        proc_name=proc_name,
        text=raw,
    )


def read_char_majors(proc_root: str) -> dict[str, int]:
    """Character device majors by driver name, from /proc/devices."""
    path = os.path.join(proc_root, "devices")
    try:
        text = read_head(path)
    except OSError as e:
        raise ProbeError(f"cannot read {path}: {e.strerror}") from e
    return parse_char_majors(text)


def nvidia_major(majors: dict[str, int]) -> int:
    """The major of the GPU nodes (/dev/nvidiaN, nvidiactl) among ``majors`` (read_char_majors):
    the driver registers it as nvidia-frontend (nvidia on some builds); 195 when it has not."""
    return majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))


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


def read_proc_files(proc_root: str) -> dict[str, bytes]:
    """/proc/driver/nvidia/{params,version,registry} as read (for the container's masked view), those present."""
    contents = {}
    for name in PROC_FILES:
        try:
            with open(os.path.join(proc_root, "driver/nvidia", name), "rb") as f:
                contents[name] = f.read(1 << 20)
        except OSError:
            pass
    return contents


# the /proc/devices names whose majors a device node of ours depends on (the GPUs and control nodes, UVM, MIG access)
NODE_MODULES = ("nvidia-frontend", "nvidia", "nvidia-uvm", "nvidia-caps")


def node_drift(proc_root: str, gpus: list[tuple[int, str, str]], majors: dict[str, int]) -> list[str]:
    """What changed since device nodes were planned for ``gpus`` ((minor, canonical bus id,
    UUID) each) and the driver's ``majors`` (name -> major, of NODE_MODULES): a GPU gone from
    the driver, at another minor (renumbered: its old node is another GPU's now) or with
    another UUID, a module's major changed or gone. Empty: every such node is still what it
    was. Cheap: /proc/devices and the named GPUs' information files only."""
    found = []
    now = read_char_majors(proc_root)
    for name, major in majors.items():
        if now.get(name) != major:
            current = f"is {now[name]} now" if name in now else "is gone from /proc/devices (module unloaded?)"
            found.append(f"the {name} major was {major} and {current}")
    if gpus:
        base = os.path.join(proc_root, "driver/nvidia/gpus")
        try:
            names = {canonical_bus_id(n): n for n in os.listdir(base)}
        except OSError:
            names = {}
        for minor, bus_id, uuid in gpus:
            info = _read_information(os.path.join(base, names[bus_id], "information"), bus_id, names[bus_id]) if bus_id in names else None
            if info is None:
                found.append(f"GPU {bus_id} ({uuid}, minor {minor}) is gone from {base}")
            elif info.minor != minor:
                found.append(f"GPU {bus_id} ({uuid}) has minor {info.minor} now, not {minor}: /dev/nvidia{minor} is another GPU's")
            elif info.uuid != uuid:
                found.append(f"GPU {bus_id} at minor {minor} is {info.uuid} now, not {uuid}")
    return found


def _read_information(path: str, bus_id: str, proc_name: str) -> GpuInformation | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(16384)
        return parse_information(raw.decode("utf-8", "replace"), bus_id, path, proc_name, raw)
    except (OSError, ProbeError):
        return None
