"""The driver's own list of the files a container needs: recent drivers install
``/usr/share/nvidia/files.d/sandboxutils-filelist.json`` under the driver root. Its format is
not documented, so the reader is tolerant and assumes only this much:

- the document is a list of entries, or an object holding that list under ``files``,
  ``entries`` or ``filelist``;
- an entry is an object with the file's absolute path under ``path`` (or ``file``, ``name``)
  and what it is for under ``capability``, ``capabilities``, ``type`` or ``category`` (a
  string or a list of strings); a driver capability name there (compute, utility, graphics,
  video, display, ngx) is the capability it is injected for; an entry naming none is ignored.

The file is root's but its content is data, never trusted further: only a plain absolute
path (no ``..``, no glob characters) is taken, resolved inside the driver root like every
other driver file; anything else is skipped with its reason. No list, or an unreadable one,
changes nothing: the capability tables (ponytail.capabilities) still decide.
"""

from __future__ import annotations

import os

from ponytail.fs.hostfiles import under_root
from ponytail.host.driver_files import FILELIST, _open_root

MAX_BYTES = 1 << 20
_LIST_KEYS = ("files", "entries", "filelist")
_PATH_KEYS = ("path", "file", "name")
_WHAT_KEYS = ("capability", "capabilities", "type", "category")


def read_filelist(driver_root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(path, capability) for each usable entry of the driver root's file list, and what was
    skipped and why. Both empty when the driver ships no list."""
    if not os.path.lexists(under_root(driver_root, FILELIST)):
        return [], []  # most drivers: one lstat, and the in-root resolution stays unimported on the hook's path
    from ponytail.fs.inroot import real_path_in_root

    root_fd = _open_root(driver_root)
    if root_fd is None:
        return [], []
    try:
        real = real_path_in_root(root_fd, FILELIST)
    finally:
        os.close(root_fd)
    if real is None:
        return [], []
    try:
        fd = os.open(under_root(driver_root, real), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            import stat

            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return [], [f"{FILELIST}: not a regular file"]
            raw = os.read(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as e:
        return [], [f"{FILELIST}: cannot read: {e.strerror}"]
    if len(raw) > MAX_BYTES:
        return [], [f"{FILELIST}: larger than {MAX_BYTES} bytes, ignored"]
    return parse_filelist(raw)


def parse_filelist(raw: bytes) -> tuple[list[tuple[str, str]], list[str]]:
    """The entries of a file list's bytes (see the module's note on the format)."""
    from ponytail.capabilities import CAPABILITIES
    from ponytail.lite.plainjson import loads

    try:
        document = loads(raw)
    except (ValueError, RecursionError) as e:  # json's error (a ValueError), also for bad UTF-8
        return [], [f"{FILELIST}: not JSON ({e}), ignored"]
    if isinstance(document, dict):
        document = next((document[k] for k in _LIST_KEYS if isinstance(document.get(k), list)), None)
    if not isinstance(document, list):
        return [], [f"{FILELIST}: no list of entries found, ignored"]
    found: list[tuple[str, str]] = []
    skipped: list[str] = []
    for entry in document:
        if not isinstance(entry, dict):
            continue
        path = next((entry[k] for k in _PATH_KEYS if isinstance(entry.get(k), str)), None)
        what = next((entry[k] for k in _WHAT_KEYS if k in entry), None)
        names = [what] if isinstance(what, str) else [w for w in what if isinstance(w, str)] if isinstance(what, list) else []
        caps = [n.strip().lower() for n in names if n.strip().lower() in CAPABILITIES]
        if path is None or not caps:
            continue
        if not _plain_absolute(path):
            skipped.append(f"{FILELIST}: entry {path!r} is not a plain absolute path, skipped")
            continue
        found += [(path, cap) for cap in dict.fromkeys(caps)]
    return found, skipped


def missing_from_tables(entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The entries the capability tables would not find: a library whose name is none of its
    capability's library names, a file no glob of its capability matches."""
    if not entries:
        return []  # no list (most hosts): fnmatch stays unimported on the hook's path
    import fnmatch

    from ponytail.capabilities import CAPABILITIES

    missing = []
    for path, cap in entries:
        table = CAPABILITIES[cap]
        name = os.path.basename(path)
        stem = name.split(".so")[0]
        if ".so" in name and stem in table.libraries or name in table.binaries:
            continue
        if any(fnmatch.fnmatchcase(path, g) for g in table.files):
            continue
        missing.append((path, cap))
    return missing


def _plain_absolute(path: str) -> bool:
    return path.startswith("/") and os.path.normpath(path) == path and not any(c in path for c in "*?[\n\0")
