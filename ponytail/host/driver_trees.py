"""Per-container user-mode drivers: driver trees the admin registers as ``[drivers.NAME]``.

The tree a container names (ponytail.container.driver_trees; only registered names, never a
path) is the driver root for this container: its libraries (found through its own
ld.so.cache and the usual directories, filtered to its version), binaries and firmware.
Device nodes, /proc and /sys stay the host's. The tree's version is read from its
libraries' file names (libcuda.so.560.28.03), never by loading them; it must equal the
loaded kernel module's unless the entry lists that module version (or "*").

A tree's libraries go into containers and its libcuda is asked for the CUDA version, so
the tree is held to ponytail.fs.trust's rule: every directory above it, its root and
every directory and file down to each file used must be root's and writable by no one
else, or the tree is refused with one line naming the path. Its files are read inside
it (a link leading out of it leads nowhere; no read blocks).
"""

from __future__ import annotations

import os

from ponytail.config import Config, DriverTree
from ponytail.errors import InputError, ProbeError
from ponytail.fs.hostfiles import is_under
from ponytail.host.driver_files import soname_state
from ponytail.lite.records import record, replace

_VERSION_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")


@record(frozen=True)
class TreeChoice:
    """The driver tree a container runs with, and why."""

    name: str  # "" for the host's driver root
    root: str
    version: str  # of the tree's libraries ("" for the host's: the kernel module's is used)
    why: str

    def describe(self) -> str:
        if not self.name:
            return f"host driver root {self.root} ({self.why})"
        return f"driver tree '{self.name}' at {self.root}, version {self.version} ({self.why})"


def refuse_untrusted_tree(name: str, root: str, paths: list[str]) -> None:
    """ProbeError when the tree at ``root`` or any of its ``paths`` (and its ld.so.cache) may
    have been changed by someone other than root (ponytail.fs.trust)."""
    from ponytail.fs.trust import untrusted_place

    found = untrusted_place(root, ["/etc/ld.so.cache", *paths])
    if found:
        where, why = found
        real = os.path.realpath(root)
        if is_under(where, real):
            fix = f"chown -R root:root {root} && chmod -R go-w {root}"
        else:  # a directory above the tree: that one directory
            fix = f"chown root:root {where} && chmod go-w {where}"
        raise ProbeError(
            f"driver tree '{name}' refused: {where} is {why}; its code would be given to containers, so the tree and the "
            f"directories above it must be root's and writable by no one else: {fix}"
        )


def choose_tree(config: Config, asked: tuple[str, str] | None, kernel_version: str) -> tuple[Config, TreeChoice]:
    """The config to probe with (its driver root the tree's) and the choice made.

    InputError for a name that is not registered (a path is never one); ProbeError when the
    tree's version differs from the kernel module's and the entry does not allow it."""
    if asked is None:
        return config, TreeChoice("", config.driver_root, "", "no driver tree requested")
    name, source = asked
    tree = config.drivers.get(name)
    if tree is None:
        known = ", ".join(sorted(config.drivers)) or "none are registered"
        kind = "a path, not a registered driver name" if "/" in name else "not a registered driver tree"
        raise InputError(f"{source}={name!r} is {kind} (registered: {known}); the admin adds [drivers.NAME] to {config.path or 'the config'}")
    refuse_untrusted_tree(name, tree.root, [])
    version, problem = tree_state(tree.root)
    if version is None or problem is not None:
        raise ProbeError(f"driver tree '{name}' at {tree.root}{f' (version {version})' if version else ''}: {problem}; fix the tree or its [drivers.{name}] root")
    if version != kernel_version and "*" not in tree.kernel_modules and kernel_version not in tree.kernel_modules:
        raise ProbeError(
            f"driver tree '{name}' is version {version} but the loaded kernel module is {kernel_version}: "
            f"load the matching module, choose another tree, or add \"{kernel_version}\" to [drivers.{name}] kernel_modules"
        )
    why = f"{source}={name}" + (f"; kernel module {kernel_version} allowed by kernel_modules" if version != kernel_version else "")
    return replace(config, driver_root=tree.root), TreeChoice(name, tree.root, version, why)


def tree_version(root: str) -> str | None:
    """The driver version of the tree at ``root``: the version in the file name that its
    libcuda.so.1 (else libnvidia-ml.so.1) resolves to. Never loads a library."""
    return tree_state(root)[0]


def tree_state(root: str) -> tuple[str | None, str | None]:
    """(version, problem) of the tree at ``root``: a tree serves only when its libcuda.so.1 leads
    to a file named by version, and libnvidia-ml.so.1 (when there) to one of the same version. A link that leads to no file, or two
    versions (a half-updated tree: libcuda 560 beside libnvidia-ml 550), is a problem that
    fails every start selecting it, so it is said wherever the tree is shown."""
    found = {soname: soname_state(root, soname) for soname in _VERSION_SONAMES}
    versions = {soname: state[0] for soname, state in found.items() if state[0] is not None}
    version = next(iter(versions.values()), None)
    for soname, (_, _, dangling) in found.items():
        if dangling:
            return version, f"its {dangling} ({soname}) leads to no file in the tree: reinstall the tree's libraries"
    if len(set(versions.values())) > 1:
        mixed = " but ".join(f"{soname} is {v}" for soname, v in versions.items())
        return version, f"half-updated: {mixed}; reinstall one version of the driver's libraries in the tree"
    if version is None:
        return None, "no libcuda.so.1 or libnvidia-ml.so.1 named by version (libcuda.so.X.Y.Z)"
    if "libcuda.so.1" not in versions:  # every start asking for compute (the default) would fail
        return version, f"no libcuda.so.1 named by version (libcuda.so.{version}): the default capabilities need it; install the tree's libcuda"
    return version, None


def describe_trees(config: Config, kernel_version: str | None) -> list[tuple[DriverTree, str | None, str | None]]:
    """Each registered tree with its version and, if it cannot serve this kernel module, why."""
    from ponytail.fs.trust import untrusted_tree

    rows = []
    for tree in config.drivers.values():
        version, problem = tree_state(tree.root)
        if not os.path.isdir(tree.root):
            problem = f"{tree.root} is not a directory"
        elif untrusted := untrusted_tree(tree.root, ["/etc/ld.so.cache"]):
            problem = f"refused: {untrusted} (a tree must be root's and writable by no one else)"
        elif problem is not None:
            problem = f"{problem} (under {tree.root})"
        elif kernel_version and version != kernel_version and "*" not in tree.kernel_modules and kernel_version not in tree.kernel_modules:
            problem = f"version {version} but the loaded kernel module is {kernel_version}"
        rows.append((tree, version, problem))
    return rows


def trees_json(config: Config, kernel_version: str | None) -> list[dict[str, object]]:
    """The registered trees for ``info --json``."""
    return [
        {"name": t.name, "root": t.root, "description": t.description, "version": version,
         "kernel_modules": list(t.kernel_modules), "usable": problem is None, "problem": problem}
        for t, version, problem in describe_trees(config, kernel_version)
    ]
