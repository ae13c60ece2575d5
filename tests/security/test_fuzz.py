"""Property-based fuzzing: generated inputs by the thousand, zero tracebacks.

- The in-root resolver, on random trees of directories, files and symlinks (absolute, relative,
  '..'-laden, looping): it never names or creates anything outside the root, and where the
  kernel can say (openat2 with RESOLVE_IN_ROOT, asked here directly) it resolves to the very
  file the kernel does, also where the resolver follows a last symlink or creates directories.
- The OCI state, the bundle's config.json and config.toml parsers, alone and through the whole
  hook in-process (-debug, so nothing is mounted): a valid input or one line, exit 2.
- The ld.so.cache parser, which reads the rootfs's cache back after ldconfig: any bytes.
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ponytail.config import load_config, parse_config
from ponytail.container.oci import load_container, parse_env, parse_json_object, parse_state
from ponytail.container.request import build_request
from ponytail.container.require import Facts, check_requirements
from ponytail.errors import ConfigError, InputError, PonytailError
from ponytail.fs.inroot import UnsafePath, resolve_in_root
from ponytail.hooks.prestart import run_hook
from ponytail.host.ldcache import _NEW_ENTRY, _NEW_HEADER, NEW_MAGIC, OLD_MAGIC, parse_ld_cache_entries
from ponytail.host.probe import Host, probe_host
from ponytail.options import HookOptions
from ponytail.plan.select import select_devices

from support.fakehost import FakeHost, gpus
from support.harness import tree_digest

# how many examples: the Hypothesis profile (tests/conftest.py); trees built on disk are slow examples
fuzz = settings(suppress_health_check=list(HealthCheck))

# -- the resolver ------------------------------------------------------------------
NAMES = ("a", "b", "c")
component = st.sampled_from(NAMES + ("..", "."))
relative = st.lists(component, min_size=1, max_size=5).map("/".join)
link_text = st.one_of(relative, relative.map(lambda p: "/" + p), st.just("/"), st.sampled_from(("../../..", "../../../a/b")))
entry_path = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)
entry = st.tuples(entry_path, st.one_of(st.just("dir"), st.just("file"), link_text.map(lambda t: "link:" + t)))
lookup = st.tuples(st.booleans(), st.lists(component, min_size=1, max_size=6)).map(lambda t: ("/" if t[0] else "") + "/".join(t[1]))


def build_tree(root: Path, entries: list[tuple[tuple[str, ...], str]]) -> None:
    for parts, kind in entries:
        parent = root
        for name in parts[:-1]:
            parent = parent / name
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                break
            parent.mkdir(exist_ok=True)
        else:
            path = parent / parts[-1]
            if path.is_symlink() or path.exists():
                continue
            if kind == "dir":
                path.mkdir()
            elif kind == "file":
                path.write_text("")
            else:
                os.symlink(kind[5:], path)


SYS_OPENAT2 = 437
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def kernel_resolve(root_fd: int, path: str, follow_last: bool) -> tuple[int, int] | int:
    """(st_dev, st_ino) of what openat2(RESOLVE_IN_ROOT) opens, or its errno."""
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW), 0, RESOLVE_IN_ROOT)
    for _ in range(64):  # EAGAIN: a rename or mount anywhere on the machine raced with a '..'; the kernel asks to try again
        fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), root_fd, path.encode(), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0 or ctypes.get_errno() != errno.EAGAIN:
            break
    if fd < 0:
        return ctypes.get_errno()
    try:
        st_ = os.fstat(fd)
        return (st_.st_dev, st_.st_ino)
    finally:
        os.close(fd)


def _has_openat2() -> bool:
    fd = os.open("/", os.O_PATH)
    try:
        return kernel_resolve(fd, ".", True) != 38  # ENOSYS
    finally:
        os.close(fd)


HAS_OPENAT2 = _has_openat2()


@fuzz
@given(
    entries=st.lists(entry, max_size=10),
    paths=st.lists(st.tuples(lookup, st.booleans(), st.booleans()), min_size=1, max_size=4),
)
def test_resolver_never_leaves_the_root_and_agrees_with_the_kernel(entries, paths) -> None:
    base = Path(tempfile.mkdtemp(prefix="ponytail-fuzz-"))
    try:
        root = base / "root"
        for name in NAMES:  # what an escape through '..' or an absolute link would reach
            (base / name / "a" / "b").mkdir(parents=True)
        root.mkdir()
        build_tree(root, entries)
        outside = tree_digest(base / "a") + tree_digest(base / "b") + tree_digest(base / "c")
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            for path, follow_last, create_dirs in paths:
                check_one(root, root_fd, path, follow_last, create_dirs)
        finally:
            os.close(root_fd)
        assert tree_digest(base / "a") + tree_digest(base / "b") + tree_digest(base / "c") == outside
    finally:
        shutil.rmtree(base)


def check_one(root: Path, root_fd: int, path: str, follow_last: bool, create_dirs: bool) -> None:
    expected = kernel_resolve(root_fd, path, follow_last) if HAS_OPENAT2 and not create_dirs else None
    try:
        resolved = resolve_in_root(root_fd, path, follow_last=follow_last, create_dirs=create_dirs)
    except UnsafePath:
        if isinstance(expected, tuple):  # the kernel found it: only the root itself is refused
            assert expected == (root.stat().st_dev, root.stat().st_ino), path
        return
    try:
        parent = os.readlink(f"/proc/self/fd/{resolved.parent_fd}")
        assert parent == str(root) or parent.startswith(f"{root}/"), (path, parent)
        assert os.path.join(parent, resolved.name) == str(root) + resolved.path, (path, resolved.path)
        if not resolved.exists:
            assert expected in (None, 2), (path, expected)  # ENOENT
            return
        st_ = os.stat(resolved.name, dir_fd=resolved.parent_fd, follow_symlinks=False)
        assert not (follow_last and os.path.islink(os.path.join(parent, resolved.name))), path
        if expected is not None:
            assert expected == (st_.st_dev, st_.st_ino), (path, expected)
    finally:
        resolved.close()


# -- the parsers -----------------------------------------------------------------------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
path_text = st.one_of(
    st.text(max_size=12), st.text(max_size=12).map(lambda t: "/" + t),
    st.sampled_from(("/", "rootfs", "/nonexistent", "/a\0b", "a\0b", "/x\ud800", "\udc80", "../../x")),
)


def mostly(valid: st.SearchStrategy, other: st.SearchStrategy = json_value) -> st.SearchStrategy:
    """``valid`` three times in four, so that most inputs get past the first check."""
    return st.one_of(valid, valid, valid, other)


def state_object(bundle: str) -> st.SearchStrategy:
    required = {
        "id": mostly(st.text(min_size=1, max_size=12)),
        "pid": mostly(st.integers(1, 2**40), st.one_of(st.integers(-5, 0), json_value)),
        "bundle": mostly(st.just(bundle), st.one_of(path_text, json_value)),
    }
    optional = {
        "ociVersion": mostly(st.just("1.0.2")),
        "status": mostly(st.sampled_from(("creating", "created", "running", "stopped"))),
        "annotations": mostly(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)),
        "junk": json_value,
    }
    return mostly(st.fixed_dictionaries(required, optional=optional), st.fixed_dictionaries({}, optional={**required, **optional}))


selector = st.one_of(
    st.sampled_from(("all", "void", "none", "", "0", "1", "0,1", "GPU-00000001-1111-2222-3333-000000000000", "00000000:18:00.0")),
    st.sampled_from(("0:0:0", "²:0:0", "0:²:1", "9:9:9", "0:0", "MIG-00000000-0000-0000-0000-000000000000")),
    st.text(alphabet=st.sampled_from(list("0123456789,:.- ²٣GPUabcdefx")), max_size=10),
)
capabilities = st.lists(st.sampled_from(("compute", "utility", "graphics", "video", "display", "compat32", "ngx", "all", "bogus", "", "²")), max_size=3).map(",".join)
requirement = st.text(alphabet=st.sampled_from(list("cudariverbnh<>=!,. 0123456789²٣")), max_size=16)
env_item = st.one_of(
    selector.map(lambda v: "NVIDIA_VISIBLE_DEVICES=" + v),
    selector.map(lambda v: "NVIDIA_VISIBLE_DEVICES=" + v.replace(",", ":")),  # MIG GPU:GI:CI
    selector.map(lambda v: "NVIDIA_MIG_CONFIG_DEVICES=" + v),
    selector.map(lambda v: "NVIDIA_MIG_MONITOR_DEVICES=" + v),
    capabilities.map(lambda v: "NVIDIA_DRIVER_CAPABILITIES=" + v),
    requirement.map(lambda v: "NVIDIA_REQUIRE_CUDA=" + v),
    st.sampled_from(("PATH=/bin", "=", "X", "NVIDIA_DISABLE_REQUIRE=1", "CUDA_VERSION=12.4", "CUDA_VERSION=²٣.0")),
    json_value,
)


def bundle_object() -> st.SearchStrategy:
    required = {"root": mostly(st.fixed_dictionaries({"path": mostly(st.just("rootfs"), st.one_of(path_text, json_value))}))}
    optional = {
        "process": mostly(st.fixed_dictionaries({"env": mostly(st.lists(env_item, min_size=1, max_size=4))})),
        "annotations": mostly(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)),
        "linux": mostly(st.fixed_dictionaries({}, optional={"cgroupsPath": json_value})),
    }
    return mostly(st.fixed_dictionaries(required, optional=optional), st.fixed_dictionaries({}, optional={**required, **optional}))


def encoded(value: st.SearchStrategy) -> st.SearchStrategy:
    """JSON text of ``value``, sometimes cut short or with bytes flipped."""
    text = value.map(lambda v: json.dumps(v).encode())
    return mostly(text, st.one_of(st.tuples(text, st.integers(0, 200)).map(lambda t: t[0][: t[1]]), st.binary(max_size=64)))


def test_json_errors_are_one_line_input_errors() -> None:
    for raw, message in (
        (b'{"a": }', "state is not valid JSON: Expecting value: line 1 column 7 (char 6)"),
        (b'{"a": 1} x', "state is not valid JSON: Extra data: line 1 column 10 (char 9)"),
        (b'{"a": "\\ud800"}', "state contains a string that is not valid Unicode (a lone \\uD8xx escape)"),
        (b"[1]", "state must be a JSON object, not list"),
        (b"[" * 100000 + b"]" * 100000, "state is nested too deeply"),
    ):
        with pytest.raises(InputError) as e:
            parse_json_object(raw, "state")
        assert e.value.message == message


@pytest.fixture(scope="module")
def fuzz_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[FakeHost, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    host = FakeHost(base / "host", gpu_list=gpus(2))
    (base / "bundle" / "rootfs").mkdir(parents=True)
    return host, base / "bundle"


@fuzz
@given(data=st.data())
def test_state_parser_gives_a_container_or_an_input_error(fuzz_host, data) -> None:
    _, bundle = fuzz_host
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    raw = data.draw(encoded(state_object(str(bundle))))
    try:
        container = load_container(parse_state(raw))
    except InputError as e:
        assert e.message  # one line once printed: see the whole-hook test below
        return
    assert container.pid > 0 and container.rootfs == f"{bundle}/rootfs"


@fuzz
@given(data=st.data())
def test_bundle_parser_gives_a_container_or_an_input_error(fuzz_host, data) -> None:
    _, bundle = fuzz_host
    raw = data.draw(encoded(bundle_object()))
    (bundle / "config.json").write_bytes(raw)
    state = json.dumps({"id": "fuzz", "pid": 1, "bundle": str(bundle)}).encode()
    try:
        container = load_container(parse_state(state))
    except InputError as e:
        assert e.message
        return
    assert os.path.isabs(container.rootfs) and all(isinstance(v, str) for v in container.env.values())


toml_value = st.one_of(
    st.text(max_size=16).map(json.dumps),
    st.sampled_from(('"/"', '"/tmp"', '"relative"', "1", "true", "1.5", "1979-05-27", "[]", '["/a/*.so"]', '["x"]', "{a = 1}", "[[1]]", '"\\u0000"')),
    st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
)
toml_key = st.sampled_from(("driver_root", "proc_root", "sys_root", "dev_root", "ldconfig", "paths", "file", "bogus"))
toml_line = st.one_of(
    st.tuples(toml_key, toml_value).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    st.sampled_from(("[host]", "[library]", "[log]", "[bogus]", "[[host]]", "host = 1", "[host", "= 1", "")),
    st.text(max_size=20),
)


@fuzz
@given(lines=st.lists(toml_line, max_size=8), raw_tail=st.binary(max_size=8))
def test_config_parser_gives_a_config_or_a_config_error(lines, raw_tail) -> None:
    raw = "\n".join(lines).encode() + (raw_tail if len(lines) % 3 == 0 else b"")
    try:
        config = parse_config(raw, "/etc/ponytail/config.toml")
    except ConfigError as e:
        assert e.message.startswith("config file /etc/ponytail/config.toml") and "\n" not in e.message
        return
    assert all(p.startswith("/") for p in config.library_paths)
    assert all(v.startswith("/") for v in (config.driver_root, config.proc_root, config.sys_root, config.dev_root))


@fuzz
@given(data=st.data())
def test_the_whole_hook_answers_every_input_with_one_line(fuzz_host, data) -> None:
    """State and bundle through run_hook with -debug: never a traceback or an internal error. A plan
    is printed, with at most warnings beside it; a plan that cannot work (exit 1) is printed with its
    reason; bad input is exit 2 and one line."""
    host, bundle = fuzz_host
    (bundle / "config.json").write_bytes(data.draw(encoded(bundle_object())))
    raw = data.draw(encoded(state_object(str(bundle))))
    out, err = io.StringIO(), io.StringIO()
    code = run_hook(HookOptions(config=str(host.write_config()), debug=True), stdin=io.BytesIO(raw), stdout=out, stderr=err)
    message = err.getvalue()
    assert "internal error" not in message and "Traceback" not in message, message
    warnings = message.splitlines()
    if code in (0, 1):  # 1: e.g. graphics asked of a host without its libraries; the plan says why
        assert all(w.startswith("ponytail: warning: ") for w in warnings) and out.getvalue().startswith("ponytail -debug"), message
    else:
        assert code == 2 and message.startswith("ponytail: error: ") and message.count("\n") == 1, message


cache_header = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 2**32 - 1))
cache_entry = st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 300), st.integers(0, 300), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))


@fuzz
@given(
    old=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    header=cache_header,
    entries=st.lists(cache_entry, max_size=6),
    tail=st.binary(max_size=200),
)
def test_ld_cache_parser_takes_any_bytes(old, header, entries, tail) -> None:
    """The rootfs's /etc/ld.so.cache is read back after ldconfig to check the injected libraries
    win; the image can swap it for anything meanwhile."""
    data = b""
    if old is not None:
        data = OLD_MAGIC + b"\0" + struct.pack("<I", old)
    data += _NEW_HEADER.pack(NEW_MAGIC, *header) + b"".join(_NEW_ENTRY.pack(*e) for e in entries) + tail
    for sample in (data, data[: len(data) // 2], tail):
        for name, path, flags in parse_ld_cache_entries(sample):
            assert isinstance(name, str) and isinstance(path, str) and "\0" not in path and isinstance(flags, int)


@pytest.fixture(scope="module")
def probed(fuzz_host) -> Host:
    host, _ = fuzz_host
    config = load_config(str(host.write_config()), required=True)
    return probe_host(config, ("compute", "utility"))


@fuzz
@given(env=st.lists(env_item.filter(lambda e: isinstance(e, str)), max_size=5), privileged=st.booleans())
def test_the_nvidia_variables_give_a_request_or_an_input_error(probed: Host, env: list[str], privileged: bool) -> None:
    """NVIDIA_VISIBLE_DEVICES, _DRIVER_CAPABILITIES, _REQUIRE_*, MIG selectors: the image's own
    words, read by the hook on the host."""
    try:
        request = build_request(env=parse_env(env, "env"), privileged=privileged)
        selection = select_devices(probed.gpus, request.devices, lambda: {})
        facts = Facts(probed.driver_version, lambda: "12.4", tuple(g.model for g in selection.gpus))
        check_requirements(request.requirements, facts)
    except PonytailError as e:
        assert e.message
