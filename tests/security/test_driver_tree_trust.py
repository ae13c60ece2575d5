"""A driver's code never runs as root, and a registered driver tree is only as trusted as
whoever can write it.

- The CUDA version (for NVIDIA_REQUIRE_CUDA) is asked of libcuda, and MIG UUIDs of
  libnvidia-ml, by a child that gave up root: the fake library's constructor
  (tests/c/spy.h) reports what it ran as, through a FIFO: user and group nobody, no
  capability (the bounding set too), no_new_privs, and every mount read-only (it cannot
  create a file in a directory that anyone may write). That holds for a registered tree's
  libcuda and for the host's own driver root.
- A [drivers.NAME] tree that someone other than root could change (the root, a directory
  above it or below it, a file used, its ld.so.cache) is refused with one line naming the
  path, its owner and mode, and what to do.
- A FIFO as a tree's ld.so.cache or among its libraries never hangs a run.
- The strict policy (accept_env_when_unprivileged = false) refuses an unprivileged
  container's choice of tree, as it refuses its NVIDIA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.fakehost import LIB_DIR, FakeHost, gpus
from support.harness import bundle_for, run_ponytail, state_for

TREE = ("560.28.03", 12060)
NOBODY = 65534
EROFS = 30
STRICT = "[request]\naccept_env_when_unprivileged = false\n"


@pytest.fixture
def host(tmp_path: Path) -> tuple[FakeHost, Path]:
    host = FakeHost(tmp_path / "host", gpu_list=gpus(1))
    tree = host.add_driver_tree("dev", *TREE)
    config = host.write_config()
    config.write_text(config.read_text() + f'[drivers.dev]\nroot = "{tree}"\nkernel_modules = ["*"]\n')
    return host, config


@pytest.fixture
def spy() -> Iterator[Path]:
    """A directory anyone may enter holding a FIFO anyone may write (the spy's way out of a
    child that runs as nobody) and ``open/``, a directory anyone may write."""
    where = Path(tempfile.mkdtemp(prefix="ponytail-spy-"))
    where.chmod(0o755)
    os.mkfifo(where / "fifo")
    (where / "fifo").chmod(0o666)
    (where / "open").mkdir()
    (where / "open").chmod(0o777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def hook_dry_run(tmp_path: Path, config: Path, env: list[str], environ: dict[str, str] | None = None,
                 privileged: bool = False, mounts: list | None = None) -> subprocess.CompletedProcess:
    """The hook's -debug run for a container with ``env`` (and the device plugin's ``mounts``)."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir(exist_ok=True)
    bundle = bundle_for(tmp_path, rootfs, env=["PATH=/bin", *env])
    spec = json.loads((bundle / "config.json").read_text())
    caps = ["CAP_CHOWN", "CAP_SYS_ADMIN"] if privileged else ["CAP_CHOWN"]
    spec["process"]["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps}
    spec["mounts"] = mounts or []
    (bundle / "config.json").write_text(json.dumps(spec))
    return run_ponytail(["-config", str(config), "-debug"], stdin=state_for(bundle, 1), env=environ)


def spied(fifo: Path, run: Callable[[], subprocess.CompletedProcess]) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """``run()``, and the status lines every loader of the fake libcuda wrote to ``fifo``."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = run()
        try:
            data = os.read(reader, 1 << 16).decode()
        except BlockingIOError:
            data = ""
    finally:
        os.close(reader)
    fields: dict[str, str] = {}
    for line in data.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name, " ".join(value.split()))
    fields["loads"] = str(data.count("Uid:"))
    return result, fields


@pytest.mark.parametrize("whose", ["registered tree", "host driver root", "NVML for a MIG UUID"])
def test_driver_libraries_are_loaded_as_nobody_without_capabilities(
    host: tuple[FakeHost, Path], tmp_path: Path, spy: Path, whose: str
) -> None:
    """libcuda asked for the CUDA version (a tree's, the host's), libnvidia-ml for MIG UUIDs."""
    fake, config = host
    env = ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"] + (["PONYTAIL_DRIVER=dev"] if whose == "registered tree" else [])
    if whose.startswith("NVML"):
        mig = FakeHost(tmp_path / "mig", gpu_list=gpus(1), mig={0: [(1, 0)]})
        config, env = mig.write_config(), [f"NVIDIA_VISIBLE_DEVICES={FakeHost.mig_uuid(0, 1, 0)}"]
    environ = {"PONYTAIL_TEST_SPY": str(spy / "fifo"), "PONYTAIL_TEST_SPY_WRITE": str(spy / "open/planted")}
    result, seen = spied(spy / "fifo", lambda: hook_dry_run(tmp_path, config, env, environ))
    assert result.returncode == 0, result.stderr
    assert "problem" not in result.stdout.decode(), result.stdout.decode()  # CUDA 12.6 / 12.4 meets cuda>=12.0
    assert seen["loads"] == "1", seen  # loaded once, by the child, never by ponytail itself
    assert seen["Uid"] == seen["Gid"] == f"{NOBODY} {NOBODY} {NOBODY} {NOBODY}", seen
    assert seen["Groups"] == "", seen
    assert {seen[c] for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}, seen
    assert seen["NoNewPrivs"] == "1", seen
    assert seen["SpyWrite"] == str(EROFS), seen  # a directory anyone may write: read-only in the child's view
    assert not (spy / "open/planted").exists()
    # of root's descriptors the driver code holds only the library it is (read-only) and the answer pipe:
    # not the run log (open for appending), the container's namespace or rootfs, a cache
    kinds = sorted(fd.split(":", 1)[1] for fd in seen["SpyFds"].split())
    assert kinds == ["f:r", "p:w"], seen["SpyFds"]
    assert seen["SpyForged"] == "", seen
    logs = list(tmp_path.rglob("ponytail.log"))
    assert logs and not any("forged by driver code" in log.read_text() for log in logs)


def test_a_cached_cuda_version_loads_no_code(host: tuple[FakeHost, Path], tmp_path: Path, spy: Path) -> None:
    _, config = host
    environ = {"PONYTAIL_TEST_SPY": str(spy / "fifo")}
    first = spied(spy / "fifo", lambda: hook_dry_run(tmp_path, config, ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"], environ))[1]
    second = spied(spy / "fifo", lambda: hook_dry_run(tmp_path, config, ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"], environ))[1]
    assert (first["loads"], second["loads"]) == ("1", "0")


def _chown(path: Path) -> None:
    os.lchown(path, 1000, 1000)


# how a tree can be someone else's: (what is changed, relative to the tree's root; how)
UNTRUSTED = {
    "root owned by a user": ("", _chown),
    "a library directory owned by a user": (LIB_DIR.lstrip("/"), _chown),
    "libcuda owned by a user": (f"{LIB_DIR.lstrip('/')}/libcuda.so.{TREE[0]}", _chown),
    "ld.so.cache owned by a user": ("etc/ld.so.cache", _chown),
    "a group-writable directory": ("usr/lib", lambda p: p.chmod(0o775)),
    "a world-writable library": (f"{LIB_DIR.lstrip('/')}/libnvidia-ml.so.{TREE[0]}", lambda p: p.chmod(0o666)),
    "the directory above owned by a user": ("..", _chown),
}


@pytest.mark.parametrize("case", list(UNTRUSTED))
def test_a_tree_someone_else_could_change_is_refused_in_one_line(host: tuple[FakeHost, Path], tmp_path: Path, case: str) -> None:
    fake, config = host
    relative, change = UNTRUSTED[case]
    path = Path(os.path.normpath(fake.base / "umd/dev" / relative))
    change(path)
    result = run_ponytail(["list", "-config", str(config), "--driver", "dev"])
    err = result.stderr.decode()
    assert result.returncode == 1, (case, result.stdout, err)
    assert err.count("\n") == 1 and f"driver tree 'dev' refused: {path} is " in err, err
    # the fix names what is wrong: the tree, or the one directory above it
    assert (f"chown root:root {path} && chmod go-w {path}" if relative == ".." else "chown -R root:root") in err, err
    result = hook_dry_run(tmp_path, config, ["PONYTAIL_DRIVER=dev", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    assert result.returncode == 1 and f"{path} is " in result.stderr.decode(), result.stderr
    info = json.loads(run_ponytail(["info", "--json", "-config", str(config)]).stdout)
    row = next(t for t in info["driver_trees"] if t["name"] == "dev")
    if relative in ("", "..", "etc/ld.so.cache"):  # info looks at the tree's root and its ld.so.cache
        assert not row["usable"] and str(path) in row["problem"], row


@pytest.mark.parametrize("where", ["etc/ld.so.cache", f"{LIB_DIR.lstrip('/')}/libcuda.so.9"])
def test_a_fifo_in_a_tree_never_hangs_a_run(host: tuple[FakeHost, Path], tmp_path: Path, where: str) -> None:
    fake, config = host
    fifo = fake.base / "umd/dev" / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    fifo.chmod(0o644)
    result = run_ponytail(["list", "-config", str(config), "--driver", "dev"])  # before: blocked in open()
    assert result.returncode == 0, result.stderr
    assert f"{fake.base}/umd/dev{LIB_DIR}/libcuda.so.{TREE[0]}" in result.stdout.decode().splitlines()


DEVICES = "/var/run/nvidia-container-devices"


def test_the_strict_policy_refuses_an_unprivileged_containers_choice_of_tree(host: tuple[FakeHost, Path], tmp_path: Path) -> None:
    fake, config = host
    config.write_text(config.read_text() + STRICT)
    plugin = [{"destination": f"{DEVICES}/0", "source": "/dev/null", "type": "bind", "options": ["rbind", "ro"]}]
    env = [f"NVIDIA_VISIBLE_DEVICES={DEVICES}", "PONYTAIL_DRIVER=dev"]
    out = hook_dry_run(tmp_path, config, env, mounts=plugin).stdout.decode()
    assert "PONYTAIL_DRIVER='dev' refused: unprivileged container" in out, out
    assert f"{fake.driver}{LIB_DIR}/libcuda.so.{fake.driver_version}" in out and "umd/dev" not in out, out
    assert "refused" in fake.log.read_text()
    check = json.loads(run_ponytail(["check", "-config", str(config), "--bundle", str(tmp_path / "bundle"), "--json"]).stdout)
    said = {(f["subject"], f["level"]): f["message"] for f in check["findings"] if f["area"] == "container"}
    assert "refused: unprivileged container" in said[("driver tree", "warning")], said  # ponytail check says the same
    assert "host driver root" in said[("driver", "ok")], said
    privileged = hook_dry_run(tmp_path, config, env, privileged=True, mounts=plugin).stdout.decode()
    assert f"umd/dev{LIB_DIR}/libcuda.so.{TREE[0]}" in privileged and "refused" not in privileged, privileged
