"""The oci-hooks file (hooks.d, version 1.0.0) that makes podman and CRI-O run ponytail.

podman silently drops a hook whose ``path`` does not exist, and a malformed file
in a hooks directory makes every podman run fail: ``ponytail install-hook``
writes the file atomically, with the absolute path of this install's command.
The repository ships the same file for the usual path (hooks.d/ponytail.json).
"""

from __future__ import annotations

import json
import os
import re

from ponytail.container.gpu_markers import GPU_ANNOTATION, GPU_ANNOTATION_VALUE
from ponytail.errors import UsageError, os_failure
from ponytail.fs.atomic import replace_file

FILE_NAME = "ponytail.json"
DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # what Debian 12's podman 4.3.1 reads


def hook_file_text(command: str, config: str | None = None, always: bool = False) -> str:
    """The hooks.d JSON: run ``command`` at prestart of containers annotated com.example.gpu=true
    (``always``: of every container; the hook injects only into those that ask for GPUs).
    Without ``config`` the hook reads /etc/ponytail/config.toml if it exists, else its defaults."""
    args = ["ponytail", "-config", config] if config else ["ponytail"]
    when: dict = {"always": True} if always else {
        "annotations": {f"^{re.escape(GPU_ANNOTATION)}$": f"^{re.escape(GPU_ANNOTATION_VALUE)}$"}
    }
    document = {"version": "1.0.0", "hook": {"path": command, "args": args}, "when": when, "stages": ["prestart"]}
    return json.dumps(document, indent=2) + "\n"


def install_hook(directory: str, command: str, config: str | None) -> str:
    """Write ``directory``/ponytail.json atomically; returns its path."""
    if not os.path.isabs(command) or not os.path.isfile(command) or not os.access(command, os.X_OK):
        raise UsageError(f"hook command {command} is not an executable file given by an absolute path (podman would skip the hook)")
    if config is not None and not os.path.isabs(config):
        raise UsageError(f"--config {config}: must be an absolute path (the hook runs in the bundle directory)")
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, FILE_NAME)
        replace_file(path, hook_file_text(command, config).encode(), 0o644)
    except OSError as e:
        raise os_failure(f"cannot write the hook file in {directory}", e, UsageError) from e
    return path
