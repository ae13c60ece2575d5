"""Files written inside the rootfs, never through what the image put there.

A file is written as a new file: into an unnamed file (O_TMPFILE) linked in under its name
(linkat through /proc/self/fd), or, on a filesystem without O_TMPFILE, a named temporary file
(O_EXCL | O_NOFOLLOW) renamed over it; always under the directory descriptor that
ponytail.fs.inroot resolved inside the rootfs. What is there is never opened for writing (a
FIFO, a hard link to a host file), only after a check that it is a regular file, and only to
read it back (ponytail.fs.inroot's open_regular_file); a file that already holds the content
is left alone; killed at any moment, a write leaves the old file, no file or the new one,
never a partial or temporary one; and nothing is ever written on a kernel filesystem (proc,
sysfs, cgroup: ponytail.fs.kernelfs), wherever a symlink in the image leads.
"""

from __future__ import annotations

import errno
import os
import stat

from ponytail.errors import InjectionError
from ponytail.fs.inroot import InRoot, Resolved, UnsafePath, open_regular_file
from ponytail.fs.kernelfs import kernel_filesystem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Outcome(Protocol):  # ponytail.apply.outcome.Outcome: what a write did goes there
        done: list[str]
        unchanged: list[str]


def write_in_root(paths: InRoot, path: str, content: bytes, outcome: Outcome, replace: bool) -> None:
    """Write ``path`` as a new file: never opens what is there for writing (a FIFO, a hard
    link), leaves a file that already holds ``content`` alone, and never leaves a partly
    written file under any name, even when killed (ponytail.apply.rootlock keeps other runs out)."""
    resolved = paths.resolve(path, create_dirs=True)
    try:
        if resolved.exists and not replace:
            return
        if resolved.exists and not stat.S_ISREG(resolved.mode):
            raise UnsafePath(f"{resolved.path} in the rootfs is not a regular file; refusing to write it")
        refuse_kernel_fs(resolved, resolved.parent_fd, "write")
        if resolved.exists and _holds(resolved, content):
            outcome.unchanged.append(f"{resolved.path} (already written)")
            return
        if _publish(resolved, content, replace):
            outcome.done.append(f"wrote {resolved.path}")
    except OSError as e:
        raise InjectionError(f"cannot write {resolved.path} in the rootfs: {e.strerror}") from e
    finally:
        resolved.close()


def _holds(resolved: Resolved, content: bytes) -> bool:
    """Whether the regular file there holds exactly ``content`` (never opens anything else)."""
    try:
        fd = open_regular_file(resolved.parent_fd, resolved.name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    if fd is None:
        return False
    try:
        return os.read(fd, len(content) + 1) == content
    finally:
        os.close(fd)


def _publish(resolved: Resolved, content: bytes, replace: bool) -> bool:
    """Give ``content`` the resolved name: written into an unnamed file (O_TMPFILE), then
    linked in under its final name (an old file there is unlinked first when ``replace``).
    Killed at any moment, this leaves the old file, no file, or the new one: never a
    partial or temporary one. False when the name was taken meanwhile and ``replace`` is
    not set. A filesystem without O_TMPFILE gets a named temporary file, renamed over."""
    dir_fd, name = resolved.parent_fd, resolved.name
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError:
        return _publish_named(dir_fd, name, content, replace)
    try:
        _write_all(fd, content)
        for _ in range(3):
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
                return True
            except FileExistsError:
                if not replace:
                    return False  # created meanwhile: not ours to overwrite
                _unlink(dir_fd, name)
        raise FileExistsError(errno.EEXIST, "created again and again meanwhile")
    finally:
        os.close(fd)


def _publish_named(dir_fd: int, name: str, content: bytes, replace: bool) -> bool:
    temp = f".{name}.ponytail-new" if replace else name
    if replace:
        _unlink(dir_fd, temp)  # left by a run killed before its rename
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        if replace:
            raise
        return False
    try:
        _write_all(fd, content)
    finally:
        os.close(fd)
    if replace:
        try:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            try:
                _unlink(dir_fd, temp)
            except OSError:
                pass
    return True


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view):]


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def refuse_kernel_fs(resolved: Resolved, fd: int, what: str) -> None:
    """A symlink in the image led to /proc, /sys, a cgroup...: acting there would act on the host's kernel."""
    try:
        kind = kernel_filesystem(fd)
    except OSError as e:
        raise UnsafePath(f"cannot {what} at {resolved.path} in the rootfs: {e.strerror}") from e
    if kind is not None:
        raise UnsafePath(f"refusing to {what} at {resolved.path}: a symlink in the image leads it onto the kernel's {kind} filesystem")


def write_new_file(dir_fd: int, relative: str, content: bytes) -> None:
    """Write a file into a directory we created ourselves (the fresh tmpfs)."""
    *dirs, name = relative.split("/")
    fds = [dir_fd]
    try:
        for d in dirs:
            try:
                os.mkdir(d, 0o555, dir_fd=fds[-1])
            except FileExistsError:
                pass
            fds.append(os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444, dir_fd=fds[-1])
        try:
            os.write(fd, content)
        finally:
            os.close(fd)
    finally:
        for fd in fds[1:]:
            os.close(fd)
