"""NVIDIA's container toolkit for the tests that run ponytail beside it: the prebuilt tools of
``../shared/anchor/nvidia-tools-x86_64.tar.xz`` (or $NVIDIA_TOOLS_TARBALL), unpacked once per run,
and nvidia-ctk's real CDI spec of a FakeHost (its NVML answered by bench/fake_nvml.c with the host's
GPU table compiled in). Tests that need them are skipped, saying so, without the tarball."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

from support.fakehost import LIB_DIR, FakeHost

REPO = Path(__file__).resolve().parents[2]
TARBALL = Path(os.environ.get("NVIDIA_TOOLS_TARBALL", REPO.parent / "shared/anchor/nvidia-tools-x86_64.tar.xz"))
FAKE_NVML = REPO / "bench/fake_nvml.c"
OCI_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
TOOL_BINARIES = ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime-hook", "nvidia-container-runtime", "nvidia-container-cli")


@cache
def tools() -> Path:
    """The unpacked tools (bin/, lib/); the test is skipped without the tarball."""
    if not TARBALL.is_file():
        pytest.skip(f"NVIDIA's prebuilt tools are not here ({TARBALL}; set NVIDIA_TOOLS_TARBALL)")
    root = Path(tempfile.mkdtemp(prefix="ponytail-nvidia-tools-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    subprocess.run(["tar", "-xJf", str(TARBALL), "-C", str(root)], check=True)
    root.chmod(0o755)
    return root


def install_fake_nvml(host: FakeHost) -> None:
    """The host's libnvidia-ml answers NVIDIA's tools (go-nvml's ~30 entry points) from its GPU table."""
    rows = ", ".join(f'{{ {g.minor}, "{g.bus_id}", "{g.uuid}", "{g.model}" }}' for g in host.gpu_list)
    table = host.base / "nvml-table.h"
    table.write_text(f"#define FAKE_GPUS {rows}\n")
    out = host.driver / LIB_DIR.lstrip("/") / f"libnvidia-ml.so.{host.driver_version}"
    out.unlink()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", f'-DDRIVER_VERSION="{host.driver_version}"',
         f"-DCUDA_VERSION_INT={host.cuda_version}", "-include", str(table), "-o", str(out), str(FAKE_NVML)],
        check=True,
    )
    subprocess.run(["ldconfig", "-r", str(host.driver)], check=True)


def nvidia_ctk_spec(host: FakeHost, output: Path, hook_path: str | None = None) -> bytes:
    """``nvidia-ctk cdi generate`` for ``host`` (its driver root and /dev) into ``output``; the bytes written."""
    root = tools()
    install_fake_nvml(host)
    argv = [str(root / "bin/nvidia-ctk"), "cdi", "generate", "--driver-root", str(host.driver), "--dev-root", str(host.dev.parent),
            "--nvidia-cdi-hook-path", hook_path or str(root / "bin/nvidia-cdi-hook"), "--output", str(output)]
    made = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": str(root / "lib")}, timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    return output.read_bytes()


def install_toolkit(root: Path, host: FakeHost) -> dict[str, bytes]:
    """NVIDIA's toolkit installed under ``root`` as its packages and their set-up steps install it:
    the programs in /usr/bin and libnvidia-container in /usr/lib/x86_64-linux-gnu, the config of
    ``nvidia-ctk config default``, the engine entries of ``nvidia-ctk runtime configure`` (docker's
    daemon.json; containerd's and CRI-O's drop-ins, 1.20's default), and the CDI spec of ``nvidia-ctk cdi
    generate`` in /etc/cdi, whose hooks run the nvidia-cdi-hook installed there. nvidia-ctk runs in a
    mount namespace whose /etc is an overlay of a scratch directory: nothing reaches the machine's /etc.
    Every file made, by its path under ``root``: NVIDIA's bytes, for the byte-for-byte checks."""
    source = tools()
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in TOOL_BINARIES:
        shutil.copy2(source / "bin" / name, bindir / name)
    libdir = root / LIB_DIR.lstrip("/")
    libdir.mkdir(parents=True, exist_ok=True)
    for library in (source / "lib").iterdir():
        shutil.copy2(library, libdir / library.name, follow_symlinks=False)
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    (root / "etc/containerd/config.toml").write_text("version = 3\n")
    (root / "etc/nvidia-container-runtime").mkdir(parents=True, exist_ok=True)
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
    (root / OCI_HOOK.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ponytail-etc-overlay-"))
    try:
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        script = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={scratch}/upper,workdir={scratch}/work /etc && " + " && ".join(steps)
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True,
                              env={**os.environ, "LD_LIBRARY_PATH": str(libdir)}, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not any((scratch / "upper").iterdir()), "nvidia-ctk wrote to /etc"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    nvidia_ctk_spec(host, root / "etc/cdi/nvidia.yaml", hook_path=str(bindir / "nvidia-cdi-hook"))
    return tree_bytes(root)


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
