"""The ``/dev/char/MAJOR:MINOR`` links of the NVIDIA driver's device nodes, as found (plain data).

Under the systemd cgroup driver runc hands each device rule of config.json to systemd as
``DeviceAllow=/dev/char/M:m`` and leaves out a rule whose link does not exist; on
``systemctl daemon-reload`` systemd rebuilds the container's device program from that list, so a
node without a link is denied again in a running container. udev makes the links for the nodes it
creates; the NVIDIA driver's nodes (made by nvidia-modprobe with mknod) have none.

``probe_char_links`` lists every NVIDIA character device under the dev root (``nvidia*``, and
the entries of ``nvidia-caps/`` and ``nvidia-caps-imex-channels/``) whose major the driver
registered in ``/proc/devices``, and says what is at its link: the link ponytail makes is
relative (``char/195:0 -> ../nvidia0``), as udev's are, so it holds under any dev root.
Nothing is followed out of the dev root when listing the nodes: a symlink named ``nvidia0`` is
not a node.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ponytail.errors import ProbeError
from ponytail.host.driver import read_char_majors

NODE_DIRECTORIES = ("nvidia-caps", "nvidia-caps-imex-channels")  # under the dev root, besides its nvidia* nodes
OK, MISSING, DANGLING, OTHER = "ok", "missing", "dangling", "other"


@dataclass(frozen=True)
class CharLink:
    node: str  # relative to the dev root: "nvidia0", "nvidia-caps/nvidia-cap1"
    major: int
    minor: int
    state: str  # ok; missing; dangling (a link to nothing); other (a file, or a link to something else)
    found: str  # what is at the link now (its target, or the kind of file); "" when missing

    @property
    def link(self) -> str:
        """The link, relative to the dev root."""
        return f"char/{self.major}:{self.minor}"

    @property
    def target(self) -> str:
        """What the link says: the node, relative to the link's directory."""
        return f"../{self.node}"


def probe_char_links(dev_root: str, proc_root: str) -> list[CharLink]:
    """Each NVIDIA node under ``dev_root`` and the state of its link, in name order; none when
    the driver has registered no majors (it is not loaded)."""
    try:
        majors = {number for name, number in read_char_majors(proc_root).items() if name.startswith("nvidia")}
    except ProbeError:
        majors = set()
    out = []
    for node, major, minor in _nvidia_nodes(dev_root, majors):
        state, found = _link_state(os.path.join(dev_root, "char", f"{major}:{minor}"), major, minor, f"../{node}")
        out.append(CharLink(node, major, minor, state, found))
    return out


def _nvidia_nodes(dev_root: str, majors: set[int]) -> list[tuple[str, int, int]]:
    names = [name for name in _listdir(dev_root) if name.startswith("nvidia") and name not in NODE_DIRECTORIES]
    for directory in NODE_DIRECTORIES:
        if os.path.isdir(os.path.join(dev_root, directory)) and not os.path.islink(os.path.join(dev_root, directory)):
            names += [f"{directory}/{name}" for name in _listdir(os.path.join(dev_root, directory))]
    out = []
    for name in sorted(names):
        try:
            st = os.stat(os.path.join(dev_root, name), follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors:
            out.append((name, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _link_state(path: str, major: int, minor: int, target: str) -> tuple[str, str]:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return MISSING, ""
    except OSError as e:
        return OTHER, f"cannot be read ({e.strerror})"
    if not stat.S_ISLNK(st.st_mode):
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
            return OK, "the node itself"
        return OTHER, "a file that is not a link"
    said = os.readlink(path)
    if said == target:
        return OK, said
    try:
        resolved = os.stat(path)  # the host's own /dev: another name for the same node is as good
    except OSError:
        return DANGLING, said
    if stat.S_ISCHR(resolved.st_mode) and resolved.st_rdev == os.makedev(major, minor):
        return OK, said
    return OTHER, f"a link to {said}"
