"""MIG: which GPUs have MIG enabled and which GPU/compute instances exist, from the
driver's capability tree under /proc/driver/nvidia/capabilities (no NVML needed).
A MIG device's UUID is only known to NVML: ``mig_uuids`` asks it, in a child process,
and only when a MIG UUID is requested.
"""

from __future__ import annotations

import os

from ponytail.errors import ProbeError
from ponytail.fs.hostfiles import read_head
from ponytail.lite.records import record


@record(frozen=True)
class MigDevice:
    """GPU instance ``gi`` / compute instance ``ci`` of GPU ``gpu_index``, and the minors
    of the /dev/nvidia-caps/nvidia-cap<N> nodes that grant access to them."""

    gpu_index: int
    gi: int
    ci: int
    gi_minor: int
    ci_minor: int

    @property
    def name(self) -> str:
        return f"{self.gpu_index}:{self.gi}:{self.ci}"


def caps_dir(proc_root: str) -> str:
    return os.path.join(proc_root, "driver/nvidia/capabilities")


def read_mig_devices(proc_root: str, gpu_minor: int, gpu_index: int) -> tuple[bool, tuple[MigDevice, ...]]:
    """(MIG enabled, its MIG devices) for the GPU with ``gpu_minor``."""
    base = os.path.join(caps_dir(proc_root), f"gpu{gpu_minor}", "mig")
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return False, ()
    except OSError as e:
        raise ProbeError(f"cannot list {base}: {e.strerror}") from e
    devices = []
    for gi_name in sorted(names, key=_number):
        if not gi_name.startswith("gi") or not gi_name[2:].isdigit():
            continue
        gi_dir = os.path.join(base, gi_name)
        gi_minor = read_access_minor(os.path.join(gi_dir, "access"))
        if gi_minor is None:
            continue
        for ci_name in sorted(os.listdir(gi_dir), key=_number):
            if ci_name.startswith("ci") and ci_name[2:].isdigit():
                ci_minor = read_access_minor(os.path.join(gi_dir, ci_name, "access"))
                if ci_minor is not None:
                    devices.append(MigDevice(gpu_index, int(gi_name[2:]), int(ci_name[2:]), gi_minor, ci_minor))
    return True, tuple(devices)


def read_access_minor(path: str) -> int | None:
    """The DeviceFileMinor of a capability's access file, or None."""
    for line in read_head(path, 4096, default="").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def mig_access_path(gpu_minor: int, device: MigDevice) -> tuple[str, str]:
    """The access files of a MIG device's GPU and compute instance, relative to /proc/driver/nvidia."""
    gi = f"capabilities/gpu{gpu_minor}/mig/gi{device.gi}"
    return f"{gi}/access", f"{gi}/ci{device.ci}/access"


def read_access_files(proc_root: str, migs: list[tuple[int, MigDevice]]) -> dict[str, bytes]:
    """The capability access files a container given these MIG devices (and the MIG
    config/monitor capabilities) reads to learn what it may use, by path relative to
    /proc/driver/nvidia."""
    wanted = ["capabilities/mig/config", "capabilities/mig/monitor"]
    for gpu_minor, device in migs:
        wanted += mig_access_path(gpu_minor, device)
    contents = {}
    for relative in wanted:
        try:
            with open(os.path.join(proc_root, "driver/nvidia", relative), "rb") as f:
                contents[relative] = f.read(4096)
        except OSError:
            pass
    return contents


def _number(name: str) -> int:
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) if digits else -1


def mig_uuids(libnvidia_ml: str, timeout_s: float = 5.0) -> dict[str, tuple[int, int, int]]:
    """MIG UUID -> (parent GPU minor, GI id, CI id), asked of NVML (the nvidia-ml-py
    package, loading the driver's own ``libnvidia-ml``) in a forked child, so that
    NVML's threads never exist in this process (which must stay single-threaded to
    enter the container's mount namespace). The child gives up root first (driver code
    never runs as root, ponytail.host.forked_call; NVML lists MIG devices as any user may) and
    loads the file opened and checked here."""
    import stat

    import ponytail.host.elf  # noqa: F401 - imported here, as pynvml: the child, as nobody, may not be allowed to read Python's files
    from ponytail.host.forked_call import ChildTimeout, run_in_child

    try:
        import pynvml  # noqa: F401
    except ImportError:
        raise ProbeError(f"cannot resolve MIG UUIDs with NVML ({libnvidia_ml}): the nvidia-ml-py package is not installed (Debian: apt install python3-pynvml, from contrib; else pip install nvidia-ml-py)") from None
    try:
        fd = os.open(libnvidia_ml, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ProbeError(f"cannot resolve MIG UUIDs with NVML: cannot open {libnvidia_ml}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProbeError(f"cannot resolve MIG UUIDs with NVML: {libnvidia_ml} is not a regular file")
        result = run_in_child(_query_nvml, fd, libnvidia_ml, timeout_s=timeout_s, unprivileged=True, keep_fds=(fd,))
    except ChildTimeout as e:
        raise ProbeError(f"cannot resolve MIG UUIDs with NVML ({libnvidia_ml}): the NVML query {e}; raise [timeouts] probe in the config") from e
    finally:
        os.close(fd)
    if isinstance(result, str):
        raise ProbeError(f"cannot resolve MIG UUIDs with NVML ({libnvidia_ml}): {result}")
    return {uuid: (minor, gi, ci) for uuid, (minor, gi, ci) in result.items()}


NVML_SONAME = "libnvidia-ml.so.1"  # the name nvidia-ml-py loads NVML by


def _query_nvml(fd: int, libnvidia_ml: str) -> dict[str, list[int]] | str:
    """In the child: NVML's answer, from the library open on ``fd`` (``libnvidia_ml``)."""
    import ctypes

    import pynvml

    from ponytail.host.elf import NotElf, read_elf_info_file
    from ponytail.host.forked_call import loadable

    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            soname = read_elf_info_file(f).soname
    except (OSError, NotElf) as e:
        return f"cannot read {libnvidia_ml}: {e}"
    if soname != NVML_SONAME:
        return f"{libnvidia_ml} has the SONAME {soname}, not {NVML_SONAME}"
    try:
        # Loaded first, by its path: the dynamic linker then gives nvidia-ml-py, which asks
        # for libnvidia-ml.so.1, this library (a loaded library answers to its SONAME).
        driver_nvml = ctypes.CDLL(loadable(fd, libnvidia_ml))
        pynvml.nvmlInit()
        found: dict[str, list[int]] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
            minor = pynvml.nvmlDeviceGetMinorNumber(gpu)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(gpu)
            except pynvml.NVMLError:
                continue
            if not current:
                continue
            for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, k)
                except pynvml.NVMLError:
                    continue
                uuid = pynvml.nvmlDeviceGetUUID(mig)
                found[uuid if isinstance(uuid, str) else uuid.decode()] = [
                    minor, pynvml.nvmlDeviceGetGpuInstanceId(mig), pynvml.nvmlDeviceGetComputeInstanceId(mig)
                ]
        pynvml.nvmlShutdown()
        del driver_nvml
        return found
    except (OSError, pynvml.NVMLError) as e:
        return str(e)


