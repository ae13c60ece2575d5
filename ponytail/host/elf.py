"""Just enough ELF to know a shared library: its machine and its SONAME.

Reads the program headers and the dynamic section through file offsets; never
maps or loads the library.
"""

from __future__ import annotations

import struct

from ponytail.lite.records import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: for type checkers only
    from typing import BinaryIO

EM_386 = 3
EM_X86_64 = 62
EM_AARCH64 = 183
EM_PPC64 = 21
MACHINE_BY_UNAME = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64, "ppc64le": EM_PPC64, "i686": EM_386}

PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_SONAME = 14


@record(frozen=True)
class ElfInfo:
    machine: int
    bits: int
    soname: str | None
    needed: tuple[str, ...] = ()  # DT_NEEDED: the libraries it links against, by SONAME


MAX_NEEDED = 64


class NotElf(ValueError):
    pass


def read_elf_info(path: str) -> ElfInfo:
    """Machine, class and SONAME of the ELF file at ``path``; NotElf if it is not one."""
    with open(path, "rb") as f:
        return _parse(f)


def read_elf_info_file(f: BinaryIO) -> ElfInfo:
    """``read_elf_info`` of an open binary file (one opened safely inside a rootfs)."""
    return _parse(f)


def _parse(f: BinaryIO) -> ElfInfo:
    ident = f.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF":
        raise NotElf("not an ELF file")
    bits = {1: 32, 2: 64}.get(ident[4])
    endian = {1: "<", 2: ">"}.get(ident[5])
    if bits is None or endian is None:
        raise NotElf("unknown ELF class or byte order")
    if bits == 64:
        machine, = struct.unpack_from(endian + "H", ident, 18)
        phoff, = struct.unpack_from(endian + "Q", ident, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", ident, 54)
        ph_fmt, dyn_fmt = endian + "IIQQQQQQ", endian + "qQ"
    else:
        machine, = struct.unpack_from(endian + "H", ident, 18)
        phoff, = struct.unpack_from(endian + "I", ident, 28)
        phentsize, phnum = struct.unpack_from(endian + "HH", ident, 42)
        ph_fmt, dyn_fmt = endian + "IIIIIIII", endian + "iI"
    if phnum == 0 or phnum > 512 or phentsize < struct.calcsize(ph_fmt):
        return ElfInfo(machine, bits, None)
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        entry = table[i * phentsize : (i + 1) * phentsize]
        if len(entry) < struct.calcsize(ph_fmt):
            break
        if bits == 64:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(ph_fmt, entry)
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _flags, _align = struct.unpack_from(ph_fmt, entry)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, min(p_filesz, 1 << 20))
    if dynamic is None:
        return ElfInfo(machine, bits, None)
    f.seek(dynamic[0])
    raw = f.read(dynamic[1])
    size = struct.calcsize(dyn_fmt)
    strtab = soname = None
    needed: list[int] = []
    for pos in range(0, len(raw) - size + 1, size):
        tag, value = struct.unpack_from(dyn_fmt, raw, pos)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
        elif tag == DT_NEEDED and len(needed) < MAX_NEEDED:
            needed.append(value)
    offset = _vaddr_to_offset(loads, strtab) if strtab is not None else None
    if offset is None:
        return ElfInfo(machine, bits, None)
    names = tuple(n for n in (_string(f, offset + value) for value in needed) if n)
    return ElfInfo(machine, bits, _string(f, offset + soname) if soname is not None else None, names)


def _string(f: BinaryIO, offset: int) -> str | None:
    f.seek(offset)
    name = f.read(256).split(b"\0", 1)[0]
    return name.decode("utf-8", "replace") or None


def _vaddr_to_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int | None:
    for seg_vaddr, seg_offset, seg_filesz in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_filesz:
            return vaddr - seg_vaddr + seg_offset
    return None
