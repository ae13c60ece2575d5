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


def parse_ld_cache(data: bytes) -> list[tuple[str, str]]:
    return [(name, path) for name, path, _flags in parse_ld_cache_entries(data)]


def is_64bit_entry(flags: int) -> bool:
    """Whether a cache entry's flags name a 64-bit ABI (x86-64, AArch64, ppc64...)."""
    return flags & 0xFF00 != 0


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
    for flags, key, value, _osv, _hwcap in _NEW_ENTRY.iter_unpack(table):
        name, path = _string(data, start + key), _string(data, start + value)
        if name and path:
            entries.append((name, path, flags))
    return entries


def _string(data: bytes, offset: int) -> str | None:
    end = data.find(b"\0", offset)  # -1 past the end, or unterminated
    if end < 0:
        return None
    return data[offset:end].decode("utf-8", "replace")
