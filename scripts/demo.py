"""make demo: inject this machine's GPUs into a small demo rootfs and run nvidia-smi in it.

With a loaded NVIDIA driver it uses the real one (config: $PONYTAIL_CONFIG, else
/etc/ponytail/config.toml, else built-in defaults). Without one it says so and
builds a SIMULATED driver tree (fake /proc, /sys, /dev nodes, gcc-built
libraries) so the whole path can still be seen. Everything runs in a private
mount namespace: nothing stays mounted afterwards, and the rootfs is put back as it
was (the mount points ponytail made in it removed, its linker cache restored).

At the end it prints the commands to run ponytail against the same host and rootfs
again, each exactly as it ran here (with the -config it used).

    scripts/demo.py            build demo/ (or $PONYTAIL_DEMO_DIR) and run the demo
    scripts/demo.py --reset    put the demo rootfs back as it was built (after a run by hand)
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import FakeHost, gpus, make_rootfs  # noqa: E402

DEMO = Path(os.environ.get("PONYTAIL_DEMO_DIR") or REPO / "demo")
ROOTFS = DEMO / "rootfs"
PRISTINE = DEMO / "rootfs.pristine"  # what --reset puts back


def main(argv: list[str]) -> int:
    if argv == ["--reset"]:
        return reset()
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv:
        print(f"demo.py: error: unknown argument {argv[0]!r} (usage: demo.py [--reset | --help])", file=sys.stderr)
        return 2
    if DEMO.exists():
        shutil.rmtree(DEMO)
    DEMO.mkdir(parents=True)
    rootfs = make_rootfs(ROOTFS, programs=("cudacheck.c",))
    shutil.copytree(rootfs, PRISTINE, symlinks=True)
    args: list[str] = []
    if Path("/proc/driver/nvidia/version").exists():
        print("== NVIDIA driver found on this machine: injecting the real driver")
        config = os.environ.get("PONYTAIL_CONFIG") or "/etc/ponytail/config.toml"
        if Path(config).exists():
            args = ["-config", config]
    else:
        print("== No NVIDIA driver on this machine (/proc/driver/nvidia/version is missing).")
        print("== Using a SIMULATED driver tree: fake /proc, /sys and /dev nodes, gcc-built libraries.")
        print("==   (a simulated driver has no GPU behind its nodes: opening one gives ENXIO)")
        host = FakeHost(DEMO / "simulated-host", gpu_list=gpus(2, minors=[1, 0]))
        args = ["-config", str(host.write_config())]
    ponytail, config = shlex.join(ponytail_command()), shlex.join(args)
    inject = f"{ponytail} {config} -root {shlex.quote(str(rootfs))} -device 0".replace("  ", " ")
    info = f"{ponytail} info {config}".rstrip()  # a subcommand's options after it
    smi = f"chroot {shlex.quote(str(rootfs))} /usr/bin/nvidia-smi"
    script = f"""
    set -e
    echo "== {info}"; {info}
    echo "== {inject}"; {inject}
    echo "== {smi}"; {smi}
    echo "== chroot {rootfs} cudacheck (dlopen libcuda.so.1, call cuDriverGetVersion, open the GPU node)"
    chroot {rootfs} /usr/local/bin/cudacheck $(cd {rootfs} && ls dev/nvidia[0-9]* | sed 's|^|/|')
    """
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script])
    reset(quiet=True)
    if result.returncode != 0:
        return result.returncode
    print(f"== done: the injection lived in a private mount namespace; {rootfs} is as it was built again")
    print("== to run ponytail against this host and rootfs yourself (as root; each line as it ran here):")
    for line in again_commands(info, inject, smi):
        print(f"   {line}")
    return 0


def again_commands(info: str, inject: str, smi: str) -> list[str]:
    """The lines the demo prints: the same commands, the injection in a private mount namespace
    (nothing stays mounted in yours), and the reset of the mount points it leaves in the rootfs."""
    in_private = shlex.quote(f"{inject} && {smi}")
    return [
        info,
        f"unshare -m --propagation private sh -c {in_private}",
        ("" if DEMO == REPO / "demo" else f"PONYTAIL_DEMO_DIR={shlex.quote(str(DEMO))} ")
        + f"{shlex.join([sys.executable, str(Path(__file__).resolve())])} --reset   "
        "# remove the empty mount points ponytail made in the rootfs",
    ]


def ponytail_command() -> list[str]:
    """This install's ponytail command (the console script beside this Python), else python -m ponytail."""
    script = Path(sys.executable).parent / "ponytail"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ponytail"]


def reset(quiet: bool = False) -> int:
    """The rootfs as it was built: what a run put there (mount points, the linker cache) goes."""
    if not PRISTINE.is_dir():
        print(f"demo.py: no {PRISTINE}: run the demo first (make demo)", file=sys.stderr)
        return 1
    if ROOTFS.exists():
        shutil.rmtree(ROOTFS)  # fails, saying which, on a mount point still mounted: unmount it first
    shutil.copytree(PRISTINE, ROOTFS, symlinks=True)
    if not quiet:
        print(f"{ROOTFS}: as it was built again")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
