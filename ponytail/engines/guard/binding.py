"""Whether a running container is still bound to the user-mode driver that runs now.

A driver upgrade while containers run leaves them with the old user-mode driver: their
processes map a libcuda that has been deleted (or replaced), and the version they were
given is no longer /proc/driver/nvidia/version's. A container started from a CDI spec made
for another driver is stale the same way. Read only; plain strings for the report.
"""

from __future__ import annotations

import os


def stale_reasons(record: dict, running_version: str, pids: list[int]) -> list[str]:
    """Why the container of ``record`` (its processes ``pids``) is bound to a driver that no longer runs."""
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
    deleted = deleted_libcuda(pids)
    if deleted:
        reasons.append(f"process(es) {', '.join(str(p) for p, _ in deleted[:5])} map a deleted {deleted[0][1]}")
    return reasons


def deleted_libcuda(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, path) of each process of ``pids`` that maps a libcuda file that has since been deleted."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if "libcuda.so" in line and line.rstrip().endswith("(deleted)"):
                        found.append((pid, line.split(None, 5)[-1].rsplit(" (deleted)", 1)[0].strip()))
                        break
        except OSError:
            continue
    return found


def cgroup_pids(directory: str | None) -> list[int]:
    """The processes of a cgroup directory (its cgroup.procs); none when it cannot be read."""
    if directory is None:
        return []
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as f:
            return [int(line) for line in f.read().split() if line.isdigit()]
    except OSError:
        return []


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
