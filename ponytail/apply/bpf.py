"""Thin ctypes wrappers for the bpf(2) commands that edit a cgroup's device programs.

Only what ponytail needs: list the programs attached to a cgroup for
BPF_CGROUP_DEVICE, open one by id, read its (translated) instructions, load a
BPF_PROG_TYPE_CGROUP_DEVICE program, attach it (atomically in place of another
with BPF_F_REPLACE, Linux 5.6+) and detach one. Each ``bpf_attr`` is a zeroed
buffer filled at the offsets of linux/bpf.h; the kernel takes a shorter union
than it knows, so no field past the ones set here is ever sent.
"""

from __future__ import annotations

import ctypes
import errno
import struct

from ponytail.fs.libc import syscall

BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16

BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # attach type

BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4
BPF_F_QUERY_EFFECTIVE = 1

_ATTR_SIZE = 128  # bytes of bpf_attr sent: covers every command used here
_INFO_SIZE = 80  # bpf_prog_info up to name (type, id, tag, lengths, pointers, load time, uid, maps, name)
MAX_PROGRAMS = 64  # the kernel's limit on programs attached to one cgroup for one type


def _bpf(command: int, attr: ctypes.Array, what: str) -> int:
    return syscall("bpf", command, attr, _ATTR_SIZE, what=what)


def _attr() -> ctypes.Array:
    return ctypes.create_string_buffer(_ATTR_SIZE)


def query_device_programs(cgroup_fd: int, effective: bool = False) -> tuple[int, tuple[int, ...]]:
    """(attach flags, ids of the device programs attached directly to this cgroup, in run order);
    with ``effective``, the ids of all that run for it, those inherited from its parents included."""
    ids = (ctypes.c_uint32 * MAX_PROGRAMS)()
    attr = _attr()
    query_flags = BPF_F_QUERY_EFFECTIVE if effective else 0
    struct.pack_into("=IIIIQI", attr, 0, cgroup_fd, BPF_CGROUP_DEVICE, query_flags, 0, ctypes.addressof(ids), MAX_PROGRAMS)
    _bpf(BPF_PROG_QUERY, attr, "BPF_PROG_QUERY")
    flags = struct.unpack_from("=I", attr, 12)[0]
    count = struct.unpack_from("=I", attr, 24)[0]
    return flags, tuple(ids[: min(count, MAX_PROGRAMS)])


def program_fd(program_id: int) -> int:
    """A descriptor of the loaded program ``program_id`` (it keeps the program alive)."""
    attr = _attr()
    struct.pack_into("=I", attr, 0, program_id)
    return _bpf(BPF_PROG_GET_FD_BY_ID, attr, f"BPF_PROG_GET_FD_BY_ID {program_id}")


class ProgramInfo:
    """What BPF_OBJ_GET_INFO_BY_FD says of a program: its type, id and translated instructions.

    ``instructions`` is empty when the kernel would not show them (``readable`` False):
    no CAP_BPF/CAP_SYS_ADMIN, or constant blinding (net.core.bpf_jit_harden) with raw
    dumps restricted."""

    __slots__ = ("type", "id", "instructions", "readable", "name")

    def __init__(self, type_: int, id_: int, instructions: bytes, readable: bool, name: str = "") -> None:
        self.type = type_
        self.id = id_
        self.instructions = instructions
        self.readable = readable
        self.name = name  # as loaded (16 bytes at most; runc's is empty)


def program_info(fd: int, max_bytes: int = 1 << 20) -> ProgramInfo:
    size = 8 * 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        info = ctypes.create_string_buffer(_INFO_SIZE)
        struct.pack_into("=I", info, 20, size)  # xlated_prog_len
        struct.pack_into("=Q", info, 32, ctypes.addressof(buf))  # xlated_prog_insns
        attr = _attr()
        struct.pack_into("=IIQ", attr, 0, fd, _INFO_SIZE, ctypes.addressof(info))
        _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "BPF_OBJ_GET_INFO_BY_FD")
        type_, id_ = struct.unpack_from("=II", info, 0)
        length = struct.unpack_from("=I", info, 20)[0]
        pointer = struct.unpack_from("=Q", info, 32)[0]
        if length > size and size < max_bytes:
            size = min(max_bytes, length)
            continue
        name = info.raw[64:80].split(b"\0", 1)[0].decode("ascii", "replace")
        if length == 0 or pointer == 0 or length > size:
            return ProgramInfo(type_, id_, b"", False, name)
        return ProgramInfo(type_, id_, buf.raw[:length], True, name)


def load_device_program(instructions: bytes, name: str, license: bytes = b"Apache-2.0") -> int:
    """Load a BPF_PROG_TYPE_CGROUP_DEVICE program; on refusal the OSError carries the verifier's last line."""
    insns = ctypes.create_string_buffer(instructions, len(instructions))
    lic = ctypes.create_string_buffer(license)
    attr = _attr()
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name[16], ifindex, expected_attach_type
    struct.pack_into("=IIQQIIQII16sII", attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE, len(instructions) // 8,
                     ctypes.addressof(insns), ctypes.addressof(lic), 0, 0, 0, 0, 0, name.encode()[:15], 0, BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "BPF_PROG_LOAD")
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EINVAL):  # the verifier said no; ask it why
            raise
        log = ctypes.create_string_buffer(1 << 16)
        struct.pack_into("=IIQ", attr, 24, 1, len(log), ctypes.addressof(log))
        try:
            return _bpf(BPF_PROG_LOAD, attr, "BPF_PROG_LOAD")
        except OSError as again:
            skip = ("processed ", "verification time", "stack depth")
            lines = [line for line in log.value.decode(errors="replace").splitlines() if line.strip() and not line.startswith(skip)]
            reason = lines[-1] if lines else ""
            raise OSError(again.errno, f"{again.strerror}{': ' + reason if reason else ''}") from e


def attach_device_program(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int = 0) -> None:
    attr = _attr()
    struct.pack_into("=IIIII", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE, flags, replace_fd)
    _bpf(BPF_PROG_ATTACH, attr, "BPF_PROG_ATTACH")


def detach_device_program(cgroup_fd: int, prog_fd: int) -> None:
    attr = _attr()
    struct.pack_into("=III", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE)
    _bpf(BPF_PROG_DETACH, attr, "BPF_PROG_DETACH")
