"""Run the host's ldconfig on the rootfs so that nothing in the image can steer it.

``ldconfig -r ROOTFS`` chroots into the rootfs, then reads and writes paths the image
controls: /etc/ld.so.conf and its includes, /etc/ld.so.cache~ (renamed onto
/etc/ld.so.cache), /var/cache/ldconfig/aux-cache and aux-cache~, and SONAME links in every
library directory it scans. A chroot stops '..' and absolute symlinks, but not the magic
links of the container's /proc, which is already mounted in the rootfs at prestart
(/proc/<pid>/root leads back to the host's /), nor writes into /proc/sys or a cgroup
hierarchy; and any of those names can be a device node, a FIFO or a socket the image
ships (ldconfig opens its temporary files with O_NOFOLLOW but without O_EXCL: a block
device there would get the cache written into it, as root, outside the container's device
cgroup). So the host's ldconfig (never the image's) runs:

- in a private copy of the mount namespace from which every kernel filesystem under the
  rootfs is detached, so inside its chroot there are only plain files;
- on a view of the rootfs mounted nodev, nosuid and noexec (the rootfs and every mount
  under it bind-mounted onto itself with those flags): no device node there can be opened,
  whatever its name;
- only when none of the files it opens at fixed names (LDCONFIG_FILES) is a device, a
  FIFO (an open would wait for ever) or a socket, looked up in that very view (what the
  image hid under its /proc mount point is there once /proc is detached);
- with -X: ponytail makes the SONAME links it needs itself, ldconfig only writes its cache;
- with a fixed environment (nothing of the container's, nothing of ponytail's own), stdin
  from /dev/null, no descriptor but its own binary, and a time limit.

Afterwards /etc/ld.so.cache must be a regular file: the container's loader reads anything
else as an empty cache.

The hook makes that private namespace itself, for as long as ldconfig runs, and then
returns into the one it came from (the container's): ldconfig is spawned without
forking the hook (ponytail.apply.program), so there is no child of ours in which to
isolate it, and nothing but the spawn happens in between. A failure to return is an
error, before anything else is done.
"""

from __future__ import annotations

import os
import stat

from ponytail.apply import syscalls
from ponytail.apply.program import run_program
from ponytail.errors import InjectionError
from ponytail.fs.inroot import InRoot, UnsafePath, resolve_in_root
from ponytail.fs.kernelfs import kernel_mounts_under
from ponytail.fs.rootfswriter import write_in_root
from ponytail.host.ldcache import is_64bit_entry, parse_ld_cache_entries

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.apply.outcome import Outcome
    from ponytail.plan.operations import LinkerCache

LDCONFIG_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
LDCONFIG_TIMEOUT_S = 10.0  # the default of [timeouts] ldconfig
LD_SO_CACHE = "/etc/ld.so.cache"
# what ldconfig -r opens in the rootfs by a fixed name (it renames the cache onto LD_SO_CACHE)
LDCONFIG_FILES = ("/etc/ld.so.conf", "/etc/ld.so.cache~", "/var/cache/ldconfig/aux-cache", "/var/cache/ldconfig/aux-cache~")
VIEW_ATTRIBUTES = syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NOEXEC
_VIEW_FLAGS = os.ST_NODEV | os.ST_NOSUID | os.ST_NOEXEC
LD_SO_CONF = "/etc/ld.so.conf"
LD_SO_CONF_TEXT = b"include /etc/ld.so.conf.d/*.conf\n"
# musl's loader reads no ld.so.cache: its library path is this file when the image has one, else these
MUSL_ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64", "ppc64le": "powerpc64le", "s390x": "s390x", "riscv64": "riscv64"}
MUSL_DEFAULT_PATH = ("/lib", "/usr/local/lib", "/usr/lib")


def run_ldconfig(
    program: str, program_fd: int, root_fd: int, directories: tuple[str, ...], timeout_s: float = LDCONFIG_TIMEOUT_S
) -> str:
    """Rebuild the linker cache of the root ``root_fd``; returns the rootfs path ldconfig was given."""
    rootfs = _canonical_path(root_fd)
    argv = ["ldconfig", "-X", "-r", rootfs, *directories]
    home = _open_namespace()
    try:
        try:
            _isolate(rootfs)
            view_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise InjectionError(f"refusing to run {program} on {rootfs}: cannot isolate it from the host's kernel filesystems and devices: {e}") from e
        try:  # in the view ldconfig will see: what the image hid under its /proc or /sys mount point is there
            _refuse_special_files(program, view_fd, rootfs)
        finally:
            os.close(view_fd)
        try:
            status, output = run_program(program_fd, argv, dict(LDCONFIG_ENV), timeout_s)
        except TimeoutError:
            raise InjectionError(
                f"{program} -r {rootfs} did not finish within {timeout_s:g} s (killed): raise [timeouts] ldconfig "
                "in the config, or look for an ld.so.conf in the image that includes itself, or a FIFO it lists"
            ) from None
        except OSError as e:
            raise InjectionError(f"cannot run {program} on the rootfs: {e}") from e
    finally:
        _return(home)
    detail = output.decode(errors="replace").strip().splitlines()
    last = detail[-1] if detail else "no message"
    if status != 0:
        raise InjectionError(f"{program} -r {rootfs} failed (exit {status}): {last}")
    _require_regular_cache(program, root_fd, rootfs)
    return rootfs


def _canonical_path(root_fd: int) -> str:
    """The path of the directory ``root_fd`` holds, as mountinfo and chroot will see it."""
    path = os.readlink(f"/proc/self/fd/{root_fd}")
    try:
        same = os.path.samestat(os.stat(path), os.fstat(root_fd))
    except OSError:
        same = False
    if not path.startswith("/") or not same:
        raise InjectionError(f"the rootfs is not reachable by a path from this mount namespace ({path})")
    return path


def _refuse_special_files(program: str, root_fd: int, rootfs: str) -> None:
    """None of the files ldconfig opens by a fixed name may be a device, a FIFO or a socket,
    resolved as its chroot resolves them in its own view (``root_fd``: the rootfs with the kernel
    filesystems detached, so a FIFO the image put under its /proc mount point is seen; a name
    that cannot be resolved, a loop or a magic link, it cannot open either)."""
    for path in LDCONFIG_FILES:
        try:
            resolved = resolve_in_root(root_fd, path)
        except UnsafePath:
            continue
        resolved.close()
        kind = special_file_kind(resolved.mode) if resolved.exists else None
        if kind is not None:
            named = path if resolved.path == path else f"{path} (-> {resolved.path})"
            raise InjectionError(
                f"refusing to run {program} on {rootfs}: {named} in the image is {kind}, not a regular file "
                "(ldconfig would open it as root); remove it from the image"
            )


def special_file_kind(mode: int) -> str | None:
    """'a block device', 'a character device', 'a FIFO' or 'a socket'; None for anything else."""
    for test, kind in ((stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def _require_regular_cache(program: str, root_fd: int, rootfs: str) -> None:
    """The linker cache ldconfig left must be a regular file (not a link, not a node)."""
    try:
        resolved = resolve_in_root(root_fd, LD_SO_CACHE, follow_last=False)
    except UnsafePath as e:
        raise InjectionError(f"after {program} -r {rootfs}: {e.message}") from e
    resolved.close()
    if resolved.exists and stat.S_ISREG(resolved.mode):
        return
    what = "missing" if not resolved.exists else (special_file_kind(resolved.mode) or "not a regular file")
    raise InjectionError(
        f"after {program} -r {rootfs}, {LD_SO_CACHE} in the rootfs is {what}: the container's linker would not find "
        "the driver's libraries; check [host] ldconfig in the config names the host's ldconfig"
    )


def _open_namespace() -> int:
    """The mount namespace this process is in (the container's, in hook mode)."""
    try:
        return os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open this process's mount namespace: {e.strerror}") from e


def _isolate(rootfs: str) -> None:
    """Move this process into a private mount namespace with no kernel filesystem under the
    rootfs, and the rootfs seen through a nodev, nosuid, noexec view."""
    syscalls.unshare_mount_namespace()
    for _ in range(3):
        mounts = kernel_mounts_under(rootfs)
        if not mounts:
            _restricted_view(rootfs)
            return
        for point in mounts:
            try:
                syscalls.detach_mount(point)
            except OSError:
                pass  # already gone with a parent; checked again above
    raise OSError(f"kernel filesystems stay mounted under it: {', '.join(mounts)}")


def _restricted_view(rootfs: str) -> None:
    """Bind the rootfs, with every mount under it, onto itself nodev, nosuid and noexec."""
    tree = syscalls.clone_tree(rootfs, recursive=True)
    try:
        syscalls.set_mount_attributes(tree, VIEW_ATTRIBUTES, recursive=True)
        target = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            syscalls.attach_tree(tree, target)
        finally:
            os.close(target)
    finally:
        os.close(tree)
    if os.statvfs(rootfs).f_flag & _VIEW_FLAGS != _VIEW_FLAGS:
        raise OSError(f"{rootfs} is not nodev, nosuid and noexec after binding it so")


def _return(namespace_fd: int) -> None:
    """Back into the mount namespace ``namespace_fd`` (the private copy is dropped with it)."""
    try:
        syscalls.setns_mount(namespace_fd)
    except OSError as e:
        raise InjectionError(f"cannot return to the container's mount namespace after running ldconfig: {e}") from e
    finally:
        os.close(namespace_fd)


def linker_cache(paths: InRoot, op: LinkerCache, ldconfig_fd: int, outcome: Outcome, timeout_s: float = LDCONFIG_TIMEOUT_S) -> None:
    """The linker-cache step: the linker config written, ldconfig run on the rootfs, the new cache
    checked (the injected libraries win), and musl's path file written for a musl image."""
    content = "".join(f"{d}\n" for d in op.directories).encode()
    write_in_root(paths, op.conf_file, content, outcome, replace=True)
    write_in_root(paths, LD_SO_CONF, LD_SO_CONF_TEXT, outcome, replace=False)
    rootfs = run_ldconfig(op.ldconfig, ldconfig_fd, paths.root_fd, op.directories, timeout_s)
    outcome.done.append(f"ran {op.ldconfig} -X -r {rootfs} ({', '.join(op.directories)})")
    check_cache(paths, op, outcome)
    musl_path(paths, op.directories, outcome)


def musl_path(paths: InRoot, directories: tuple[str, ...], outcome: Outcome, machine: str = "") -> None:
    """An image with musl's loader (Alpine) ignores the linker cache: write its path file,
    /etc/ld-musl-<arch>.path, with the injected directories first, then the file's own
    entries, then musl's defaults (a path file replaces them). Nothing when no musl loader."""
    arch = MUSL_ARCHES.get(machine or os.uname().machine)
    if arch is None or not _is_regular_file(paths, f"/lib/ld-musl-{arch}.so.1"):
        return
    path_file = f"/etc/ld-musl-{arch}.path"
    old = (paths.read_file(path_file, 1 << 16) or b"").decode(errors="replace")
    entries = [*directories, *old.replace(":", "\n").split("\n"), *MUSL_DEFAULT_PATH]
    content = "".join(f"{d}\n" for d in dict.fromkeys(e.strip() for e in entries) if d).encode()
    write_in_root(paths, path_file, content, outcome, replace=True)


def _is_regular_file(paths: InRoot, path: str) -> bool:
    """Whether ``path`` resolves inside the root to a regular file (links followed within it)."""
    try:
        resolved = paths.resolve(path)
    except (UnsafePath, OSError):
        return False
    try:
        return resolved.exists and stat.S_ISREG(resolved.mode)
    finally:
        resolved.close()


def check_cache(paths: InRoot, op: LinkerCache, outcome: Outcome) -> None:
    """The injected libraries must be what the container's linker finds first; copies the
    image ships of the same SONAME are named in a warning."""
    entries = _read_rootfs_cache(paths)
    for soname, expected in op.sonames:
        found = [path for name, path, flags in entries if name == soname and is_64bit_entry(flags)]
        if not found:
            continue
        # the usual: ldconfig names it by the very path planned (no resolving needed to know it is ours)
        if found[0] != expected and paths.real_path(found[0]) != paths.real_path(expected):
            raise InjectionError(
                f"the container's linker cache gives {soname} as {found[0]}, not the injected {expected}; "
                f"remove that copy from the image"
            )
        ours = paths.real_path(expected) if found[1:] else None
        others = [p for p in found[1:] if paths.real_path(p) != ours]
        if others:
            outcome.warnings.append(
                f"the image ships its own {soname} ({', '.join(others)}); the injected driver's {expected} wins"
            )


def _read_rootfs_cache(paths: InRoot) -> list[tuple[str, str, int]]:
    return parse_ld_cache_entries(paths.read_file(LD_SO_CACHE, 64 << 20) or b"")
