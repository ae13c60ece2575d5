"""The driver-root search of the probe, remembered between container starts.

What the probe finds under the driver root (libraries with their ELF headers, binaries,
ICD files, firmware: ``find_libraries``, ``find_binary``, ``find_files``) is most of
its time and does not change between two container starts on one host. It is kept in
one file per key, ``probe-<hash of the key>.cache`` in the cache directory (``[cache]
dir``, default /run/ponytail, a tmpfs: a reboot starts afresh; the MAX_ENTRIES most
recent are kept), and served only when all of this still holds:

- the key is the same: the driver root, the driver version the files must match (a
  driver upgrade changes /proc/driver/nvidia/version), the capabilities, the -libs
  globs, the config's library globs and extra names, the machine, and the identity of
  the search code itself (a ponytail upgrade);
- every witness is as it was: the driver root's ld.so.cache, each directory searched
  and every directory above it up to the driver root (a file added, removed, renamed or
  relinked in any of them changes its mtime), and each file found or skipped (a file
  rewritten in place changes its mtime and ctime), compared by device, inode, type, size,
  mtime and ctime, without following links (and, for a link, what it leads to as well).

The GPUs, device nodes, /proc files and MIG state are never cached: the probe reads
them on every run, so a new or removed GPU or a MIG change is always seen.

The file is checked like any other input: the directory and the file must belong to
root (or this user) and be writable by no one else, the file is opened without
following a link, bounded in size, and its content must have exactly the expected
shape; anything else is ignored (never trusted, never an error) and replaced by the
next run that can write. A write goes to a temporary file renamed into place, so a
reader sees the old file or the new one; concurrent runs at worst lose an entry. A
search during which a witness changed (a driver being installed) is not remembered.
Searches whose directories hold glob characters are not cached.
"""

from __future__ import annotations

import marshal
import os
import stat
import time

from ponytail.fs.hostfiles import under_root

PREFIX, SUFFIX = "probe-", ".cache"
FORMAT = 1
MAX_BYTES = 1 << 20
# the modules whose code decides what a search finds, relative to the ponytail package (host/features:
# versions_named, which decides whether a binary of another driver is skipped)
SEARCH_CODE = ("host/driver_files", "host/driver_search", "host/features", "host/probe", "host/elf", "host/ldcache", "host/probecache", "fs/inroot", "fs/hostfiles", "capabilities")
MAX_ENTRIES = 32  # the most recent keys remembered: driver roots × capability sets × ponytail installs (pip, binary)
_PRIME = (1 << 61) - 1  # the file name's hash: the key's bytes as a number, modulo this
_MAGIC = "*?["
# a file system stamps a change with a clock that may lag by a tick (1-10 ms): a witness changed
# less than this before the search began may have changed during it
RACY_NS = 20_000_000

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ponytail.host.driver_files import DriverFile, FoundFiles


def cached_search(
    cache_dir: str, driver_root: str, key: tuple, search_dirs: tuple[str, ...], search: Callable[[], FoundFiles]
) -> FoundFiles:
    """``search()``'s result, from the cache when its key and witnesses still hold; else
    searched and remembered. ``search_dirs``: the in-root directories the search lists
    (and globs); ``key``: everything else the result depends on."""
    if not cache_dir or not cache_dir.startswith("/") or any(c in d for d in search_dirs for c in _MAGIC):
        return search()
    key = (FORMAT, driver_root, _code_identity(), *key)
    name = f"{PREFIX}{int.from_bytes(repr(key).encode(), 'little') % _PRIME:016x}{SUFFIX}"
    entry = _read(cache_dir, name)
    if entry is not None and entry[0] == key and _valid_entry(entry[1], entry[2]) and _unchanged(entry[1]):
        return _decode(entry[2])
    started = time.time_ns()
    found = search()
    in_root = {"/etc/ld.so.cache", *search_dirs, *(f.path for f in (*found.libraries, *found.binaries, *found.files))}
    in_root.update(s.path for s in found.skipped)
    in_root.update(f.target for f in found.files)  # found by a glob: the path that matched
    in_root.update(p for r in found.reports for p in (*r.matches, *r.from_cache))
    paths: set[str] = set()
    for p in in_root:
        if p.startswith("/"):  # not a binary's bare name (not found: its directories are witnesses)
            paths.update(_with_parents(driver_root, p))
    witnesses = tuple((p, _signature(p)) for p in sorted(paths))
    if not any(_changed_since(s, started - RACY_NS) for _, s in witnesses):  # else a later run remembers it
        _write(cache_dir, name, (key, witnesses, _encode(found)))
    return found


def _with_parents(root: str, path: str) -> list[str]:
    """``path`` inside ``root`` and every directory above it up to the root, as host paths."""
    out = []
    while True:
        out.append(under_root(root, path) if path != "/" else root)
        if path in ("/", ""):
            return out
        path = os.path.dirname(path)


def _signature(path: str) -> tuple | None:
    """The identity of ``path`` (and of what a link leads to); None when it does not exist."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    own = (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if not stat.S_ISLNK(st.st_mode):
        return own
    try:
        st = os.stat(path)
    except OSError:
        return (*own, None)
    return (*own, (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


def _changed_since(signature: tuple | None, ns: int) -> bool:
    """Whether the inode (or a link's target) changed at ``ns`` or later (its ctime): the
    driver root was being changed while it was searched (a driver being installed), and
    what was found may be half old, half new."""
    if signature is None:
        return False
    target = signature[6] if len(signature) == 7 else None
    return signature[5] >= ns or (target is not None and target[5] >= ns)


def _unchanged(witnesses: tuple) -> bool:
    for path, signature in witnesses:
        if _signature(path) != signature:
            return False
    return True


def _code_identity() -> tuple:
    """The search code's own files (``SEARCH_CODE``; .py or the binary's .pyc): a ponytail
    upgrade or an edit never reads what an older search found."""
    from ponytail.host import driver_files

    package, extension = os.path.dirname(os.path.dirname(driver_files.__file__)), os.path.splitext(driver_files.__file__)[1]
    names = [f"{package}/{m}{extension}" for m in SEARCH_CODE]
    out: list = []
    for name in names:
        try:
            st = os.stat(name)
            out += [name, st.st_size, st.st_mtime_ns]
        except OSError:
            out.append(None)
    return tuple(out)


# -- the file ---------------------------------------------------------------------------


def _open_dir(cache_dir: str) -> int | None:
    """The cache directory, if it is a real directory that only root (or this user) may change."""
    from ponytail.fs.trust import Untrusted, open_private_dir

    try:
        return open_private_dir(cache_dir)
    except (OSError, Untrusted):
        return None


def _read(cache_dir: str, name: str) -> tuple | None:
    """The cache file's entry (key, witnesses, payload), or None for anything odd."""
    from ponytail.fs.trust import Untrusted, read_private_file

    try:
        data = read_private_file(cache_dir, name, MAX_BYTES)
    except Untrusted:
        return None
    if data is None or not bounded_marshal(data):
        return None
    try:
        entry = marshal.loads(data)  # noqa: S302 - root's own file (checked above), walked by bounded_marshal, its shape checked below
    except (ValueError, EOFError, TypeError, MemoryError, RecursionError):
        return None
    return entry if type(entry) is tuple and len(entry) == 3 and type(entry[0]) is tuple else None


# marshal's type codes of what the cache stores (Python/marshal.c), with or without FLAG_REF (0x80),
# by kind: 1 None, 2 a short string (a 1-byte length), 3 a string (4-byte length), 4 an int (4 bytes),
# 5 a long (a 4-byte count of 2-byte digits), 6 a small tuple (a 1-byte count), 7 a tuple (4-byte
# count), 8 a reference to an earlier value; 0 anything else
_KINDS = bytearray(256)
for _code, _kind in (("N", 1), ("z", 2), ("Z", 2), ("a", 3), ("A", 3), ("u", 3), ("t", 3), ("i", 4), ("l", 5), (")", 6), ("(", 7)):
    _KINDS[ord(_code)] = _KINDS[ord(_code) | 0x80] = _kind
_KINDS[ord("r")] = 8
_MAX_DEPTH = 8  # the entry nests 5 deep


def bounded_marshal(data: bytes) -> bool:
    """Whether ``data`` is one marshalled value of the kinds the cache stores (None, ints,
    strings, tuples, back-references to earlier values) whose every length and count fits in
    what is left of ``data``, nested at most _MAX_DEPTH deep, with nothing after it.
    marshal.loads allocates a tuple (or a long) by the count in its header before it reads an
    item: a 6-byte file whose header said a billion items cost 25 s and 9.6 GB. After this walk,
    linear in ``data``, what marshal builds is never larger than ``data`` times a pointer."""
    end, pos, refs, kinds = len(data), 0, 0, _KINDS
    pending: list[int] = [1]
    left = 1  # the items still to read in the innermost open tuple (pending[-1], kept in a local)
    while True:
        if left == 0:
            pending.pop()
            if not pending:
                return pos == end
            left = pending[-1]
            continue
        left -= 1
        if pos >= end:
            return False
        code = data[pos]
        kind = kinds[code]
        refs += code >> 7  # FLAG_REF: the value is remembered for later references
        if kind == 2:
            if pos + 1 >= end:
                return False
            pos += 2 + data[pos + 1]
        elif kind == 8:
            if int.from_bytes(data[pos + 1:pos + 5], "little") >= refs or pos + 5 > end:
                return False
            pos += 5
        elif kind == 6 or kind == 7:
            if kind == 6:
                size, pos = (data[pos + 1] if pos + 1 < end else end), pos + 2
            else:
                size, pos = int.from_bytes(data[pos + 1:pos + 5], "little"), pos + 5
            if size > end - pos or len(pending) > _MAX_DEPTH:
                return False
            pending[-1] = left
            pending.append(size)
            left = size
        elif kind == 3:
            pos += 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
        elif kind == 4:
            pos += 5
        elif kind == 5:
            pos += 5 + 2 * abs(int.from_bytes(data[pos + 1:pos + 5], "little", signed=True))
        elif kind != 1:
            return False
        else:
            pos += 1
        if pos > end:
            return False


def _write(cache_dir: str, name: str, entry: tuple) -> None:
    """Replace the cache file atomically; any failure (not root, a full /run) leaves no trace."""
    from ponytail.fs.atomic import replace_file  # a cache miss only: a warm start never writes

    try:
        os.mkdir(cache_dir, 0o700)
    except OSError:
        pass
    dir_fd = _open_dir(cache_dir)
    if dir_fd is None:
        return
    try:
        replace_file(name, marshal.dumps(entry), 0o600, dir_fd=dir_fd)
        _tidy(dir_fd)
    except (OSError, ValueError):
        pass
    finally:
        os.close(dir_fd)


def _tidy(dir_fd: int) -> None:
    """The MAX_ENTRIES newest cache files kept, and no temporary file of a writer killed
    before its rename (a SIGKILLed hook)."""
    from ponytail.fs.atomic import writer_pid

    caches = []
    for name in os.listdir(dir_fd):
        if name.startswith(PREFIX) and name.endswith(SUFFIX):
            try:
                caches.append((os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns, name))
            except OSError:
                pass
            continue
        pid = writer_pid(name)
        if pid is None or not name.startswith(f".{PREFIX}"):
            continue
        try:
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except OSError:  # alive, another user's
            continue
        _unlink(name, dir_fd)
    for _, name in sorted(caches)[:-MAX_ENTRIES]:
        _unlink(name, dir_fd)


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


# -- what is stored: plain tuples of strings and numbers, checked before use -------------


def _encode(found: FoundFiles) -> tuple:
    return (
        tuple(_file(f) for f in found.libraries),
        tuple((r.search, tuple(r.matches), tuple(r.from_cache)) for r in found.reports),
        tuple((s.path, s.reason) for s in found.skipped),
        tuple(_file(f) for f in found.binaries),
        tuple(_file(f) for f in found.files),
    )


def _file(f: DriverFile) -> tuple:
    return (f.path, f.host_path, f.target, f.soname, f.found_by, f.bits, f.needed, f.capability)


def _decode(payload: tuple) -> FoundFiles:
    from ponytail.host.driver_files import DriverFile, FoundFiles, SearchReport, SkippedFile

    libraries, reports, skipped, binaries, files = payload
    return FoundFiles(
        tuple(DriverFile(*f) for f in libraries),
        tuple(SearchReport(*r) for r in reports),
        tuple(SkippedFile(*s) for s in skipped),
        tuple(DriverFile(*f) for f in binaries),
        tuple(DriverFile(*f) for f in files),
    )


def _strings(value: object, n: int | None = None) -> bool:
    return type(value) is tuple and (n is None or len(value) == n) and all(type(x) is str for x in value)


def _valid_file(f: object) -> bool:
    return (
        type(f) is tuple and len(f) == 8 and _strings(f[:3]) and (f[3] is None or type(f[3]) is str)
        and type(f[4]) is str and f[5] in (32, 64) and type(f[5]) is int and _strings(f[6]) and type(f[7]) is str
    )


def _valid_payload(p: object) -> bool:
    if type(p) is not tuple or len(p) != 5 or not all(type(part) is tuple for part in p):
        return False
    libraries, reports, skipped, binaries, files = p
    return (
        all(_valid_file(f) for f in (*libraries, *binaries, *files))
        and all(type(r) is tuple and len(r) == 3 and type(r[0]) is str and _strings(r[1]) and _strings(r[2]) for r in reports)
        and all(_strings(s, 2) for s in skipped)
    )


def _valid_signature(s: object) -> bool:
    if s is None:
        return True
    if type(s) is not tuple or len(s) not in (6, 7) or not all(type(x) is int for x in s[:6]):
        return False
    return len(s) == 6 or s[6] is None or (type(s[6]) is tuple and len(s[6]) == 6 and all(type(x) is int for x in s[6]))


def _valid_entry(witnesses: object, payload: object) -> bool:
    return (
        type(witnesses) is tuple
        and all(type(w) is tuple and len(w) == 2 and type(w[0]) is str and _valid_signature(w[1]) for w in witnesses)
        and _valid_payload(payload)
    )
