"""The record of a GPU container ponytail started: what ``ponytail guard`` watches.

The prestart hook, the CDI hook and NVIDIA's hook names write one file per container,
``<records dir>/<id>.json`` (``[guard] records``; by default ``containers/`` under ``[cache] dir``):
the container's id, its process (pid and start time, so that a reused pid is not taken for it),
its cgroups (the v1 devices path and the v2 path, from /proc/<pid>/cgroup, and the inode of the
cgroup namespace those paths are relative to), the device nodes it was given (type, major,
minor, path in the container), the driver version and the libcuda (path and identity) it was
given, and which start path made it. A CDI hook runs inside the container's cgroup namespace,
where its own cgroup reads as ``/``: it reads the paths from the host's cgroup namespace
(its runtime's, entered with setns) where it may, else records its own and the guard reads the
host's view of the pinned process itself. Files are root's alone: 0600, in a 0700 directory that
only root may change (ponytail.fs.trust), replaced atomically (ponytail.fs.atomic), so that the
guard, which runs as root and edits cgroups from them, believes nothing another user could have
written. They are not fsynced: a record describes a running process, which a crash ends too, and
an fsync is the one costly step of writing it.

Writing costs a hook start one small file (tmpfs) and a few reads of /proc; a record that
cannot be written is a warning in the log, never a failed start. The guard removes the
record of a container that is gone, and one start in 64 does too (``prune_records``), so
that records do not pile up where no guard runs. A record is removed only if it is still the
file that was read (``remove_record``): a container restarted under the same id keeps its new
one. A record that is not JSON at all (a file cut short) is removed as well.

Beside a record, ``<id>.xids`` holds the GPU errors (Xids) that ``ponytail dra-plugin`` attributed
to the container (``note_xid``), the latest ``MAX_XIDS``; it names the record's process (pid and start
time), so that a container restarted under the same id does not inherit them. It is written and trusted
as the records are; the guard shows it (``read_xids``) and removes it with its record.
"""

from __future__ import annotations

import os

from ponytail.fs.hostfiles import read_head
from ponytail.lite.plainjson import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

RECORD_VERSION = 1
SUFFIX = ".json"
XIDS_SUFFIX = ".xids"  # the Xids attributed to a container, beside its record
MAX_XIDS = 16
MAX_RECORD_BYTES = 1 << 16
PRUNE_CHANCE = 4  # of 256: one start in 64 also removes the records of containers that are gone
_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def record_container(
    directory: str, container_id: str, pid: int, started_by: str, devices: Iterable[tuple[str, int, int, str]],
    driver_version: str, libcuda: dict[str, object] | None = None, spec_driver_version: str = "", in_container: bool = False,
) -> str:
    """Write the record of container ``container_id`` (process ``pid``) into ``directory``; the
    file's path (OSError when it cannot be written, ValueError for an id that is no file name).
    ``in_container``: written by a hook that runs in the container's namespaces (``host_cgroup_namespace``)."""
    name = record_name(container_id)
    namespace = host_cgroup_namespace(in_container)
    text = read_head(f"/proc/{pid}/cgroup")
    data = {
        "version": RECORD_VERSION,
        "id": container_id,
        "started_by": started_by,
        "pid": pid,
        "pid_start": process_start(pid),
        "cgroup": cgroup_paths(text),
        "cgroup_ns": namespace,
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
    """Remove the records of containers whose process is gone, records cut short (not JSON), and
    temporary files of killed writers; how many went. The guard does this on each pass; a start
    does it now and then too, so that records do not pile up in /run on a node where no guard runs."""
    from ponytail.fs.atomic import writer_pid
    from ponytail.fs.trust import Untrusted

    removed = 0
    for name in os.listdir(dir_fd):
        if name.endswith(SUFFIX) and not name.startswith("."):
            try:
                read = read_record(dir_fd, name)
            except Untrusted:
                continue  # not root's: the guard says so; never removed on its word
            if read is None:
                continue
            record, identity = read
            if record is CUT_SHORT or isinstance(record, dict) and record_gone(record):
                if remove_record(dir_fd, name, identity):
                    removed += 1
                    remove_xids(dir_fd, name)
            continue
        pid = writer_pid(name)
        if pid is not None and process_start(pid) == -1:
            try:
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
            except OSError:
                pass
    return removed


CUT_SHORT = "cut short"  # read_record's answer for a file that is not JSON at all


def read_record(dir_fd: int, name: str, directory: str = "") -> tuple[object, tuple[int, int]] | None:
    """The record ``name`` of the open records directory (``directory`` names it in messages), parsed
    (a dict, other JSON, or CUT_SHORT for a file that is not JSON: one cut short), and the (device,
    inode) of the file read; None when it is gone or cannot be read. Untrusted (ponytail.fs.trust)
    for a file another user could have written (not a regular file, another owner, a group or other
    bit, larger than a record)."""
    from ponytail.fs.trust import read_private_at
    from ponytail.lite.plainjson import loads_plain

    read = read_private_at(dir_fd, name, MAX_RECORD_BYTES, directory or "records")
    if read is None:
        return None
    data, st = read
    record = loads_plain(data)
    if record is None:  # not plain JSON: json itself says whether it is JSON at all (rare: json's import is not paid otherwise)
        import json

        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            record = CUT_SHORT
    return record, (st.st_dev, st.st_ino)


def record_gone(record: dict) -> bool:
    """Whether the process a record names has ended (or its pid is another process's now)."""
    pid, start = record.get("pid"), record.get("pid_start")
    return isinstance(pid, int) and isinstance(start, int) and process_start(pid) != start


def remove_record(dir_fd: int, name: str, identity: tuple[int, int]) -> bool:
    """Remove the record ``name`` only if it is still the file ``identity`` (device, inode) that was
    read: it is first renamed aside, then looked at; a newer record (the container restarted under
    the same id, its hook wrote again meanwhile) is put back, unless an even newer one came."""
    from ponytail.fs.atomic import temporary_name

    aside = temporary_name(name)  # a hidden name with this process's pid: pruned if this one is killed here
    try:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.stat(aside, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != identity:
            try:
                os.link(aside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)  # never over a newer one
            except FileExistsError:
                pass
            return False
        return True
    finally:
        try:
            os.unlink(aside, dir_fd=dir_fd)
        except OSError:
            pass


def trusted_records(directory: str) -> Iterator[tuple[str, dict]]:
    """(file name, record) of each record in ``directory`` that the guard would trust (root's own
    files in root's own directory; any other file is passed over), in name order. Only reads; none
    when the directory cannot be opened."""
    from ponytail.fs.trust import Untrusted

    try:
        dir_fd = open_records_dir(directory)
    except OSError:
        return
    try:
        for name in sorted(os.listdir(dir_fd)):
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            try:
                read = read_record(dir_fd, name)
            except Untrusted:
                continue
            if read is not None and isinstance(read[0], dict):
                yield name, read[0]
    finally:
        os.close(dir_fd)


def container_of(directory: str, pid: int) -> dict | None:
    """The record of the running container whose process is ``pid`` (its start time checked), or None:
    how another part of ponytail maps a process to the container ponytail started."""
    start = process_start(pid)
    for _, record in trusted_records(directory):
        if record.get("pid") == pid and record.get("pid_start") == start != -1:
            return record
    return None


def note_xid(directory: str, record: dict, xid: dict) -> None:
    """Add ``xid`` (plain JSON: the Xid, its GPU, time, pid...) to the Xids noted for the container of
    ``record`` (as read from ``directory``); OSError or ValueError when it cannot be written."""
    from ponytail.fs.atomic import replace_file
    from ponytail.fs.trust import Untrusted

    name = xids_name(record_name(str(record.get("id", ""))))
    dir_fd = open_records_dir(directory)
    try:
        try:
            earlier = read_xids(dir_fd, record)
        except Untrusted:
            earlier = []  # replaced: the directory is root's, the file in it is not believed
        data = {"pid": record.get("pid"), "pid_start": record.get("pid_start"), "xids": [*earlier, xid][-MAX_XIDS:]}
        replace_file(name, (dumps(data) + "\n").encode(), 0o600, dir_fd=dir_fd, durable=False)
    finally:
        os.close(dir_fd)


def read_xids(dir_fd: int, record: dict) -> list[dict]:
    """The Xids noted for the container of ``record`` in the open records directory: [] when none are,
    or the note is another process's (an earlier container of the same id). Untrusted as read_record."""
    from ponytail.fs.trust import read_private_at
    from ponytail.lite.plainjson import loads_plain

    try:
        name = xids_name(record_name(str(record.get("id", ""))))
    except ValueError:
        return []
    read = read_private_at(dir_fd, name, MAX_RECORD_BYTES, "records")
    note = loads_plain(read[0]) if read else None
    if not isinstance(note, dict) or note.get("pid") != record.get("pid") or note.get("pid_start") != record.get("pid_start"):
        return []
    xids = note.get("xids")
    return [x for x in xids if isinstance(x, dict) and isinstance(x.get("xid"), int)][-MAX_XIDS:] if isinstance(xids, list) else []


def xids_name(record: str) -> str:
    """The file of the Xids noted beside the record file ``record``."""
    return record.removesuffix(SUFFIX) + XIDS_SUFFIX


def remove_xids(dir_fd: int, name: str) -> None:
    """Remove the Xids noted beside record ``name`` (its record is gone)."""
    try:
        os.unlink(xids_name(name), dir_fd=dir_fd)
    except OSError:
        pass


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
        text = read_head(f"/proc/{pid}/stat")
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


def host_cgroup_namespace(in_container: bool) -> int:
    """The inode of the cgroup namespace this process reads /proc/<pid>/cgroup in (0 when unknown).
    ``in_container``: a CDI hook, which runs in the container's cgroup namespace, where its cgroup is
    ``/``: it first enters its runtime's (the nearest ancestor's in another one: the namespace the
    prestart hook and the guard read in), so that the record holds the cgroup as the host sees it.
    A process that may not enter it (a rootless engine's hook) stays; the guard then reads the host's
    view of the pinned process itself."""
    try:
        own = os.stat("/proc/self/ns/cgroup").st_ino
    except OSError:
        return 0
    if not in_container:
        return own
    pid = parent_pid("self")
    for _ in range(_ANCESTORS):
        if pid <= 1:
            break
        try:
            fd = os.open(f"/proc/{pid}/ns/cgroup", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            break
        try:
            theirs = os.fstat(fd).st_ino
            if theirs != own:
                from ponytail.fs.libc import libc

                return theirs if libc().setns(fd, CLONE_NEWCGROUP) == 0 else own
        finally:
            os.close(fd)
        pid = parent_pid(str(pid))
    return own


def parent_pid(pid: str) -> int:
    """The parent of process ``pid`` ("self" too) as /proc names it (the host's pids: a hook runs
    with the host's /proc); 0 when it cannot be read."""
    fields = read_head(f"/proc/{pid}/stat", 4096, default="").rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


_ANCESTORS = 4  # the hook, the runtime's init (the container's process), the runtime: two steps up; a little more for wrappers
CLONE_NEWCGROUP = 0x02000000
