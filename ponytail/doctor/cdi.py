"""``ponytail check``'s CDI findings: each NVIDIA spec in the engines' spec directories (ponytail's
or another generator's), read as the CDI runtime reads it and checked against the running driver
and GPUs with the test of ``ponytail cdi check``; and each kind that more than one file defines,
which the engines refuse or shadow; and each of NVIDIA's hook command lines a spec runs that ponytail's
hook would not serve (ponytail.cdi.nvidiahooks). Advice never sends ponytail over another generator's file."""

from __future__ import annotations

import os
import stat

from ponytail.cdi.files import stale
from ponytail.cdi.nvidiahooks import unserved
from ponytail.cdi.owners import OTHER, PONYTAIL, clash_message, clashes, regenerate_advice, scan
from ponytail.config import Config
from ponytail.doctor.findings import FAIL, OK, WARN, Finding
from ponytail.errors import PonytailError


def cdi_findings(root: str, config: Config) -> list[Finding]:
    out = []
    files = scan(root)
    fail = config.unknown_nvidia_hooks == "fail"
    for f in files:
        if f.spec is None:
            if f.kind.startswith("nvidia.com/") or f.generator != OTHER:
                out.append(Finding("engine", "CDI", FAIL, f"{f.error}: the engines refuse it; {regenerate_advice(f)}"))
            continue
        for hook in unserved(f.hooks):  # any kind: the device plugin's and the GPU Operator's specs run them too
            out.append(Finding("engine", "CDI hook", FAIL if hook.stops_a_start(fail) else WARN, hook.said(f.label, fail)))
        if not f.kind.startswith("nvidia.com/"):
            continue  # another vendor's devices: not ours to judge
        try:
            found = stale(f.spec, config)
        except PonytailError as e:  # no driver loaded: check_host says so already
            found = [e.message]
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            out.append(Finding("engine", "CDI", FAIL, f"{f.label} is stale: {found[0]}{more}: {regenerate_advice(f)}"))
        else:
            note = _rootless_note(f.spec) if f.generator == PONYTAIL else ""
            out.append(Finding("engine", "CDI", OK, f"{f.label} is true for the running driver and GPUs{note}"))
    for kind, group in clashes([f for f in files if f.kind.startswith("nvidia.com/")]).items():
        out.append(Finding("engine", f"CDI {kind}", FAIL, clash_message(kind, group)))
    return out


def _rootless_note(spec: dict) -> str:
    """What keeps rootless podman (an ordinary user's) from running the spec's hooks, else ''."""
    hooks = {h["path"] for e in [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec["devices"])]
             for h in e.get("hooks") or [] if isinstance(h.get("path"), str)}
    for hook in sorted(hooks):
        why = not_runnable_by_all(hook)
        if why is not None:
            return (f"; for root only: rootless podman cannot run its hook {hook} ({why}): install ponytail where every user can run it "
                    "(the binary in /usr/local/bin) and generate the spec with --hook-path")
    return ""


def not_runnable_by_all(program: str, depth: int = 0) -> str | None:
    """Why a user other than its owner cannot run ``program`` (None: anyone can): a directory on the way
    without the search bit for others, the file without their execute bit, or (a script) its interpreter."""
    real = os.path.realpath(program)
    parts = real.split("/")
    for i in range(2, len(parts)):
        directory = "/".join(parts[:i])
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return f"{directory} cannot be read"
        if not mode & stat.S_IXOTH:
            return f"{directory} is mode {stat.S_IMODE(mode):04o}"
    try:
        mode = os.stat(real).st_mode
        with open(real, "rb") as f:
            head = f.read(256)
    except OSError:
        return f"{real} cannot be read"
    if not mode & stat.S_IXOTH:
        return f"{real} is mode {stat.S_IMODE(mode):04o}"
    if head.startswith(b"#!") and depth == 0:
        words = head[2:].split(b"\n", 1)[0].split()
        if words:
            if not mode & stat.S_IROTH:
                return f"{real}, a script, is mode {stat.S_IMODE(mode):04o}"
            found = not_runnable_by_all(words[0].decode(errors="replace"), 1)
            return f"its interpreter: {found}" if found else None
    return None
