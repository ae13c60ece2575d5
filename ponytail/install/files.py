"""The engine's config file, read and written with care: no symlinks followed, nothing
half-written (a temporary file renamed over it). What it was before ponytail is kept by
ponytail.install.undo, where no engine reads it."""

from __future__ import annotations

import os
import stat

from ponytail.errors import ConfigError, InjectionError, os_failure
from ponytail.fs.atomic import replace_file

MAX_BYTES = 4 << 20


def lstat_or_none(path: str, failing: str) -> os.stat_result | None:
    """``path``'s own status; None when it does not exist; ConfigError ``failing: why`` otherwise."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise os_failure(f"cannot read {path}", e, ConfigError) from e


def read_text(path: str) -> str | None:
    """The file's text; None when it does not exist. A symlink, a non-regular file, a file
    that is not UTF-8 or is too large is refused with one line."""
    st = lstat_or_none(path, f"cannot read {path}")
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{path} is a symlink (to {os.readlink(path)}); ponytail edits only regular files: "
            "pass the real file with --config-file"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise os_failure(f"cannot read {path}", e, ConfigError) from e
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_BYTES} bytes; refusing to edit it")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}); refusing to edit it") from e


def check_writable(path: str) -> None:
    """Refuse a file that has no write bit (someone made it read-only on purpose) or that
    lies on a read-only file system, before anything is written."""
    directory = os.path.dirname(path) or "."
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not st.st_mode & 0o222:
        raise ConfigError(
            f"{path} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); ponytail will not override that: "
            "make it writable or pass another --config-file"
        )
    probe = directory if os.path.isdir(directory) else _existing_parent(directory)
    try:
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            raise ConfigError(f"{path} is on a read-only file system; cannot change it")
    except OSError as e:
        raise os_failure(f"cannot use {directory}", e, ConfigError) from e


def _existing_parent(directory: str) -> str:
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory.rstrip("/")) or "/"
    return directory or "/"


def write_atomically(path: str, text: str, new_mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename, keeping its mode and owner (``new_mode``,
    root, for a new file)."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        replace_file(path, text.encode("utf-8"), new_mode, keep_mode=True, keep_owner=True)
    except OSError as e:
        raise os_failure(f"cannot write {path}", e, InjectionError) from e


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise os_failure(f"cannot remove {path}", e, InjectionError) from e

