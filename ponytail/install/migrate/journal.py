"""The migration's journal: the record that makes ``migrate`` and ``--undo`` one transaction.

STATE/record.json is written (fsynced, atomically) before the first change, after every original
is saved in STATE/files (a hard link on the state directory's file system, else a copy; fsynced).
For each path it holds what was there before (nothing, a link and its target, or a file by its
SHA-256, size, mode, owner and times) and what the migration leaves there (nothing, a link, or a
file: its bytes, mode and owner). Every change is one atomic step from the one to the other, so
whatever stops a run (SIGKILL, Ctrl-C, a full disk) leaves each path as it was or as it is left:
a rerun of ``migrate`` brings every path forward, ``--undo`` every path back, from any such mix.

The record decides what root writes where, so it is believed only when nobody but root can have
written it (ponytail.fs.trust, the rule configure's records follow): the state directory, its
files/ and every directory from the root down to them root's and not writable by group or others,
the record a regular file of root's that no one else may read or write. A record's path must be
one of the places a migration can touch (NVIDIA's spec directories, the engines' configs and
drop-in directories, its programs on the engines' PATH, its config), resolved inside --root; its
saved copy is always STATE/files/<the path, quoted>; a copy is restored only when its SHA-256 is
the one recorded, with the mode, owner and times of the record, never the copy's.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import stat
from urllib.parse import quote

from ponytail.cdi.files import SPEC_DIRS
from ponytail.errors import PonytailError
from ponytail.fs.atomic import replace_file
from ponytail.fs.trust import Untrusted, read_private_file, untrusted_place, untrusted_store
from ponytail.install.dockergpus import SERVICE_PATH
from ponytail.install.migrate.nvidia import BINARIES, BOOT_UNIT, BOOT_WANTS, CONFIG, ENGINE_DROP_INS, ENGINE_FILES, under

RECORD = "record.json"
FILES = "files"
VERSION = 2
MAX_RECORD = 64 << 20  # bytes: ponytail's files are in it
_CHUNK = 1 << 20
UNDO = "ponytail migrate --from nvidia --undo"
MIGRATE = "ponytail migrate --from nvidia"


def saved_name(path: str) -> str:
    return quote(path, safe="")


# --- what a path holds -------------------------------------------------------------------------

def describe(full: str) -> dict:
    """What is at the host path ``full`` now, as the record keeps it (a file by its digest)."""
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return {"kind": "nothing"}
    owner = {"uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISLNK(st.st_mode):
        return {"kind": "link", "target": os.readlink(full), **owner}
    if not stat.S_ISREG(st.st_mode):
        raise PonytailError(f"not migrating: {full} is not a regular file or a link, which could not be put back as it was; move it by hand")
    digest, size = file_digest(full)
    return {"kind": "file", "sha256": digest, "size": size, "mode": stat.S_IMODE(st.st_mode), **owner,
            "atime_ns": st.st_atime_ns, "mtime_ns": st.st_mtime_ns}


def file_digest(full: str, dir_fd: int | None = None) -> tuple[str, int]:
    """The SHA-256 and size of the regular file ``full`` (a link is not followed, nothing else opened)."""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", full)
        h, size = hashlib.sha256(), 0
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
            size += len(chunk)
        return h.hexdigest(), size
    finally:
        os.close(fd)


def holds(full: str, what: dict) -> bool:
    """Whether the host path ``full`` holds ``what`` (a record's description: nothing, a link, a file)."""
    kind = what.get("kind")
    if kind == "nothing":
        return not os.path.lexists(full)
    if kind == "link":
        return os.path.islink(full) and os.readlink(full) == what.get("target")
    try:
        return file_digest(full)[0] == what.get("sha256")
    except OSError:
        return False


def left_for(step_data: bytes | None, step_link: str | None, before: dict) -> dict:
    """What a step leaves: a link, a file (its bytes; the original's mode and owner when it was a
    file, as replace_file's keep_mode and keep_owner give), or nothing."""
    if step_link is not None:
        return {"kind": "link", "target": step_link}
    if step_data is None:
        return {"kind": "nothing"}
    left = {"kind": "file", "sha256": hashlib.sha256(step_data).hexdigest(), "data": base64.b64encode(step_data).decode(), "mode": 0o644}
    if before["kind"] == "file":
        left.update(mode=before["mode"], uid=before["uid"], gid=before["gid"])
    return left


def left_data(left: dict) -> bytes:
    data = base64.b64decode(left["data"], validate=True)
    if hashlib.sha256(data).hexdigest() != left["sha256"]:
        raise ValueError("a file's bytes do not match their digest")
    return data


# --- the places a migration can touch ---------------------------------------------------------

def known_place(root: str, path: str) -> bool:
    """Whether ``path`` (a record's, on the node) is one of the places a migration of NVIDIA's toolkit
    can have changed, both resolved inside ``root``: a .json or .yaml file of a CDI spec directory,
    an engine config or a file of its drop-in directory, one of NVIDIA's programs in a directory of
    the engines' PATH, or NVIDIA's config."""
    if not path.startswith("/") or "\0" in path or os.path.normpath(path) != path or path == "/":
        return False
    directory, name = os.path.split(under(root, path))

    def place(d: str) -> str:
        return under(root, d) if root == "/" else _followed(root, d)

    if directory in {place(d) for d in SPEC_DIRS}:
        return name.endswith((".json", ".yaml"))
    if directory in {place(d) for d in ENGINE_DROP_INS}:
        return True
    if name in BINARIES and directory in {place(d) for d in SERVICE_PATH}:
        return True
    if os.path.join(directory, name) in {os.path.join(place(os.path.dirname(p)), os.path.basename(p)) for p in (BOOT_UNIT, BOOT_WANTS)}:
        return True  # the unit that writes ponytail's spec in /var/run/cdi at boot, and its link
    return os.path.join(directory, name) in {os.path.join(place(os.path.dirname(p)), os.path.basename(p)) for p in (*ENGINE_FILES, CONFIG)}


def _followed(root: str, directory: str) -> str:
    from ponytail.fs.inroot import host_path_in_root  # ctypes: not with every command (cli.migrate loads this module)

    return host_path_in_root(root, directory, follow_last=True)


# --- the record -------------------------------------------------------------------------------

def write_record(state: str, record: dict) -> None:
    replace_file(os.path.join(state, RECORD), (json.dumps(record, indent=1) + "\n").encode(), 0o600)


def check_store(root: str, state_dir: str, doing: str) -> bool:
    """Whether the state directory is there; PonytailError when it, its files/ or a directory above it
    (up to the root) may be someone else's doing, or it is not a real directory."""
    state = under(root, state_dir)
    try:
        st = os.lstat(state)
    except FileNotFoundError:
        return False
    why = untrusted_store(st)
    where = state_dir
    if why is None:
        files = os.path.join(state, FILES)
        try:
            why = untrusted_store(os.lstat(files))
            where = os.path.join(state_dir, FILES)
        except FileNotFoundError:
            pass
    if why is None:
        inside = state if root == "/" else state[len(root.rstrip("/")):]  # under() names it by the root's own path
        found = untrusted_place(root, [inside])
        if found is not None:
            where, why = found
    if why is not None:
        raise PonytailError(
            f"{doing}: {where} (the migration's state directory, or on the way to it) is {why}: its record decides what is written "
            f"as root, so only root may change it; make it root's alone (chown root:root {where} && chmod go-w {where}), or pass --state-dir DIR"
        )
    return True


def read_record(root: str, state_dir: str, doing: str) -> dict | None:
    """The record (its entries checked), None when there is none; PonytailError (one line) when it cannot
    be believed: an untrusted store or file, not a record ponytail wrote, a path no migration touches."""
    if not check_store(root, state_dir, doing):
        return None
    state = under(root, state_dir)
    where = os.path.join(state_dir, RECORD)
    try:
        raw = read_private_file(state, RECORD, MAX_RECORD)
    except Untrusted as e:
        raise PonytailError(f"{doing}: the migration's record {e} (only a regular file of root's that no one else may read or write "
                            f"is believed); make it root's alone (chown root:root {where} && chmod 0600 {where})") from None
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        entries = record["entries"]
        if not isinstance(entries, list):
            raise TypeError("no entries")
        for entry in entries:
            _check_entry(root, state_dir, entry, record.get("version"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PonytailError(f"{doing}: {where} is not a migration record ponytail wrote ({e}); "
                            f"put back the files it names by hand from {os.path.join(state_dir, FILES)}, then remove {state_dir}") from e
    return record


def _check_entry(root: str, state_dir: str, entry: dict, version: object) -> None:
    path = entry["path"]
    if not isinstance(path, str) or not known_place(root, path):
        raise ValueError(f"it names {path!r}, which no migration of NVIDIA's toolkit touches")
    if version != VERSION:  # an earlier release's record: its copy is there, its digest unknown
        if entry.get("saved") not in (None, saved_name(path)):
            raise ValueError(f"it keeps {path}'s original as {entry.get('saved')!r}, not {saved_name(path)!r}")
        return
    for side in ("before", "left"):
        what = entry[side]
        if what["kind"] not in ("nothing", "link", "file"):
            raise ValueError(f"{path}: {side} is {what['kind']!r}")
        if what["kind"] == "link" and not isinstance(what["target"], str):
            raise ValueError(f"{path}: a link without a target")
    before, left = entry["before"], entry["left"]
    if before["kind"] == "file":
        for key in ("size", "mode", "uid", "gid", "atime_ns", "mtime_ns"):
            if not isinstance(before[key], int) or before[key] < 0:
                raise ValueError(f"{path}: {key} is {before[key]!r}")
        if before["mode"] & ~0o7777 or not isinstance(before["sha256"], str):
            raise ValueError(f"{path}: mode {before['mode']!r}")
    if left["kind"] == "file":
        left_data(left)
        if not isinstance(left["mode"], int) or left["mode"] & ~0o7777:
            raise ValueError(f"{path}: mode {left['mode']!r}")


def upgrade(root: str, state_dir: str, record: dict) -> dict:
    """An earlier release's record (its copies kept with their mode and owner; no digest, no bytes of what
    it left) in this release's form: the copies' status, and their digests as they are now."""
    if record.get("version") == VERSION:
        return record
    files = os.path.join(under(root, state_dir), FILES)
    entries = []
    for old in record["entries"]:
        saved = old.get("saved")
        before: dict = {"kind": "nothing"}
        if saved is not None:
            before = describe(os.path.join(files, saved_name(old["path"])))
            if before["kind"] == "nothing":
                raise PonytailError(f"not undoing: the saved original of {old['path']} ({os.path.join(state_dir, FILES, saved)}) is "
                                    f"missing; put it there by hand (e.g. reinstall nvidia-container-toolkit's package), then run {UNDO} again")
            if before.get("uid") not in (0, os.geteuid()):
                raise PonytailError(f"not undoing: the saved copy of {old['path']} is owned by uid {before.get('uid')}, not root: "
                                    f"its owner cannot be believed; put {old['path']} back by hand from {os.path.join(state_dir, FILES)}")
        entries.append({"path": old["path"], "before": before, "left": {**old["left"], "data": None}})
    return {**record, "version": VERSION, "entries": entries, "earlier": True}


# --- the space a run needs --------------------------------------------------------------------

def check_space(needs: dict[str, tuple[int, int]], doing: str, then: str) -> None:
    """``needs``: a host directory -> (bytes, inodes) that will be written on its file system
    (directories on one file system are added up); PonytailError when one has less free."""
    by_device: dict[int, list] = {}
    for directory, (size, inodes) in needs.items():
        dev = os.stat(directory).st_dev
        if dev in by_device:
            by_device[dev][1] += size
            by_device[dev][2] += inodes
        else:
            by_device[dev] = [directory, size, inodes]
    for directory, size, inodes in by_device.values():
        vfs = os.statvfs(directory)
        free = vfs.f_bavail * vfs.f_frsize
        if size > free or (vfs.f_files and inodes > vfs.f_favail):
            short = f"{_mib(free)} free, {_mib(size)} needed" if size > free else f"{vfs.f_favail} inodes free, {inodes} needed"
            raise PonytailError(f"{doing}: not enough space on the file system of {directory} ({short}); nothing was changed; "
                                f"free some space there, then {then}")


def rounded(size: int, block: int = 4096) -> int:
    """The blocks ``size`` bytes take, and one more for what the file system keeps of the file."""
    return (size + 2 * block - 1) // block * block


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"
