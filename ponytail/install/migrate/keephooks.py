"""NVIDIA's hook paths, served by ponytail after a migration, put back when NVIDIA's package removes them.

A migrated node keeps ponytail's link at ``nvidia-container-runtime-hook`` and ponytail's hook script at
``nvidia-cdi-hook`` / ``nvidia-ctk`` (plan.py). Those are paths of NVIDIA's packages: dpkg deletes them
when the package is removed, and every GPU container then fails. The Debian package's file triggers
(debian/ponytail.triggers) run this after such a change: each recorded hook path that is gone is made
again as the migration left it (its record says), so the engines keep working and ``--undo`` still
finds what it left. Run as ``python3 -I -m ponytail.install.migrate.keephooks [STATE_DIR]``.
"""

from __future__ import annotations

import hashlib
import os
import sys

from ponytail.errors import PonytailError
from ponytail.fs.atomic import replace_file
from ponytail.install.migrate.journal import left_data, read_record
from ponytail.install.migrate.nvidia import SERVED, under
from ponytail.install.nvidiahook import script

SCRIPT_NAMES = ("nvidia-cdi-hook", "nvidia-ctk")


def put_back(state_dir: str = "/var/lib/ponytail/migrate", root: str = "/") -> list[str]:
    """Each recorded hook path that is gone, made again; one line each. The record is read as
    ``--undo`` reads it (journal.read_record: believed only when root's alone); none: nothing to do."""
    try:
        record = read_record(root, state_dir, "not putting back NVIDIA's hook paths")
    except PonytailError as e:
        return [f"ponytail: {e.message}"]
    lines = []
    for entry in record["entries"] if record is not None else []:
        path, left = entry.get("path"), entry.get("left") or {}
        if not isinstance(path, str) or not os.path.isabs(path) or os.path.lexists(under(root, path)):
            continue
        name = os.path.basename(path)
        target = str(left.get("target", ""))
        if SERVED.get(name) == "link" and left.get("kind") == "link" and os.path.basename(target).startswith("ponytail"):
            os.symlink(target, under(root, path))
            lines.append(f"ponytail: {path} was removed with NVIDIA's package: put back the link to {target} (the migration's)")
        elif name in SCRIPT_NAMES and left.get("kind") == "file":
            try:  # the bytes the migration left (its record keeps them), else the script as it writes it
                data = left_data(left)
            except (KeyError, ValueError, TypeError):
                words = str(entry.get("restore", "")).split()
                data = script(words[words.index("--path") + 1] if "--path" in words[:-1] else "/usr/bin/ponytail")
            if hashlib.sha256(data).hexdigest() != left.get("sha256"):
                lines.append(f"ponytail: {path} was removed with NVIDIA's package; it was not ponytail's usual hook script: "
                             f"run 'ponytail install-nvidia-hook --at {path}'")
                continue
            os.makedirs(os.path.dirname(under(root, path)), exist_ok=True)
            replace_file(under(root, path), data, int(left.get("mode", 0o755)) & 0o7777)
            lines.append(f"ponytail: {path} was removed with NVIDIA's package: put back ponytail's hook script (the migration's)")
    return lines


if __name__ == "__main__":
    for line in put_back(*sys.argv[1:2]):
        print(line)
