"""`make gpu-check`: ponytail against a real NVIDIA GPU and driver, in one command.

1. `ponytail info --json` agrees with the driver's own view (nvidia-smi's index, UUID,
   PCI bus id and driver version of every GPU);
2. manual mode: GPU 0 injected into a small busybox rootfs (in a private mount namespace),
   where `nvidia-smi -L` and a real CUDA driver call sequence run;
3. hook mode: the same through runc, with ponytail as the container's prestart hook.

Each step prints PASS or FAIL with its evidence; the exit status is 0 only when all pass.
On a machine without an NVIDIA driver it says so in one line and exits 1. Standard
library only, so it runs before (or without) `make setup`; at most a few minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP_TIMEOUT = 120
results: list[tuple[str, bool]] = []


def main() -> int:
    if not Path("/proc/driver/nvidia/version").exists():
        print("gpu-check: no NVIDIA driver is loaded on this machine (/proc/driver/nvidia/version is missing): "
              "run it on a machine with an NVIDIA GPU and its driver", file=sys.stderr)
        return 1
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("gpu-check: the NVIDIA driver is loaded but nvidia-smi is not on PATH: install the driver's utilities",
              file=sys.stderr)
        return 1
    ponytail = ponytail_command()
    print(f"gpu-check: ponytail = {' '.join(ponytail)}")
    print(f"gpu-check: driver = {Path('/proc/driver/nvidia/version').read_text().splitlines()[0].strip()}")
    gpu0_uuid = check_info(ponytail, smi)
    with tempfile.TemporaryDirectory(prefix="ponytail-gpu-check-") as tmp:
        work = Path(tmp)
        program = build_cuda_program(work)
        if program is not None:
            rootfs = make_rootfs(work / "manual-rootfs", program, smi)
            check_manual_mode(ponytail, rootfs, gpu0_uuid)
            check_hook_mode(ponytail, make_rootfs(work / "hook-rootfs", program, smi), work, gpu0_uuid)
    failed = [name for name, ok in results if not ok]
    print(f"gpu-check: {len(results) - len(failed)} passed, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


def report(name: str, ok: bool, evidence: str) -> bool:
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}")
    for line in evidence.strip().splitlines():
        print(f"    {line}")
    return ok


def ponytail_command() -> list[str]:
    """The ponytail this checkout installs: the venv's command, else the binary, else
    `make setup` first."""
    for candidate in (REPO / ".venv/bin/ponytail", REPO / "dist/ponytail/ponytail"):
        if os.access(candidate, os.X_OK):
            return [str(candidate)]
    subprocess.run(["make", "-C", str(REPO), "setup"], check=True)
    return [str(REPO / ".venv/bin/ponytail")]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT, **kwargs)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(command, 124, e.stdout or "", f"timed out after {STEP_TIMEOUT} s")
    except OSError as e:
        return subprocess.CompletedProcess(command, 127, "", str(e))


def canonical_bus_id(text: str) -> str:
    domain, rest = text.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def check_info(ponytail: list[str], smi: str) -> str | None:
    mine = run([*ponytail, "info", "--json"])
    theirs = run([smi, "--query-gpu=index,uuid,pci.bus_id,driver_version", "--format=csv,noheader"])
    evidence = f"ponytail info --json (exit {mine.returncode}):\n{mine.stdout}{mine.stderr}\n"
    evidence += f"nvidia-smi --query-gpu=index,uuid,pci.bus_id,driver_version (exit {theirs.returncode}):\n{theirs.stdout}{theirs.stderr}"
    if mine.returncode != 0 or theirs.returncode != 0:
        report("info matches nvidia-smi", False, evidence)
        return None
    info = json.loads(mine.stdout)
    smi_gpus = [[field.strip() for field in line.split(",")] for line in theirs.stdout.strip().splitlines()]
    problems = []
    if len(info["gpus"]) != len(smi_gpus):
        problems.append(f"ponytail sees {len(info['gpus'])} GPU(s), nvidia-smi {len(smi_gpus)}")
    for gpu, (index, uuid_, bus_id, driver) in zip(info["gpus"], smi_gpus, strict=False):
        if str(gpu["index"]) != index or gpu["uuid"] != uuid_ or canonical_bus_id(gpu["pci_bus_id"]) != canonical_bus_id(bus_id):
            problems.append(f"GPU {index}: ponytail says {gpu['index']} {gpu['uuid']} {gpu['pci_bus_id']}, nvidia-smi {index} {uuid_} {bus_id}")
        if info["driver_version"] != driver:
            problems.append(f"driver version: ponytail {info['driver_version']}, nvidia-smi {driver}")
    report("info matches nvidia-smi", not problems, "\n".join(problems) + ("\n" if problems else "") + evidence)
    return smi_gpus[0][1] if smi_gpus else None


def build_cuda_program(work: Path) -> Path | None:
    out = work / "cuda_roundtrip"
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        report("build the CUDA test program", False, "no C compiler on this machine (make setup installs gcc)")
        return None
    result = run([gcc, "-O1", "-o", str(out), str(REPO / "scripts/gpu/cuda_roundtrip.c"), "-ldl"])
    if result.returncode != 0:
        report("build the CUDA test program", False, result.stderr)
        return None
    return out


def shared_libraries(program: str) -> list[str]:
    out = run(["ldd", program]).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1 and words[words.index("=>") + 1].startswith("/"):
            found.append(words[words.index("=>") + 1])
        elif words and words[0].startswith("/"):
            found.append(words[0])
    return found


def copy_with_libraries(program: str, rootfs: Path, target: str) -> None:
    """``program`` at ``target`` in ``rootfs``, with the system libraries it links against
    (never the NVIDIA driver's own: ponytail brings those)."""
    destination = rootfs / target.lstrip("/")
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(program, destination)
    for library in shared_libraries(program):
        name = os.path.basename(library)
        if name.startswith(("libcuda", "libnvidia")):
            continue
        copy = rootfs / library.lstrip("/")
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(library), copy)


def make_rootfs(path: Path, program: Path, smi: str) -> Path:
    """A busybox image with this machine's loader and libc (what the test program and the
    driver's libraries link against) and /etc/ld.so.conf; no NVIDIA file at all."""
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc/ld.so.conf.d", "usr/bin", "usr/local/bin"):
        (path / d).mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    copy_with_libraries(busybox, path, "/bin/busybox")
    # every applet the image's commands use has its link: Debian's dynamically linked busybox, unlike
    # busybox-static, runs no applet that has none (IN_CONTAINER uses sh, ls, grep)
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (path / "bin" / applet).symlink_to("busybox")
    copy_with_libraries(str(program), path, "/usr/local/bin/cuda_roundtrip")
    # the libraries nvidia-smi and libcuda link against, from this machine's system
    copy_with_libraries(smi, path, "/tmp/nvidia-smi-libs")  # noqa: S108 - a path in the rootfs, removed below
    (path / "tmp/nvidia-smi-libs").unlink()
    libcuda = next((p for p in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1") if os.path.exists(p)), None)
    if libcuda:
        copy_with_libraries(libcuda, path, "/tmp/libcuda-libs")  # noqa: S108 - a path in the rootfs, removed below
        (path / "tmp/libcuda-libs").unlink()
    (path / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    return path


IN_CONTAINER = "nvidia-smi -L && /usr/local/bin/cuda_roundtrip && ls -l /dev | grep nvidia"


def check_output(name: str, result: subprocess.CompletedProcess, gpu0_uuid: str | None) -> None:
    evidence = f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    ok = result.returncode == 0 and "OK cuda" in result.stdout
    if gpu0_uuid is not None:
        listed = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
        ok = ok and len(listed) == 1 and gpu0_uuid in listed[0]
        evidence += f"\nexpected exactly GPU 0 ({gpu0_uuid}) in nvidia-smi -L"
    report(name, ok, evidence)


def check_manual_mode(ponytail: list[str], rootfs: Path, gpu0_uuid: str | None) -> None:
    script = f'"$@" -root {rootfs} -device 0 && chroot {rootfs} /bin/sh -c "{IN_CONTAINER}"'
    result = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *ponytail])
    check_output("manual mode: GPU 0 in a busybox rootfs, nvidia-smi -L and CUDA inside", result, gpu0_uuid)


def check_hook_mode(ponytail: list[str], rootfs: Path, work: Path, gpu0_uuid: str | None) -> None:
    name = "hook mode: runc with ponytail as prestart hook, nvidia-smi -L and CUDA inside"
    runc = shutil.which("runc")
    if runc is None:
        report(name, False, "runc is not installed (make setup installs it)")
        return
    bundle = work / "bundle"
    bundle.mkdir()
    spec = run([runc, "spec", "--bundle", str(bundle)])
    if spec.returncode != 0:
        report(name, False, spec.stderr)
        return
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": False}
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh", "-c", IN_CONTAINER]
    config["process"]["env"] = ["PATH=/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    config["hooks"] = {"prestart": [{"path": ponytail[0], "args": ["ponytail"], "timeout": 60}]}
    (bundle / "config.json").write_text(json.dumps(config))
    result = run([runc, "run", "--bundle", str(bundle), f"ponytail-gpu-check-{uuid.uuid4().hex[:8]}"])
    check_output(name, result, gpu0_uuid)


if __name__ == "__main__":
    sys.exit(main())
