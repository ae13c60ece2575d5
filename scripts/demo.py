"""make demo: inject this machine's GPUs into a small demo rootfs and run nvidia-smi in it.

With a loaded NVIDIA driver it uses the real one (config: $PONYTAIL_CONFIG, else
/etc/ponytail/config.toml, else built-in defaults). Without one it says so and
builds a SIMULATED driver tree (fake /proc, /sys, /dev nodes, gcc-built
libraries) so the whole path can still be seen. Everything runs in a private
mount namespace: nothing stays mounted afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import FakeHost, gpus, make_rootfs  # noqa: E402

DEMO = REPO / "demo"


def main() -> int:
    if DEMO.exists():
        shutil.rmtree(DEMO)
    DEMO.mkdir()
    rootfs = make_rootfs(DEMO / "rootfs", programs=("cudacheck.c",))
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
    ponytail = [sys.executable, "-m", "ponytail", *args]
    script = f"""
    set -e
    echo "== ponytail info"; {' '.join(ponytail[:3])} info {' '.join(args)}
    echo "== ponytail -root {rootfs} -device 0"; {' '.join(ponytail)} -root {rootfs} -device 0
    echo "== chroot {rootfs} nvidia-smi"; chroot {rootfs} /usr/bin/nvidia-smi
    echo "== chroot {rootfs} cudacheck (dlopen libcuda.so.1, call cuDriverGetVersion, open the GPU node)"
    chroot {rootfs} /usr/local/bin/cudacheck $(cd {rootfs} && ls dev/nvidia[0-9]* | sed 's|^|/|')
    """
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script])
    if result.returncode == 0:
        print(f"== done: the injection lived in a private mount namespace; {rootfs} is a plain directory again")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
