"""The container's device cgroup: allow exactly the injected character devices.

cgroup v1: a bind-mounted node is visible but ``open`` fails with EPERM until
``c MAJOR:MINOR rw`` is written to the container's ``devices.allow``.
cgroup v2: the rules are eBPF device programs attached to the container's cgroup;
ponytail.apply.cgroup2 replaces each with one that also allows the nodes.
A hybrid host can have both (a v1 devices cgroup and programs on the cgroup2 mount,
as with runc given a pure cgroup v2 view on a hybrid host): both are looked at.

Everything is found and opened from the host side, before ponytail enters the
container's mount namespace, never through the rootfs: the container's cgroups come
from /proc/<pid>/cgroup, the mount points of the hierarchies from ponytail's own
/proc/self/mountinfo. A container left in a hierarchy's root cgroup is not confined
there, and the root is never edited (that would widen every process on the host).
"""

from __future__ import annotations

import os

from ponytail.errors import InjectionError, InputError
from ponytail.fs.hostfiles import is_under, read_head
from ponytail.fs.kernelfs import unescape_mountinfo
from ponytail.lite.records import record
from ponytail.plan.operations import AllowDevices

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.apply.cgroup2 import DevicePrograms


@record
class DevicesCgroup:
    """The container's open ``devices.allow`` (v1) and prepared device programs (v2), or notes why not."""

    allow_path: str = ""
    fd: int = -1
    note: str = ""  # a warning: rules that could not be written
    info: str = ""  # why there was nothing to do somewhere (no program attached, rootless)
    programs: DevicePrograms | None = None
    unit: str = ""  # the systemd scope the v2 cgroup is (the systemd cgroup driver), with
    systemd_fd: int = -1  # a connection to systemd (ponytail.apply.systemdbus), opened on the host's side

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.systemd_fd >= 0:
            os.close(self.systemd_fd)
            self.systemd_fd = -1
        if self.programs is not None:
            self.programs.close()


def open_devices_cgroup(
    pid: int, op: AllowDevices | None = None, lock_timeout_s: float = 10.0, extend_denying_programs: bool = False
) -> DevicesCgroup:
    """Open the devices.allow (v1) and prepare the device programs (v2) of process ``pid``'s cgroups
    (runs into one cgroup v2 take turns: ponytail.apply.cgroup2)."""
    text = read_proc_cgroup(pid)
    return open_cgroup_paths(devices_cgroup_path(text), unified_cgroup_path(text), op, lock_timeout_s, extend_denying_programs)


def open_cgroup_paths(
    v1: str | None, v2: str | None, op: AllowDevices | None = None, lock_timeout_s: float = 10.0, extend_denying_programs: bool = False
) -> DevicesCgroup:
    """``open_devices_cgroup`` for the cgroups ``v1`` (devices) and ``v2`` (unified) named by path:
    ponytail guard, which has pinned the container's process and checked it is in them."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        mountinfo = f.read()
    cgroup = DevicesCgroup()
    if v1 is not None and v1 != "/":
        directory = devices_directory(mountinfo, v1)
        if directory is None:
            cgroup.note = (
                f"the cgroup v1 devices hierarchy (container cgroup {v1}) is not mounted here; "
                "device rules not written, the container may get EPERM on the injected nodes"
            )
        else:
            cgroup.allow_path = os.path.join(directory, "devices.allow")
            try:
                cgroup.fd = os.open(cgroup.allow_path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as e:
                raise InjectionError(f"cannot open {cgroup.allow_path} (the container's devices cgroup): {e.strerror}") from e
    if v2 is not None and v2 != "/":
        directory = cgroup2_directory(mountinfo, v2)
        if directory is not None and op is not None:
            from ponytail.apply.cgroup2 import prepare_device_programs

            try:
                cgroup.programs = prepare_device_programs(directory, op, lock_timeout_s, extend_denying_programs)
            except BaseException:
                cgroup.close()
                raise
            cgroup.info = cgroup.programs.note
            cgroup.note = "; ".join(n for n in (cgroup.note, cgroup.programs.warning) if n)
            if cgroup.programs.pairs:
                from ponytail.apply.systemdbus import connect, scope_unit

                unit = scope_unit(v2)
                fd = connect() if unit else None
                if unit and fd is not None:
                    cgroup.unit, cgroup.systemd_fd = unit, fd
    if cgroup.fd < 0 and cgroup.programs is None and not cgroup.note:
        cgroup.info = "no device cgroup of the container's own (rootless, or in the root cgroup): no device rules to add"
    return cgroup


def describe_device_cgroup(pid: int) -> list[str]:
    """What a real run would edit for process ``pid``, for -debug: read only, never fails."""
    from ponytail.errors import PonytailError

    try:
        text = read_proc_cgroup(pid)
        v1, v2 = devices_cgroup_path(text), unified_cgroup_path(text)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
        lines = []
        if v1 is not None and v1 != "/":
            directory = devices_directory(mountinfo, v1)
            lines.append(f"device cgroup v1: {os.path.join(directory, 'devices.allow') if directory else f'{v1} (hierarchy not mounted here)'}")
        if v2 is not None and v2 != "/":
            directory = cgroup2_directory(mountinfo, v2)
            lines.append(f"device cgroup v2: {directory or f'{v2} (cgroup2 not mounted here)'}{_programs_text(directory)}")
        return lines or ["device cgroup: none of the container's own (rootless, or in the root cgroup)"]
    except (PonytailError, OSError) as e:
        return [f"device cgroup: cannot tell: {e.message if isinstance(e, PonytailError) else e.strerror}"]


def _programs_text(directory: str | None) -> str:
    if directory is None:
        return ""
    from ponytail.apply import bpf

    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return f" (cannot open: {e.strerror})"
    try:
        flags, ids = bpf.query_device_programs(fd)
    except OSError as e:
        return f" (cannot list its device programs: {e.strerror})"
    finally:
        os.close(fd)
    if not ids:
        return ", no device program attached (nothing to edit)"
    mode = {0: "exclusive", bpf.BPF_F_ALLOW_OVERRIDE: "override", bpf.BPF_F_ALLOW_MULTI: "multi"}.get(flags, str(flags))
    return f", device program(s) {', '.join(map(str, ids))} ({mode}) to be extended"


def read_proc_cgroup(pid: int) -> str:
    cgroup_file = f"/proc/{pid}/cgroup"
    try:
        return read_head(cgroup_file)
    except FileNotFoundError as e:
        raise InputError(f"container process {pid} is gone ({cgroup_file} does not exist)") from e
    except ProcessLookupError as e:
        raise InputError(f"container process {pid} is gone (it exited while ponytail read {cgroup_file})") from e
    except OSError as e:
        raise InjectionError(f"cannot read {cgroup_file}: {e.strerror}") from e


def allow_devices(cgroup: DevicesCgroup, op: AllowDevices, sources: dict[tuple[int, int], str] | None = None) -> list[str]:
    """Write one rule per injected node (v1) and swap in the prepared programs (v2), and where the v2 cgroup is a
    systemd scope add the nodes (``sources``: each node's host path) to its DeviceAllow=; the lines for the log."""
    done = []
    if cgroup.fd >= 0:
        for rule in op.rules:
            try:
                os.write(cgroup.fd, rule.encode())
            except OSError as e:
                raise InjectionError(f"cannot allow '{rule}' in {cgroup.allow_path}: {e.strerror}") from e
        done.append(f"allowed {', '.join(op.rules)} in {cgroup.allow_path}")
    if cgroup.programs is not None:
        from ponytail.apply.cgroup2 import replace_device_programs, systemd_warning

        replaced = replace_device_programs(cgroup.programs)
        if replaced:
            done.append(f"allowed {', '.join(op.rules)}: {replaced}")
            told = _tell_systemd(cgroup, op, sources or {}, done) if cgroup.systemd_fd >= 0 else None
            cgroup.note = "; ".join(n for n in (cgroup.note, systemd_warning(cgroup.programs.directory) if told is None else told) if n)
    return done


def _tell_systemd(cgroup: DevicesCgroup, op: AllowDevices, sources: dict[tuple[int, int], str], done: list[str]) -> str | None:
    """The nodes in the scope's DeviceAllow= (systemd re-grants them on daemon-reload); a warning, or "" when all went in."""
    from ponytail.apply.systemdbus import add_device_allow, device_paths

    paths, left_out = device_paths(op.devices, sources)
    try:
        if paths:
            add_device_allow(cgroup.systemd_fd, cgroup.unit, paths)
            done.append(f"added {', '.join(paths)} to DeviceAllow= of {cgroup.unit} (systemd keeps them on daemon-reload)")
    except OSError as e:
        return f"could not add the nodes to DeviceAllow= of {cgroup.unit} ({e.strerror}): systemctl daemon-reload will take them until 'ponytail guard' gives them back"
    if left_out:
        return (f"{', '.join(left_out)} not in DeviceAllow= of {cgroup.unit} (systemd takes device paths under /dev only, and no "
                "/dev/char link leads there: run 'ponytail dev-char-links'): systemctl daemon-reload will take them")
    return ""


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


def unified_cgroup_path(text: str) -> str | None:
    """The cgroup v2 path (the ``0::`` line) from a /proc/<pid>/cgroup text; None without one.

    Refused: a relative path, one with ``.`` or ``..`` components (what the kernel shows
    for a cgroup outside the reader's cgroup namespace) and a text with two such lines."""
    found = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    if not found:
        return None
    path = found[0]
    if len(found) > 1:
        raise InjectionError(f"/proc/<pid>/cgroup has {len(found)} cgroup v2 lines ({', '.join(map(repr, found[:3]))}); refusing to guess")
    if path == "/":
        return path
    parts = path.split("/")
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts[1:]):
        raise InjectionError(
            f"unexpected cgroup v2 path {path!r} in /proc/<pid>/cgroup (outside ponytail's cgroup namespace?); refusing to edit it"
        )
    return path


def cgroup2_directory(mountinfo: str, cgroup_path: str) -> str | None:
    """The host directory of ``cgroup_path`` on a mounted cgroup2 hierarchy, or None."""
    return _hierarchy_directory(mountinfo, cgroup_path, "cgroup2", "")


def devices_directory(mountinfo: str, cgroup_path: str) -> str | None:
    """The host directory of ``cgroup_path`` in a mounted cgroup v1 devices hierarchy."""
    return _hierarchy_directory(mountinfo, cgroup_path, "cgroup", "devices")


def _hierarchy_directory(mountinfo: str, cgroup_path: str, fstype: str, controller: str) -> str | None:
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3 or fields[dash + 1] != fstype:
            continue
        if controller and (len(fields) < dash + 4 or controller not in fields[dash + 3].split(",")):
            continue
        root, mount_point = unescape_mountinfo(fields[3]), unescape_mountinfo(fields[4])
        if root != "/" and not is_under(cgroup_path, root):
            continue  # this mount shows another part of the hierarchy
        inside = cgroup_path[len(root.rstrip("/")) :].strip("/")
        directory = os.path.normpath(os.path.join(mount_point, inside))
        if not is_under(directory, mount_point):
            raise InjectionError(f"{controller or fstype} cgroup path {cgroup_path!r} leaves its hierarchy at {mount_point}")
        return directory
    return None
