"""Which of a container's allotted device nodes its device cgroup still allows, read as the hook reads it.

cgroup v1: the container's ``devices.list`` (``a *:* rwm``, ``c 195:* rwm``, ``c 195:0 rw`` ...).
cgroup v2: every device program attached to the container's cgroup (they are ANDed), each run on
the node by ponytail.plan.devicefilter.verdict, as ponytail.apply.cgroup2 decides what to extend.
Nothing is changed here.
"""

from __future__ import annotations

import os

from ponytail.apply import bpf
from ponytail.apply.cgroup import cgroup2_directory, devices_directory
from ponytail.plan.devicefilter import verdict

Device = tuple[int, int]


def denied_devices(v1: str | None, v2: str | None, devices: tuple[Device, ...], mountinfo: str) -> tuple[list[Device], list[str]]:
    """The allotted ``devices`` that the cgroups (v1 devices path ``v1``, v2 path ``v2``) no longer
    allow, and notes on what could not be read (a program that cannot be run here: not counted)."""
    denied: set[Device] = set()
    notes: list[str] = []
    if v1 is not None and v1 != "/":
        directory = devices_directory(mountinfo, v1)
        if directory is not None:
            try:
                with open(os.path.join(directory, "devices.list"), encoding="ascii", errors="replace") as f:
                    rules = parse_devices_list(f.read())
            except OSError as e:
                notes.append(f"cannot read {directory}/devices.list: {e.strerror}")
            else:
                denied |= {d for d in devices if not v1_allows(rules, d)}
    if v2 is not None and v2 != "/":
        directory = cgroup2_directory(mountinfo, v2)
        if directory is not None:
            found, note = _denied_by_programs(directory, devices)
            denied |= found
            if note:
                notes.append(note)
    return [d for d in devices if d in denied], notes


def parse_devices_list(text: str) -> list[tuple[str, str, str, str]]:
    """devices.list as (type, major, minor, access) tuples; ``*`` for any; malformed lines skipped."""
    rules = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("a", "b", "c"):
            continue
        major, _, minor = parts[1].partition(":")
        rules.append((parts[0], major, minor, parts[2]))
    return rules


def v1_allows(rules: list[tuple[str, str, str, str]], device: Device) -> bool:
    """Whether the rules allow reading and writing the character device ``device``."""
    for kind, major, minor, access in rules:
        if kind in ("a", "c") and major in ("*", str(device[0])) and minor in ("*", str(device[1])) and "r" in access and "w" in access:
            return True
    return False


def _denied_by_programs(directory: str, devices: tuple[Device, ...]) -> tuple[set[Device], str]:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return set(), f"cannot open cgroup {directory}: {e.strerror}"
    try:
        _, ids = bpf.query_device_programs(fd)
    except OSError as e:
        return set(), f"cannot list the device programs of {directory}: {e.strerror}"
    finally:
        os.close(fd)
    denied: set[Device] = set()
    unread = []
    for program_id in ids:
        try:
            prog = bpf.program_fd(program_id)
        except OSError:
            continue  # detached meanwhile
        try:
            info = bpf.program_info(prog)
        except OSError:
            unread.append(str(program_id))
            continue
        finally:
            os.close(prog)
        if not info.readable:
            unread.append(str(program_id))
            continue
        for device in devices:
            if verdict(info.instructions, *device) is False:
                denied.add(device)
    note = f"device program(s) {', '.join(unread)} of {directory} cannot be read" if unread else ""
    return denied, note
