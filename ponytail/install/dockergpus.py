"""Docker's ``--gpus`` served by ponytail alone.

dockerd registers its NVIDIA device driver when it starts, and only if a program named
``nvidia-container-runtime-hook`` is on its PATH (Docker 20.10 and 25+ alike). For each
``docker run --gpus ...`` it then adds to the container's spec:

- ``NVIDIA_VISIBLE_DEVICES``: ``all`` (``--gpus all``), ``0,1,...,N-1`` (``--gpus N``) or the
  ids of ``--gpus device=ID,...`` (indices, ``GPU-`` UUIDs, bus ids), and
  ``NVIDIA_DRIVER_CAPABILITIES`` when ``capabilities=`` names some;
- a prestart hook ``{path: <that program as found on PATH>, args: ["nvidia-container-runtime-hook",
  "prestart"]}`` (Docker 25+ also passes dockerd's own environment to it, 20.10 none).

ponytail answers to that name: a symbolic link ``nvidia-container-runtime-hook`` to the ponytail
command runs ponytail's prestart hook (the OCI state on stdin, as for every engine).
``ponytail install-docker-gpus`` makes that link, and never replaces a file of the same name
that is not ponytail's (NVIDIA's container toolkit installs one).
"""

from __future__ import annotations

import os

from ponytail.hooks.dockergpus import HOOK_NAME
from ponytail.install.hooklinks import make_link, remove_link

DEFAULT_BIN_DIR = "/usr/local/bin"
# the PATH dockerd gets from systemd (and the usual login PATH): where dockerd looks for HOOK_NAME
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def install(bin_dir: str, command: str, dry_run: bool = False) -> list[str]:
    """Make ``bin_dir``/nvidia-container-runtime-hook a link to ``command``; what was done, one
    line each, with what dockerd needs next."""
    path = os.path.join(bin_dir, HOOK_NAME)
    lines = [make_link(path, command, "docker run --gpus now runs ponytail's prestart hook", _HINT, dry_run)]
    lines += _path_warnings(bin_dir, path)
    lines.append("restart dockerd (e.g. systemctl restart docker): it looks for the hook only when it starts")
    return lines


def uninstall(bin_dir: str, command: str, dry_run: bool = False) -> list[str]:
    """Remove ``bin_dir``/nvidia-container-runtime-hook when it is ponytail's link; another
    vendor's file there is left alone."""
    path = os.path.join(bin_dir, HOOK_NAME)
    removed = remove_link(path, command, _HINT, dry_run)
    if removed is None:
        return [f"{path} does not exist: nothing changed"]
    return [f"{removed}; restart dockerd so that --gpus is no longer offered"]


_HINT = "pass --bin-dir DIR for another directory on dockerd's PATH"


def _path_warnings(bin_dir: str, path: str) -> list[str]:
    """What would keep dockerd from finding the link: its directory not on the service PATH, or
    another program of the same name ahead of it there."""
    directory = os.path.realpath(bin_dir)
    if directory not in (os.path.realpath(d) for d in SERVICE_PATH):
        return [f"ponytail: warning: {bin_dir} is not on the PATH dockerd usually has ({':'.join(SERVICE_PATH)}): add it to dockerd's PATH"]
    for other in SERVICE_PATH:
        if os.path.realpath(other) == directory:
            break
        candidate = os.path.join(other, HOOK_NAME)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK) and os.path.realpath(candidate) != os.path.realpath(path):
            return [f"ponytail: warning: {candidate} comes before {path} on dockerd's PATH: dockerd will run that one"]
    return []
