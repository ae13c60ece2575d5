"""The probe cache (ponytail.host.probecache): a second run is served what the first found
under the driver root, and whatever could make that stale (a driver upgrade, a library
added, removed or rewritten, a new ld.so.cache, a config change, a new GPU, a MIG change)
is seen at once. A cache file that is not root's own, well-formed one is ignored."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.engines import console_script
from support.fakehost import CAPS_MAJOR, LIB_DIR, NVIDIA_MAJOR, FakeHost, compile_library, gpus
from support.harness import in_private_mount_ns, mounts_under, run_ponytail

VERSION = "550.54.15"


def cached_config(host: FakeHost, tmp_path: Path, extra: str = "") -> Path:
    """The fake host's config, with its cache directory moved to ``tmp_path``/cache."""
    config = host.base / "config.toml"
    config.write_text(host.config_text().replace(f'dir = "{host.base}/cache"', f'dir = "{tmp_path}/cache"') + extra)
    return config


def listed(config: Path) -> list[str]:
    result = run_ponytail(["list", "-config", str(config)])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().splitlines()


def warm(config: Path, tmp_path: Path) -> list[str]:
    """``ponytail list`` until it has remembered its search (a run does not when the driver
    root changed just before it began: a fake host is built just before)."""
    for _ in range(5):
        listing = listed(config)
        if list((tmp_path / "cache").glob("probe-*.cache")):
            return listing
    raise AssertionError("the probe cache was never written")


def cache_file(tmp_path: Path) -> Path:
    """The one cache file of a test's private cache directory."""
    files = list((tmp_path / "cache").glob("probe-*.cache"))
    assert len(files) == 1, files
    return files[0]


def lib(host: FakeHost, name: str) -> str:
    return f"{host.driver}{LIB_DIR}/{name}"


def test_a_second_run_is_served_from_the_cache(host: FakeHost, tmp_path: Path, rootfs: Path) -> None:
    config = cached_config(host, tmp_path)
    first = warm(config, tmp_path)
    cache = cache_file(tmp_path)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600 and stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    assert lib(host, f"libcuda.so.{VERSION}") in first
    assert listed(config) == first

    # a manual injection served from the cache searches nothing: the search's modules stay unimported
    def injected_modules(cache_dir: str) -> set[str]:
        config.write_text(host.config_text().replace(f'dir = "{host.base}/cache"', f'dir = "{cache_dir}"'))
        result = in_private_mount_ns(
            f"""
            PYTHONPROFILEIMPORTTIME=1 {console_script("ponytail")} -config {config} -root {rootfs} -device 0
            chroot {rootfs} /usr/local/bin/cudacheck /dev/nvidia0
            """
        )
        assert result.returncode == 0 and "cuDriverGetVersion 12040" in result.stdout, result.stderr
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:") and "|" in line}

    search = {"glob", "fnmatch", "ponytail.host.elf"}
    assert search <= injected_modules("")  # no cache: the driver root is searched
    injected_modules(f"{tmp_path}/cache")  # remembers what a manual run's capabilities find
    served = injected_modules(f"{tmp_path}/cache")
    assert not search & served
    # nor, with the ponytail command's own launcher (packaging/bin/ponytail) and no signal module,
    # re and the enums it brings (a hook imports them with json, a manual run need not)
    assert not {"re", "enum", "signal", "functools", "collections"} & served
    assert mounts_under(rootfs) == []


def _upgrade_driver(host: FakeHost) -> None:  # the kernel module now says 535: its libraries are the ones to take
    version = host.proc / "driver/nvidia/version"
    version.write_text(version.read_text().replace(VERSION, "535.104.05"))


def _install(host: FakeHost, stem: str) -> None:
    built = compile_library("fake_plain.c", f"{stem}.so.1", f"{stem}.so.{VERSION}", VERSION)
    shutil.copy(built, lib(host, f"{stem}.so.{VERSION}"))


def _add_library(host: FakeHost) -> None:
    _install(host, "libnvidia-allocator")


def _remove_library(host: FakeHost) -> None:
    os.unlink(lib(host, f"libnvidia-ptxjitcompiler.so.{VERSION}"))


def _rewrite_library_in_place(host: FakeHost) -> None:  # same inode, no longer an ELF library
    with open(lib(host, f"libnvidia-ptxjitcompiler.so.{VERSION}"), "r+b") as f:
        f.write(b"garbage!")


def _new_ld_cache(host: FakeHost) -> None:  # a library in a directory only ld.so.cache names
    opt = host.driver / "opt/nvidia/lib"
    opt.mkdir(parents=True)
    shutil.copy(compile_library("fake_plain.c", "libnvidia-nvvm.so.4", f"libnvidia-nvvm.so.{VERSION}", VERSION), opt / f"libnvidia-nvvm.so.{VERSION}")
    (host.driver / "etc/ld.so.conf.d/opt.conf").write_text("/opt/nvidia/lib\n")
    subprocess.run(["ldconfig", "-r", str(host.driver)], check=True)


def _add_gpu(host: FakeHost) -> None:  # a fourth GPU, last in bus order, /dev/nvidia9
    old, new = host.gpu_list[0], "0000:e8:00.0"
    text = (host.proc / "driver/nvidia/gpus" / old.bus_id / "information").read_text()
    text = text.replace(old.bus_id, new).replace(old.uuid, "GPU-99999999-1111-2222-3333-444444444444")
    text = text.replace(f"Device Minor: \t {old.minor}", "Device Minor: \t 9")
    (host.proc / "driver/nvidia/gpus" / new).mkdir()
    (host.proc / "driver/nvidia/gpus" / new / "information").write_text(text)
    pci = host.sys / "bus/pci/devices" / new
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x10de\n")
    (pci / "class").write_text("0x030200\n")
    os.mknod(host.dev / "nvidia9", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 9))


CHANGES: dict[str, tuple[Callable[[FakeHost], None], str, str]] = {
    # change -> (what it does, a path listed only before, a path listed only after) ("" : none)
    "driver upgrade": (_upgrade_driver, f"libcuda.so.{VERSION}", "libcuda.so.535.104.05"),
    "library added": (_add_library, "", f"libnvidia-allocator.so.{VERSION}"),
    "library removed": (_remove_library, f"libnvidia-ptxjitcompiler.so.{VERSION}", ""),
    "library rewritten in place": (_rewrite_library_in_place, f"libnvidia-ptxjitcompiler.so.{VERSION}", ""),
    "new ld.so.cache": (_new_ld_cache, "", f"/opt/nvidia/lib/libnvidia-nvvm.so.{VERSION}"),
    "GPU added": (_add_gpu, "", "/dev/nvidia9"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_on_the_host_is_seen_by_the_next_run(host: FakeHost, tmp_path: Path, change: str) -> None:
    _install(host, "libnvidia-ptxjitcompiler")  # one that may go (the capabilities need libcuda and libnvidia-ml)
    config = cached_config(host, tmp_path)
    do, before_only, after_only = CHANGES[change]
    before = warm(config, tmp_path)
    assert listed(config) == before  # served from the cache
    do(host)
    after = listed(config)
    if before_only:
        assert any(p.endswith(before_only) for p in before) and not any(p.endswith(before_only) for p in after), after
    if after_only:
        assert not any(p.endswith(after_only) for p in before) and any(p.endswith(after_only) for p in after), after


def test_a_config_change_is_seen_by_the_next_run(host: FakeHost, tmp_path: Path) -> None:
    extra_dir = host.driver / "opt/extra"
    extra_dir.mkdir(parents=True)
    shutil.copy(compile_library("fake_plain.c", "libextra.so.1", "libextra.so.1", VERSION), extra_dir / "libextra.so.1")
    before = listed(cached_config(host, tmp_path))
    after = listed(cached_config(host, tmp_path, '[library]\npaths = ["/opt/extra/libextra.so.*"]\n'))
    assert f"{extra_dir}/libextra.so.1" in after and f"{extra_dir}/libextra.so.1" not in before


def test_a_mig_change_is_seen_by_the_next_run(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(2))
    config = cached_config(host, tmp_path)

    def info() -> dict:
        result = run_ponytail(["info", "--json", "-config", str(config)])
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    before = info()
    assert info() == before
    # MIG on GPU 1 with one GPU instance and one compute instance, as the driver shows it
    gi_minor, ci_minor = FakeHost.mig_minors(1, 1, 0)
    gi = host.proc / "driver/nvidia/capabilities/gpu1/mig/gi1"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
    (gi / "ci0/access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")
    for minor in (gi_minor, ci_minor):
        os.mknod(host.dev / f"nvidia-caps/nvidia-cap{minor}", 0o666 | stat.S_IFCHR, os.makedev(CAPS_MAJOR, minor))
    after = info()
    assert after != before, after
    print(json.dumps(after))


# -- a cache file that is not root's own, well-formed one -----------------------------------


def _poison(cache: Path, evil: Path) -> bytes:
    """The cache's entry with one more library, ``evil``."""
    key, witnesses, (libraries, *rest) = marshal.loads(cache.read_bytes())  # noqa: S302 - the test's own cache file
    bogus = (str(evil), str(evil), "/usr/lib/x86_64-linux-gnu/libevil.so.1", "libevil.so.1", "compute", 64, (), "")
    return marshal.dumps((key, witnesses, (libraries + (bogus,), *rest)))


HOSTILE: dict[str, str] = {
    # name -> a shell script run before the second run; $C is the cache file, $P its poisoned content
    "garbage": 'printf "\\x00\\xffnot marshal" > "$C"',
    "empty": ': > "$C"',
    "wrong shape": "printf '" + "".join(f"\\{byte:03o}" for byte in marshal.dumps([1, 2, 3])) + "' > \"$C\"",  # octal: no xxd on a fresh machine
    "wrong shape inside": "",  # the right key, a payload of another shape (written by the test)
    "too big": 'head -c 2000000 /dev/zero > "$C"',
    "a FIFO": 'rm "$C" && mkfifo -m 600 "$C"',
    "world-writable": 'cp "$P" "$C" && chmod 666 "$C"',
    "group-readable": 'cp "$P" "$C" && chmod 640 "$C"',
    "another user's": 'cp "$P" "$C" && chown 65534 "$C"',
    "a symlink": 'rm "$C" && cp "$P" "$C.real" && chmod 600 "$C.real" && ln -s "$C.real" "$C"',
    "in a group-writable directory": 'cp "$P" "$C" && chmod 770 "$(dirname "$C")"',
    "in a symlinked directory": 'D=$(dirname "$C"); mv "$D" "$D.real" && cp "$P" "$D.real/$(basename "$C")" && ln -s "$D.real" "$D"',
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_cache_file_is_ignored(host: FakeHost, tmp_path: Path, case: str) -> None:
    config = cached_config(host, tmp_path)
    honest = warm(config, tmp_path)
    honest_stderr = run_ponytail(["list", "-config", str(config)]).stderr
    cache = cache_file(tmp_path)
    evil = tmp_path / "evil.so"
    evil.write_bytes(b"\x7fELF not really")
    poisoned = tmp_path / "poisoned"
    poisoned.write_bytes(_poison(cache, evil))
    if HOSTILE[case]:
        setup = subprocess.run(["sh", "-c", HOSTILE[case]], env={**os.environ, "C": str(cache), "P": str(poisoned)})
        assert setup.returncode == 0
    else:
        key, witnesses, _ = marshal.loads(cache.read_bytes())  # noqa: S302 - the test's own cache file
        cache.write_bytes(marshal.dumps((key, witnesses, ((str(evil),), (), (), (), ()))))
    result = run_ponytail(["list", "-config", str(config)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines() == honest and str(evil) not in result.stdout.decode()
    assert result.stderr == honest_stderr  # not a word about the cache
    assert evil.read_bytes() == b"\x7fELF not really"


CORRUPT: dict[str, bytes] = {
    # root's own 0600 file, every trust check passes: only the decoder stands between it and the run
    "a tuple header of 1.2 billion items": b"(" + (1_200_000_000).to_bytes(4, "little") + b"N",
    "a small tuple of more items than bytes": b")\xffNN",
    "a long of 2**30 digits": b"l" + (1 << 30).to_bytes(4, "little") + b"\x00\x00",
    "a string longer than the file": b"u" + (1 << 31).to_bytes(4, "little") + b"x",
    "a reference to nothing": b"r" + (0).to_bytes(4, "little"),
    "nesting": b")\x01" * 100_000 + b"N",
}


@pytest.mark.parametrize("case", CORRUPT)
def test_a_corrupted_cache_costs_neither_time_nor_memory_and_is_rewritten(host: FakeHost, tmp_path: Path, case: str) -> None:
    """Before, the 6-byte tuple header cost ~25 s and ~9.6 GB (marshal allocates by the count it
    reads before the items), and was never rewritten. Run in 1 GiB of address space."""
    config = cached_config(host, tmp_path)
    honest = warm(config, tmp_path)
    honest_stderr = run_ponytail(["list", "-config", str(config)]).stderr
    cache = cache_file(tmp_path)
    cache.write_bytes(CORRUPT[case])
    cache.chmod(0o600)
    started = time.monotonic()
    result = run_ponytail(["list", "-config", str(config)], command=["prlimit", f"--as={1 << 30}", "--", *PONYTAIL])
    took = time.monotonic() - started
    assert result.returncode == 0 and result.stderr == honest_stderr, result.stderr
    assert result.stdout.decode().splitlines() == honest
    assert took < 10, took
    key, _, _ = marshal.loads(cache_file(tmp_path).read_bytes())  # noqa: S302 - rewritten by the run: the test's own cache file
    assert type(key) is tuple  # a whole entry again


def test_the_poison_of_the_hostile_cases_would_be_served_from_root_s_own_file(host: FakeHost, tmp_path: Path) -> None:
    # the control for the cases above: their poisoned entry is well-formed and matches, so only
    # the checks on the file keep it out (root's own 0600 file in root's 0700 directory is trusted)
    config = cached_config(host, tmp_path)
    warm(config, tmp_path)
    cache = cache_file(tmp_path)
    evil = tmp_path / "evil.so"
    cache.write_bytes(_poison(cache, evil))
    assert str(evil) in listed(config)


def test_the_cache_keeps_the_newest_entries_and_no_orphaned_temporary_file(host: FakeHost, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = cache_dir / f".probe-0000000000000000.cache.{dead.pid}-000000000000.tmp"  # a writer SIGKILLed before its rename
    orphan.write_bytes(b"half")
    from ponytail.host.probecache import MAX_ENTRIES

    for i in range(MAX_ENTRIES + 2):  # as many configs, as many keys
        listed(cached_config(host, tmp_path, f'[library]\npaths = ["/opt/extra{i}/lib*.so"]\n'))
    assert len(list(cache_dir.glob("probe-*.cache"))) == MAX_ENTRIES == 32
    assert not orphan.exists()


def test_a_search_during_which_the_driver_root_changed_is_not_remembered(host: FakeHost, tmp_path: Path) -> None:
    # a driver being installed while a container starts: what the search found may be half old,
    # half new, and its witnesses already show the new state; a later run remembers a clean search
    from ponytail.host.driver_files import FoundFiles
    from ponytail.host.probecache import cached_search

    libdir = f"{host.driver}{LIB_DIR}"
    cache_dir = tmp_path / "cache"

    def search(change: bool):  # type: ignore[no-untyped-def]
        def run():  # type: ignore[no-untyped-def]
            if change:
                (Path(libdir) / "libnvidia-new.so.1").write_bytes(b"")  # the installer, meanwhile
            return FoundFiles()

        return run

    key = ("550.54.15",)
    cached_search(str(cache_dir), str(host.driver), key, (LIB_DIR,), search(change=True))
    assert not list(cache_dir.glob("probe-*.cache"))
    for _ in range(200):  # until the driver root's last change is more than a clock tick ago
        cached_search(str(cache_dir), str(host.driver), key, (LIB_DIR,), search(change=False))
        if list(cache_dir.glob("probe-*.cache")):
            break
        time.sleep(0.005)
    assert len(list(cache_dir.glob("probe-*.cache"))) == 1


def test_info_s_libcuda_lookup_is_cached_and_sees_libcuda_go(host: FakeHost, tmp_path: Path) -> None:
    config = cached_config(host, tmp_path)

    def info() -> dict:
        result = run_ponytail(["info", "--json", "-config", str(config)])
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    for _ in range(5):  # until the lookup is remembered (see warm())
        assert info()["cuda_version"] == "12.4"
        if list((tmp_path / "cache").glob("probe-*.cache")):
            break
    assert info()["cuda_version"] == "12.4"  # from the cache
    for name in (f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so"):
        os.unlink(lib(host, name))
    assert info()["cuda_version"] is None


def test_the_key_names_each_module_of_the_search_code_where_it_is() -> None:
    # a module moved or renamed would silently drop out of the key: an edit of it would not
    # invalidate what an older search found
    import ponytail
    from ponytail.host.probecache import SEARCH_CODE, _code_identity

    package = Path(ponytail.__file__).parent
    assert [m for m in SEARCH_CODE if not (package / f"{m}.py").is_file()] == []
    assert None not in _code_identity()
