"""Which shared libraries an image has, read inside the untrusted rootfs (ponytail.fs.inroot:
a link never leads out of it): the injected driver links against the C library's parts
(libdl.so.2, libpthread.so.0, librt.so.1, libm.so.6), which a trimmed image may lack; the
driver then fails inside the container ("libdl.so.2: cannot open shared object file") though
the start succeeded. Plain data out; nothing of the image is run."""

from __future__ import annotations

import os

from ponytail.host.driver_files import library_dirs

LIBC = "libc.so.6"


def lacking_dependencies(
    rootfs: str, files: list[tuple[str, tuple[str, ...]]], provided: set[str]
) -> list[tuple[str, tuple[str, ...]]]:
    """For each (name, the libraries it links against) of an injected file, those the image lacks
    and the injection does not bring (``provided``); files lacking none are left out."""
    needs = [(name, tuple(n for n in needed if n not in provided)) for name, needed in files]
    wanted = tuple(n for _, names in needs for n in names)
    missing = set(missing_in_image(rootfs, wanted)) if wanted else set()
    return [(name, lacking) for name, names in needs if (lacking := tuple(n for n in names if n in missing))]


def lacking_message(name: str, lacking: tuple[str, ...]) -> str:
    return (
        f"the injected {name} needs {', '.join(lacking)}, which the image lacks: it will fail to load in the container "
        "('cannot open shared object file'); use an image with glibc's libraries (Debian and Ubuntu: libc6)"
    )


def missing_in_image(rootfs: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """Of the SONAMEs ``names``, those the image has neither in its usual library directories
    nor in its linker cache. Only an image with glibc (a libc.so.6) is judged: () for a static
    or musl image (musl's loader provides glibc's split-out names itself), or an empty one."""
    from ponytail.fs.inroot import real_path_in_root

    try:
        root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        dirs = (*library_dirs(), "/lib64", "/lib", f"/lib/{os.path.basename(library_dirs()[0])}")

        def present(name: str) -> bool:
            return any(real_path_in_root(root_fd, f"{d}/{name}") is not None for d in dirs)

        if not present(LIBC):
            return ()
        missing = tuple(name for name in dict.fromkeys(names) if not present(name))
        if missing:
            from ponytail.host.ldcache import read_ld_cache_in_root

            cached = {name for name, _ in read_ld_cache_in_root(root_fd)}
            missing = tuple(name for name in missing if name not in cached)
        return missing
    finally:
        os.close(root_fd)
