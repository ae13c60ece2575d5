"""Read a glibc ld.so.cache file: which library file names live at which paths.

Supports the current format ("glibc-ld.so.cache1.1", alone or after the old
"ld.so-1.7.0" table). Used to find the driver wherever the driver root's linker
cache says it is, without running ldconfig.
"""

from __future__ import annotations

import struct

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension offset
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_OLD_ENTRY_SIZE = 12
MAX_CACHE_BYTES = 64 << 20


def read_ld_cache(path: str) -> list[tuple[str, str]]:
    """(file name, path) pairs of the cache at ``path``; [] if it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CACHE_BYTES)
    except OSError:
        return []
    return parse_ld_cache(data)


def read_ld_cache_in_root(root_fd: int) -> list[tuple[str, str]]:
    """``read_ld_cache`` of the /etc/ld.so.cache of a root (a driver root, a driver tree),
    read like an image's file: resolved inside the root, a regular file only, never blocking."""
    from ponytail.fs.inroot import read_file_in_root

    data = read_file_in_root(root_fd, "/etc/ld.so.cache", MAX_CACHE_BYTES)
    return parse_ld_cache(data) if data is not None else []


def parse_ld_cache(data: bytes) -> list[tuple[str, str]]:
    return [(name, path) for name, path, _flags in parse_ld_cache_entries(data)]


# An entry's flags (glibc's ldconfig.h): the library's type in the low byte (FLAG_ELF_LIBC6,
# 0x03, for every glibc library) and the ABI it needs in the high byte, 0x0000 for the
# architecture's default one (i386, 32-bit ARM soft-float before FLAG_ARM_LIBSF...). Only the
# 64-bit ABIs are named here; the others are 32-bit: MIPS n32 0x0600 and 0x0D00 (NaN-2008),
# x32 0x0800, 32-bit ARM hard-float 0x0900 and soft-float 0x0B00, MIPS o32 NaN-2008 0x0C00.
FLAG_REQUIRED_MASK = 0xFF00
FLAG_SPARC_LIB64 = 0x0100
FLAG_IA64_LIB64 = 0x0200
FLAG_X8664_LIB64 = 0x0300
FLAG_S390_LIB64 = 0x0400
FLAG_POWERPC_LIB64 = 0x0500
FLAG_MIPS64_LIBN64 = 0x0700
FLAG_AARCH64_LIB64 = 0x0A00
FLAG_MIPS64_LIBN64_NAN2008 = 0x0E00
FLAG_RISCV_FLOAT_ABI_SOFT = 0x0F00  # RISC-V and LoongArch name their float ABI; glibc's
FLAG_RISCV_FLOAT_ABI_DOUBLE = 0x1000  # ports that use them are 64-bit (riscv64, loongarch64)
FLAG_LARCH_FLOAT_ABI_SOFT = 0x1100
FLAG_LARCH_FLOAT_ABI_DOUBLE = 0x1200
LIB64_FLAGS = frozenset({
    FLAG_SPARC_LIB64, FLAG_IA64_LIB64, FLAG_X8664_LIB64, FLAG_S390_LIB64, FLAG_POWERPC_LIB64, FLAG_MIPS64_LIBN64,
    FLAG_AARCH64_LIB64, FLAG_MIPS64_LIBN64_NAN2008, FLAG_RISCV_FLOAT_ABI_SOFT, FLAG_RISCV_FLOAT_ABI_DOUBLE,
    FLAG_LARCH_FLOAT_ABI_SOFT, FLAG_LARCH_FLOAT_ABI_DOUBLE,
})


def is_64bit_entry(flags: int) -> bool:
    """Whether a cache entry is a library of a 64-bit ABI (x86-64, AArch64, ppc64...): not
    i386, x32, 32-bit ARM or MIPS n32, whatever their flags' high byte says."""
    return flags & FLAG_REQUIRED_MASK in LIB64_FLAGS


def parse_ld_cache_entries(data: bytes) -> list[tuple[str, str, int]]:
    """(file name, path, flags) of every entry, in the cache's (lookup) order."""
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            return []
        nlibs, = struct.unpack_from("<I", data, 12)
        start = 16 + nlibs * _OLD_ENTRY_SIZE
        start = (start + 7) & ~7  # the new table is aligned
        if not data.startswith(NEW_MAGIC, start):
            start = data.find(NEW_MAGIC, 16)
            if start < 0:
                return []
    if not data.startswith(NEW_MAGIC, start) or len(data) < start + _NEW_HEADER.size:
        return []
    _magic, nlibs, _len_strings, _flags, _ext = _NEW_HEADER.unpack_from(data, start)
    pos = start + _NEW_HEADER.size
    count = min(nlibs, (len(data) - pos) // _NEW_ENTRY.size)
    table = memoryview(data)[pos : pos + count * _NEW_ENTRY.size]
    entries = []
    strings = _Strings(data)
    for flags, key, value, _osv, _hwcap in _NEW_ENTRY.iter_unpack(table):
        name, path = strings.at(start + key), strings.at(start + value)
        if strings.spent > 4 * len(data):  # entries pointing all over a long string: no linker's cache
            break
        if name and path:
            entries.append((name, path, flags))
    return entries


MAX_STRING_BYTES = 4096  # PATH_MAX: a longer name or path is no library's


class _Strings:
    """The NUL-terminated strings of a cache by offset, each decoded once. Each search is bounded
    (MAX_STRING_BYTES), so a cache whose entries all point into one long run of bytes without a NUL
    costs in proportion to its entries, not entries times its size; ``spent`` counts the bytes
    decoded (a real cache's names and paths share their bytes at most about twice)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.found: dict[int, str | None] = {}
        self.spent = 0

    def at(self, offset: int) -> str | None:
        """The string at ``offset``; None when it is unterminated or longer than a path."""
        if offset in self.found:
            return self.found[offset]
        end = self.data.find(b"\0", offset, offset + MAX_STRING_BYTES + 1)
        text = None if end < 0 else self.data[offset:end].decode("utf-8", "replace")
        self.spent += max(end - offset, 0)
        self.found[offset] = text
        return text
