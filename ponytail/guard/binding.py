"""Whether a running container is still bound to the user-mode driver that runs now.

A driver upgrade while containers run leaves them with the old user-mode driver: their
processes map a libcuda that has been deleted (or replaced), and the version they were
given is no longer /proc/driver/nvidia/version's. A container started from a CDI spec made
for another driver is stale the same way. Read only; plain strings for the report.

Which processes still map the old libcuda is read from their /proc/<pid>/maps, which a
container can make as long as it likes: so it is read only when it can matter (the libcuda
file the container was given is no longer at its path: the driver changed since its start),
a mapping counts only if it is that very file (its device and inode, as recorded), and the
reading is bounded: ``MAX_PROCESSES`` processes a container, ``MAX_MAPS_BYTES`` of each
one's maps, ``SCAN_BUDGET_S`` for a whole pass. A bound that was hit is said.
"""

from __future__ import annotations

import os
import time

MAX_PROCESSES = 16  # a container's processes whose maps are read, from its cgroup.procs
MAX_MAPS_BYTES = 1 << 20  # of one process's /proc/<pid>/maps (about 8,000 mappings of usual paths)
SCAN_BUDGET_S = 1.0  # for the reading of maps in one pass, all containers together
_CHUNK = 1 << 16


class ScanBudget:
    """The time left to one pass's reading of maps, and the bounds it hit."""

    def __init__(self, seconds: float = SCAN_BUDGET_S) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.hit: list[str] = []

    def spent(self) -> bool:
        return time.monotonic() >= self.deadline


def stale_reasons(record: dict, running_version: str) -> list[str]:
    """Why the container of ``record`` is bound to a driver that no longer runs, as far as the
    record and the host's files tell (no process is read)."""
    reasons = []
    given = record.get("driver_version")
    if isinstance(given, str) and given and running_version and given != running_version:
        reasons.append(f"given driver {given}, {running_version} runs now")
    spec = record.get("spec_driver_version")
    if isinstance(spec, str) and spec and running_version and spec != running_version:
        reasons.append(f"started from a CDI spec made for driver {spec}, {running_version} runs now (stale spec)")
    libcuda = record.get("libcuda")
    if isinstance(libcuda, dict) and isinstance(libcuda.get("path"), str):
        changed = _file_changed(libcuda["path"], libcuda.get("identity"))
        if changed:
            reasons.append(changed)
    return reasons


def old_driver_file(record: dict) -> tuple[int, int] | None:
    """(device, inode) of the libcuda file the container was given, when another file (or none)
    is at its path now: the only file whose mappings say the container runs the old driver. None
    when nothing changed (no process need be read) or the record names no file."""
    libcuda = record.get("libcuda")
    identity = libcuda.get("identity") if isinstance(libcuda, dict) else None
    if not isinstance(libcuda, dict) or not isinstance(libcuda.get("path"), str) or not isinstance(identity, list) or len(identity) != 4:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in identity):
        return None
    try:
        st = os.stat(libcuda["path"])
    except FileNotFoundError:
        return identity[0], identity[1]
    except OSError:
        return None
    return None if (st.st_dev, st.st_ino) == (identity[0], identity[1]) else (identity[0], identity[1])


def mapping_processes(pids: list[int], file: tuple[int, int], budget: ScanBudget, what: str) -> list[tuple[int, str]]:
    """(pid, path in the container) of each process of ``pids`` that maps the file ``file`` (device,
    inode), reading at most MAX_PROCESSES of them, MAX_MAPS_BYTES of each, within ``budget``; the
    bounds hit are added to ``budget.hit``, naming ``what``."""
    found = []
    if len(pids) > MAX_PROCESSES:
        budget.hit.append(f"{what}: the maps of only {MAX_PROCESSES} of its processes read (it has more)")
    for pid in pids[:MAX_PROCESSES]:
        if budget.spent():
            budget.hit.append(f"{what}: the maps of process {pid} and after not read (the pass's {budget.seconds:g} s for maps spent)")
            break
        path, cut = _maps_path(pid, file, budget)
        if path is not None:
            found.append((pid, path))
        elif cut:
            budget.hit.append(f"{what}: process {pid}: {cut}")
    return found


def _maps_path(pid: int, file: tuple[int, int], budget: ScanBudget) -> tuple[str | None, str]:
    """The path under which process ``pid`` maps ``file``, or None and why the reading stopped short."""
    device = f"{os.major(file[0]):02x}:{os.minor(file[0]):02x}"
    inode = str(file[1])
    read = 0
    rest = b""
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, ""
    try:
        while True:
            if read >= MAX_MAPS_BYTES:
                return None, f"only the first {MAX_MAPS_BYTES} bytes of its maps read"
            if budget.spent():
                return None, f"its maps read for {read} bytes only (the pass's {budget.seconds:g} s for maps spent)"
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                return None, ""
            if not chunk:
                return None, ""
            read += len(chunk)
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                fields = line.split(None, 5)  # address perms offset dev inode path
                if len(fields) == 6 and fields[4] == inode.encode() and _same_device(fields[3], device):
                    return fields[5].decode("utf-8", "replace").strip(), ""
            if len(rest) > _CHUNK * 2:
                rest = b""  # one line longer than any path: not a mapping of interest
    finally:
        os.close(fd)


def _same_device(field: bytes, device: str) -> bool:
    major, _, minor = field.decode("ascii", "replace").partition(":")
    want_major, _, want_minor = device.partition(":")
    try:
        return int(major, 16) == int(want_major, 16) and int(minor, 16) == int(want_minor, 16)
    except ValueError:
        return False


def cgroup_pids(directory: str | None, limit: int = MAX_PROCESSES + 1) -> list[int]:
    """Up to ``limit`` processes of a cgroup directory (its cgroup.procs); none when it cannot be read."""
    if directory is None:
        return []
    try:
        fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        data = os.read(fd, 12 * limit)
    except OSError:
        return []
    finally:
        os.close(fd)
    words = data.split()
    if len(data) == 12 * limit and words:
        words = words[:-1]  # the last one may be cut
    return [int(w) for w in words[:limit] if w.isdigit()]


def _file_changed(path: str, identity: object) -> str:
    if not isinstance(identity, list) or len(identity) != 4:
        return ""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"the libcuda it was given ({path}) is gone"
    except OSError:
        return ""
    if [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns] != identity:
        return f"the libcuda it was given ({path}) has been replaced"
    return ""
