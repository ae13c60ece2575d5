"""ld.so.cache entries of 32-bit ABIs (i386, x32, 32-bit ARM, MIPS n32) are not taken for 64-bit
ones: the executor's check of the container's linker cache looks at 64-bit entries only. The
cache is written here entry by entry and read back by glibc's own ``ldconfig -p -C``, which
names each entry's ABI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ponytail.host.ldcache import _NEW_ENTRY, _NEW_HEADER, NEW_MAGIC, is_64bit_entry, parse_ld_cache_entries

# flags -> (what glibc's ldconfig -p calls the ABI, 64-bit?)
ABIS = {
    0x0303: ("libc6,x86-64", True),
    0x0003: ("libc6", False),  # i386 (and every architecture's default 32-bit ABI)
    0x0803: ("libc6,x32", False),
    0x0903: ("libc6,hard-float", False),  # 32-bit ARM
    0x0B03: ("libc6,soft-float", False),  # 32-bit ARM
    0x0A03: ("libc6,AArch64", True),
    0x0503: ("libc6,64bit", True),  # ppc64
    0x0403: ("libc6,64bit", True),  # s390x
    0x0103: ("libc6,64bit", True),  # sparc64
    0x0203: ("libc6,IA-64", True),
    0x0603: ("libc6,N32", False),
    0x0703: ("libc6,64bit", True),  # MIPS n64
    0x0C03: ("libc6,nan2008", False),
    0x0D03: ("libc6,N32,nan2008", False),
    0x0E03: ("libc6,64bit,nan2008", True),
    0x1003: ("libc6,double-float", True),  # riscv64
}


def cache_bytes(flags: list[int]) -> bytes:
    """A new-format ld.so.cache with one entry libabiN.so.1 per flags value."""
    start = _NEW_HEADER.size + len(flags) * _NEW_ENTRY.size
    strings, entries = b"", b""
    for i, f in enumerate(flags):
        name, path = f"libabi{i}.so.1".encode(), f"/lib/abi{i}/libabi{i}.so.1".encode()
        entries += _NEW_ENTRY.pack(f, start + len(strings), start + len(strings) + len(name) + 1, 0, 0)
        strings += name + b"\0" + path + b"\0"
    return _NEW_HEADER.pack(NEW_MAGIC, len(flags), len(strings), 2, 0) + entries + strings


@pytest.mark.skipif(shutil.which("ldconfig") is None, reason="no ldconfig")
def test_each_abi_is_64_bit_exactly_when_glibc_says_so(tmp_path: Path) -> None:
    flags = list(ABIS)
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(cache_bytes(flags))
    printed = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    glibc = [line.split(" (", 1)[1].split(")", 1)[0] for line in printed.splitlines()[1:]]
    assert glibc == [ABIS[f][0] for f in flags]
    ours = parse_ld_cache_entries(cache.read_bytes())
    assert [(name, flag) for name, _, flag in ours] == [(f"libabi{i}.so.1", f) for i, f in enumerate(flags)]
    assert [is_64bit_entry(flag) for _, _, flag in ours] == [ABIS[f][1] for f in flags]


def test_loongarch_is_64_bit() -> None:
    """glibc 2.36's ldconfig prints LoongArch's flags as numbers; its only glibc port is 64-bit."""
    assert is_64bit_entry(0x1103) and is_64bit_entry(0x1203)
