"""``ponytail check``'s findings about what the engines do with CDI requests beyond ponytail's own
configuration: containerd 1.6 (and older) ignores the CDI devices of a CRI request, so a pod the
device plugin gave GPUs that way starts without them, and without an error."""

from __future__ import annotations

import os
import shutil
import subprocess

from ponytail.cli.findings import OK, WARN, Finding

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
    from ponytail.engines.cdi.owners import scan

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
