"""The container's cgroup v2 device programs: replace each with one that also allows the injected nodes.

On cgroup v2 the engine (runc, crun, systemd) attaches a BPF_PROG_TYPE_CGROUP_DEVICE
program to the container's cgroup before the hooks run; device programs are ANDed, so
attaching one more "allow" program widens nothing: each attached program must be
replaced. Two phases, as the executor works:

- ``prepare_device_programs`` (host side, before ponytail enters the container's mount
  namespace): open the cgroup directory under the cgroup2 mount, list the device
  programs attached to it, read each one's instructions and load its replacement
  (ponytail.plan.devicefilter: the allow block in front of the unchanged old instructions).
  Nothing is changed yet; a program that cannot be read or extended is an error here,
  before any mount is made.
- ``replace_device_programs`` (after the mounts): attach each replacement in place of
  its program. Programs attached with BPF_F_ALLOW_MULTI (runc, crun, systemd) are
  swapped atomically with BPF_F_REPLACE (Linux 5.6+); on older kernels the new one is
  attached first and the old one detached after, so for a moment both apply (narrower,
  never wider). A program attached without it (exclusive or BPF_F_ALLOW_OVERRIDE) is
  replaced by attaching with the same flags, which the kernel does in one step.

Which programs are extended: each program is run on the injected nodes (the instructions are
read back; ponytail.plan.devicefilter.verdict). One that allows them all already is left as it is.
One that denies what it does not name is an allow list, what runc, crun and systemd attach (runc
and crun detach every other program when they attach theirs): it is extended. One that allows
devices it does not name but denies an injected node is a deny list of another tool, a rule made
on purpose: it wins, and the start fails with one line naming the node and the program, unless
``[cgroup] extend_denying_programs = true``. A program that cannot be run here is treated as an
allow list (as before this rule).

No program attached means nothing to edit (nothing is added: an allow-only program
would not be needed and an ANDed one would not help). A rootless engine attaches none
and a rootless hook may not even ask: that is nothing to do, not an error.
"""

from __future__ import annotations

import errno
import os

from ponytail.apply import bpf
from ponytail.apply.rootlock import lock_directory
from ponytail.errors import InjectionError
from ponytail.fs.kernelfs import filesystem_magic
from ponytail.plan.devicefilter import denied_on_purpose, extend, verdict, why_not_extensible
from ponytail.plan.operations import AllowDevices

PROGRAM_NAME = "ponytail_dev"
CGROUP2_MAGIC = 0x63677270


class DevicePrograms:
    """The prepared edit of one cgroup: its directory, attach flags and (old, new) program pairs."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self.fd = fd
        self.flags = 0
        self.pairs: list[tuple[int, int, int]] = []  # (old id, old fd, new fd)
        self.unchanged: list[int] = []  # ids of programs that already allow the nodes
        self.note = ""  # why there was nothing to edit
        self.warning = ""  # programs of parent cgroups that also apply and are not edited

    def close(self) -> None:
        for _, old, new in self.pairs:
            os.close(old)
            os.close(new)
        self.pairs = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def prepare_device_programs(directory: str, op: AllowDevices, lock_timeout_s: float = 10.0, extend_denying: bool = False) -> DevicePrograms:
    """Open ``directory`` (the container's cgroup on the cgroup2 mount), lock it and load the replacements.

    The lock (an exclusive flock on the cgroup directory, ponytail.apply.rootlock) is held until
    ``close``: from reading the programs to swapping them, one run at a time per cgroup, so that a
    second run reads what the first attached, not a program the first is about to replace."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open the container's cgroup {directory}: {e.strerror}") from e
    programs = DevicePrograms(directory, fd)
    try:
        if filesystem_magic(fd) != CGROUP2_MAGIC:
            raise InjectionError(f"{directory} is not on a cgroup2 filesystem; refusing to edit it")
        lock_directory(fd, f"the cgroup {directory}", lock_timeout_s)
        _prepare(programs, op, extend_denying)
    except BaseException:
        programs.close()
        raise
    return programs


def _prepare(programs: DevicePrograms, op: AllowDevices, extend_denying: bool) -> None:
    where = f"the device program(s) of cgroup {programs.directory}"
    try:
        programs.flags, ids = bpf.query_device_programs(programs.fd)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES) and _rootless():
            programs.note = f"rootless (no permission to list {where}): no device program to edit"
            return
        if e.errno == errno.EINVAL:  # a kernel without BPF_CGROUP_DEVICE: no programs either
            programs.note = f"this kernel has no cgroup device programs ({e.strerror}): nothing to edit at {programs.directory}"
            return
        raise InjectionError(f"cannot list {where}: {e.strerror}{_permission_hint(e)}") from e
    programs.warning = _inherited(programs, ids)
    if not ids:
        programs.note = f"no device program attached to cgroup {programs.directory}: nothing to edit"
        return
    for program_id in ids:
        try:
            old = bpf.program_fd(program_id)
        except OSError as e:
            if e.errno == errno.ENOENT:  # detached and freed meanwhile
                continue
            raise InjectionError(f"cannot open device program {program_id} of cgroup {programs.directory}: {e.strerror}{_permission_hint(e)}") from e
        try:
            new = _replacement(programs.directory, program_id, old, op, extend_denying)
        except BaseException:
            os.close(old)
            raise
        if new is None:
            programs.unchanged.append(program_id)
            os.close(old)
        else:
            programs.pairs.append((program_id, old, new))


def _inherited(programs: DevicePrograms, own: tuple[int, ...]) -> str:
    """Programs attached to a parent cgroup run too (ANDed). They are not edited: that would widen
    every cgroup under that parent, other containers included."""
    try:
        _, effective = bpf.query_device_programs(programs.fd, effective=True)
    except OSError:
        return ""
    inherited = [str(i) for i in effective if i not in own]
    if not inherited:
        return ""
    return (
        f"device program(s) {', '.join(inherited)} of a parent cgroup of {programs.directory} also apply and are "
        "not edited (that would widen its other cgroups too): if they deny the injected nodes, the container "
        "gets EPERM; allow them there (e.g. the engine's config.json: ponytail-runtime or a CDI spec)"
    )


def _replacement(directory: str, program_id: int, old_fd: int, op: AllowDevices, extend_denying: bool) -> int | None:
    """The loaded replacement of one program, or None when it needs none: it allows every node
    already (e.g. it was extended by an earlier run)."""
    what = f"device program {program_id} of cgroup {directory}"
    try:
        info = bpf.program_info(old_fd)
    except OSError as e:
        raise InjectionError(f"cannot read {what}: {e.strerror}{_permission_hint(e)}") from e
    if info.name:
        what = f"device program {program_id} ({info.name!r}) of cgroup {directory}"
    if info.type != bpf.BPF_PROG_TYPE_CGROUP_DEVICE:
        raise InjectionError(f"{what} has type {info.type}, not a device program; refusing to edit it")
    if not info.readable:
        reason = "the kernel does not show its instructions (constant blinding with net.core.bpf_jit_harden=2 and kernel.kptr_restrict, or no CAP_BPF)"
        raise InjectionError(f"cannot allow the GPU nodes in {what}: {reason}; {_ENGINE_HINT}")
    why = why_not_extensible(info.instructions)
    if why is not None:
        raise InjectionError(f"cannot allow the GPU nodes in {what}: {why}; {_ENGINE_HINT}")
    devices = op.devices
    if all(verdict(info.instructions, major, minor) for major, minor in devices):
        return None
    denied = denied_on_purpose(info.instructions, devices)
    if denied is not None and not extend_denying:
        node = dict(zip(devices, op.nodes, strict=False)).get(denied)
        raise InjectionError(
            f"{what} denies {node + ' ' if node else ''}(c {denied[0]}:{denied[1]}) on purpose (it allows devices it does not "
            "name, so it is not the engine's allow list): ponytail does not widen another tool's deny; allow the node there, "
            "or set [cgroup] extend_denying_programs = true in the config to extend it anyway"
        )
    program = extend(info.instructions, devices)
    if program is None:
        return None
    try:
        return bpf.load_device_program(program, PROGRAM_NAME)
    except OSError as e:
        raise InjectionError(f"cannot load the extended {what}: {e.strerror}{_permission_hint(e)}") from e


_ENGINE_HINT = "let the engine allow them instead (ponytail-runtime or a CDI spec puts them in config.json)"


def replace_device_programs(programs: DevicePrograms) -> str | None:
    """Attach each prepared program in place of its old one; the line for the log, or None."""
    if not programs.pairs:
        return None
    multi = bool(programs.flags & bpf.BPF_F_ALLOW_MULTI)
    replaced = []
    for old_id, old, new in programs.pairs:
        what = f"device program {old_id} of cgroup {programs.directory}"
        try:
            if multi:
                _swap(programs.fd, old, new, programs.flags)
            else:  # one exclusive or overridable program: attaching with its flags replaces it
                bpf.attach_device_program(programs.fd, new, programs.flags)
        except OSError as e:
            hint = " (attached through a bpf link, which only its owner can update, or detached meanwhile)" if e.errno == errno.ENOENT else ""
            raise InjectionError(f"cannot replace {what}: {e.strerror}{hint}{_permission_hint(e)}") from e
        replaced.append(str(old_id))
    mode = "atomically" if multi else "in place"
    return f"replaced device program(s) {', '.join(replaced)} of cgroup {programs.directory} {mode}"


def systemd_warning(directory: str) -> str:
    """A systemd scope re-applies its own device program on ``systemctl daemon-reload``."""
    if not any(part.endswith(".scope") for part in directory.split("/")):
        return ""
    return (
        f"cgroup {directory} is a systemd scope (the systemd cgroup driver): systemctl daemon-reload re-applies "
        "systemd's device program and drops this edit, unless config.json allows the nodes too (ponytail-runtime, "
        "CDI) and they have /dev/char/MAJOR:MINOR links; see docs/cgroup-v2-and-systemd.md"
    )


def _swap(cgroup_fd: int, old: int, new: int, flags: int) -> None:
    try:
        bpf.attach_device_program(cgroup_fd, new, flags | bpf.BPF_F_REPLACE, old)
        return
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    # before Linux 5.6 (no BPF_F_REPLACE): both apply for a moment, which only narrows
    bpf.attach_device_program(cgroup_fd, new, flags)
    try:
        bpf.detach_device_program(cgroup_fd, old)
    except OSError:
        bpf.detach_device_program(cgroup_fd, new)
        raise


def _rootless() -> bool:
    """True when this process is not root in the initial user namespace (a rootless engine's hook)."""
    if os.geteuid() != 0:
        return True
    try:
        with open("/proc/self/uid_map", encoding="ascii") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def _permission_hint(e: OSError) -> str:
    if e.errno in (errno.EPERM, errno.EACCES):
        return " (ponytail needs CAP_SYS_ADMIN or CAP_BPF; an LSM such as SELinux or AppArmor may refuse bpf())"
    return ""
