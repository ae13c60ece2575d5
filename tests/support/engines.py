"""Real container engines for the end-to-end tests, run the way they run on this machine
(Debian 12, cgroup v1 hybrid, root): runc, crun, podman and a private dockerd.

Every container, bundle and state directory gets a unique name, so these tests can
run while other test runs use the same engines on the same machine. The hook is
this checkout's console script (``.venv/bin/ponytail``, made by ``make setup``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.commands import installed
from support.fakehost import make_rootfs
from support.sidroot import in_sid, sid_binary, sid_env, sid_root, stop_sid_daemon

# crun 1.8 refuses the hybrid cgroup layout: hide cgroup2 from it in a private mount namespace.
CRUN = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'umount /sys/fs/cgroup/unified; exec crun "$@"', "crun"]
# A cgroup v2 only host, as most GPU hosts are: in a private mount namespace the engine sees
# only cgroup2 at /sys/fs/cgroup (this machine's unified hierarchy), and so attaches eBPF
# device programs instead of writing v1 rules. The hook runs in that namespace too.
PURE_V2_SCRIPT = 'umount -R /sys/fs/cgroup || umount -l /sys/fs/cgroup; mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$0" "$@"'


def pure_v2(command: list[str]) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", PURE_V2_SCRIPT, *command]


RUNTIMES = {"runc": ["runc"], "crun": CRUN, "runc-v2": pure_v2(["runc"]), "crun-v2": pure_v2(["crun"])}
TIMEOUT = 120


def console_script(name: str) -> str:
    """This checkout's installed console script (``make setup`` installs it into .venv)."""
    return installed(name)


def unique(prefix: str = "ponytail-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def hook_entry(config: Path) -> dict:
    return {"path": console_script("ponytail"), "args": ["ponytail", "-config", str(config)]}


def oci_bundle(base: Path, args: list[str], env: Sequence[str] = (), hooks: dict | None = None, annotations: dict | None = None) -> Path:
    """A bundle as ``runc spec`` makes it (read-only root, every device denied), with a fresh rootfs."""
    bundle = base / unique("bundle")
    bundle.mkdir(parents=True)
    make_rootfs(bundle / "rootfs")
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = args
    spec["process"]["env"] += list(env)
    if hooks:
        spec["hooks"] = hooks
    if annotations:
        spec["annotations"] = annotations
    (bundle / "config.json").write_text(json.dumps(spec, indent=1))
    return bundle


def run_bundle(runtime: str, bundle: Path, container_id: str | None = None) -> subprocess.CompletedProcess:
    """``<runtime> run --bundle BUNDLE ID``: create, start, wait, delete."""
    container_id = container_id or unique()
    command = RUNTIMES[runtime] + ["run", "--bundle", str(bundle), container_id]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(RUNTIMES[runtime] + ["delete", "-f", container_id], capture_output=True, timeout=TIMEOUT)


class Podman:
    """podman with private storage, run and tmp directories and the given hooks directory."""

    def __init__(self, hooks_dir: Path, pure_v2_cgroups: bool = False, sid: bool = False, runtime: str = "runc",
                 etc_files: dict[str, str] | None = None) -> None:
        """``sid``: Debian sid's podman 5.8 (with ``runtime``, runc 1.3 or crun 1.28) in the sid root
        (support.sidroot), whose /etc gets ``etc_files`` (e.g. cdi/NAME.yaml); else Debian 12's podman 4.3 with runc."""
        if sid:
            sid_root()  # built, or the test skipped saying why, before any state is made
        self.state = Path(tempfile.mkdtemp(prefix="ponytail-podman-"))
        # under cgroup v2 podman sets a pids limit by default, and this machine's unified hierarchy has no pids
        # controller: podman 4.3 sets none with -1; podman 5.8 with crun 1.28 still asks for the controller with -1, not with 0
        self.extra = [f"--pids-limit={0 if sid else -1}"] if pure_v2_cgroups else []
        command = [
            "podman", "--root", str(self.state / "root"), "--runroot", str(self.state / "run"),
            "--tmpdir", str(self.state / "tmp"), "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
            "--runtime", runtime, "--hooks-dir", str(hooks_dir),
        ]
        self.env: dict[str, str] | None = None
        self.runtime, self.pure_v2 = runtime, pure_v2_cgroups
        if sid:
            self.base = in_sid(command, etc_layer=etc_layer(self.state / "etc", etc_files), cgroup2_only=pure_v2_cgroups)
            self.env = sid_env({"PODMAN_IGNORE_CGROUPSV1_WARNING": "1"})  # podman 5.8 warns on every run on a cgroup v1 host
        else:
            assert not etc_files and runtime == "runc", "Debian 12's podman: runc, the host's /etc"
            self.base = (pure_v2([]) if pure_v2_cgroups else []) + command

    def run(self, rootfs: Path, args: list[str], annotations: dict[str, str] | None = None, env: Sequence[str] = (),
            devices: Sequence[str] = ()) -> subprocess.CompletedProcess:
        """``podman run --rm`` of ``rootfs``; ``devices``: ``--device`` each (a CDI name, e.g. nvidia.com/gpu=0)."""
        command = self.base + [
            "run", "--rm", "--name", unique(), "--network=none",
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", *self.extra,
        ]
        for device in devices:
            command += ["--device", device]
        for key, value in (annotations or {}).items():
            command += ["--annotation", f"{key}={value}"]
        for item in env:
            command += ["-e", item]
        command += ["--rootfs", str(rootfs), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=self.env)

    def close(self) -> None:
        """Wait for podman's own cleanup processes (conmon runs them after a container exits), then remove the state."""
        deadline = time.monotonic() + 30
        while processes_naming(str(self.state)) and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.state, ignore_errors=True)


def processes_naming(text: str) -> list[int]:
    """Processes (other than this one) whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


class Dockerd:
    """A private dockerd (own socket, data and exec roots, vfs storage, no networking) with
    ponytail-runtime registered as the runtime ``ponytail``; ``env`` reaches the runtime."""

    def __init__(self, env: dict[str, str], etc_files: dict[str, str] | None = None, sid: bool = False,
                 args: tuple[str, ...] = ()) -> None:
        """``etc_files``: files (path under /etc -> text) that dockerd and everything it starts see
        in /etc. Debian 12's dockerd runs in a private mount namespace whose /etc is a read-only overlay
        over the host's, with a private, writable /etc/docker (dockerd 20.10 writes its key.json there
        and reads daemon.json from there): the host's /etc is never read for docker's own config nor written.
        ``sid``: Debian sid's dockerd 28.5 with the containerd 2.1 and runc 1.3 it starts itself, in the sid
        root (support.sidroot), whose own /etc gets ``etc_files``; its docker CLI. ``args``: more of dockerd's options."""
        if sid:
            sid_root()  # built, or the test skipped saying why, before any state is made
        self.state = Path(tempfile.mkdtemp(prefix="ponytail-docker-"))
        self.process: subprocess.Popen | None = None
        self.socket = f"unix://{self.state}/docker.sock"
        self.sid = sid
        self.docker_command = sid_binary("docker") if sid else "docker"
        command = [
            "dockerd", "--iptables=false", "--bridge=none", "--storage-driver=vfs",
            "--data-root", str(self.state / "data"), "--exec-root", str(self.state / "exec"),
            "-H", self.socket, "--pidfile", str(self.state / "dockerd.pid"),
            "--add-runtime", f"ponytail={console_script('ponytail-runtime')}",
        ]
        command += args  # e.g. --config-file FILE
        if sid:
            command[1:1] = ["--ip6tables=false"]
            command, env = in_sid(command, etc_layer=etc_layer(self.state / "etc", etc_files)), sid_env(env)
        else:
            command = with_etc_files(command, self.state / "etc", etc_files or {}, {"docker": self.state / "etc-docker"})
        stop = stop_sid_daemon if sid else stop_daemon
        self.process = start_daemon(command, self.state / "dockerd.log", env, lambda: self.docker("version").returncode == 0, self._release,
                                    stop=stop)

    def docker(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.docker_command, "-H", self.socket, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    def import_rootfs(self, rootfs: Path) -> str:
        image = unique("ponytail-test-image").lower() + ":1"
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        result = subprocess.run([self.docker_command, "-H", self.socket, "import", "-", image], stdin=tar.stdout, capture_output=True, timeout=TIMEOUT)
        tar.wait()
        if result.returncode != 0:
            raise RuntimeError(f"docker import failed: {result.stderr.decode()}")
        return image

    def bundle_config(self, container_id: str) -> dict:
        """The config.json of a running container's bundle, as the runtime received it."""
        path = self.state / "exec/containerd/daemon/io.containerd.runtime.v2.task/moby" / container_id / "config.json"
        return json.loads(path.read_text())

    def close(self) -> None:
        if self.process is not None:
            (stop_sid_daemon if self.sid else stop_daemon)(self.process)
            self.process = None
        self._release()

    def _release(self) -> None:
        """Remove the state: what remains once dockerd (and the containerd it started) is stopped."""
        shutil.rmtree(self.state, ignore_errors=True)


# a module fixture's params for "Debian 12's engines, and Debian sid's under make test-engines"
DOCKER_RELEASES = ["debian", pytest.param("sid", marks=pytest.mark.current_engines)]


def engines_for(release: str) -> bool:
    """Whether ``release`` (a DOCKER_RELEASES param) is Debian sid's (support.sidroot), else Debian 12's on PATH."""
    if release == "sid":
        sid_root()  # built here, or the test skipped saying why
    return release == "sid"


def etc_layer(layer: Path, files: dict[str, str] | None) -> Path | None:
    """``files`` (path under /etc -> text) written under ``layer``; ``layer``, or None without files."""
    for name, text in (files or {}).items():
        path = layer / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return layer if files else None


def with_etc_files(command: list[str], layer: Path, files: dict[str, str], writable: dict[str, Path] | None = None) -> list[str]:
    """``command`` run in a private mount namespace whose /etc also holds ``files``: an overlay of
    ``layer`` over the host's /etc, whose writes (an engine's or a vendor tool's) land in ``layer``
    too; ``writable`` (directory under /etc -> a directory of the test's) are bind-mounted there,
    whether or not the host has them. The host's /etc is neither written nor, for those
    directories, read."""
    etc_layer(layer, files)
    layer.mkdir(parents=True, exist_ok=True)
    work = layer.parent / f"{layer.name}.work"
    work.mkdir(exist_ok=True)
    script = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={shlex.quote(str(layer))},workdir={shlex.quote(str(work))} /etc"
    for name, source in (writable or {}).items():
        (layer / name).mkdir(parents=True, exist_ok=True)  # the mount point, where the host has none
        source.mkdir(parents=True, exist_ok=True)
        script += f" && mount --bind {shlex.quote(str(source))} {shlex.quote('/etc/' + name)}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script + ' && exec "$0" "$@"', *command]


class DaemonDidNotStart(pytest.fail.Exception):  # type: ignore[misc]  # pytest.fail.Exception is the class Failed, an attribute to mypy
    """A daemon a fixture started died or did not come up: tests/conftest.py reports the test that
    needed it as failed (with the end of the daemon's log), not as an error of its fixture."""


# how long a daemon may take to come up, or a short container to run: minutes, not seconds, on a busy shared machine
BUSY_DEADLINE = 180


def start_daemon(command: list[str], log_path: Path, env: dict[str, str], ready, release, stop=None) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """Start a daemon logging to ``log_path`` and wait (BUSY_DEADLINE at most) until ``ready()``.
    If it dies or does not come up: stop it (``stop``, by default stop_daemon), ``release()`` what the
    caller set up for it, and fail the test with the end of the daemon's log (DaemonDidNotStart: the
    daemon's reason, no traceback)."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **env})
    deadline = time.monotonic() + BUSY_DEADLINE
    while not ready():
        exited = process.poll()
        if exited is not None or time.monotonic() > deadline:
            why = f"exited with status {exited}" if exited is not None else f"was not ready after {BUSY_DEADLINE} s"
            (stop or stop_daemon)(process)
            tail = log_path.read_text(errors="replace")[-3000:]
            release()
            raise DaemonDidNotStart(f"{log_path.stem} ({shlex.join(command)[:300]}) {why}; the end of its log {log_path}:\n{tail}", pytrace=False)
        time.sleep(0.05)
    return process


def stop_daemon(process: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL after 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# cudacheck arguments and what they must give for NVIDIA_VISIBLE_DEVICES=0 on conftest's
# host fixture (GPU index 0 has minor 2): the selected node and the control nodes open
# with ENXIO (visible, and allowed by the device cgroup: EPERM would mean denied), the
# other GPUs' nodes are absent.
CUDACHECK_GPU0 = ["/usr/local/bin/cudacheck", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"]
EXPECTED_GPU0 = [
    "cuDriverGetVersion 12040",
    "open /dev/nvidia2 ENXIO",
    "open /dev/nvidiactl ENXIO",
    "open /dev/nvidia-uvm ENXIO",
    "open /dev/nvidia0 ENOENT",
    "open /dev/nvidia1 ENOENT",
]
