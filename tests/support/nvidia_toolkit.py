"""NVIDIA's container toolkit for the tests that run ponytail beside it or migrate a node off it: its files laid
out under a root as its packages and set-up steps put them there. The CDI spec is what nvidia-ctk 1.20.0 wrote
(../shared/nvidia, support.nvidia_tools). The programs and the files of ``nvidia-ctk runtime configure`` and
``config default`` come from NVIDIA's own toolkit where a node has it installed (``PATH``, or
``NVIDIA_TOOLKIT_DIR``); elsewhere the programs are stand-ins of the tests (they say so and fail) and the
engine entries are written as NVIDIA documents them. Nothing here builds, downloads or unpacks NVIDIA's programs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from support.fakehost import FakeHost
from support.nvidia_tools import TOOL_BINARIES, installed_toolkit, nvidia_spec

OCI_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
STAND_IN = """#!/bin/sh
# a stand-in of ponytail's tests for NVIDIA's {name}: NVIDIA's own program is not installed here
echo "{name}: NVIDIA's program is not installed on this machine (a stand-in of ponytail's tests)" >&2
exit 1
"""
# what `nvidia-ctk runtime configure` (1.20) writes for each engine, and `nvidia-ctk config default`, as NVIDIA
# documents them (the runtime entry named nvidia running /usr/bin/nvidia-container-runtime); {root}: the root
DOCKER_DAEMON = """{
    "runtimes": {
        "nvidia": {
            "args": [],
            "path": "nvidia-container-runtime"
        }
    }
}"""
CONTAINERD_CONFIG = 'imports = ["{root}/etc/containerd/conf.d/*.toml"]\nversion = 3\n'
CONTAINERD_DROP_IN = """version = 3

[plugins]

  [plugins."io.containerd.cri.v1.runtime"]

    [plugins."io.containerd.cri.v1.runtime".containerd]

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes]

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CRIO_DROP_IN = """
[crio]

  [crio.runtime]

    [crio.runtime.runtimes]

      [crio.runtime.runtimes.nvidia]
        runtime_path = "/usr/bin/nvidia-container-runtime"
        runtime_type = "oci"
"""
RUNTIME_CONFIG = """#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
"""
OCI_HOOK_JSON = """{
    "version": "1.0.0",
    "hook": {
        "path": "{hook}",
        "args": [
            "nvidia-container-runtime-hook",
            "prestart"
        ],
        "env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ]
    },
    "when": {
        "always": true,
        "commands": [
            ".*"
        ]
    },
    "stages": [
        "prestart"
    ]
}
"""


def install_toolkit(root: Path, host: FakeHost) -> dict[str, bytes]:
    """NVIDIA's toolkit installed under ``root`` as its packages and their set-up steps install it: the programs
    in /usr/bin, the config of ``nvidia-ctk config default``, the engine entries of ``nvidia-ctk runtime
    configure`` (docker's daemon.json; containerd's and CRI-O's drop-ins, 1.20's default; podman's legacy
    OCI hook), and nvidia-ctk's CDI spec (captured) in /etc/cdi, whose hooks run the nvidia-cdi-hook installed
    there. With NVIDIA's toolkit installed here, its own programs and nvidia-ctk's own set-up steps (run in a
    mount namespace whose /etc is an overlay of a scratch directory: nothing reaches the machine's /etc).
    Every file made, by its path under ``root``: its bytes, for the byte-for-byte checks."""
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (root / OCI_HOOK.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / "etc/nvidia-container-runtime").mkdir(parents=True, exist_ok=True)
    real = installed_toolkit()
    if real is not None:
        for name in TOOL_BINARIES:
            shutil.copy2(real / name, bindir / name)
        _configure(root, bindir)
    else:
        for name in TOOL_BINARIES:
            (bindir / name).write_text(STAND_IN.format(name=name))
            (bindir / name).chmod(0o755)
        files = {
            "etc/docker/daemon.json": DOCKER_DAEMON,
            "etc/containerd/config.toml": CONTAINERD_CONFIG.replace("{root}", str(root)),
            "etc/containerd/conf.d/99-nvidia.toml": CONTAINERD_DROP_IN,
            "etc/crio/crio.conf.d/99-nvidia.toml": CRIO_DROP_IN,
            "etc/nvidia-container-runtime/config.toml": RUNTIME_CONFIG,
            OCI_HOOK.lstrip("/"): OCI_HOOK_JSON.replace("{hook}", str(bindir / "nvidia-container-runtime-hook")),
        }
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    nvidia_spec(host, root / "etc/cdi/nvidia.yaml", str(bindir / "nvidia-cdi-hook"))
    return tree_bytes(root)


def _configure(root: Path, bindir: Path) -> None:
    """nvidia-ctk's own set-up steps for the engines under ``root`` (its programs copied to ``bindir``)."""
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    (root / "etc/containerd/config.toml").write_text("version = 3\n")
    ctk = f"{bindir}/nvidia-ctk --quiet"
    steps = [
        f"{ctk} runtime configure --runtime=docker --config={root}/etc/docker/daemon.json",
        f"{ctk} runtime configure --runtime=containerd --config={root}/etc/containerd/config.toml "
        f"--drop-in-config={root}/etc/containerd/conf.d/99-nvidia.toml",
        f"{ctk} runtime configure --runtime=crio --config={root}/etc/crio/crio.conf --drop-in-config={root}/etc/crio/crio.conf.d/99-nvidia.toml",
        f"{ctk} config default --output={root}/etc/nvidia-container-runtime/config.toml",
        f"{ctk} runtime configure --runtime=crio --config-mode=oci-hook --oci-hook-path={root}{OCI_HOOK} "
        f"--nvidia-runtime-hook-path={bindir}/nvidia-container-runtime-hook",  # podman's legacy hook (older packages installed it)
    ]
    scratch = Path(tempfile.mkdtemp(prefix="ponytail-etc-overlay-"))
    try:
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        script = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={scratch}/upper,workdir={scratch}/work /etc && " + " && ".join(steps)
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not any((scratch / "upper").iterdir()), "nvidia-ctk wrote to /etc"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file and link under ``root``: its bytes (a link: its target), mode and owner."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            out[str(path)] = b"link:" + os.readlink(path).encode()
        elif path.is_file():
            out[str(path)] = path.read_bytes() + f"\n{st.st_mode:o} {st.st_uid}:{st.st_gid}".encode()
    return out


def migrated_gpu_node(tmp_path: Path) -> tuple[FakeHost, Path, Path, str, Path]:
    """A Kubernetes GPU node's files (support.containerd_cri.gpu_node_files) with NVIDIA's toolkit installed
    in ``tmp_path``/root and then `ponytail migrate --from nvidia` run on it: (the fake host, ponytail's config,
    the image's rootfs, the image's name, the migrated root)."""
    from support.containerd_cri import gpu_node_files
    from support.engines import console_script
    from support.harness import run_ponytail

    host, ponytail_config, rootfs, image = gpu_node_files(tmp_path)
    root = tmp_path / "root"
    install_toolkit(root, host)
    migrated = run_ponytail(["migrate", "--from", "nvidia", "--root", str(root), "-config", str(ponytail_config),
                             "--path", console_script("ponytail")])
    assert migrated.returncode == 0, migrated.stderr
    return host, ponytail_config, rootfs, image, root
