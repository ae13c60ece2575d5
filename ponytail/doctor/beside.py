"""``ponytail check``'s findings about the engines beyond ponytail's own configuration: containerd 1.6
(and older) ignores the CDI devices of a CRI request, so a pod the device plugin gave GPUs that way
starts without them, and without an error; podman running crun, which refuses a hybrid cgroup layout
(cgroup v1 with a cgroup2 'unified' mount), root's or an ordinary user's."""

from __future__ import annotations

import os
import shutil
import subprocess

from ponytail.cdi.owners import scan
from ponytail.config import Config
from ponytail.doctor.findings import OK, WARN, Finding
from ponytail.engines.podman import configured_runtime

CONTAINERD_WITHOUT_CDI = ((1, 6),)  # and older: (major, minor) at most this


def containerd_cdi(checked: list[Finding], root: str) -> list[Finding]:
    """A finding on containerd's CDI support when containerd was checked: its version, from
    ``containerd --version`` of the containerd on PATH (the host's program, never an image's).
    A warning where CDI specs wait in the spec directories (someone expects CDI requests to work),
    else a note."""
    if not any(f.area == "engine" and f.subject == "containerd" for f in checked):
        return []
    version = containerd_version()
    if version is None:
        return []
    text, numbers = version
    if numbers > CONTAINERD_WITHOUT_CDI[0]:
        return [Finding("engine", "containerd CDI", OK, f"containerd {text} resolves CDI requests (1.7 with enable_cdi; 2.x by default)")]
    specs = [f.path for f in scan(root)]
    why = f" ({', '.join(specs)} will not be used for CRI requests)" if specs else ""
    return [Finding(
        "engine", "containerd CDI", WARN if specs else OK,
        f"containerd {text} ignores the CDI devices of CRI requests{why}: a pod the device plugin gives GPUs by its cdi-cri strategy "
        "starts without them, and no error (even for an unknown name); use its volume-mounts or cdi-annotations strategy with the "
        "runtime ponytail (ponytail-runtime reads them), or containerd 1.7+ with enable_cdi",
    )]


def containerd_version() -> tuple[str, tuple[int, int]] | None:
    """('1.6.20', (1, 6)) for the containerd on PATH; None when there is none or it says no version."""
    program = shutil.which("containerd")
    if program is None:
        return None
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=10, check=False,  # noqa: S603 - the host's own containerd
                             env={"PATH": os.defpath}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_containerd_version(out)


def parse_containerd_version(out: str) -> tuple[str, tuple[int, int]] | None:
    """'containerd github.com/containerd/containerd v1.6.20~ds1 1.6.20~ds1-1+b1' -> ('1.6.20~ds1', (1, 6))."""
    for word in out.split()[1:]:
        text = word.removeprefix("v")
        parts = text.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return text, (int(parts[0]), int(parts[1]))
    return None


def podman_runtime(checked: list[Finding], root: str, config: Config) -> list[Finding]:
    """A warning when podman was checked, the host's cgroups are the hybrid layout and podman's runtime
    (``runtime`` under [engine] of containers.conf, the last file that sets it; unset: crun where it
    is installed) is crun: crun refuses that layout, so no container starts (rootless ones neither)."""
    if not any(f.area == "engine" and f.subject == "podman" for f in checked):
        return []
    cgroup = os.path.join(config.sys_root, "fs/cgroup")
    hybrid = os.path.isdir(os.path.join(cgroup, "devices")) and os.path.exists(os.path.join(cgroup, "unified/cgroup.controllers"))
    if not hybrid:
        return []
    runtime, where = "crun" if shutil.which("crun") else "runc", "podman's default"
    found = configured_runtime(root)
    if found is not None:
        runtime, where = found[0], f"runtime in {found[1]}"
    if os.path.basename(runtime) != "crun":
        return [Finding("engine", "podman runtime", OK, f"{runtime} ({where}) runs on this hybrid cgroup layout")]
    return [Finding(
        "engine", "podman runtime", WARN,
        f"podman runs crun ({where}), which refuses this hybrid cgroup layout (cgroup v1 with {cgroup}/unified): set runtime = \"runc\" "
        "under [engine] in /etc/containers/containers.conf (an ordinary user's: ~/.config/containers/containers.conf), or run podman --runtime runc",
    )]
