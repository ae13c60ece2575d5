"""CUDA forward compatibility: an image's own newer libcuda under /usr/local/cuda/compat.

Images built on NVIDIA's ``cuda-compat`` package ship the user-mode driver of a newer
branch (libcuda.so.560.28.03, libnvidia-ptxjitcompiler.so.1, ...) so that a newer CUDA
runs on an older kernel module. When that libcuda's major version is newer than the
driver's, its directory is put first in the container's linker path (as NVIDIA's
enable-cuda-compat hook does). The directory lies in the untrusted rootfs: it is read by
ponytail.container.image_compat (resolved inside the rootfs, versions from file names and
ELF headers only; nothing of the image is ever run), and decided on here. An image whose compat libcuda is as
old as or older than the driver keeps the injected one (and the check that the image's
copies do not shadow it). Opt out per container with PONYTAIL_DISABLE_CUDA_COMPAT=true,
or for the host with ``[cuda] compat = false``.
"""

from __future__ import annotations

from ponytail.lite.records import record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.plan.operations import Plan

DISABLE_VAR = "PONYTAIL_DISABLE_CUDA_COMPAT"
_TRUE = ("1", "true", "yes", "on")

# The CUDA version each driver branch supports (NVIDIA's CUDA release notes, table 3): the
# requirement check reads the compat libcuda's CUDA version from here, never by loading it.
_CUDA_BY_DRIVER = (
    (580, "13.0"), (575, "12.9"), (570, "12.8"), (565, "12.7"), (560, "12.6"), (555, "12.5"), (550, "12.4"),
    (545, "12.3"), (535, "12.2"), (530, "12.1"), (525, "12.0"), (520, "11.8"), (515, "11.7"), (510, "11.6"),
    (495, "11.5"), (470, "11.4"), (465, "11.3"), (460, "11.2"), (455, "11.1"), (450, "11.0"),
)


@record(frozen=True)
class Compat:
    """What the image's compat directory holds and whether it is used."""

    directory: str  # canonical path inside the rootfs
    version: str  # of its libcuda, from the file name ("" if none)
    used: bool
    why: str
    sonames: tuple[tuple[str, str], ...] = ()  # (SONAME, in-root path of its link in the directory)


def choose_compat(
    found: tuple[str, str, tuple[tuple[str, str], ...]] | None, env: dict[str, str] | None, driver_version: str, enabled: bool = True
) -> Compat | None:
    """What to do with the image's compat directory as ponytail.container.image_compat read it
    (directory, version, SONAME links), or None when the image has none."""
    return None if found is None else decide(*found, driver_version, env, enabled)


def decide(
    directory: str, version: str, sonames: tuple[tuple[str, str], ...], driver_version: str,
    env: dict[str, str] | None, enabled: bool = True,
) -> Compat:
    """Use the directory only for a newer major than the driver's, and not when opted out."""
    if not version:
        return Compat(directory, "", False, f"{directory} has no libcuda.so.X.Y.Z reached by a libcuda.so.1 link")
    if not enabled:
        return Compat(directory, version, False, "[cuda] compat = false in the config")
    if (env or {}).get(DISABLE_VAR, "").strip().lower() in _TRUE:
        return Compat(directory, version, False, f"{DISABLE_VAR} is set")
    if _major(version) <= _major(driver_version):
        return Compat(
            directory, version, False,
            f"its libcuda {version} is not a newer major than the driver's {driver_version}: the injected libcuda is used",
        )
    why = f"its libcuda {version} is newer than the driver's {driver_version}: CUDA forward compatibility"
    return Compat(directory, version, True, why, sonames)


def apply_compat(plan: Plan, compat: Compat | None) -> Plan:
    """The plan with the compat directory first in the container's linker path, and the
    cache check expecting its libraries; unchanged when the directory is not used."""
    from ponytail.plan.operations import LinkerCache

    if compat is None or not compat.used:
        return plan
    ours = dict(compat.sonames)
    operations = []
    for op in plan.operations:
        if isinstance(op, LinkerCache):
            directories = (compat.directory,) + tuple(d for d in op.directories if d != compat.directory)
            sonames = tuple((s, ours.get(s, path)) for s, path in op.sonames)
            op = replace(op, directories=directories, sonames=sonames, reason=f"{op.reason}; {compat.directory} first ({compat.why})")
        operations.append(op)
    return replace(plan, operations=tuple(operations))


def cuda_version_of_driver(version: str) -> str | None:
    """The CUDA version a driver branch supports, e.g. '12.6' for 560.28.03."""
    major = _major(version)
    return next((cuda for branch, cuda in _CUDA_BY_DRIVER if major >= branch), None)


def _major(version: str) -> int:
    head = version.split(".")[0]
    return int(head) if head.isascii() and head.isdigit() else 0
