"""One guard pass over the recorded GPU containers (ponytail.apply.containerrecord).

For each record: is its container still there (the same process, by pid and start time, in
the same cgroups)? If not, the record goes. If so: does its device cgroup still allow every
node it was given (ponytail.guard.access)? Where it does not, and repair is on, exactly
the lost nodes are given back through the hook's own code (ponytail.apply.cgroup: v1 rules,
v2 programs extended), and the check is made again. And is it still bound to the driver that
runs (ponytail.guard.binding)? Only recorded containers are ever looked at.

The container's process is pinned for the whole check and repair: a descriptor of its /proc/<pid>
directory, whose start time is the recorded one, reads its cgroups and says it is still there
(a reused pid is another process, which that descriptor never reads). The cgroups are opened by
the paths checked, the process is checked again after they are open (still there, still in
them) and before anything is written, and once more after: a pid reused meanwhile is never given
anything. A record is removed only if it is still the file that was read.

Passes take turns: each holds the lock on the records directory (ponytail.apply.rootlock) while it
checks, repairs and removes; the reading of processes' maps for a stale driver comes after the
lock is released, bounded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ponytail.apply.cgroup import allow_devices, cgroup2_directory, devices_directory, open_cgroup_paths
from ponytail.apply.containerrecord import (
    CUT_SHORT,
    SUFFIX,
    XIDS_SUFFIX,
    cgroup_paths,
    open_records_dir,
    read_record,
    read_xids,
    remove_record,
    remove_xids,
)
from ponytail.apply.rootlock import lock_directory
from ponytail.errors import PonytailError
from ponytail.fs.trust import Untrusted
from ponytail.guard.access import denied_devices
from ponytail.guard.binding import ScanBudget, cgroup_pids, mapping_processes, old_driver_file, stale_reasons
from ponytail.host.driver import read_driver_version
from ponytail.plan.operations import AllowDevices

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.apply.cgroup import DevicesCgroup
    from ponytail.config import Config


@dataclass(frozen=True)
class PassView:
    """What a pass reads once for all its records (the mount table, the running driver's version, this
    guard's cgroup namespace) and how it acts on each: repair or report only, with the config's timeouts."""

    config: Config
    repair: bool
    mountinfo: str
    running_version: str
    own_namespace: int = 0


class Watched:
    """What one pass found of one recorded container."""

    def __init__(self, container_id: str, pid: int, started_by: str) -> None:
        self.id = container_id
        self.pid = pid
        self.started_by = started_by
        self.state = "ok"  # ok, lost (access lost, not repaired), repaired, gone (container no longer there)
        self.lost: list[str] = []  # the nodes whose access was lost, "c 195:0 /dev/nvidia0"
        self.stale: list[str] = []
        self.notes: list[str] = []
        self.allowed = 0
        self.removed = False  # gone, and its record removed
        self.xids: list[dict] = []  # the GPU errors ponytail dra-plugin attributed to it (containerrecord.note_xid)

    def line(self) -> str:
        """The one line said of this container."""
        head = f"container {self.id} (pid {self.pid}, {self.started_by})"
        xids = []
        if self.xids:
            last = self.xids[-1]
            xids = [f"{len(self.xids)} Xid(s) attributed, the last Xid {last['xid']} on {_plain(last.get('gpu'))} at {_plain(last.get('time'))}"]
        if self.state == "gone":
            return "; ".join([f"{head}: gone", 'its record removed' if self.removed else 'its record kept (report only)', *xids])
        parts = []
        if self.state == "repaired":
            parts.append(f"had lost {', '.join(self.lost)}; given back (only those)")
        elif self.state == "lost":
            parts.append(f"has lost {', '.join(self.lost)}; not given back (report only)")
        else:
            parts.append(f"all {self.allowed} allotted node(s) allowed")
        if self.stale:
            parts.append("stale driver: " + "; ".join(self.stale))
        parts += xids + self.notes
        return f"{head}: {'; '.join(parts)}"

    def as_dict(self) -> dict:
        return {"id": self.id, "pid": self.pid, "started_by": self.started_by, "state": self.state, "lost": self.lost,
                "stale": self.stale, "notes": self.notes, "xids": self.xids}


def _plain(value: object) -> str:
    """A noted field for the text line: printable characters only (a process can name itself anything)."""
    return "".join(c for c in str(value or "?")[:80] if c.isprintable())


class PassReport:
    def __init__(self) -> None:
        self.containers: list[Watched] = []
        self.problems: list[str] = []  # records that could not be read, a directory that is not root's
        self.records_dir = ""
        self.repair = True
        self.driver_version = ""
        self.bounded: list[str] = []  # the bounds the reading of maps hit (ponytail.guard.binding)
        self.duration_s = 0.0
        self.finished = 0.0

    def count(self, state: str) -> int:
        return sum(1 for c in self.containers if c.state == state)

    @property
    def watched(self) -> int:
        return sum(1 for c in self.containers if c.state != "gone")

    @property
    def stale(self) -> int:
        return sum(1 for c in self.containers if c.stale and c.state != "gone")

    @property
    def found_something(self) -> bool:
        return bool(self.problems) or self.stale > 0 or any(c.state in ("lost", "repaired") for c in self.containers)

    def as_dict(self) -> dict:
        return {
            "records": self.records_dir, "repair": self.repair, "driver_version": self.driver_version,
            "watched": self.watched, "lost": self.count("lost") + self.count("repaired"), "repaired": self.count("repaired"),
            "stale": self.stale, "gone": self.count("gone"), "removed": sum(1 for c in self.containers if c.removed),
            "problems": self.problems, "bounded": self.bounded, "duration_s": round(self.duration_s, 3),
            "containers": [c.as_dict() for c in self.containers],
        }


def guard_pass(config: Config, repair: bool) -> PassReport:
    """One pass over the records of ``config``'s records directory; ``repair`` False changes nothing."""
    started = time.monotonic()
    report = PassReport()
    report.records_dir = directory = config.records_dir
    report.repair = repair
    if not directory:
        report.problems.append("no records directory ([guard] records and [cache] dir are both \"\"): nothing is watched")
        return report
    try:
        dir_fd = open_records_dir(directory)
    except FileNotFoundError:
        return _done(report, started)  # no GPU container recorded yet
    except OSError as e:
        report.problems.append(f"records directory {directory}: {e.strerror}")
        return _done(report, started)
    scans: list[tuple[Watched, str | None, tuple[int, int]]] = []
    try:
        lock_directory(dir_fd, f"the records directory {directory}", config.timeout_lock)
        report.driver_version = _running_version(config.proc_root)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            view = PassView(config, repair, f.read(), report.driver_version, _own_cgroup_namespace())
        names = sorted(os.listdir(dir_fd))
        for name in names:
            record_file = name.removesuffix(XIDS_SUFFIX) + SUFFIX
            if repair and name.endswith(XIDS_SUFFIX) and not name.startswith(".") and record_file not in names:
                remove_xids(dir_fd, record_file)  # its record went before it was noted
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            read = _read_record(dir_fd, directory, name, report, repair)
            if read is None:
                continue
            record, identity = read
            watched, scan = _check(record, view)
            try:
                watched.xids = read_xids(dir_fd, record)  # a gone container's too: they may be why it went
            except Untrusted as e:
                report.problems.append(f"Xids ignored: {e}")
            if watched.state == "gone" and repair:
                watched.removed = remove_record(dir_fd, name, identity)
                if watched.removed:
                    remove_xids(dir_fd, name)
            if scan is not None:
                scans.append((watched, *scan))
            report.containers.append(watched)
    except PonytailError as e:
        report.problems.append(e.message)
    finally:
        os.close(dir_fd)  # the lock goes with it: the maps are read without it
    budget = ScanBudget()
    for watched, cgroup_dir, file in scans:
        before = len(budget.hit)
        found = mapping_processes(cgroup_pids(cgroup_dir) or [watched.pid], file, budget, f"container {watched.id}")
        if found:
            pids, path = ", ".join(str(p) for p, _ in found[:5]), found[0][1]
            deleted = path.endswith(" (deleted)")
            watched.stale.append(f"process(es) {pids} map {'a deleted' if deleted else 'the old'} {path.removesuffix(' (deleted)')}")
        watched.notes += [f"stale-driver scan bounded: {line.partition(': ')[2]}" for line in budget.hit[before:]]
    report.bounded = budget.hit
    return _done(report, started)


def _done(report: PassReport, started: float) -> PassReport:
    report.duration_s = time.monotonic() - started
    report.finished = time.time()
    return report


def _running_version(proc_root: str) -> str:
    try:
        return read_driver_version(proc_root)
    except PonytailError:
        return ""  # no driver loaded: nothing to be stale against


def _read_record(dir_fd: int, directory: str, name: str, report: PassReport, repair: bool) -> tuple[dict, tuple[int, int]] | None:
    """The record ``name`` and the (device, inode) of the file read; None (and a problem said) when it
    cannot be used. A record that is not JSON at all (cut short) is removed when repair is on."""
    try:
        read = read_record(dir_fd, name, directory)
    except Untrusted as e:
        report.problems.append(f"record ignored: {e}")
        return None
    if read is None:
        return None  # removed meanwhile
    record, identity = read
    if record is CUT_SHORT:
        outcome = "kept (report only)" if not repair else "removed" if remove_record(dir_fd, name, identity) else "changed meanwhile, kept"
        report.problems.append(f"record {directory}/{name} is not JSON (cut short?): {outcome}")
        return None
    if not isinstance(record, dict) or not _valid(record) or record["id"] + SUFFIX != name:
        report.problems.append(f"record ignored: {directory}/{name} is not a container record")
        return None
    return record, identity


def _valid(record: object) -> bool:
    if not isinstance(record, dict) or record.get("version") != 1 or not isinstance(record.get("id"), str):
        return False
    if not all(isinstance(record.get(k), int) and not isinstance(record.get(k), bool) for k in ("pid", "pid_start")):
        return False
    cgroup = record.get("cgroup")
    if not isinstance(cgroup, dict) or not all(v is None or isinstance(v, str) for v in (cgroup.get("v1"), cgroup.get("v2"))):
        return False
    devices = record.get("devices")
    return isinstance(devices, list) and all(
        isinstance(d, dict) and d.get("type") == "c" and isinstance(d.get("major"), int) and isinstance(d.get("minor"), int)
        and isinstance(d.get("path"), str) for d in devices
    )


class Pinned:
    """A process held by a descriptor of its /proc/<pid> directory: what is read through it is that
    process's, or an error once it has ended, even when its pid is another process's by then."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.start = -1

    @classmethod
    def open(cls, pid: int, start: int) -> Pinned | None:
        """Process ``pid`` if it is the one that started at ``start`` (clock ticks after boot); else None."""
        if pid <= 0:
            return None
        try:
            fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        pinned = cls(pid, fd)
        if pinned.read_start() != start:
            pinned.close()
            return None
        pinned.start = start
        return pinned

    def read(self, name: str) -> str:
        """/proc/<pid>/``name`` of the pinned process (OSError once it has ended)."""
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            return os.read(fd, 65536).decode("utf-8", "replace")
        finally:
            os.close(fd)

    def read_start(self) -> int:
        try:
            fields = self.read("stat").rpartition(")")[2].split()
        except OSError:
            return -1
        return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else -1

    def cgroups(self) -> dict[str, str | None] | None:
        """Its cgroups as this process sees them (v1 devices, v2); None once it has ended."""
        try:
            text = self.read("cgroup")
        except OSError:
            return None
        return cgroup_paths(text) if self.read_start() == self.start else None  # still there after the read: the text was its own

    def cgroup_namespace(self) -> int:
        try:
            return os.stat("ns/cgroup", dir_fd=self.fd).st_ino
        except OSError:
            return 0

    def close(self) -> None:
        os.close(self.fd)


def _check(record: dict, view: PassView) -> tuple[Watched, tuple[str | None, tuple[int, int]] | None]:
    """What one record's container is now, repaired if need be; and, when its processes' maps
    must be read for a stale driver, its cgroup directory and the old driver's file."""
    pid = record["pid"]
    watched = Watched(record["id"], pid, str(record.get("started_by", "")))
    pinned = Pinned.open(pid, record["pid_start"])
    if pinned is None:
        watched.state = "gone"
        return watched, None
    try:
        cgroup = _cgroups(record, pinned, view.own_namespace)
        if cgroup is None:
            watched.state = "gone"
            return watched, None
        _check_access(watched, pinned, cgroup, record, view)
    finally:
        pinned.close()

    v1, v2 = cgroup.get("v1"), cgroup.get("v2")
    directory = cgroup2_directory(view.mountinfo, v2) if v2 not in (None, "/") else None
    if directory is None and v1 not in (None, "/"):
        directory = devices_directory(view.mountinfo, v1)
    watched.stale = stale_reasons(record, view.running_version)
    old = old_driver_file(record)
    return watched, ((directory, old) if old is not None else None)


def _cgroups(record: dict, pinned: Pinned, own_namespace: int) -> dict[str, str | None] | None:
    """The pinned process's cgroups as this guard sees them, if they are still the recorded ones;
    None when it has ended or moved. A record whose paths were read in another cgroup namespace
    (a CDI hook that could not enter the host's: they read ``/``) is taken as the guard sees the
    process, while it is still in that namespace."""
    now = pinned.cgroups()
    if now is None:
        return None
    recorded = {"v1": record["cgroup"].get("v1"), "v2": record["cgroup"].get("v2")}
    if now == recorded:
        return now
    namespace = record.get("cgroup_ns")
    if isinstance(namespace, int) and namespace and own_namespace and namespace != own_namespace \
            and pinned.cgroup_namespace() == namespace:
        return now
    return None


def _check_access(watched: Watched, pinned: Pinned, cgroup: dict[str, str | None], record: dict, view: PassView) -> None:
    devices = tuple((d["major"], d["minor"]) for d in record["devices"])
    paths = {(d["major"], d["minor"]): d["path"] for d in record["devices"]}
    watched.allowed = len(devices)
    try:
        denied, notes = denied_devices(cgroup.get("v1"), cgroup.get("v2"), devices, view.mountinfo)
    except PonytailError as e:
        denied, notes = [], [e.message]
    watched.notes += notes
    if not denied:
        return
    watched.lost = [f"c {major}:{minor} {paths[(major, minor)]}".rstrip() for major, minor in denied]
    watched.state = "lost"
    if not view.repair:
        return
    given = _give_back(watched, pinned, cgroup, tuple(denied), paths, view.config)
    again, _ = denied_devices(cgroup.get("v1"), cgroup.get("v2"), devices, view.mountinfo)
    if not again and given:
        watched.state = "repaired"
    elif again:
        watched.notes.append(f"still denied after the repair: {', '.join(f'c {a}:{b}' for a, b in again)}")


def _give_back(watched: Watched, pinned: Pinned, cgroup: dict[str, str | None], denied: tuple[tuple[int, int], ...],
               paths: dict, config: Config) -> bool:
    """Allow exactly the ``denied`` nodes again in ``cgroup`` (the pinned process's), with the hook's
    code (v1 rules, v2 programs extended): opened by path, then written only while the pinned process
    is still there and in them, and the descriptors are of those very directories. Whether it wrote."""
    op = AllowDevices(denied, "given back by ponytail guard", tuple(paths[d] for d in denied))
    try:
        opened = open_cgroup_paths(cgroup.get("v1"), cgroup.get("v2"), op, config.timeout_lock, config.extend_denying_programs)
        try:
            if pinned.cgroups() != cgroup or not _opened_are_current(opened):
                watched.notes.append(f"not given back: process {pinned.pid} ended or moved while the guard looked")
                return False
            allow_devices(opened, op)
        finally:
            opened.close()
    except PonytailError as e:
        watched.notes.append(f"not given back: {e.message}")
        return False
    except OSError as e:
        watched.notes.append(f"not given back: {e.strerror}")
        return False
    if pinned.cgroups() != cgroup:
        watched.notes.append(f"process {pinned.pid} ended or moved during the repair (its cgroups were given back the nodes)")
    return True


def _opened_are_current(opened: DevicesCgroup) -> bool:
    """Whether the open v1 devices.allow and v2 cgroup are what their paths name now (not a cgroup
    removed and made again under that name between the opening and the check)."""
    checks = []
    if opened.fd >= 0:
        checks.append((opened.fd, opened.allow_path))
    if opened.programs is not None and opened.programs.fd >= 0:
        checks.append((opened.programs.fd, opened.programs.directory))
    for fd, path in checks:
        try:
            if not os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                return False
        except OSError:
            return False
    return True


def _own_cgroup_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/cgroup").st_ino
    except OSError:
        return 0
