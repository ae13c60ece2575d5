"""Which libcuda.so.1 and libnvidia-ml.so.1 a container's loader will pick once ponytail
has injected the driver, told from the image's files alone (for ``ponytail check``).

The dynamic loader looks in LD_LIBRARY_PATH first, then in the linker cache. ponytail
rebuilds that cache with its own directories first (after the image's CUDA compat
directory, when that one is used), so the libraries named by LD_LIBRARY_PATH are the
ones that can still shadow the injected driver; copies the image lists in its cache or
ld.so.conf directories are what a start without ponytail would load. Everything is read
inside the rootfs with ponytail.fs.inroot, never following a link out of it.
"""

from __future__ import annotations

import fnmatch
import os
import stat

from ponytail.config import Config
from ponytail.container.driver_trees import refused_tree, requested_tree
from ponytail.container.image_compat import read_compat_dir
from ponytail.container.image_libs import lacking_dependencies, lacking_message
from ponytail.doctor.findings import FAIL, OK, WARN, Finding
from ponytail.fs.inroot import UnsafePath, read_file_in_root, real_path_in_root, resolve_in_root
from ponytail.host.driver import read_driver_version
from ponytail.host.driver_files import library_dirs, library_version
from ponytail.host.driver_trees import choose_tree
from ponytail.host.ldcache import is_64bit_entry, parse_ld_cache_entries
from ponytail.host.probe import Host, probe_host
from ponytail.plan.compat import choose_compat

SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
MAX_CONF_FILES = 64


def loader_view(config: Config, rootfs: str, env: dict[str, str], annotations: dict[str, str], privileged: bool = True) -> list[Finding]:
    kernel = read_driver_version(config.proc_root)
    asked = requested_tree(env, annotations)
    refusal = refused_tree(asked, privileged, config.accept_env_when_unprivileged)
    tree_config, tree = choose_tree(config, None if refusal else asked, kernel)
    expected = tree.version or kernel
    host = probe_host(tree_config, ("utility", "compute"), udev=False, library_version=tree.version)
    compat = choose_compat(read_compat_dir(rootfs), env, expected, config.cuda_compat)
    out = [Finding("container", "driver", OK, f"the container gets the {tree.describe()}")]
    if refusal:
        out.append(Finding("container", "driver tree", WARN, refusal))
    if compat is not None:
        out.append(Finding("container", "CUDA compat", OK, f"{compat.directory} {'used' if compat.used else 'not used'}: {compat.why}"))
    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        image_dirs = _image_library_dirs(root_fd)
        cache = _image_cache(root_fd)
        for soname in SONAMES:
            injected = host.library(soname)
            target_dir = os.path.dirname(injected.target) if injected is not None else None
            compat_path = dict(compat.sonames).get(soname) if compat is not None and compat.used else None
            out.append(_picked(root_fd, soname, env, target_dir, compat_path, compat.version if compat_path and compat else "", expected, kernel))
            out += _image_copies(root_fd, soname, cache, image_dirs, compat_path, expected)
    finally:
        os.close(root_fd)
    return out + _lacking(rootfs, host)


def _lacking(rootfs: str, host: Host) -> list[Finding]:
    """A failure for each injected libcuda, libnvidia-ml and binary that links against a library
    the image lacks: the container starts, and the driver then fails to load inside."""
    provided = {lib.soname for lib in host.libraries if lib.soname}
    files = [(soname, lib.needed) for soname in SONAMES if (lib := host.library(soname)) is not None]
    files += [(binary.target, binary.needed) for binary in host.binaries]
    return [Finding("container", name, FAIL, lacking_message(name, lacking)) for name, lacking in lacking_dependencies(rootfs, files, provided)]


def _picked(
    root_fd: int, soname: str, env: dict[str, str], target_dir: str | None, compat_path: str | None,
    compat_version: str, expected: str, kernel: str,
) -> Finding:
    for directory in (d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")):
        directory = os.path.normpath(directory)
        if directory == target_dir:
            break  # the injected library is there
        real = real_path_in_root(root_fd, f"{directory}/{soname}")
        if real is None:
            continue
        version = library_version(real)
        if version is not None and version in (expected, compat_version):
            return Finding("container", soname, OK, f"LD_LIBRARY_PATH gives {real} (version {version})")
        if version is None:
            return Finding("container", soname, WARN, f"LD_LIBRARY_PATH puts the image's {real} (version unknown) before the injected driver {expected}: remove {directory} from LD_LIBRARY_PATH or {soname} from the image")
        return Finding(
            "container", soname, FAIL,
            f"LD_LIBRARY_PATH puts the image's {real} (version {version}) before the injected driver {expected} "
            f"(kernel module {kernel}): 'Driver/library version mismatch'; remove {directory} from LD_LIBRARY_PATH or {soname} from the image",
        )
    if compat_path is not None:
        return Finding("container", soname, OK, f"{compat_path} from the image's CUDA compat directory (version {compat_version})")
    if target_dir is None:
        return Finding("container", soname, FAIL, f"the driver has no {soname} to inject: install it in the driver root")
    return Finding("container", soname, OK, f"{target_dir}/{soname}, injected by ponytail (version {expected})")


def _image_copies(
    root_fd: int, soname: str, cache: list[tuple[str, str]], image_dirs: list[str], compat_path: str | None, expected: str,
) -> list[Finding]:
    """The image's own copies, which a start without ponytail would load (a warning each
    of another version)."""
    candidates = [p for name, p in cache if name == soname] + [f"{d}/{soname}" for d in image_dirs]
    seen: set[str] = set()
    out = []
    for path in candidates:
        if path == compat_path:
            continue  # reported above
        real = real_path_in_root(root_fd, path)
        if real is None or real in seen:
            continue
        seen.add(real)
        version = library_version(real)
        if version == expected:
            continue
        said = f"version {version}" if version else "version unknown"
        out.append(Finding(
            "container", soname, WARN,
            f"the image ships its own {path} ({said}); ponytail's injected {expected} comes first, but a start without "
            f"ponytail loads this one: remove it from the image",
        ))
    return out


def _image_library_dirs(root_fd: int) -> list[str]:
    """The directories the image's ldconfig would scan: /etc/ld.so.conf and its includes,
    then the loader's defaults."""
    dirs: dict[str, None] = {}  # in order, each once (a set's lookup: a list's would be quadratic)
    pending = ["/etc/ld.so.conf"]
    for done in range(MAX_CONF_FILES):
        if done >= len(pending):
            break
        text = read_file_in_root(root_fd, pending[done], 1 << 16)
        for line in (text or b"").decode("utf-8", "replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("include"):
                if len(pending) < MAX_CONF_FILES:
                    pending += _expand(root_fd, line[len("include"):].strip())
            elif line.startswith("/"):
                dirs.setdefault(line.rstrip("/") or "/")
    for d in (*library_dirs(), "/lib64", "/lib"):
        dirs.setdefault(d)
    return list(dirs)


def _expand(root_fd: int, pattern: str) -> list[str]:
    directory, name = os.path.split(pattern)
    if not directory.startswith("/"):
        return []
    try:
        resolved = resolve_in_root(root_fd, directory)
    except (UnsafePath, OSError):
        return []
    try:
        if not resolved.exists or not stat.S_ISDIR(resolved.mode):
            return []
        fd = os.open(resolved.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
        try:
            names = sorted(os.listdir(fd))
        finally:
            os.close(fd)
    except OSError:
        return []
    finally:
        resolved.close()
    return [f"{directory}/{n}" for n in names if fnmatch.fnmatchcase(n, name)][:MAX_CONF_FILES]


def _image_cache(root_fd: int) -> list[tuple[str, str]]:
    data = read_file_in_root(root_fd, "/etc/ld.so.cache", 64 << 20)
    return [(name, path) for name, path, flags in parse_ld_cache_entries(data or b"") if is_64bit_entry(flags)]


