"""``ponytail install-nvidia-hook``: ponytail where NVIDIA's CDI specs look for their hook binary.

A spec names its hook by absolute path: ``nvidia-ctk cdi generate`` writes its
``--nvidia-cdi-hook-path`` (default /usr/bin/nvidia-cdi-hook), NVIDIA's device plugin its own
``--nvidia-cdi-hook-path`` (default /usr/bin/nvidia-ctk, the ``nvidia-ctk hook`` form), the GPU
Operator's toolkit container /usr/local/nvidia/toolkit/nvidia-cdi-hook, the DRA driver the path it
is configured with. Each of these paths becomes a small shell script that runs the ponytail command
(ponytail.install.hooklinks: another vendor's file there is never replaced or removed), so the
spec's hooks run ponytail (ponytail.hooks.nvidia).

The script is there for speed. NVIDIA's spec runs five hook processes a start; the first ponytail
run does the work of all of them and leaves a mark in the bundle (ponytail.hooks.nvidia's
MARK, named by the process that runs the hooks: runc's or crun's, the same for all hooks of one
start, another for the next start). The script reads the OCI state with the shell's builtins and,
when that mark is there and newer than the bundle's config.json, exits at once: the later hooks of a
start cost a shell, not a Python interpreter. Anything it cannot read so goes to ponytail, which
decides from config.json's hook list as before.
"""

from __future__ import annotations

import os

from ponytail.cdi.files import read_spec
from ponytail.cdi.nvidiahooks import unserved
from ponytail.cdi.skim import spec_hooks
from ponytail.errors import UsageError
from ponytail.hooks.nvidia import MARK
from ponytail.install.hooklinks import make_link, remove_link

DEFAULT_PATH = "/usr/bin/nvidia-cdi-hook"
TOOLKIT_NAME = "nvidia-cdi-hook"
NAMES = ("nvidia-cdi-hook", "nvidia-ctk")
_HINT = "point the spec's generator at another path (--nvidia-cdi-hook-path) and pass --at PATH"


def hook_paths(at: tuple[str, ...], specs: tuple[str, ...], toolkit_dirs: tuple[str, ...], warnings: list[str] | None = None) -> list[str]:
    """Where the links go: each ``at`` path, the hook paths the ``specs`` name, ``toolkit_dir``/nvidia-cdi-hook;
    the default path when none is given. Each hook command line of the ``specs`` that ponytail would
    not serve (ponytail.cdi.nvidiahooks) is added to ``warnings``, one line each."""
    paths = list(at) + [os.path.join(d, TOOLKIT_NAME) for d in toolkit_dirs]
    for spec_file in specs:
        spec = read_spec(spec_file)
        named = hook_paths_in(spec)
        if not named:
            raise UsageError(f"{spec_file} names no nvidia-cdi-hook or nvidia-ctk hook: nothing to serve there")
        paths += named
        if warnings is not None:
            warnings += [hook.said(spec_file, None) for hook in unserved(spec_hooks(spec))]
    paths = list(dict.fromkeys(paths or [DEFAULT_PATH]))
    for path in paths:
        if not os.path.isabs(path) or os.path.basename(path) not in NAMES:
            raise UsageError(f"{path}: a hook path must be absolute and end in nvidia-cdi-hook or nvidia-ctk (the names ponytail answers to)")
    return paths


def install(paths: list[str], command: str, dry_run: bool = False, config: str | None = None) -> list[str]:
    does = "NVIDIA's CDI specs naming it now run ponytail's hook"
    return [make_link(path, command, does, _HINT, dry_run, script(command, config)) for path in paths]


def script(command: str, config: str | None = None) -> bytes:
    """The hook script that runs ``command`` (an absolute path without quotes or backslashes), with
    ``config`` as its config file (else $PONYTAIL_CONFIG from the hook's environment, or the default)."""
    for what, value in (("the ponytail command's path", command), ("the config file's path", config or "")):
        if any(c in value for c in "'\\\n"):
            raise UsageError(f"{value!r}: {what} must not hold quotes, backslashes or newlines")
    if config is not None and not os.path.isabs(config):
        raise UsageError(f"--config {config!r}: give the config file by an absolute path")
    environment = f"PONYTAIL_CONFIG='{config}' " if config else ""
    return _SCRIPT.replace("@MARK@", MARK).replace("@ENV@", environment).replace("@COMMAND@", command).encode()


_SCRIPT = """#!/bin/sh
# ponytail-hook-script: NVIDIA's CDI hook binary served by ponytail ('ponytail install-nvidia-hook'; --uninstall removes it)
# The first hook of a container start does the work of all of them and marks the bundle: the later ones exit here.
state=
while IFS= read -r line; do state="$state$line
"; done
state="$state$line"
bundle=${state#*'"bundle":'}
while case $bundle in ' '*) true ;; *) false ;; esac; do bundle=${bundle#?}; done
case $bundle in
'"/'*) bundle=${bundle#'"'}; bundle=${bundle%%'"'*}; [ "$bundle/@MARK@.$PPID" -nt "$bundle/config.json" ] && exit 0 ;;
esac
@ENV@exec '@COMMAND@' nvidia-hook "$0" "$@" <<PONYTAIL_STATE
$state
PONYTAIL_STATE
"""


def uninstall(paths: list[str], command: str, dry_run: bool = False) -> list[str]:
    return [remove_link(path, command, _HINT, dry_run) or f"{path} does not exist: nothing changed" for path in paths]


def hook_paths_in(spec: dict) -> list[str]:
    """The absolute hook paths a spec names that end in a name ponytail answers to."""
    edits = [spec.get("containerEdits")] + [d.get("containerEdits") for d in spec.get("devices") or [] if isinstance(d, dict)]
    found = []
    for edit in edits:
        for hook in (edit or {}).get("hooks") or [] if isinstance(edit, dict) else []:
            path = hook.get("path") if isinstance(hook, dict) else None
            if isinstance(path, str) and os.path.basename(path) in NAMES:
                found.append(path)
    return found
