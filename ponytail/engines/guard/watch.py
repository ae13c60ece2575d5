"""One guard pass over the recorded GPU containers (ponytail.apply.containerrecord).

For each record: is its container still there (the same process, by pid and start time, in
the same cgroups)? If not, the record goes. If so: does its device cgroup still allow every
node it was given (ponytail.engines.guard.access)? Where it does not, and repair is on, exactly
the lost nodes are given back through the hook's own code (ponytail.apply.cgroup: v1 rules,
v2 programs extended), and the check is made again. And is it still bound to the driver that
runs (ponytail.engines.guard.binding)? Only recorded containers are ever looked at.

Passes take turns: each holds the lock on the records directory (ponytail.apply.rootlock).
"""

from __future__ import annotations

import json
import os
import time

from ponytail.apply.containerrecord import MAX_RECORD_BYTES, SUFFIX, cgroup_paths, open_records_dir, process_start, read_small
from ponytail.engines.guard.access import denied_devices
from ponytail.engines.guard.binding import cgroup_pids, stale_reasons
from ponytail.errors import PonytailError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.config import Config


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

    def line(self) -> str:
        """The one line said of this container."""
        head = f"container {self.id} (pid {self.pid}, {self.started_by})"
        if self.state == "gone":
            return f"{head}: gone; {'its record removed' if self.removed else 'its record kept (report only)'}"
        parts = []
        if self.state == "repaired":
            parts.append(f"had lost {', '.join(self.lost)}; given back (only those)")
        elif self.state == "lost":
            parts.append(f"has lost {', '.join(self.lost)}; not given back (report only)")
        else:
            parts.append(f"all {self.allowed} allotted node(s) allowed")
        if self.stale:
            parts.append("stale driver: " + "; ".join(self.stale))
        parts += self.notes
        return f"{head}: {'; '.join(parts)}"

    def as_dict(self) -> dict:
        return {"id": self.id, "pid": self.pid, "started_by": self.started_by, "state": self.state, "lost": self.lost,
                "stale": self.stale, "notes": self.notes}


class PassReport:
    def __init__(self) -> None:
        self.containers: list[Watched] = []
        self.problems: list[str] = []  # records that could not be read, a directory that is not root's
        self.records_dir = ""
        self.repair = True
        self.driver_version = ""
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
            "problems": self.problems,
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
    try:
        from ponytail.apply.rootlock import lock_directory

        lock_directory(dir_fd, f"the records directory {directory}", config.timeout_lock)
        report.driver_version = _running_version(config.proc_root)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
        for name in sorted(os.listdir(dir_fd)):
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            record = _read_record(directory, name, report)
            if record is None:
                continue
            watched = _check(record, mountinfo, report.driver_version, repair, config)
            if watched.state == "gone" and repair:
                watched.removed = _remove(dir_fd, name)
            report.containers.append(watched)
    except PonytailError as e:
        report.problems.append(e.message)
    finally:
        os.close(dir_fd)
    return _done(report, started)


def _done(report: PassReport, started: float) -> PassReport:
    report.duration_s = time.monotonic() - started
    report.finished = time.time()
    return report


def _running_version(proc_root: str) -> str:
    from ponytail.host.driver import read_driver_version

    try:
        return read_driver_version(proc_root)
    except PonytailError:
        return ""  # no driver loaded: nothing to be stale against


def _read_record(directory: str, name: str, report: PassReport) -> dict | None:
    from ponytail.fs.trust import Untrusted, read_private_file

    try:
        data = read_private_file(directory, name, MAX_RECORD_BYTES)
    except Untrusted as e:
        report.problems.append(f"record ignored: {e}")
        return None
    if data is None:
        return None  # removed meanwhile
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        record = None
    if not _valid(record) or record["id"] + SUFFIX != name:
        report.problems.append(f"record ignored: {directory}/{name} is not a container record")
        return None
    return record


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


def _check(record: dict, mountinfo: str, running_version: str, repair: bool, config: Config) -> Watched:
    pid = record["pid"]
    watched = Watched(record["id"], pid, str(record.get("started_by", "")))
    cgroup = record["cgroup"]
    if pid <= 0 or process_start(pid) != record["pid_start"] or _cgroups_now(pid) != {"v1": cgroup.get("v1"), "v2": cgroup.get("v2")}:
        watched.state = "gone"
        return watched
    devices = tuple((d["major"], d["minor"]) for d in record["devices"])
    paths = {(d["major"], d["minor"]): d["path"] for d in record["devices"]}
    watched.allowed = len(devices)
    try:
        denied, notes = denied_devices(cgroup.get("v1"), cgroup.get("v2"), devices, mountinfo)
    except PonytailError as e:
        denied, notes = [], [e.message]
    watched.notes += notes
    if denied:
        watched.lost = [f"c {major}:{minor} {paths[(major, minor)]}".rstrip() for major, minor in denied]
        watched.state = "lost"
        if repair:
            _give_back(watched, pid, tuple(denied), paths, config)
            again, _ = denied_devices(cgroup.get("v1"), cgroup.get("v2"), devices, mountinfo)
            if not again and watched.state == "lost":
                watched.state = "repaired"
            elif again:
                watched.notes.append(f"still denied after the repair: {', '.join(f'c {a}:{b}' for a, b in again)}")
    from ponytail.apply.cgroup import cgroup2_directory, devices_directory

    v1, v2 = cgroup.get("v1"), cgroup.get("v2")
    directory = cgroup2_directory(mountinfo, v2) if v2 not in (None, "/") else None
    if directory is None and v1 not in (None, "/"):
        directory = devices_directory(mountinfo, v1)
    watched.stale = stale_reasons(record, running_version, cgroup_pids(directory) or [pid])
    return watched


def _give_back(watched: Watched, pid: int, denied: tuple[tuple[int, int], ...], paths: dict, config: Config) -> None:
    """Allow exactly the ``denied`` nodes again, with the hook's code (v1 rules, v2 programs extended)."""
    from ponytail.apply.cgroup import allow_devices, open_devices_cgroup
    from ponytail.plan.operations import AllowDevices

    op = AllowDevices(denied, "given back by ponytail guard", tuple(paths[d] for d in denied))
    try:
        cgroup = open_devices_cgroup(pid, op, config.timeout_lock, config.extend_denying_programs)
        try:
            allow_devices(cgroup, op)
        finally:
            cgroup.close()
    except PonytailError as e:
        watched.notes.append(f"not given back: {e.message}")
    except OSError as e:
        watched.notes.append(f"not given back: {e.strerror}")


def _cgroups_now(pid: int) -> dict[str, str | None] | None:
    try:
        return cgroup_paths(read_small(f"/proc/{pid}/cgroup"))
    except OSError:
        return None


def _remove(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True
