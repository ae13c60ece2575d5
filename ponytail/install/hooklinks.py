"""Links under another vendor's program names that lead to the ponytail command.

Engines and specs find NVIDIA's hooks by name: dockerd looks for ``nvidia-container-runtime-hook``
on its PATH (ponytail.install.dockergpus), NVIDIA's CDI specs name ``nvidia-cdi-hook`` or
``nvidia-ctk`` by absolute path (ponytail.hooks.nvidia). ponytail answers to those names
through a symbolic link to its command. A link is made only where nothing is or where ponytail's
own link is, and removed only when it is ponytail's: another vendor's file of that name (NVIDIA's
toolkit installs them) is never replaced nor removed.
"""

from __future__ import annotations

import os

from ponytail.errors import InjectionError, UsageError, os_failure
from ponytail.fs.atomic import replace_file, replace_with_symlink


def make_link(path: str, command: str, does: str, hint: str, dry_run: bool = False, script: bytes = b"") -> str:
    """Make ``path`` a link to ``command`` (or, given ``script``, an executable file holding it, which
    must hold SCRIPT_MARK); the line that says what was done (``does``: what it then does; ``hint``:
    what to do instead when another vendor's file is there)."""
    require_command(command)
    if is_ours(path, command) and (not script or holds(path, script)):
        return f"{path} already runs {command}: nothing changed"
    refuse_foreign(path, hint, command=command)
    if not dry_run:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if script:
                replace_file(path, script, 0o755)
            else:
                replace_with_symlink(command, path)
        except OSError as e:
            raise os_failure(f"cannot make {path}", e, InjectionError) from e
    verb = ("would write" if dry_run else "wrote") if script else ("would link" if dry_run else "linked")
    return f"{verb} {path} -> {command}: {does}"


SCRIPT_MARK = b"\n# ponytail-hook-script: "  # the second line of a script make_link wrote: ponytail's own file


def remove_link(path: str, command: str, hint: str, dry_run: bool = False) -> str | None:
    """Remove ``path`` when it is ponytail's link (or script); None when nothing is there. Another
    vendor's file is an error and stays."""
    if not os.path.lexists(path):
        return None
    if not is_ours(path, command):
        refuse_foreign(path, hint, doing="remove")
    if not dry_run:
        try:
            os.unlink(path)
        except OSError as e:
            raise os_failure(f"cannot remove {path}", e, InjectionError) from e
    return f"{'would remove' if dry_run else 'removed'} {path}"


def require_command(command: str) -> None:
    if not os.path.isabs(command) or not os.path.isfile(command) or not os.access(command, os.X_OK):
        raise UsageError(f"{command} is not an executable file given by an absolute path (the link must lead to the ponytail command)")


def is_ours(path: str, command: str) -> bool:
    """A link to this ponytail command, or to another install's ``ponytail`` (an upgrade), or a
    script make_link wrote."""
    if not os.path.islink(path):
        return _is_our_script(path)
    target = os.readlink(path)
    return os.path.realpath(path) == os.path.realpath(command) or os.path.basename(target) == "ponytail"


def _is_our_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return SCRIPT_MARK in f.read(512)
    except OSError:
        return False


def holds(path: str, content: bytes) -> bool:
    """Whether the file ``path`` holds exactly ``content`` (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(content) + 1) == content
    except OSError:
        return False


def refuse_foreign(path: str, hint: str, doing: str = "replace", command: str = "") -> None:
    if not os.path.lexists(path) or (command and is_ours(path, command)):
        return
    what = f"a link to {os.readlink(path)}" if os.path.islink(path) else "a file that is not a link to ponytail"
    raise InjectionError(
        f"{path} is {what} (NVIDIA's container toolkit installs one of that name): ponytail does not {doing} another "
        f"vendor's file; uninstall that package or remove the file, or {hint}"
    )
