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


# A character device no engine's rule names: what a program answers for it is its default
NEUTRAL_DEVICE = (4095, 1048575)  # the largest major and minor
MAX_STEPS = 1 << 18
_MASK32, _MASK64 = (1 << 32) - 1, (1 << 64) - 1


def verdict(program: bytes, major: int, minor: int, access: int = ACC_READ | ACC_WRITE, dev_type: int = DEV_CHAR) -> bool | None:
    """What the device program answers for this access (True: allowed), run on its instructions;
    None when it does something this does not model (a helper call, a map, memory other than
    its context, pointer arithmetic, division) or runs over MAX_STEPS. Engines' programs
    (runc's, crun's, systemd's, this module's block) only load the context and compare."""
    context = (dev_type | access << 16, major, minor)
    regs = [0] * (MAX_REGISTER + 1)
    context_regs = {1}  # registers holding the context pointer
    count = len(program) // 8
    pc = steps = 0
    while 0 <= pc < count and steps < MAX_STEPS:
        steps += 1
        code, r, off, imm = INSN.unpack_from(program, pc * 8)
        dst, src = r & 0xF, r >> 4
        if dst > MAX_REGISTER or src > MAX_REGISTER:
            return None
        kind = code & 0x07
        if code == EXIT:
            return bool(regs[0] & 1)
        if code == LDX_W:
            if src not in context_regs or off not in (0, 4, 8):
                return None
            regs[dst] = context[off // 4]
            context_regs.discard(dst)
        elif code == LD_IMM64 and src == 0 and pc + 1 < count:
            regs[dst] = (imm & _MASK32) | (INSN.unpack_from(program, pc * 8 + 8)[3] & _MASK32) << 32
            context_regs.discard(dst)
            pc += 1
        elif kind in (0x04, 0x07):  # ALU, ALU64
            moves = code & 0xF0 == 0xB0  # a move overwrites whatever the register held
            if code == 0xBF and src in context_regs:  # r = the context pointer
                context_regs.add(dst)
            elif (dst in context_regs and not moves) or (code & 0x08 and src in context_regs):
                return None
            else:
                value = _alu(code, regs[dst], regs[src] if code & 0x08 else imm & _MASK64, kind == 0x04)
                if value is None:
                    return None
                regs[dst] = value
                context_regs.discard(dst)
        elif kind in (0x05, 0x06):  # JMP, JMP32
            if code == JA:
                pc += off
            else:
                if dst in context_regs or (code & 0x08 and src in context_regs):
                    return None
                taken = _jump(code, regs[dst], regs[src] if code & 0x08 else imm & _MASK64, kind == 0x06)
                if taken is None:
                    return None
                if taken:
                    pc += off
        else:
            return None
        pc += 1
    return None


def _alu(code: int, a: int, b: int, alu32: bool) -> int | None:
    op = code & 0xF0
    mask = _MASK32 if alu32 else _MASK64
    a, b = a & mask, b & mask
    shift = b & (31 if alu32 else 63)
    results = {
        0x00: a + b, 0x10: a - b, 0x40: a | b, 0x50: a & b, 0x60: a << shift, 0x70: a >> shift,
        0x80: -a, 0xA0: a ^ b, 0xB0: b,
    }
    result = results.get(op)
    return None if result is None else result & mask


def _jump(code: int, a: int, b: int, jmp32: bool) -> bool | None:
    bits = 32 if jmp32 else 64
    a, b = a & ((1 << bits) - 1), b & ((1 << bits) - 1)
    sa, sb = (a - (1 << bits) if a >> (bits - 1) else a), (b - (1 << bits) if b >> (bits - 1) else b)
    return {
        0x10: a == b, 0x20: a > b, 0x30: a >= b, 0x40: bool(a & b), 0x50: a != b, 0x60: sa > sb, 0x70: sa >= sb,
        0xA0: a < b, 0xB0: a <= b, 0xC0: sa < sb, 0xD0: sa <= sb,
    }.get(code & 0xF0)


def denied_on_purpose(program: bytes, devices: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
    """The first of ``devices`` the program denies while it allows a device it does not list
    (NEUTRAL_DEVICE): a deny list, another tool's deliberate rule, not an engine's allow list
    (which denies whatever it does not name). None when there is no such device, or the
    program cannot be run here (then it is treated as an allow list)."""
    if verdict(program, *NEUTRAL_DEVICE) is not True:
        return None
    for major, minor in devices:
        if verdict(program, major, minor) is False:
            return major, minor
    return None


def describe(devices: tuple[tuple[int, int], ...]) -> str:
    """The block in words, for -debug."""
    return f"{len(allow_block(devices)) // 8} eBPF instructions that allow these rules and leave anything else to the engine's program"
