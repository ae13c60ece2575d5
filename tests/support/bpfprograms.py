"""cgroup v2 device programs as other tools build them, and a listing of any program as text.

The programs stand for what an engine attached before ponytail's hook runs: runc's allow list
(one block per rule, deny at the end, as runc's libcontainer/cgroups/devices/devicefilter.go lays
it out), deny-all, allow-all and one that calls a helper. ``listing`` renders instructions the way
the kernel's verifier log writes them, one a line with its index and where a jump lands: the golden
files of tests/unit/test_devicefilter_golden.py are such listings."""

from __future__ import annotations

from ponytail.plan.devicefilter import (
    AND32_K,
    CALL,
    EXIT,
    INSN,
    JA,
    JEQ_K,
    JNE_K,
    LDX_W,
    MOV32_X,
    MOV64_K,
    RSH32_K,
    insn,
)


def deny_all() -> bytes:
    return insn(MOV64_K, 0, imm=0) + insn(EXIT)


def allow_all() -> bytes:
    return insn(MOV64_K, 0, imm=1) + insn(EXIT)


def calls_a_helper() -> bytes:
    return insn(CALL, imm=15) + allow_all()  # bpf_get_current_uid_gid


def runc_style(*allowed: tuple[int, int]) -> bytes:
    """An allow list the way runc lays it out: type, access, major, minor in r2-r5, one block per
    rule (c MAJOR:MINOR rwm), deny at the end."""
    head = [
        insn(LDX_W, 2, 1, 0), insn(AND32_K, 2, imm=0xFFFF),
        insn(LDX_W, 3, 1, 0), insn(RSH32_K, 3, imm=16),
        insn(LDX_W, 4, 1, 4), insn(LDX_W, 5, 1, 8),
    ]
    body = []
    for major, minor in allowed:
        body += [
            insn(JNE_K, 2, off=7, imm=2),  # not a character device
            insn(MOV32_X, 1, 3), insn(AND32_K, 1, imm=~7), insn(JNE_K, 1, off=4, imm=0),  # access not within rwm
            insn(JNE_K, 4, off=3, imm=major),
            insn(JNE_K, 5, off=2, imm=minor),
            insn(MOV64_K, 0, imm=1), insn(EXIT),
        ]
    return b"".join(head + body) + deny_all()


_JUMPS = {JNE_K: "!=", JEQ_K: "=="}


def _instruction(code: int, dst: int, src: int, off: int, imm: int, index: int) -> str:
    if code == LDX_W:
        return f"r{dst} = *(u32 *)(r{src} {off:+d})"
    if code == MOV32_X:
        return f"w{dst} = w{src}"
    if code == AND32_K:
        return f"w{dst} &= {imm & 0xFFFFFFFF:#x}"
    if code == RSH32_K:
        return f"w{dst} >>= {imm}"
    if code == MOV64_K:
        return f"r{dst} = {imm}"
    if code in _JUMPS:
        return f"if r{dst} {_JUMPS[code]} {imm} goto pc{off:+d}  ; -> {index + 1 + off}"
    if code == JA:
        return f"goto pc{off:+d}  ; -> {index + 1 + off}"
    if code == EXIT:
        return "exit"
    if code == CALL:
        return f"call {imm}"
    return f"code={code:#04x} dst=r{dst} src=r{src} off={off} imm={imm}"


def listing(program: bytes) -> str:
    """The instructions of ``program``, one a line: ``INDEX: INSTRUCTION``."""
    lines = []
    for index in range(len(program) // INSN.size):
        code, regs, off, imm = INSN.unpack_from(program, index * INSN.size)
        lines.append(f"{index:4d}: {_instruction(code, regs & 0xF, regs >> 4, off, imm, index)}")
    return "\n".join(lines) + "\n"
