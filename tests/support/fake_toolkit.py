"""NVIDIA's container toolkit as its packages and ``nvidia-ctk`` leave it on a node, in files that
need none of NVIDIA's programs (tests/support/nvidia_toolkit.py has the real ones): a CDI spec whose
hooks run nvidia-cdi-hook, docker's, containerd's and CRI-O's runtime entries running
nvidia-container-runtime, its three programs on PATH (stand-in bytes; ``program_size`` makes them
bigger), and its config. For the migration's transaction tests: kill, full-disk and hostile-record runs."""

from __future__ import annotations

import os
from pathlib import Path

from support.nvidia_toolkit import tree_bytes

NVIDIA_SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"""
DAEMON_JSON = """\
{
    "runtimes": {
        "nvidia": {
            "args": [],
            "path": "nvidia-container-runtime"
        }
    }
}
"""
CONTAINERD_DROP_IN = """\
version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"

  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CRIO_DROP_IN = """\
[crio.runtime.runtimes.nvidia]
runtime_path = "/usr/bin/nvidia-container-runtime"
runtime_type = "oci"
"""
CONFIG = """\
[nvidia-container-runtime]
mode = "auto"
"""


def install_fake_toolkit(root: Path, spec_dir: str = "etc/cdi", program_size: int = 4096) -> dict[str, bytes]:
    """NVIDIA's files under ``root`` (its spec in ``spec_dir``); every file, by path: bytes, mode and owner."""
    files = {
        f"{spec_dir}/nvidia.yaml": (NVIDIA_SPEC.encode(), 0o644, 0),
        "etc/docker/daemon.json": (DAEMON_JSON.encode(), 0o600, 0),
        "etc/containerd/conf.d/99-nvidia.toml": (CONTAINERD_DROP_IN.encode(), 0o644, 0),
        "etc/crio/crio.conf.d/99-nvidia.toml": (CRIO_DROP_IN.encode(), 0o640, 4),
        "etc/nvidia-container-runtime/config.toml": (CONFIG.encode(), 0o644, 0),
    }
    for k, name in enumerate(("nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvidia-ctk")):
        files[f"usr/bin/{name}"] = (b"\x7fELF" + bytes([k]) * program_size, 0o755, 0)
    for path, (data, mode, gid) in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
        os.chmod(full, mode)
        os.chown(full, 0, gid)
        os.utime(full, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    (root / "etc/containerd/config.toml").write_text("version = 3\n")
    return tree_bytes(root)


# the system calls that change files: a migration or an undo killed at each of them is killed at every step
CHANGING_CALLS = "rename,renameat,renameat2,link,linkat,unlink,unlinkat,symlink,symlinkat,mkdir,mkdirat,rmdir,fsync,fdatasync,fchmod,fchown,fchownat,fchmodat,utimensat"


def migrate_argv(root: Path, config: Path, *args: str) -> list[str]:
    from support.engines import console_script

    ponytail = console_script("ponytail")
    return [ponytail, "migrate", "--from", "nvidia", "--root", str(root), "-config", str(config), "--path", ponytail, *args]


def undo_argv(root: Path) -> list[str]:
    from support.engines import console_script

    return [console_script("ponytail"), "migrate", "--from", "nvidia", "--root", str(root), "--undo"]


def at_call(argv: list[str], when: int, action: str = "signal=KILL", calls: str = CHANGING_CALLS, trace: str = "/dev/null") -> list[str]:
    """``argv`` under strace, ``action`` (a signal, or error=EIO) injected at the entry of the ``when``-th call
    of each of ``calls`` (strace counts each system call on its own): the calls traced into ``trace``, an
    injected one saying INJECTED."""
    return ["strace", "-f", "-qq", "-o", trace, "-e", f"trace={calls}", "-e", f"inject={calls}:{action}:when={when}", *argv]


def kill_points(argv: list[str], trace: Path) -> list[tuple[str, int]]:
    """Every call of CHANGING_CALLS ``argv`` makes, in order, as (its name, which of its kind it is):
    ``at_call(argv, n, calls=name)`` stops the run right before it."""
    import re
    import subprocess

    done = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={CHANGING_CALLS}", *argv],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen: dict[str, int] = {}
    points = []
    for line in trace.read_text().splitlines():
        call = re.match(r"(?:\d+ +)?(\w+)\(", line)
        if call:
            seen[call.group(1)] = seen.get(call.group(1), 0) + 1
            points.append((call.group(1), seen[call.group(1)]))
    return points


def node_files(root: Path) -> dict[str, bytes]:
    """Every file and link of the node but the migration's state directory: bytes, mode, owner and mtime."""
    out = {}
    for path, data in tree_bytes(root).items():
        if path.startswith(f"{root}/var/lib/ponytail"):
            continue
        out[path] = data if data.startswith(b"link:") else data + f" {os.lstat(path).st_mtime_ns}".encode()
    return out


def without_mtimes(files: dict[str, bytes]) -> dict[str, bytes]:
    return {p: b if b.startswith(b"link:") else b.rpartition(b" ")[0] for p, b in files.items()}


def listing_command(root: Path, times: bool = True) -> str:
    """A shell command printing each file and link under ``root`` but the migration's state directory,
    sorted: its path, mode, owner, (mtime,) and digest (a link: its target). For roots only a mount
    namespace of the script's own can see (a small tmpfs)."""
    time = " %T@" if times else ""
    return (f"find {root} -path {root}/var/lib/ponytail -prune -o -path {root}/filler -prune -o \\( -type f -o -type l \\) "
            f"-printf '%p %m %U:%G{time} ' -exec sh -c 'if [ -L \"$1\" ]; then readlink \"$1\"; else sha256sum < \"$1\"; fi' sh {{}} \\; | sort")
