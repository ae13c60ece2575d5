"""Apply a Plan: the one place where ponytail changes anything.

Order of work:
1. In the host's mount namespace, clone every source into a detached mount
   (open_tree) and check it is what the plan says (character device with the
   planned major:minor, regular file, socket or directory); make it
   read-only/nosuid/nodev there, before anyone can see it. Open the
   container's devices.allow (cgroup v1) and load the replacements of its
   device programs (cgroup v2) (hook mode; ponytail.apply.cgroup).
2. Enter the container's mount namespace (hook mode) and open its rootfs.
3. Resolve each target inside the rootfs (ponytail.fs.inroot: openat2 with
   RESOLVE_IN_ROOT), create the mount point, and attach the detached mount onto
   the target's descriptor.
4. Create SONAME links (where the image has a file of its own instead, the library
   is cloned then, back in the host's namespace, and mounted over it), mask
   /proc/driver/nvidia, write the linker config, run the host's ldconfig (on a nodev,
   nosuid, noexec view of the rootfs: ponytail.apply.ldconfig), and check the injected
   libraries win in the new linker cache.
5. Allow the injected device nodes in the container's devices cgroup (v1) and
   swap in its new device programs (v2).
What is in the rootfs is never opened for writing: files are written as new files
(O_TMPFILE or O_EXCL) after a check that what they replace is a regular file, a file
read back is opened only once held and checked to be one (ponytail.fs.inroot's
open_regular_file), so a device node, FIFO or socket the image planted is never opened.
Nothing is ever created or written on a kernel filesystem (proc, sysfs, cgroup...
see ponytail.fs.kernelfs), wherever a symlink in the image points; the one mount
made onto one is the tmpfs that masks /proc/driver/nvidia. When a step fails,
the mounts this run attached are detached again before the error is reported.
"""

from __future__ import annotations

import errno
import os
import stat

from ponytail.apply import syscalls
from ponytail.apply.ldconfig import LD_SO_CACHE, LDCONFIG_TIMEOUT_S, run_ldconfig
from ponytail.apply.rootlock import lock_rootfs
from ponytail.errors import InjectionError, InputError, PonytailError
from ponytail.fs.inroot import InRoot, Resolved, UnsafePath, open_regular_file, open_root, resolve_in_root
from ponytail.fs.kernelfs import TMPFS_MAGIC, filesystem_magic, fstatfs, kernel_filesystem
from ponytail.host.ldcache import is_64bit_entry, parse_ld_cache_entries
from ponytail.lite.records import field, record
from ponytail.plan.operations import MOUNT_OPTIONS, AllowDevices, HideNode, LinkerCache, Mount, Plan, ProcMask, Symlink

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ponytail.apply.cgroup import DevicesCgroup  # imported when a plan has device rules (not a CDI hook's)

LD_SO_CONF = "/etc/ld.so.conf"
LD_SO_CONF_TEXT = b"include /etc/ld.so.conf.d/*.conf\n"
# musl's loader reads no ld.so.cache: its library path is this file when the image has one, else these
MUSL_ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64", "ppc64le": "powerpc64le", "s390x": "s390x", "riscv64": "riscv64"}
MUSL_DEFAULT_PATH = ("/lib", "/usr/local/lib", "/usr/lib")
_ATTRIBUTES = {  # a Mount's options, as mount_setattr flags
    "ro": syscalls.MOUNT_ATTR_RDONLY,
    "nosuid": syscalls.MOUNT_ATTR_NOSUID,
    "nodev": syscalls.MOUNT_ATTR_NODEV,
    "noexec": syscalls.MOUNT_ATTR_NOEXEC,
}


@record
class Outcome:
    """What a run did, for the log: one line per change, and what was already there."""

    done: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    attached: list[int] = field(default_factory=list, repr=False)  # a descriptor of each mount made


def apply_plan(
    plan: Plan, rootfs: str, container_pid: int | None, ldconfig_timeout_s: float = LDCONFIG_TIMEOUT_S, lock_timeout_s: float = 10.0,
    extend_denying_programs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Apply ``plan`` to ``rootfs``; in the mount namespace of ``container_pid`` when given.
    Runs into the same rootfs directory take turns (ponytail.apply.rootlock). ``progress`` is
    told each step as it begins (the run log's step lines: where a killed run was)."""
    step = progress or _quiet
    syscalls.require_new_mount_api()
    outcome = Outcome()
    trees: dict[int, int] = {}  # operation index -> detached mount
    ldconfig_fd = -1
    host_ns = -1  # to clone a library for a SONAME link only if the image has a file there (_symlink)
    identities = {op.source: op.identity for op in plan.operations if isinstance(op, Mount) and op.identity is not None}
    devices_cgroup: DevicesCgroup | None = None  # hook mode with device rules only (not a CDI hook's plan)
    try:
        step(f"clone {plan.count('device') + plan.count('library')} device node(s) and librar(ies) and check them")
        for i, op in enumerate(plan.operations):
            if isinstance(op, Mount):
                trees[i] = _clone_source(op)
            elif isinstance(op, Symlink) and op.library and container_pid is not None and host_ns < 0:
                host_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            elif isinstance(op, LinkerCache):
                ldconfig_fd = _open_program(op.ldconfig)
            elif isinstance(op, AllowDevices) and container_pid is not None:
                from ponytail.apply.cgroup import open_devices_cgroup

                devices_cgroup = open_devices_cgroup(container_pid, op, lock_timeout_s, extend_denying_programs)
        if container_pid is not None:
            _enter_mount_namespace(container_pid)
        root_fd = open_root(rootfs)
        step(f"wait for other runs into {rootfs} (the rootfs lock)")
        try:
            lock_fd = lock_rootfs(root_fd, rootfs, lock_timeout_s)
        except BaseException:
            os.close(root_fd)
            raise
        paths = InRoot(root_fd)
        step("mount and link in the rootfs")
        try:
            for i, op in enumerate(plan.operations):
                if isinstance(op, Mount):
                    _mount(paths, op, trees[i], outcome)
                elif isinstance(op, Symlink):
                    _symlink(paths, op, host_ns, outcome, identities.get(op.library))
                elif isinstance(op, ProcMask):
                    _mask_proc(root_fd, op, outcome)
                elif isinstance(op, HideNode):
                    _hide_node(paths, op, outcome)
                elif isinstance(op, LinkerCache):
                    step(f"linker cache ({op.ldconfig})")
                    _linker_cache(paths, op, ldconfig_fd, outcome, ldconfig_timeout_s)
                elif isinstance(op, AllowDevices) and devices_cgroup is not None:
                    step("device rules")
                    _allow_devices(devices_cgroup, op, outcome)
        except BaseException as e:
            leftover = _undo(outcome.attached)
            if leftover and isinstance(e, PonytailError):
                e.message += leftover
            raise
        finally:
            os.close(root_fd)
            os.close(lock_fd)
    finally:
        for fd in outcome.attached:
            os.close(fd)
        if devices_cgroup is not None:
            devices_cgroup.close()
        for fd in trees.values():
            os.close(fd)
        for fd in (ldconfig_fd, host_ns):
            if fd >= 0:
                os.close(fd)
    return outcome


def _quiet(step: str) -> None:
    pass


def _undo(attached: list[int]) -> str:
    """Detach the mounts this run attached (each descriptor names its mount), newest first."""
    failed = []
    for tree in reversed(attached):
        try:
            syscalls.detach_mount(f"/proc/self/fd/{tree}")
        except OSError as e:
            failed.append(e.strerror)
    if not failed:
        return ""
    return f" (and {len(failed)} of the {len(attached)} mount(s) made could not be undone: {failed[0]})"


def _allow_devices(devices_cgroup: DevicesCgroup, op: AllowDevices, outcome: Outcome) -> None:
    from ponytail.apply.cgroup import allow_devices

    outcome.done += allow_devices(devices_cgroup, op)
    if devices_cgroup.note:
        outcome.warnings.append(devices_cgroup.note)
    if devices_cgroup.info:
        outcome.unchanged.append(f"device cgroup: {devices_cgroup.info}")


def _clone_source(op: Mount) -> int:
    try:
        tree = syscalls.clone_tree(op.source)
    except OSError as e:
        raise InjectionError(f"cannot bind {op.source} (for {op.target}): {e.strerror}") from e
    try:
        st = os.fstat(tree)
        if op.rdev is not None:
            actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
            if not stat.S_ISCHR(st.st_mode) or actual != op.rdev:
                raise InjectionError(
                    f"{op.source} is no longer the character device {op.rdev[0]}:{op.rdev[1]}; refusing to mount it"
                )
        elif op.kind == "ipc" or op.is_dir:
            if not (stat.S_ISDIR(st.st_mode) if op.is_dir else stat.S_ISSOCK(st.st_mode)):
                raise InjectionError(f"{op.source} is no longer a {'directory' if op.is_dir else 'socket'}; refusing to mount it")
        elif not stat.S_ISREG(st.st_mode):
            raise InjectionError(f"{op.source} is not a regular file; refusing to mount it")
        elif op.identity is not None and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != op.identity:
            raise InjectionError(
                f"{op.source} on the host changed after it was checked (a driver being installed meanwhile?); "
                "refusing to mount it: try again"
            )
        try:
            flags = 0
            for option in op.options:
                flags |= _ATTRIBUTES[option]
            syscalls.set_mount_attributes(tree, flags)
        except OSError as e:
            raise InjectionError(f"cannot set mount flags on {op.source}: {e.strerror}") from e
    except BaseException:
        os.close(tree)
        raise
    return tree


def _open_program(path: str) -> int:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open {path}: {e.strerror}; set [host] ldconfig in the config") from e


def _enter_mount_namespace(pid: int) -> None:
    path = f"/proc/{pid}/ns/mnt"
    try:
        ns_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"container process {pid} is gone ({path} does not exist)") from None
    except OSError as e:
        raise InjectionError(f"cannot open {path}: {e.strerror}") from e
    try:
        if os.fstat(ns_fd).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            return  # already there (the container shares our mount namespace)
        host_root = os.stat("/")
        syscalls.setns_mount(ns_fd)
        same_root = os.path.samestat(os.stat("/"), host_root)
    except OSError as e:
        raise InjectionError(f"cannot enter the mount namespace of process {pid}: {e.strerror}") from e
    finally:
        os.close(ns_fd)
    if not same_root:  # pivoted: its / is the image, and nothing may be loaded or run from there
        raise InjectionError(
            f"process {pid} has already switched its root to the rootfs: run ponytail as a prestart or "
            "createRuntime hook, before the container pivots"
        )


def _mount(paths: InRoot, op: Mount, tree: int, outcome: Outcome) -> None:
    resolved = paths.resolve(op.target, create_dirs=True)
    try:
        if resolved.exists and stat.S_ISDIR(resolved.mode) != op.is_dir:
            kind = "a directory" if op.is_dir else "not a directory"
            raise UnsafePath(f"cannot mount {op.source}: {resolved.path} in the rootfs is {'not ' if op.is_dir else ''}a directory, the source is {kind}")
        _refuse_kernel_fs(resolved, resolved.parent_fd, f"mount {op.source}")
        if not resolved.exists:
            _create_mount_point(resolved, op.is_dir)
        _attach(resolved, tree, op.source, outcome, on_kernel_fs=False)
    finally:
        resolved.close()


ST_NODEV = 4  # statfs f_flags: the mount has nodev


def _hide_node(paths: InRoot, op: HideNode, outcome: Outcome) -> None:
    """Bind the container's own node ``op.target`` onto itself with nodev (and ro, nosuid,
    noexec), in the container's mount namespace: opening it then fails with EACCES. Only that
    character device is acted on (never a symlink, nor what the image put there instead)."""
    if paths.real_path(os.path.dirname(op.target)) is None:  # no /dev/nvidia-caps: no node of it
        outcome.unchanged.append(f"{op.target} (not in the container: nothing to hide)")
        return
    resolved = paths.resolve(op.target, follow_last=False)
    try:
        if not resolved.exists:
            outcome.unchanged.append(f"{resolved.path} (not in the container: nothing to hide)")
            return
        try:
            node_fd = os.open(resolved.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
        except OSError as e:
            raise InjectionError(f"cannot hide {resolved.path} in the container: {e.strerror}") from e
        try:
            st = os.fstat(node_fd)
            if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != op.rdev:
                outcome.warnings.append(f"{resolved.path} is not the character device {op.rdev[0]}:{op.rdev[1]}: left as it is")
                return
            _refuse_kernel_fs(resolved, node_fd, "hide a GPU node")
            if fstatfs(node_fd).f_flags & ST_NODEV:
                outcome.unchanged.append(f"{resolved.path} (hidden already: nodev)")
                return
            try:
                tree = syscalls.clone_tree("", dir_fd=node_fd)
            except OSError as e:
                raise InjectionError(f"cannot hide {resolved.path} in the container: {e.strerror}") from e
            try:
                flags = syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NOEXEC
                syscalls.set_mount_attributes(tree, flags)
                syscalls.attach_tree(tree, node_fd)
                outcome.attached.append(os.dup(tree))
            except OSError as e:
                raise InjectionError(f"cannot hide {resolved.path} in the container: {e.strerror}") from e
            finally:
                os.close(tree)
        finally:
            os.close(node_fd)
    finally:
        resolved.close()
    outcome.done.append(f"hide {resolved.path} (nodev: {op.reason})")


def _create_mount_point(resolved: Resolved, is_dir: bool) -> None:
    try:
        if is_dir:
            os.mkdir(resolved.name, 0o755, dir_fd=resolved.parent_fd)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(resolved.name, flags, 0o644, dir_fd=resolved.parent_fd))
    except FileExistsError:
        pass
    except OSError as e:
        raise InjectionError(f"cannot create mount point {resolved.path} in the rootfs: {e.strerror}") from e


def _attach(resolved: Resolved, tree: int, source: str, outcome: Outcome, on_kernel_fs: bool) -> None:
    """Attach ``tree`` onto the resolved target (never a symlink; on a kernel filesystem only
    when ``on_kernel_fs``); remember it, to take it back if a later step fails."""
    try:
        target_fd = os.open(resolved.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
    except OSError as e:
        raise InjectionError(f"cannot mount {source} onto {resolved.path} in the rootfs: {e.strerror}") from e
    try:
        if stat.S_ISLNK(os.fstat(target_fd).st_mode):
            raise UnsafePath(f"{resolved.path} in the rootfs turned into a symlink while mounting; refused")
        if _same_file(target_fd, tree):
            outcome.unchanged.append(f"{resolved.path} (already mounted)")
            return
        if not on_kernel_fs:
            _refuse_kernel_fs(resolved, target_fd, f"mount {source}")
        syscalls.attach_tree(tree, target_fd)
        outcome.attached.append(os.dup(tree))
    except OSError as e:
        if e.errno == errno.ENOENT and _unlinked(tree):  # the host's file was replaced since it was cloned
            raise InjectionError(
                f"cannot mount {source} onto {resolved.path} in the rootfs: {source} on the host was removed or replaced "
                "meanwhile (a driver being installed?); try again"
            ) from e
        if e.errno == errno.ENOENT and _unlinked(target_fd):  # an earlier run's mount of a host file replaced since
            raise InjectionError(
                f"cannot mount {source} onto {resolved.path} in the rootfs: an earlier run mounted a host file there "
                f"that has been removed or replaced since ({source}, a driver being installed?); start the container again"
            ) from e
        if e.errno == errno.ENOENT:  # the mount point was unlinked between resolving and attaching
            raise InjectionError(
                f"cannot mount {source} onto {resolved.path} in the rootfs: {resolved.path} was removed meanwhile "
                "(something else is changing the rootfs); try again"
            ) from e
        raise InjectionError(f"cannot mount {source} onto {resolved.path} in the rootfs: {e.strerror}") from e
    finally:
        os.close(target_fd)
    outcome.done.append(f"mount {source} -> {resolved.path}")


def _unlinked(fd: int) -> bool:
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False


def _refuse_kernel_fs(resolved: Resolved, fd: int, what: str) -> None:
    """A symlink in the image led to /proc, /sys, a cgroup...: acting there would act on the host's kernel."""
    try:
        kind = kernel_filesystem(fd)
    except OSError as e:
        raise UnsafePath(f"cannot {what} at {resolved.path} in the rootfs: {e.strerror}") from e
    if kind is not None:
        raise UnsafePath(f"refusing to {what} at {resolved.path}: a symlink in the image leads it onto the kernel's {kind} filesystem")


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _symlink(paths: InRoot, op: Symlink, host_ns: int, outcome: Outcome, identity: tuple[int, ...] | None = None) -> None:
    resolved = paths.resolve(op.target, create_dirs=True, follow_last=False)
    try:
        _refuse_kernel_fs(resolved, resolved.parent_fd, f"link {op.link_to}")
        if resolved.exists and stat.S_ISREG(resolved.mode) and op.library:
            outcome.warnings.append(
                f"the image ships its own {resolved.path}; the driver's {op.link_to} is mounted over it"
            )
            tree = _clone_library(op, host_ns, identity)
            try:
                _attach(resolved, tree, op.library, outcome, on_kernel_fs=False)
            finally:
                os.close(tree)
            return
        if resolved.exists:
            if not stat.S_ISLNK(resolved.mode):
                raise UnsafePath(f"cannot create link {resolved.path} in the rootfs: something else is there")
            current = os.readlink(resolved.name, dir_fd=resolved.parent_fd)
            if current == op.link_to:
                outcome.unchanged.append(f"{resolved.path} -> {op.link_to} (already linked)")
                return
            outcome.warnings.append(f"the image's link {resolved.path} -> {current} now points to the driver's {op.link_to}")
            os.unlink(resolved.name, dir_fd=resolved.parent_fd)
        os.symlink(op.link_to, resolved.name, dir_fd=resolved.parent_fd)
        outcome.done.append(f"link {resolved.path} -> {op.link_to}")
    except OSError as e:
        raise InjectionError(f"cannot create link {resolved.path} -> {op.link_to} in the rootfs: {e.strerror}") from e
    finally:
        resolved.close()


def _clone_library(op: Symlink, host_ns: int, identity: tuple[int, ...] | None) -> int:
    """The library a SONAME link names, as a detached mount, for an image that has a file where
    the link goes. Cloned only then, and not before entering the container (as mounts are):
    closing a detached mount that was never attached makes the kernel wait for an RCU grace
    period, milliseconds for each link of every start. Cloning needs the host's mount
    namespace (``host_ns``; -1: this process never left it), so the hook steps back into it
    for the clone and returns to the container's."""
    source = Mount("library", op.library, op.target, MOUNT_OPTIONS["library"], op.reason, identity=identity)
    if host_ns < 0:
        return _clone_source(source)
    here = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.setns_mount(host_ns)
        try:
            return _clone_source(source)
        finally:
            syscalls.setns_mount(here)
    except OSError as e:
        raise InjectionError(f"cannot clone {op.library} for {op.target}: {e.strerror}") from e
    finally:
        os.close(here)


def _mask_proc(root_fd: int, op: ProcMask, outcome: Outcome) -> None:
    try:
        resolved = resolve_in_root(root_fd, op.target)
    except UnsafePath:
        outcome.unchanged.append(f"{op.target}: not in the container, nothing to mask")
        return
    try:
        if not resolved.exists or not stat.S_ISDIR(resolved.mode):
            outcome.unchanged.append(f"{op.target}: not in the container, nothing to mask")
            return
        if _masked_already(resolved):
            outcome.unchanged.append(f"{op.target} (already masked)")
            return
        flags = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOEXEC
        try:
            tmpfs = syscalls.new_tmpfs({"mode": "0555", "size": "4m"}, flags)
        except OSError as e:
            raise InjectionError(f"cannot create the tmpfs for {op.target}: {e.strerror}") from e
        try:
            for name, content in op.files:
                _write_into(tmpfs, name, content)
            syscalls.set_mount_attributes(tmpfs, flags | syscalls.MOUNT_ATTR_RDONLY)
            _attach(resolved, tmpfs, "tmpfs (masked driver view)", outcome, on_kernel_fs=True)
        finally:
            os.close(tmpfs)
    finally:
        resolved.close()


def _masked_already(resolved: Resolved) -> bool:
    """A read-only tmpfs there is the mask of an earlier run: another would stack on it."""
    try:
        fd = os.open(resolved.name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
    except OSError as e:
        raise InjectionError(f"cannot open {resolved.path} in the rootfs: {e.strerror}") from e
    try:
        return filesystem_magic(fd) == TMPFS_MAGIC and bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
    finally:
        os.close(fd)


def _write_into(dir_fd: int, relative: str, content: bytes) -> None:
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


def _linker_cache(paths: InRoot, op: LinkerCache, ldconfig_fd: int, outcome: Outcome, timeout_s: float = LDCONFIG_TIMEOUT_S) -> None:
    content = "".join(f"{d}\n" for d in op.directories).encode()
    _write_file(paths, op.conf_file, content, outcome, replace=True)
    _write_file(paths, LD_SO_CONF, LD_SO_CONF_TEXT, outcome, replace=False)
    rootfs = run_ldconfig(op.ldconfig, ldconfig_fd, paths.root_fd, op.directories, timeout_s)
    outcome.done.append(f"ran {op.ldconfig} -X -r {rootfs} ({', '.join(op.directories)})")
    _check_cache(paths, op, outcome)
    _musl_path(paths, op.directories, outcome)


def _musl_path(paths: InRoot, directories: tuple[str, ...], outcome: Outcome, machine: str = "") -> None:
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
    _write_file(paths, path_file, content, outcome, replace=True)


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


def _check_cache(paths: InRoot, op: LinkerCache, outcome: Outcome) -> None:
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


def _write_file(paths: InRoot, path: str, content: bytes, outcome: Outcome, replace: bool) -> None:
    """Write ``path`` as a new file: never opens what is there for writing (a FIFO, a hard
    link), leaves a file that already holds ``content`` alone, and never leaves a partly
    written file under any name, even when killed (ponytail.apply.rootlock keeps other runs out)."""
    resolved = paths.resolve(path, create_dirs=True)
    try:
        if resolved.exists and not replace:
            return
        if resolved.exists and not stat.S_ISREG(resolved.mode):
            raise UnsafePath(f"{resolved.path} in the rootfs is not a regular file; refusing to write it")
        _refuse_kernel_fs(resolved, resolved.parent_fd, "write")
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
