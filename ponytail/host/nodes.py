"""The host's device nodes as the probe reports them: each character device under the dev root,
whether it is what it should be (and the problem's kind when not), the numbered nodes of a
feature, the GPUs' DRM nodes and the MIG access nodes' minors."""

from __future__ import annotations

import os
import stat

from ponytail.capabilities import DRM_MAJOR
from ponytail.config import Config
from ponytail.host.mig import caps_dir, read_access_minor
from ponytail.host.records import NODE_MISSING as NODE_MISSING  # the doctor names the kinds from here
from ponytail.host.records import NODE_MODULE_NOT_LOADED as NODE_MODULE_NOT_LOADED
from ponytail.host.records import DeviceNode, Gpu, char_node


def any_minor_node(dev_root: str, name: str, major: int) -> DeviceNode:
    """The node ``name``, which must be a character device of ``major``; its minor is what it has."""
    path = os.path.join(dev_root, name)
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return char_node(dev_root, name, major, 0)
    minor = os.minor(st.st_rdev)
    if not stat.S_ISCHR(st.st_mode):
        return DeviceNode(name, path, major, minor, f"{path} is not a character device")
    if os.major(st.st_rdev) != major:
        return DeviceNode(name, path, major, minor, f"{path} is c {os.major(st.st_rdev)}:{minor}, expected major {major}")
    return DeviceNode(name, path, major, minor, None)


def numbered_nodes(dev_root: str, prefix: str) -> list[tuple[str, int | None]]:
    """(name, minor) of each ``<prefix><N>`` under ``dev_root``, by N; the minor is checked by
    its major only (a uverbs node's minor is 192+N)."""
    directory, start = os.path.split(prefix)
    try:
        names = os.listdir(os.path.join(dev_root, directory))
    except OSError:
        return []
    numbers = sorted(int(n[len(start):]) for n in names if n.startswith(start) and is_number(n[len(start):]))
    return [(os.path.join(directory, f"{start}{n}"), None) for n in numbers]


def is_number(text: str) -> bool:
    return 0 < len(text) < 10 and text.isascii() and text.isdigit()


def dri_nodes_of(config: Config, gpus: tuple[Gpu, ...]) -> dict[str, tuple[DeviceNode, ...]]:
    """Each GPU's DRM nodes, found from its PCI address: the card* and renderD* entries of
    <sys_root>/bus/pci/devices/<bus id>/drm, with the major:minor in their ``dev`` files, each
    checked at <dev_root>/dri/<name> to be that character device (major 226). Never all of /dev/dri."""
    found: dict[str, tuple[DeviceNode, ...]] = {}
    for gpu in gpus:
        drm = os.path.join(config.sys_root, "bus/pci/devices", gpu.pci_bus_id, "drm")
        try:
            names = sorted(n for n in os.listdir(drm) if _is_dri_name(n))
        except OSError:
            continue
        nodes = []
        for name in names:
            dev = os.path.join(drm, name, "dev")
            try:
                with open(dev, "rb") as f:
                    major_text, _, minor_text = f.read(64).decode("ascii", "replace").strip().partition(":")
                major, minor = int(major_text), int(minor_text)
            except (OSError, ValueError):
                nodes.append(DeviceNode(f"dri/{name}", os.path.join(config.dev_root, "dri", name), DRM_MAJOR, 0, f"cannot read {dev} as MAJOR:MINOR"))
                continue
            if major != DRM_MAJOR:
                nodes.append(DeviceNode(
                    f"dri/{name}", os.path.join(config.dev_root, "dri", name), major, minor,
                    f"{dev} says {major}:{minor}, not a DRM device (major {DRM_MAJOR})",
                ))
                continue
            nodes.append(char_node(config.dev_root, f"dri/{name}", DRM_MAJOR, minor))
        found[gpu.pci_bus_id] = tuple(nodes)
    return found


def _is_dri_name(name: str) -> bool:
    """card<N> or renderD<N> (not a connector such as card1-DP-1, nor the old controlD64)."""
    for prefix in ("card", "renderD"):
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest.isascii() and rest.isdecimal():
            return True
    return False


def mig_global_minors(proc_root: str) -> dict[str, int]:
    minors = {}
    for name in ("config", "monitor"):
        minor = read_access_minor(os.path.join(caps_dir(proc_root), "mig", name))
        if minor is not None:
            minors[name] = minor
    return minors
