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

from ponytail.errors import InjectionError, UsageError, os_failure

HOOK_NAME = "nvidia-container-runtime-hook"
DEFAULT_BIN_DIR = "/usr/local/bin"
# the PATH dockerd gets from systemd (and the usual login PATH): where dockerd looks for HOOK_NAME
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
HOOK_VERBS_WITHOUT_WORK = ("poststart", "poststop")  # NVIDIA's hook does nothing at these either


def hook_arguments(args: list[str]) -> list[str] | None:
    """The ponytail command line for a run under ``HOOK_NAME`` with ``args`` (Docker passes
    ``prestart``): the hook's own (none: hook mode, the OCI state on stdin), None for a stage
    with nothing to do. Anything else is a usage error."""
    if args[:1] == ["prestart"]:
        return args[1:]
    if args[:1] and args[0] in HOOK_VERBS_WITHOUT_WORK:
        return None
    said = " ".join(args) if args else "nothing"
    raise UsageError(f"run as {HOOK_NAME} (Docker's --gpus hook), ponytail takes 'prestart', not {said}")


def install(bin_dir: str, command: str, dry_run: bool = False) -> list[str]:
    """Make ``bin_dir``/nvidia-container-runtime-hook a link to ``command``; what was done, one
    line each, with what dockerd needs next."""
    path = os.path.join(bin_dir, HOOK_NAME)
    _require_command(command)
    if _is_ours(path, command):
        lines = [f"{path} already runs {command}: nothing changed"]
    else:
        _refuse_foreign(path)
        if not dry_run:
            _link(command, path)
        lines = [f"{'would link' if dry_run else 'linked'} {path} -> {command}: docker run --gpus now runs ponytail's prestart hook"]
    lines += _path_warnings(bin_dir, path)
    lines.append("restart dockerd (e.g. systemctl restart docker): it looks for the hook only when it starts")
    return lines


def uninstall(bin_dir: str, command: str, dry_run: bool = False) -> list[str]:
    """Remove ``bin_dir``/nvidia-container-runtime-hook when it is ponytail's link; another
    vendor's file there is left alone."""
    path = os.path.join(bin_dir, HOOK_NAME)
    if not os.path.lexists(path):
        return [f"{path} does not exist: nothing changed"]
    if not _is_ours(path, command):
        _refuse_foreign(path, doing="remove")
    if not dry_run:
        try:
            os.unlink(path)
        except OSError as e:
            raise os_failure(f"cannot remove {path}", e, InjectionError) from e
    return [f"{'would remove' if dry_run else 'removed'} {path}; restart dockerd so that --gpus is no longer offered"]


def _require_command(command: str) -> None:
    if not os.path.isabs(command) or not os.path.isfile(command) or not os.access(command, os.X_OK):
        raise UsageError(f"{command} is not an executable file given by an absolute path (the link must lead to the ponytail command)")


def _is_ours(path: str, command: str) -> bool:
    """A link to this ponytail command, or to another install's ``ponytail`` (an upgrade)."""
    if not os.path.islink(path):
        return False
    target = os.readlink(path)
    return os.path.realpath(path) == os.path.realpath(command) or os.path.basename(target) == "ponytail"


def _refuse_foreign(path: str, doing: str = "replace") -> None:
    if not os.path.lexists(path):
        return
    what = f"a link to {os.readlink(path)}" if os.path.islink(path) else "a file that is not a link to ponytail"
    raise InjectionError(
        f"{path} is {what} (NVIDIA's container toolkit installs one of that name): ponytail does not {doing} another "
        f"vendor's file; uninstall that package or remove the file, or pass --bin-dir DIR for another directory on dockerd's PATH"
    )


def _link(command: str, path: str) -> None:
    from ponytail.fs.atomic import replace_with_symlink

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        replace_with_symlink(command, path)
    except OSError as e:
        raise os_failure(f"cannot make {path}", e, InjectionError) from e


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
