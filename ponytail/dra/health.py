"""GPU health from the kernel log: NVIDIA's Xid lines and "fallen off the bus", parsed and classified.

The driver logs each GPU error as ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has
fallen off the bus.`` (the pid and name of the process that was running on it, when known), and a GPU
it lost as ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``. Each becomes an ``XidEvent``; its
effect follows NVIDIA's classification of Xids: errors an application causes (13, 31, 43, 45, 68,
109) leave the GPU healthy and are only reported; errors that lose the GPU or its memory's
integrity (48, 74, 79, 92, 94, 95, 119, 120, 140) evict its pods (``NoExecute``); any other Xid keeps
new pods off it (``NoSchedule``). ``--xid-effect XID=EFFECT`` overrides one. The container that
caused an Xid is found from its pid through the records the hooks write (``record_of_pid``); the plugin
notes the Xid beside that record (ponytail.apply.containerrecord.note_xid) for ``ponytail guard`` to show.
"""

from __future__ import annotations

from dataclasses import dataclass

from ponytail.apply.containerrecord import SUFFIX, cgroup_paths, process_start, trusted_records
from ponytail.fs.hostfiles import is_under, read_head

EFFECTS = ("NoSchedule", "NoExecute", "None")
APPLICATION_XIDS = frozenset((13, 31, 43, 45, 68, 109))
FATAL_XIDS = frozenset((48, 74, 79, 92, 94, 95, 119, 120, 140))
FALLEN_OFF = 79  # what a "fallen off the bus" line counts as


@dataclass(frozen=True)
class XidEvent:
    bus_id: str  # lower case, as the line gives it (0000:3b:00, without the function)
    xid: int
    pid: int | None
    process: str
    text: str  # the message after the driver's prefix


def parse_kmsg(line: str) -> XidEvent | None:
    """The event in one /dev/kmsg record (``6,1234,5678,-;NVRM: ...``) or one dmesg line; None for any other."""
    message = line.split(";", 1)[1] if ";" in line.split("NVRM", 1)[0] else line
    at = message.find("NVRM: ")
    if at < 0:
        return None
    message = message[at + 6:].strip()
    if message.startswith("Xid (PCI:"):
        bus, _, rest = message[9:].partition(")")
        rest = rest.lstrip(": ")
        number, _, rest = rest.partition(",")
        if not number.strip().isdigit():
            return None
        pid, process = None, ""
        for part in rest.split(","):
            key, _, value = part.strip().partition("=")
            if key == "pid" and value.strip("'").isdigit():
                pid = int(value.strip("'"))
            elif key == "name":
                process = value.strip()
        return XidEvent(_bus(bus), int(number), pid, process, message)
    if message.startswith("GPU ") and "fallen off the bus" in message:
        parts = message[4:].split(":", 3)
        if len(parts) < 4:
            return None
        return XidEvent(_bus(":".join(parts[:3])), FALLEN_OFF, None, "", message)
    return None


def _bus(text: str) -> str:
    """0000:3b:00 (from 0000:3b:00 or 0000:3b:00.0), lower case."""
    return text.strip().lower().split(".")[0]


def matches_bus(event_bus: str, gpu_bus_id: str) -> bool:
    """Whether the line's bus id (domain:bus:device) is the GPU's (sysfs' domain:bus:device.function)."""
    return _bus(gpu_bus_id) == event_bus or _bus(gpu_bus_id).endswith(":" + event_bus)


def effect_of(xid: int, overrides: dict[int, str]) -> str:
    """NoExecute, NoSchedule or None (reported, no taint) for ``xid``."""
    if xid in overrides:
        return overrides[xid]
    if xid in APPLICATION_XIDS:
        return "None"
    return "NoExecute" if xid in FATAL_XIDS else "NoSchedule"


def parse_overrides(items: tuple[str, ...] | list[str]) -> dict[int, str]:
    """``--xid-effect 79=NoExecute`` items; ValueError naming a bad one."""
    found = {}
    for item in items:
        number, _, effect = item.partition("=")
        if not number.strip().isdigit() or effect not in EFFECTS:
            raise ValueError(f"--xid-effect {item!r}: XID=EFFECT with EFFECT one of {', '.join(EFFECTS)}")
        found[int(number)] = effect
    return found


def record_of_pid(records_dir: str, pid: int, proc_root: str = "/proc") -> dict | None:
    """The record (ponytail.apply.containerrecord) of the GPU container whose cgroup holds process ``pid``;
    None when none does or the records cannot be read. Records are trusted as the guard trusts them
    (root's own files in root's own directory): any other file is passed over. Only reads."""
    try:
        mine = cgroup_paths(read_head(f"{proc_root}/{pid}/cgroup"))
    except (OSError, ValueError):
        return None
    for name, record in trusted_records(records_dir):
        if not isinstance(record.get("cgroup"), dict):
            continue
        theirs = record["cgroup"]
        first = record.get("pid")
        if not any(_inside(mine.get(k), theirs.get(k)) for k in ("v1", "v2")) and isinstance(first, int) \
                and process_start(first) == record.get("pid_start"):
            # a CDI hook in the container's cgroup namespace may record "/": the host's view of its process then
            try:
                theirs = cgroup_paths(read_head(f"{proc_root}/{first}/cgroup"))
            except OSError:
                pass
        if first == pid or any(_inside(mine.get(k), theirs.get(k)) for k in ("v1", "v2")):
            record.setdefault("id", name[: -len(SUFFIX)])
            return record
    return None


def _inside(path: object, container: object) -> bool:
    if not isinstance(path, str) or not isinstance(container, str) or container in ("", "/"):
        return False
    return is_under(path, container)
