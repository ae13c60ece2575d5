"""``ponytail install-nvidia-hook``: ponytail where NVIDIA's CDI specs look for their hook binary.

A spec names its hook by absolute path: ``nvidia-ctk cdi generate`` writes its
``--nvidia-cdi-hook-path`` (default /usr/bin/nvidia-cdi-hook), NVIDIA's device plugin its own
``--nvidia-cdi-hook-path`` (default /usr/bin/nvidia-ctk, the ``nvidia-ctk hook`` form), the GPU
Operator's toolkit container /usr/local/nvidia/toolkit/nvidia-cdi-hook, the DRA driver the path it
is configured with. Each of these paths becomes a link to the ponytail command
(ponytail.engines.hooklinks: another vendor's file there is never replaced or removed), so the
spec's hooks run ponytail (ponytail.engines.cdi.nvidiahook).
"""

from __future__ import annotations

import os

from ponytail.engines.hooklinks import make_link, remove_link
from ponytail.errors import UsageError

DEFAULT_PATH = "/usr/bin/nvidia-cdi-hook"
TOOLKIT_NAME = "nvidia-cdi-hook"
NAMES = ("nvidia-cdi-hook", "nvidia-ctk")
_HINT = "point the spec's generator at another path (--nvidia-cdi-hook-path) and pass --at PATH"


def hook_paths(at: tuple[str, ...], specs: tuple[str, ...], toolkit_dirs: tuple[str, ...]) -> list[str]:
    """Where the links go: each ``at`` path, the hook paths the ``specs`` name, ``toolkit_dir``/nvidia-cdi-hook;
    the default path when none is given."""
    from ponytail.engines.cdi.files import read_spec

    paths = list(at) + [os.path.join(d, TOOLKIT_NAME) for d in toolkit_dirs]
    for spec_file in specs:
        named = _hook_paths_in(read_spec(spec_file))
        if not named:
            raise UsageError(f"{spec_file} names no nvidia-cdi-hook or nvidia-ctk hook: nothing to serve there")
        paths += named
    paths = list(dict.fromkeys(paths or [DEFAULT_PATH]))
    for path in paths:
        if not os.path.isabs(path) or os.path.basename(path) not in NAMES:
            raise UsageError(f"{path}: a hook path must be absolute and end in nvidia-cdi-hook or nvidia-ctk (the names ponytail answers to)")
    return paths


def install(paths: list[str], command: str, dry_run: bool = False) -> list[str]:
    does = "NVIDIA's CDI specs naming it now run ponytail's hook"
    return [make_link(path, command, does, _HINT, dry_run) for path in paths]


def uninstall(paths: list[str], command: str, dry_run: bool = False) -> list[str]:
    return [remove_link(path, command, _HINT, dry_run) or f"{path} does not exist: nothing changed" for path in paths]


def _hook_paths_in(spec: dict) -> list[str]:
    edits = [spec.get("containerEdits")] + [d.get("containerEdits") for d in spec.get("devices") or [] if isinstance(d, dict)]
    found = []
    for edit in edits:
        for hook in (edit or {}).get("hooks") or [] if isinstance(edit, dict) else []:
            path = hook.get("path") if isinstance(hook, dict) else None
            if isinstance(path, str) and os.path.basename(path) in NAMES:
                found.append(path)
    return found
