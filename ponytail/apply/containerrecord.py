"""The record of a GPU container ponytail started: what ``ponytail guard`` watches.

The prestart hook and the CDI hook write one file per container, ``<records dir>/<id>.json``
(``[guard] records``; by default ``containers/`` under ``[cache] dir``): the container's id,
its process (pid and start time, so that a reused pid is not taken for it), its cgroups (the
v1 devices path and the v2 path, from /proc/<pid>/cgroup), the device nodes it was given
(type, major, minor, path in the container), the driver version and the libcuda (path and
identity) it was given, and which start path made it. Files are root's alone: 0600, in a 0700
directory that only root may change (ponytail.fs.trust), replaced atomically (ponytail.fs.atomic),
so that the guard, which runs as root and edits cgroups from them, believes nothing another
user could have written. They are not fsynced: a record describes a running process, which a
crash ends too, and an fsync is the one costly step of writing it.

Writing costs a hook start one small file (tmpfs) and two reads of /proc; a record that
cannot be written is a warning in the log, never a failed start. The guard removes the
record of a container that is gone, and one start in 64 does too (``prune_records``), so
that records do not pile up where no guard runs.
"""

from __future__ import annotations

import os

from ponytail.lite.plainjson import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

RECORD_VERSION = 1
SUFFIX = ".json"
MAX_RECORD_BYTES = 1 << 16
PRUNE_CHANCE = 4  # of 256: one start in 64 also removes the records of containers that are gone
_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def record_container(
    directory: str, container_id: str, pid: int, started_by: str, devices: Iterable[tuple[str, int, int, str]],
    driver_version: str, libcuda: dict[str, object] | None = None, spec_driver_version: str = "",
) -> str:
    """Write the record of container ``container_id`` (process ``pid``) into ``directory``; the
    file's path (OSError when it cannot be written, ValueError for an id that is no file name)."""
    name = record_name(container_id)
    text = read_small(f"/proc/{pid}/cgroup")
    data = {
        "version": RECORD_VERSION,
        "id": container_id,
        "started_by": started_by,
        "pid": pid,
        "pid_start": process_start(pid),
        "cgroup": cgroup_paths(text),
        "devices": [{"type": t, "major": major, "minor": minor, "path": path} for t, major, minor, path in devices],
        "driver_version": driver_version,
        "libcuda": libcuda,
        "spec_driver_version": spec_driver_version,
    }
    from ponytail.fs.atomic import replace_file

    dir_fd = open_records_dir(directory, create=True)
    try:
        replace_file(name, (dumps(data) + "\n").encode(), 0o600, dir_fd=dir_fd, durable=False)  # no fsync: see the docstring
        if os.urandom(1)[0] < PRUNE_CHANCE:
            prune_records(dir_fd)
    finally:
        os.close(dir_fd)
    return os.path.join(directory, name)


def prune_records(dir_fd: int) -> int:
    """Remove the records of containers whose process is gone (and temporary files of killed writers);
    how many went. The guard does this on each pass; a start does it now and then too, so that
    records do not pile up in /run on a node where no guard runs."""
    from ponytail.fs.atomic import writer_pid
    from ponytail.lite.plainjson import loads_plain

    removed = 0
    for name in os.listdir(dir_fd):
        gone = False
        if name.endswith(SUFFIX) and not name.startswith("."):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                record = loads_plain(os.read(fd, MAX_RECORD_BYTES))
            except OSError:
                record = None
            finally:
                os.close(fd)
            if isinstance(record, dict) and isinstance(record.get("pid"), int) and isinstance(record.get("pid_start"), int):
                gone = process_start(record["pid"]) != record["pid_start"]
        else:
            pid = writer_pid(name)
            gone = pid is not None and process_start(pid) == -1
        if gone:
            try:
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
            except OSError:
                pass
    return removed


def record_name(container_id: str) -> str:
    """The record's file name: the id itself (engines' ids are such names), else ValueError."""
    if not 0 < len(container_id) <= 200 or container_id[0] == "." or not set(container_id) <= _NAME_CHARACTERS:
        raise ValueError(f"container id {container_id!r} is not a plain name; not recorded")
    return container_id + SUFFIX


def open_records_dir(directory: str, create: bool = False) -> int:
    """The records directory, root's alone (ponytail.fs.trust); made 0700 when asked. OSError or
    ponytail.fs.trust.Untrusted (an OSError too: EPERM) when it cannot be used."""
    from ponytail.fs.trust import Untrusted, open_private_dir

    above = os.path.dirname(os.path.abspath(directory))
    if create:
        try:
            os.mkdir(above, 0o700)  # [cache] dir, as the probe cache makes it: a node whose first GPU start is a CDI one
        except FileExistsError:
            pass
    parent = os.stat(above)
    if parent.st_uid not in (0, os.geteuid()) or parent.st_mode & 0o022 and not parent.st_mode & 0o1000:
        # another user could rename the directory away and put one of theirs in its place
        raise PermissionError(1, f"the directory above {directory} is not root's alone (mode {parent.st_mode & 0o7777:04o}, uid {parent.st_uid})", directory)
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    try:
        fd = open_private_dir(directory)
    except Untrusted as e:
        raise PermissionError(1, str(e), directory) from None
    if os.fstat(fd).st_mode & 0o077:
        os.close(fd)
        raise PermissionError(1, f"records directory {directory} is not 0700", directory)
    return fd


def process_start(pid: int) -> int:
    """The start time of process ``pid`` (clock ticks after boot, /proc/<pid>/stat's 22nd field); -1 when gone."""
    try:
        text = read_small(f"/proc/{pid}/stat")
    except OSError:
        return -1
    fields = text.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else -1


def cgroup_paths(text: str) -> dict[str, str | None]:
    """{"v1": the devices cgroup path, "v2": the unified path} from a /proc/<pid>/cgroup text."""
    v1 = v2 = None
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path
        elif "devices" in controllers.split(","):
            v1 = path
    return {"v1": v1, "v2": v2}


def read_small(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(65536)
