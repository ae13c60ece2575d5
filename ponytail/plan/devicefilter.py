"""cgroup v2 device programs as data: the block of eBPF instructions that allows exactly
the injected nodes, and the check that an attached program can be extended with it.

Pure: no syscalls (ponytail.apply.cgroup2 loads and attaches). A device program
(BPF_PROG_TYPE_CGROUP_DEVICE) gets ``struct bpf_cgroup_dev_ctx {u32 access_type; u32
major; u32 minor}`` in r1, ``access_type`` being ``(access << 16) | type`` (type 1 block,
2 char; access bits 1 mknod, 2 read, 4 write), and returns 1 to allow, 0 to deny.

The block is put in front of the program the engine attached: for a character device
in the list, opened for read and/or write (no mknod), it returns 1; for anything else
it falls through, with r1 untouched, to the old instructions, which run unchanged (their
jumps are relative). So exactly the listed nodes are added and nothing else is widened.
"""

from __future__ import annotations

import struct

INSN = struct.Struct("<BBhi")  # code, dst_reg | src_reg << 4, off, imm

DEV_CHAR = 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4

# opcodes (linux/bpf_common.h, linux/bpf.h)
LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
MOV32_X = 0xBC  # BPF_ALU | BPF_MOV | BPF_X
AND32_K = 0x54
RSH32_K = 0x74
MOV64_K = 0xB7
JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
JEQ_K = 0x15
JA = 0x05
EXIT = 0x95
CALL = 0x85
CALLX = 0x8D
LD_IMM64 = 0x18
MAX_REGISTER = 10  # r0-r10; r11 is the kernel's scratch register of constant blinding

_HEAD = 9  # instructions before the per-device checks


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return INSN.pack(code, dst | src << 4, off, imm)


def allow_block(devices: tuple[tuple[int, int], ...]) -> bytes:
    """Instructions that return 1 for ``c MAJOR:MINOR rw`` of each device and fall through otherwise.

    One comparison per major and one per device, all leading to one shared "allow": the
    kernel's verifier walks every branch, so the block stays short for 64 GPUs too."""
    groups: dict[int, list[int]] = {}
    for major, minor in devices:
        groups.setdefault(major, []).append(minor)
    checks = len(groups) + len(devices)
    allow = _HEAD + checks + 1  # index of "r0 = 1"
    end = allow + 2  # index of the first old instruction
    out = [
        insn(LDX_W, 2, 1, 0),  # w2 = ctx->access_type
        insn(MOV32_X, 3, 2),  # w3 = w2
        insn(AND32_K, 3, imm=0xFFFF),  # w3 = device type
        insn(JNE_K, 3, off=end - 4, imm=DEV_CHAR),  # not a character device: the old program decides
        insn(RSH32_K, 2, imm=16),  # w2 = access
        insn(AND32_K, 2, imm=~(ACC_READ | ACC_WRITE)),  # anything but read and write (mknod)...
        insn(JNE_K, 2, off=end - 7, imm=0),  # ...is for the old program
        insn(LDX_W, 4, 1, 4),  # w4 = major
        insn(LDX_W, 5, 1, 8),  # w5 = minor
    ]
    for major, minors in groups.items():
        here = len(out)
        out.append(insn(JNE_K, 4, off=len(minors), imm=major))  # another major: the next group
        out += [insn(JEQ_K, 5, off=allow - (here + 2 + i), imm=minor) for i, minor in enumerate(minors)]
    out += [
        insn(JA, off=2),  # none matched: the old program decides
        insn(MOV64_K, 0, imm=1),
        insn(EXIT),
    ]
    return b"".join(out)


def extend(old: bytes, devices: tuple[tuple[int, int], ...]) -> bytes | None:
    """The old program with the allow block in front; None when it already starts with it."""
    block = allow_block(devices)
    if old.startswith(block):
        return None
    return block + old


def why_not_extensible(program: bytes) -> str | None:
    """Why the translated instructions of an attached program cannot be loaded again behind
    the block, or None. The kernel shows helper calls and map references in a form that
    cannot be loaded back, and a constant-blinded program uses its scratch register r11."""
    if not program or len(program) % 8:
        return "its instructions could not be read"
    for index in range(0, len(program), 8):
        code, regs, _, _ = INSN.unpack_from(program, index)
        if regs & 0xF > MAX_REGISTER or regs >> 4 > MAX_REGISTER:
            return "the kernel blinded its constants (net.core.bpf_jit_harden=2), so its instructions cannot be read back"
        if code in (CALL, CALLX):
            return f"it calls a function (instruction {index // 8}), which cannot be loaded again from its translated form"
        if code == LD_IMM64 and regs >> 4:
            return f"it refers to a map (instruction {index // 8}), which cannot be loaded again from its translated form"
    return None


def describe(devices: tuple[tuple[int, int], ...]) -> str:
    """The block in words, for -debug."""
    return f"{len(allow_block(devices)) // 8} eBPF instructions that allow these rules and leave anything else to the engine's program"
