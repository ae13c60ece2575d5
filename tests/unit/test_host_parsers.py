"""Parsers of the driver's /proc files, sysfs, ELF files and ld.so.cache, on real samples and garbage."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.errors import ProbeError
from ponytail.host.driver import canonical_bus_id, nvidia_major, parse_char_majors, parse_driver_version, parse_information
from ponytail.host.elf import EM_X86_64, NotElf, read_elf_info
from ponytail.host.ldcache import NEW_MAGIC, parse_ld_cache, read_ld_cache
from ponytail.host.pci import PciFunction, is_nvidia_gpu, pci_functions_pyudev, pci_functions_sysfs

from support.fakehost import FakeHost, compile_library, compile_program, gpus


@pytest.mark.parametrize(
    "text, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version: gcc 12\n", "550.54.15"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)  Thu Sep 25 2025\n", "580.95.05"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build\n", "570.86.15"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n", "390.157"),
    ],
)
def test_driver_version_formats(text: str, version: str) -> None:
    assert parse_driver_version(text) == version


@pytest.mark.parametrize("text", ["", "garbage\n", "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n", "\x00\xff"])
def test_driver_version_garbage_is_a_clear_error(text: str) -> None:
    with pytest.raises(ProbeError, match="cannot find the driver version"):
        parse_driver_version(text)


def test_gpu_information_sample() -> None:
    text = (
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 145\nGPU UUID: \t GPU-5d4e3c2b-1a09-8f7e-6d5c-4b3a29180716\n"
        "Video BIOS: \t 96.00.a5.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t 0000:19:00.0\nDevice Minor: \t 7\nGPU Excluded:\t No\n"
    )
    info = parse_information(text, "0000:19:00.0", "information")
    assert (info.minor, info.uuid, info.model, info.excluded) == (7, "GPU-5d4e3c2b-1a09-8f7e-6d5c-4b3a29180716", "NVIDIA H200", False)


def test_gpu_information_without_minor_is_an_error() -> None:
    with pytest.raises(ProbeError, match="Device Minor"):
        parse_information("Model: x\n", "0000:19:00.0", "/proc/x/information")


@pytest.mark.parametrize(
    "raw, canonical",
    [
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0001:c1:1f.7", "0001:c1:1f.7"),
        ("nonsense", None),
        ("0000:3b:00.8", None),
        ("GPU-1234", None),
    ],
)
def test_bus_id_forms(raw: str, canonical: str | None) -> None:
    assert canonical_bus_id(raw) == canonical


def test_proc_devices_majors() -> None:
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n195 notchar\n"
    assert parse_char_majors(text) == {"mem": 1, "nvidia-frontend": 195, "nvidia-caps": 234, "nvidia-uvm": 510}


@pytest.mark.parametrize(
    ("devices", "major"),
    [("195 nvidia-frontend\n", 195), ("240 nvidia\n", 240), ("241 nvidia-frontend\n240 nvidia\n", 241), ("510 nvidia-uvm\n", 195)],
)
def test_the_gpu_nodes_major_is_one_lookup(devices: str, major: int) -> None:
    # the probe (the nodes a plan creates) and the CDI hook (which of the engine's nodes are GPUs) ask the same
    assert nvidia_major(parse_char_majors("Character devices:\n" + devices)) == major


def test_gpu_classes_exclude_audio_nvswitch_and_other_vendors() -> None:
    assert is_nvidia_gpu(PciFunction("a", 0x10DE, 0x030200))
    assert is_nvidia_gpu(PciFunction("a", 0x10DE, 0x030000))
    assert not is_nvidia_gpu(PciFunction("a", 0x10DE, 0x040300))
    assert not is_nvidia_gpu(PciFunction("a", 0x10DE, 0x068000))
    assert not is_nvidia_gpu(PciFunction("a", 0x1002, 0x030000))


def test_pyudev_and_sysfs_see_the_same_pci_bus_on_this_machine() -> None:
    by_udev = sorted(pci_functions_pyudev(), key=lambda f: f.bus_id)
    by_sysfs = sorted(pci_functions_sysfs("/sys"), key=lambda f: f.bus_id)
    assert by_sysfs, "this machine should have a PCI bus"
    assert by_udev == by_sysfs


@pytest.mark.root
def test_the_hook_s_gpu_scan_finds_what_a_scan_of_every_function_finds(tmp_path: Path) -> None:
    # the hook (udev=False) reads a function's class and driver only when its vendor is NVIDIA's
    from ponytail.host.pci import nvidia_gpus

    host = FakeHost(tmp_path / "host", gpu_list=gpus(3))  # with NVIDIA audio, an NVSwitch, another vendor's VGA card
    for sys_root in (str(host.sys), "/sys"):
        every = sorted((f for f in pci_functions_sysfs(sys_root) if is_nvidia_gpu(f)), key=lambda f: f.bus_id)
        assert nvidia_gpus(sys_root, udev=False) == every
    assert [f.bus_id for f in nvidia_gpus(str(host.sys), udev=False)] == [g.bus_id for g in gpus(3)]


def test_elf_soname_of_a_gcc_built_library() -> None:
    lib = compile_library("fake_libcuda.c", "libcuda.so.1", "libcuda.so.550.54.15", "550.54.15")
    info = read_elf_info(str(lib))
    assert (info.soname, info.machine, info.bits) == ("libcuda.so.1", EM_X86_64, 64)


def test_elf_needed_of_a_library_and_of_a_program() -> None:
    lib = compile_library("fake_libcuda.c", "libcuda.so.1", "libcuda.so.550.54.15", "550.54.15")
    assert "libc.so.6" in read_elf_info(str(lib)).needed
    program = read_elf_info(str(compile_program("cudacheck.c")))  # -ldl; no SONAME: its needed libraries still read
    assert program.soname is None and "libc.so.6" in program.needed


def test_elf_rejects_non_elf(tmp_path: Path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"#!/bin/sh\necho hi\n")
    with pytest.raises(NotElf):
        read_elf_info(str(junk))
    truncated = tmp_path / "trunc.so"
    truncated.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 60 + b"\xff" * 10)
    assert read_elf_info(str(truncated)).soname is None


def test_ld_cache_matches_ldconfig_print() -> None:
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    expected = sorted(
        (line.split(" (")[0].strip(), line.split("=> ")[1].strip()) for line in listed.splitlines() if "=>" in line
    )
    assert sorted(read_ld_cache("/etc/ld.so.cache")) == expected


@pytest.mark.parametrize("data", [b"", b"glibc-ld.so.cache1.1", b"ld.so-1.7.0\0\xff\xff\xff\xff", b"\0" * 100])
def test_ld_cache_garbage_gives_nothing(data: bytes) -> None:
    assert parse_ld_cache(data) == []


def _cache(strings: bytes, offsets: list[tuple[int, int]]) -> bytes:
    """A glibc ld.so.cache: header, one entry per (name offset, path offset) into ``strings``."""
    header = struct.pack("<20sIIB3xI12x", NEW_MAGIC, len(offsets), len(strings), 0, 0)
    base = len(header) + 24 * len(offsets)
    table = b"".join(struct.pack("<iIIIQ", 0x303, base + key, base + value, 0, 0) for key, value in offsets)
    return header + table + strings


def test_a_hostile_ld_cache_costs_what_a_plain_one_does() -> None:
    """Entries pointing into one long run of bytes without a NUL (an image's or a driver tree's
    cache): each string search is bounded, so the cost follows the entries, not entries times size."""
    from support.timing import assert_as_fast

    n = 20000
    plain = _cache(b"libx.so.1\0/usr/lib/libx.so.1\0", [(0, 10)] * n)
    unterminated = _cache(b"libx.so.1\0" + b"A" * (4 << 20), [(0, 10 + i) for i in range(n)])
    long_strings = _cache(b"libx.so.1\0" + (b"/" + b"a" * 3000 + b"\0") * 1000, [(0, 10 + i * 100) for i in range(n)])
    assert_as_fast(lambda: parse_ld_cache(unterminated), lambda: parse_ld_cache(plain), "unterminated strings", "a plain cache")
    assert_as_fast(lambda: parse_ld_cache(long_strings), lambda: parse_ld_cache(plain), "long strings", "a plain cache")
    assert len(parse_ld_cache(plain)) == n
    assert parse_ld_cache(unterminated) == []
    assert 0 < len(parse_ld_cache(long_strings)) < n  # it stops when the strings read exceed 4 times the cache


# -- the probe cache's marshal walk: what it accepts, marshal reads without allocating more -----

_CACHE_VALUES = st.recursive(
    st.none() | st.integers(min_value=-(2**80), max_value=2**80) | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=8).map(tuple), max_leaves=40,
)


@given(_CACHE_VALUES)
def test_the_cache_walk_accepts_every_value_the_cache_stores_and_no_prefix_or_suffix(value: object) -> None:
    import marshal

    from ponytail.host.probecache import bounded_marshal

    data = marshal.dumps(value)
    assert bounded_marshal(data)
    assert not bounded_marshal(data + b"N")
    assert not any(bounded_marshal(data[:i]) for i in range(0, len(data), max(1, len(data) // 50)))


@given(_CACHE_VALUES, st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=4))
def test_what_the_cache_walk_accepts_marshal_reads_within_its_size(value: object, flips: list[tuple[int, int]]) -> None:
    import marshal
    import sys

    from ponytail.host.probecache import bounded_marshal

    data = bytearray(marshal.dumps(value))
    for where, byte in flips:
        data[where % len(data)] = byte
    if bounded_marshal(bytes(data)):
        try:
            loaded = marshal.loads(bytes(data))  # noqa: S302 - the test's own bytes
        except (ValueError, EOFError, TypeError):
            return
        assert sys.getsizeof(loaded) <= 64 + 8 * len(data)


@pytest.mark.parametrize("data", [
    b"(" + (1_200_000_000).to_bytes(4, "little") + b"N",  # marshal would allocate 9.6 GB first
    b"l" + (1 << 30).to_bytes(4, "little") + b"\x00\x00",
    b")\x01" * 20 + b"N",  # deeper than the cache's entries nest
    b"[\x00\x00\x00\x00", b"{0", b"g" + bytes(8), b"r" + bytes(4), b"",
])
def test_the_cache_walk_refuses_what_the_cache_never_stores(data: bytes) -> None:
    from ponytail.host.probecache import bounded_marshal

    assert not bounded_marshal(data)
