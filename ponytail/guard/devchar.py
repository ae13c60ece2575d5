"""``ponytail dev-char-links``: make the ``/dev/char/MAJOR:MINOR`` link of every NVIDIA node.

Why: see ponytail.host.devchar. The command is idempotent (a second run changes nothing) and
never replaces a file that is not a link, nor a link to something else: it says so and exits 1.
A link to nothing (a node that was removed and made again under another name) is replaced, and
said. ``packaging/systemd/ponytail-dev-char-links.{service,path}`` and
``packaging/udev/71-ponytail-dev-char-links.rules`` run it at boot, when the driver loads and
when a node appears.
"""

from __future__ import annotations

import os

from ponytail.errors import InjectionError, os_failure
from ponytail.fs.atomic import replace_with_symlink
from ponytail.host.devchar import DANGLING, MISSING, OK, CharLink, probe_char_links

# The links made in the host's /dev, one "char/M:m ../node" a line: the Debian package's purge
# removes these and no other (udev and NVIDIA's tools make links of the same names). /run and /dev
# are both emptied at boot, so the list lasts exactly as long as the links.
MADE_RECORD = "/run/ponytail/dev-char-links.made"


def make_char_links(dev_root: str, proc_root: str, dry_run: bool = False) -> tuple[list[str], bool]:
    """What was done, one line each, and whether every node has its link now (or would)."""
    links = probe_char_links(dev_root, proc_root)
    if not links:
        return [f"no NVIDIA device nodes under {dev_root} (the driver is not loaded, or nvidia-modprobe has not made them yet): nothing to link"], True
    lines: list[str] = []
    for link in links:
        path = os.path.join(dev_root, link.link)
        if link.state == OK:
            continue
        if link.state in (MISSING, DANGLING):
            if not dry_run:
                _make(path, link)
                _record(dev_root, link)
            if link.state == MISSING:
                done = "would make" if dry_run else "made"
            else:
                done = f"{'would replace' if dry_run else 'replaced'} a link to nothing ({link.found}) by"
            lines.append(f"{done} {path} -> {link.target}")
        else:
            lines.append(
                f"ponytail: warning: {path} is {link.found}, not a link to {link.node}: left as it is; "
                f"remove it and run again, or containers lose {link.node} on 'systemctl daemon-reload' under the systemd cgroup driver"
            )
    made = sum(1 for link in links if link.state in (MISSING, DANGLING))
    refused = sum(1 for link in links if link.state not in (OK, MISSING, DANGLING))
    lines.append(
        f"{len(links)} NVIDIA node(s) under {dev_root}: {len(links) - made - refused} already linked, "
        f"{made} {'to make' if dry_run else 'made'}, {refused} left as they are"
    )
    return lines, refused == 0


def _make(path: str, link: CharLink) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        replace_with_symlink(link.target, path)
    except OSError as e:
        raise os_failure(f"cannot make {path}", e, InjectionError) from e


def _record(dev_root: str, link: CharLink) -> None:
    """Add ``link`` to MADE_RECORD when it was made in the host's own /dev."""
    if os.path.realpath(dev_root) != "/dev":
        return
    try:
        os.makedirs(os.path.dirname(MADE_RECORD), mode=0o755, exist_ok=True)
        fd = os.open(MADE_RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, f"{link.link} {link.target}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the link is made; only the purge's list of it is missing
