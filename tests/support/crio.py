"""A private CRI-O (own root, runroot, socket, config, hooks and CDI directories, in a mount
namespace of its own with a private /run and /etc/ponytail/config.toml) from $ENGINES_DIR
(crio, pinns, runc) with Debian's conmon. What runs here (see ../shared/engines/README.md):
root without CAP_SYS_RESOURCE, so no infra container (``pause_command = ""``) and pods with
host networking and PID namespace mode CONTAINER (support.containerd_cri.Pods makes them so);
no CNI plugins; cgroupfs. Images come from podman, loaded into the same storage before CRI-O starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from support.containerd_cri import remove_cgroups
from support.engines import TIMEOUT, processes_naming, start_daemon, stop_daemon, with_etc_files

CONMON = "/usr/bin/conmon"


def crio_config(state: Path, engines_dir: Path, pause_image: str) -> str:
    """crio.conf with every path of its own under ``state``; ``pause_image`` an image loaded here
    (CRI-O looks it up even with no infra container)."""
    return f"""# a private CRI-O for ponytail's tests
[crio]
root = "{state}/root"
runroot = "{state}/run"
storage_driver = "vfs"
log_dir = "{state}/logs"
version_file = "{state}/version"
version_file_persist = "{state}/version-persist"
clean_shutdown_file = "{state}/clean.shutdown"

[crio.api]
listen = "{state}/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
conmon_cgroup = "pod"
cgroup_manager = "cgroupfs"
hooks_dir = ["{state}/hooks.d"]
cdi_spec_dirs = ["{state}/cdi"]
namespaces_dir = "{state}/ns"
pinns_path = "{engines_dir}/pinns"
container_exits_dir = "{state}/exits"
container_attach_socket_dir = "{state}/attach"

[crio.runtime.runtimes.runc]
runtime_path = "{engines_dir}/runc"
runtime_root = "{state}/runc"
monitor_path = "{CONMON}"

[crio.image]
pause_command = ""
pause_image = "{pause_image}"
signature_policy = "{state}/policy.json"
signature_policy_dir = "{state}/policies"
namespaced_auth_dir = "{state}/auth"

[crio.network]
network_dir = "{state}/cni"
plugin_dirs = ["{state}/cni-bin"]

[crio.nri]
enable_nri = false

[crio.metrics]
enable_metrics = false
"""


class Crio:
    """``crio --config STATE/etc/crio/crio.conf --config-dir STATE/etc/crio/crio.conf.d``; the
    ponytail config ``ponytail_config`` is /etc/ponytail/config.toml for it and what it starts
    (CRI-O gives conmon, so the runtime, a filtered environment: no PONYTAIL_CONFIG)."""

    def __init__(self, state: Path, engines_dir: Path, pause_image: str = "registry.k8s.io/pause:3.10.1") -> None:
        self.state = state
        self.engines_dir = engines_dir
        self.socket = str(state / "crio.sock")
        self.cgroup_parent = f"/{state.name}"
        self.config = state / "etc/crio/crio.conf"
        self.drop_ins = self.config.parent / "crio.conf.d"
        self.drop_ins.mkdir(parents=True)
        for name in ("hooks.d", "cdi", "cni", "cni-bin"):
            (state / name).mkdir()
        (state / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')
        self.config.write_text(crio_config(state, engines_dir, pause_image))
        self.process: subprocess.Popen | None = None

    def crio(self, *args: str) -> subprocess.CompletedProcess:
        """``crio --config ... --config-dir ... ARGS`` (e.g. ``config``: the configuration it would run with)."""
        return subprocess.run([str(self.engines_dir / "crio"), "--config", str(self.config), "--config-dir", str(self.drop_ins), *args],
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    def crictl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.engines_dir / "crictl"), "--runtime-endpoint", f"unix://{self.socket}", "--timeout", "60s", *args],
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    def load_image(self, archive: Path) -> None:
        """An OCI archive into CRI-O's storage, with podman (before CRI-O runs)."""
        loaded = subprocess.run(["podman", "--root", str(self.state / "root"), "--runroot", str(self.state / "run"),
                                 "--storage-driver", "vfs", "load", "-i", str(archive)],
                                capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        if loaded.returncode != 0:
            raise RuntimeError(f"podman load into CRI-O's storage failed: {loaded.stderr}")

    def start(self, ponytail_config: str) -> None:
        command = ["sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "sh", *self.crio_command()]
        command = with_etc_files(command, self.state / "etc-layer", {"ponytail/config.toml": ponytail_config})
        ready = lambda: os.path.exists(self.socket) and self.crictl("version").returncode == 0  # noqa: E731
        path = f"{self.engines_dir}:{os.environ['PATH']}"
        self.process = start_daemon(command, self.state / "crio.log", {"PATH": path}, ready, lambda: None)

    def crio_command(self) -> list[str]:
        return [str(self.engines_dir / "crio"), "--config", str(self.config), "--config-dir", str(self.drop_ins)]

    def log(self) -> str:
        return (self.state / "crio.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None:
            stop_daemon(self.process)
            self.process = None
        for pid in processes_naming(str(self.state)):  # conmons of containers left behind: ours, by their paths
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_cgroups(self.cgroup_parent)
