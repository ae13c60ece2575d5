"""The container's devices cgroup (v1): allow exactly the injected character devices.

On cgroup v1 a bind-mounted node is visible but ``open`` fails with EPERM until
``c MAJOR:MINOR rw`` is written to the container's ``devices.allow``. The file is
found and opened from the host side, before ponytail enters the container's mount
namespace: the container's cgroup comes from /proc/<pid>/cgroup, the mount point
of the devices hierarchy from ponytail's own /proc/self/mountinfo.

cgroup v2 has no devices.allow (its rules are an eBPF program the runtime builds
from config.json's ``linux.resources.devices``, which ponytail-runtime fills in):
there the step is skipped with a note.
"""

from __future__ import annotations

import os
from ponytail.lite.records import record

from ponytail.errors import InjectionError, InputError
from ponytail.kernelfs import unescape_mountinfo
from ponytail.plan import AllowDevices



@record
class DevicesCgroup:
    """An open ``devices.allow`` of one container, or the note saying why there is none."""

    allow_path: str = ""
    fd: int = -1
    note: str = ""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_devices_cgroup(pid: int) -> DevicesCgroup:
    """Open the devices.allow of the cgroup v1 that process ``pid`` is in (host side)."""
    cgroup_file = f"/proc/{pid}/cgroup"
    try:
        with open(cgroup_file, encoding="utf-8", errors="replace") as f:
            path = devices_cgroup_path(f.read(65536))
    except FileNotFoundError:
        raise InputError(f"container process {pid} is gone ({cgroup_file} does not exist)")
    except OSError as e:
        raise InjectionError(f"cannot read {cgroup_file}: {e.strerror}")
    if path is None:
        return DevicesCgroup(
            note="cgroup v2 (no devices controller in /proc/<pid>/cgroup): a hook cannot allow devices there; "
            "the engine must (ponytail-runtime adds linux.resources.devices to config.json)"
        )
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        directory = devices_directory(f.read(), path)
    if directory is None:
        return DevicesCgroup(
            note=f"the cgroup v1 devices hierarchy (container cgroup {path}) is not mounted here; "
            "device rules not written, the container may get EPERM on the injected nodes"
        )
    allow_path = os.path.join(directory, "devices.allow")
    try:
        fd = os.open(allow_path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise InjectionError(f"cannot open {allow_path} (the container's devices cgroup): {e.strerror}")
    return DevicesCgroup(allow_path, fd)


def allow_devices(cgroup: DevicesCgroup, op: AllowDevices) -> str | None:
    """Write one rule per injected node; the line for the log, or None if there was nothing to write to."""
    if cgroup.fd < 0:
        return None
    for rule in op.rules:
        try:
            os.write(cgroup.fd, rule.encode())
        except OSError as e:
            raise InjectionError(f"cannot allow '{rule}' in {cgroup.allow_path}: {e.strerror}")
    return f"allowed {', '.join(op.rules)} in {cgroup.allow_path}"


def devices_cgroup_path(text: str) -> str | None:
    """The cgroup v1 devices path from a /proc/<pid>/cgroup text; None on cgroup v2."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "devices" in parts[1].split(","):
            path = parts[2].strip()
            if not path.startswith("/"):
                raise InjectionError(f"unexpected devices cgroup path {path!r} in /proc/<pid>/cgroup")
            return path
    return None


def devices_directory(mountinfo: str, cgroup_path: str) -> str | None:
    """The host directory of ``cgroup_path`` in a mounted cgroup v1 devices hierarchy."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 4 or fields[dash + 1] != "cgroup" or "devices" not in fields[dash + 3].split(","):
            continue
        root, mount_point = unescape_mountinfo(fields[3]), unescape_mountinfo(fields[4])
        if root != "/" and cgroup_path != root and not cgroup_path.startswith(root.rstrip("/") + "/"):
            continue  # this mount shows another part of the hierarchy
        inside = cgroup_path[len(root.rstrip("/")) :].strip("/")
        directory = os.path.normpath(os.path.join(mount_point, inside))
        if directory != mount_point and not directory.startswith(mount_point.rstrip("/") + "/"):
            raise InjectionError(f"devices cgroup path {cgroup_path!r} leaves its hierarchy at {mount_point}")
        return directory
    return None
