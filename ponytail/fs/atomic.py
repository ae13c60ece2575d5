"""The one atomic-replace writer: a reader sees the old file or the new one, never half of it,
and nothing another user planted in the directory can capture the write.

Every file ponytail replaces on the host goes through ``replace_file`` (the hooks.d file, a CDI
spec, a bundle's config.json, an engine's configuration, the CUDA-version and probe caches):

- the temporary file is created next to the target, under a random name, with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``: a file, FIFO, device or symlink already at that name is
  never opened (another random name is tried), so a user who can write the directory cannot
  hold the file ponytail writes, nor make it block on a FIFO;
- the data is written in full (a short write is continued), the mode (and owner, when asked)
  set on the descriptor, the file fsynced, renamed over the target, and the directory fsynced;
- on any failure, an interrupt included, the temporary file is removed and the error raised.

Only ``os`` (and the built-in errno, stat) is imported: the probe cache writes through it on a hook's first start.
"""

from __future__ import annotations

import errno
import os
import stat

TEMPORARY_SUFFIX = ".tmp"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_TRIES = 16


def replace_file(
    path: str,
    data: bytes,
    mode: int = 0o644,
    *,
    keep_mode: bool = False,
    keep_owner: bool = False,
    owner: tuple[int, int] | None = None,
    dir_fd: int | None = None,
    durable: bool = True,
) -> None:
    """Replace ``path`` by a new file holding ``data``, atomically (OSError on failure).

    ``mode`` (and ``owner``, a (uid, gid), when given) are set on the new file; with
    ``keep_mode`` (``keep_owner``), a regular file already at ``path`` lends its mode (owner)
    instead. With ``dir_fd``, ``path`` is a name in that open directory. ``durable`` False skips the
    two fsyncs: still atomic for readers, but not kept through a crash (a file about running processes,
    which a crash ends too: the containers' records on the hook's path)."""
    if dir_fd is None:
        directory, name = os.path.split(os.path.abspath(path))
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            replace_file(name, data, mode, keep_mode=keep_mode, keep_owner=keep_owner, owner=owner, dir_fd=fd, durable=durable)
        finally:
            os.close(fd)
        return
    if keep_mode or keep_owner:
        try:
            st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode) if keep_mode else mode
                owner = (st.st_uid, st.st_gid) if keep_owner else owner
    temporary, fd = _create_temporary(path, dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temporary, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if durable:
        os.fsync(dir_fd)


def replace_with_symlink(target: str, path: str) -> None:
    """Make ``path`` a symbolic link saying ``target``, atomically (OSError on failure): the link
    is made under a fresh temporary name beside it (``symlink`` never follows or reuses what is
    at that name) and renamed over ``path``, so there is never a moment without it, nor half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    for _ in range(_NAME_TRIES):
        temporary = os.path.join(directory, temporary_name(os.path.basename(path)))
        try:
            os.symlink(target, temporary)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"no free temporary name after {_NAME_TRIES} tries", path)
    try:
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def temporary_name(name: str) -> str:
    """A fresh name for the temporary file of ``name``: hidden, not ending in the target's
    extension (hooks.d and CDI readers skip it), with the writer's pid (``writer_pid``)."""
    return f".{name}.{os.getpid()}-{os.urandom(6).hex()}{TEMPORARY_SUFFIX}"


def writer_pid(name: str) -> int | None:
    """The pid of the process that made the temporary file ``name``, or None when ``name`` is
    not one (a writer SIGKILLed before its rename leaves one behind: a cache tidies them)."""
    if not name.startswith(".") or not name.endswith(TEMPORARY_SUFFIX):
        return None
    pid, _, random = name[: -len(TEMPORARY_SUFFIX)].rpartition(".")[2].partition("-")
    return int(pid) if pid.isdigit() and len(random) == 12 else None


def _create_temporary(name: str, dir_fd: int) -> tuple[str, int]:
    for _ in range(_NAME_TRIES):
        temporary = temporary_name(name)
        try:
            return temporary, os.open(temporary, _CREATE, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name after {_NAME_TRIES} tries", name)
