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
What is in the rootfs is never opened for writing: files are written as new files (ponytail.fs.rootfswriter)
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
from ponytail.apply.ldconfig import LDCONFIG_TIMEOUT_S, linker_cache
from ponytail.apply.outcome import Outcome
from ponytail.apply.rootlock import lock_rootfs
from ponytail.errors import InjectionError, InputError, PonytailError
from ponytail.fs.descriptors import Descriptors
from ponytail.fs.inroot import InRoot, Resolved, UnsafePath, open_root, resolve_in_root
from ponytail.fs.kernelfs import TMPFS_MAGIC, filesystem_magic, fstatfs
from ponytail.fs.rootfswriter import refuse_kernel_fs, write_in_root, write_new_file
from ponytail.plan.operations import MOUNT_OPTIONS, AllowDevices, Chmod, HideNode, LinkerCache, Mount, ProcMask, Symlink, WriteFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ponytail.apply.cgroup import DevicesCgroup  # imported when a plan has device rules (not a CDI hook's)
    from ponytail.plan.operations import Operation, Plan

_ATTRIBUTES = {  # a Mount's options, as mount_setattr flags
    "ro": syscalls.MOUNT_ATTR_RDONLY,
    "nosuid": syscalls.MOUNT_ATTR_NOSUID,
    "nodev": syscalls.MOUNT_ATTR_NODEV,
    "noexec": syscalls.MOUNT_ATTR_NOEXEC,
}


def apply_plan(
    plan: Plan, rootfs: str, container_pid: int | None, ldconfig_timeout_s: float = LDCONFIG_TIMEOUT_S, lock_timeout_s: float = 10.0,
    extend_denying_programs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Apply ``plan``'s operations to ``rootfs`` (apply_operations)."""
    return apply_operations(
        plan.operations, rootfs, container_pid, ldconfig_timeout_s, lock_timeout_s, extend_denying_programs, progress
    )


def apply_operations(
    operations: tuple[Operation, ...], rootfs: str, container_pid: int | None, ldconfig_timeout_s: float = LDCONFIG_TIMEOUT_S,
    lock_timeout_s: float = 10.0, extend_denying_programs: bool = False, progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Apply ``operations`` to ``rootfs``; in the mount namespace of ``container_pid`` when given.
    Runs into the same rootfs directory take turns (ponytail.apply.rootlock). ``progress`` is
    told each step as it begins (the run log's step lines: where a killed run was). Every
    descriptor the run opens is held by one Descriptors, which closes them all when it ends."""
    step = progress or _quiet
    syscalls.require_new_mount_api()
    outcome = Outcome()
    trees: dict[int, int] = {}  # operation index -> detached mount
    ldconfig_fd = -1
    host_ns = -1  # to clone a library for a SONAME link only if the image has a file there (_symlink)
    identities = {op.source: op.identity for op in operations if isinstance(op, Mount) and op.identity is not None}
    devices_cgroup: DevicesCgroup | None = None  # hook mode with device rules only (not a CDI hook's plan)
    held = Descriptors()
    try:
        with held:
            mounts = sum(1 for op in operations if isinstance(op, Mount) and op.kind in ("device", "library"))
            step(f"clone {mounts} device node{'' if mounts == 1 else 's'} and libraries and check them")
            for i, op in enumerate(operations):
                if isinstance(op, Mount):
                    trees[i] = held.own(_clone_source(op))
                elif isinstance(op, Symlink) and op.library and container_pid is not None and host_ns < 0:
                    host_ns = held.own(os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
                elif isinstance(op, LinkerCache):
                    ldconfig_fd = held.own(_open_program(op.ldconfig))
                elif isinstance(op, AllowDevices) and container_pid is not None:
                    from ponytail.apply.cgroup import open_devices_cgroup

                    devices_cgroup = open_devices_cgroup(container_pid, op, lock_timeout_s, extend_denying_programs)
            if container_pid is not None:
                _enter_mount_namespace(container_pid)
            with Descriptors() as rootfs_held:  # the rootfs and its lock: let go before the mounts' descriptors
                root_fd = rootfs_held.own(open_root(rootfs))
                step(f"wait for other runs into {rootfs} (the rootfs lock)")
                rootfs_held.own(lock_rootfs(root_fd, rootfs, lock_timeout_s))
                paths = InRoot(root_fd)
                step("mount and link in the rootfs")
                try:
                    for i, op in enumerate(operations):
                        if isinstance(op, Mount):
                            _mount(paths, op, trees[i], outcome)
                        elif isinstance(op, Symlink):
                            _symlink(paths, op, host_ns, outcome, identities.get(op.library))
                        elif isinstance(op, ProcMask):
                            _mask_proc(root_fd, op, outcome)
                        elif isinstance(op, HideNode):
                            _hide_node(paths, op, outcome)
                        elif isinstance(op, WriteFile):
                            write_in_root(paths, op.target, op.content, outcome, replace=True)
                        elif isinstance(op, Chmod):
                            _chmod(paths, op, outcome)
                        elif isinstance(op, LinkerCache):
                            step(f"linker cache ({op.ldconfig})")
                            linker_cache(paths, op, ldconfig_fd, outcome, ldconfig_timeout_s)
                        elif isinstance(op, AllowDevices) and devices_cgroup is not None:
                            step("device rules")
                            _allow_devices(devices_cgroup, op, outcome)
                except BaseException as e:
                    leftover = _undo(outcome.attached)
                    if leftover and isinstance(e, PonytailError):
                        e.message += leftover
                    raise
    finally:
        Descriptors(outcome.attached).close()
        if devices_cgroup is not None:
            devices_cgroup.close()
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
        refuse_kernel_fs(resolved, resolved.parent_fd, f"mount {op.source}")
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
            refuse_kernel_fs(resolved, node_fd, "hide a GPU node")
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
            refuse_kernel_fs(resolved, target_fd, f"mount {source}")
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


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _symlink(paths: InRoot, op: Symlink, host_ns: int, outcome: Outcome, identity: tuple[int, ...] | None = None) -> None:
    resolved = paths.resolve(op.target, create_dirs=True, follow_last=False)
    try:
        refuse_kernel_fs(resolved, resolved.parent_fd, f"link {op.link_to}")
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
        if resolved.exists and stat.S_ISREG(resolved.mode) and op.replace_file:
            outcome.warnings.append(f"the image's own {resolved.path} was replaced by the link to the driver's {op.link_to}")
            os.unlink(resolved.name, dir_fd=resolved.parent_fd)
        elif resolved.exists:
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


def _chmod(paths: InRoot, op: Chmod, outcome: Outcome) -> None:
    """Set ``op.target``'s permission bits, through a descriptor of the file itself (never a link),
    and only on the container's own files: not where the directory holding it is a kernel
    filesystem, nor where the target is itself a mount point (its own filesystem's root: a kernel
    filesystem such as a devpts or sysfs is refused, any other, a volume or a directory of the
    host's, is left as it is with a warning)."""
    from ponytail.fs.kernelfs import kernel_filesystem, mount_id

    resolved = paths.resolve(op.target, follow_last=False)
    try:
        if not resolved.exists:
            outcome.unchanged.append(f"{resolved.path}: not in the container, no mode to set")
            return
        if stat.S_ISLNK(resolved.mode):
            raise UnsafePath(f"cannot set the mode of {resolved.path} in the rootfs: it is a symbolic link")
        what = f"chmod {op.mode:o}"
        refuse_kernel_fs(resolved, resolved.parent_fd, what)
        fd = os.open(resolved.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):  # raced into a link after the resolve
                raise UnsafePath(f"cannot set the mode of {resolved.path} in the rootfs: it is a symbolic link")
            kind = kernel_filesystem(fd)
            if kind is not None:
                raise UnsafePath(f"refusing to {what} at {resolved.path}: it is the root of a mount of the kernel's {kind} filesystem")
            if st.st_dev != os.fstat(resolved.parent_fd).st_dev or mount_id(fd) != mount_id(resolved.parent_fd):
                outcome.warnings.append(f"mode of {resolved.path} left as it is (not {op.mode:o}): it is a mount point, another "
                                        "filesystem's root (a volume, or a directory of the host's), not a file of the container's own")
                return
            if stat.S_IMODE(st.st_mode) == op.mode:
                outcome.unchanged.append(f"{resolved.path} (mode {op.mode:o} already)")
                return
            os.chmod(f"/proc/self/fd/{fd}", op.mode)
        finally:
            os.close(fd)
        outcome.done.append(f"mode {op.mode:o} on {resolved.path}")
    except OSError as e:
        raise InjectionError(f"cannot set the mode of {resolved.path} in the rootfs: {e.strerror}") from e
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
                write_new_file(tmpfs, name, content)
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


