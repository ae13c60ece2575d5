"""The GPU nodes in a systemd scope's ``DeviceAllow=``, so that ``systemctl daemon-reload`` keeps them.

Under the systemd cgroup driver (runc's and crun's ``--systemd-cgroup``: Docker's and Kubernetes' default on
cgroup v2, podman under systemd) the container's cgroup is a transient ``*.scope`` unit. On every reload
systemd attaches a device program built from the unit's ``DeviceAllow=`` list in place of its own, which
drops a hook's edit of that program. So after the edit the hook tells systemd too: ``SetUnitProperties(unit,
runtime=true, DeviceAllow=[(node, "rw"), ...])`` on the Manager (org.freedesktop.systemd1), which adds the
nodes to the unit's list (systemd appends to DeviceAllow=) until the unit is gone; systemd re-applies the
unit's program at once, and again on every reload, with the nodes in it.

The call goes through libsystemd's sd-bus (libsystemd0, on every systemd host; by ctypes, no Python
module) over systemd's own socket ``/run/systemd/private`` (root only, no bus daemon, no name lookup).
The socket is connected before the hook enters the container's mount namespace (``connect``); the call is
made after the programs are swapped (``add_device_allow``). Nothing here runs unless the container's
cgroup is a systemd scope. systemd takes device paths under /dev only: a node elsewhere (a test's fake
driver) is named by its ``/dev/char/MAJOR:MINOR`` link where that leads to it, else left out (said).
"""

from __future__ import annotations

import os
import re
import socket

PRIVATE_SOCKET = "/run/systemd/private"
LIBSYSTEMD = "libsystemd.so.0"
_UNIT = re.compile(r"^[A-Za-z0-9:_.\\@-]{1,250}\.scope$")


def scope_unit(cgroup_path: str) -> str | None:
    """The systemd unit a cgroup v2 path is, where it is a scope (``.../docker-<id>.scope``), else None."""
    name = cgroup_path.rstrip("/").rsplit("/", 1)[-1]
    return name if _UNIT.match(name) else None


def connect(path: str = PRIVATE_SOCKET) -> int | None:
    """A descriptor connected to systemd's private socket; None where systemd does not run (or not as root)."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        client.settimeout(1.0)
        client.connect(path)
        client.setblocking(True)
    except OSError:
        client.close()
        return None
    return client.detach()


def device_paths(devices: tuple[tuple[int, int], ...], sources: dict[tuple[int, int], str], dev: str = "/dev") -> tuple[list[str], list[str]]:
    """(the paths systemd is given for ``devices``, the nodes left out): a host node under /dev by its path,
    another by its /dev/char/M:m link where that leads to the same device."""
    given, left_out = [], []
    for major, minor in devices:
        source = sources.get((major, minor), "")
        if source.startswith("/dev/") and "/../" not in source:
            given.append(source)
            continue
        link = f"{dev}/char/{major}:{minor}"
        try:
            st = os.stat(link)
            if os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor:
                given.append(link)
                continue
        except OSError:
            pass
        left_out.append(f"c {major}:{minor}" + (f" ({source})" if source else ""))
    return given, left_out


def add_device_allow(fd: int, unit: str, paths: list[str], timeout_us: int = 2_000_000) -> None:
    """``SetUnitProperties(unit, true, [("DeviceAllow", [(path, "rw"), ...])])`` over the connected ``fd``
    (kept open: the caller closes it). OSError with systemd's message when it fails."""
    import ctypes

    class BusError(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("message", ctypes.c_char_p), ("_need_free", ctypes.c_int)]  # noqa: RUF012 - ctypes' layout

    try:
        lib = ctypes.CDLL(LIBSYSTEMD, use_errno=True)
    except OSError as e:
        raise OSError(0, f"cannot load {LIBSYSTEMD} (libsystemd0): {e}") from e
    lib.sd_bus_new.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.sd_bus_set_fd.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.sd_bus_start.argtypes = [ctypes.c_void_p]
    lib.sd_bus_set_method_call_timeout.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.sd_bus_flush_close_unref.argtypes = [ctypes.c_void_p]
    lib.sd_bus_flush_close_unref.restype = ctypes.c_void_p
    lib.sd_bus_message_unref.argtypes = [ctypes.c_void_p]
    lib.sd_bus_message_unref.restype = ctypes.c_void_p
    lib.sd_bus_error_free.argtypes = [ctypes.POINTER(BusError)]

    bus = ctypes.c_void_p()
    _check(lib.sd_bus_new(ctypes.byref(bus)), "sd_bus_new")
    reply = ctypes.c_void_p()
    error = BusError()
    own = os.dup(fd)  # sd-bus closes the descriptor it is given
    try:
        _check(lib.sd_bus_set_fd(bus, own, own), "sd_bus_set_fd")
        own = -1
        _check(lib.sd_bus_start(bus), "connecting to systemd")
        lib.sd_bus_set_method_call_timeout(bus, timeout_us)
        pairs: list[object] = []
        for path in paths:
            pairs += [path.encode(), b"rw"]
        r = lib.sd_bus_call_method(
            bus, b"org.freedesktop.systemd1", b"/org/freedesktop/systemd1", b"org.freedesktop.systemd1.Manager",
            b"SetUnitProperties", ctypes.byref(error), ctypes.byref(reply), b"sba(sv)",
            unit.encode(), ctypes.c_int(1), ctypes.c_uint(1), b"DeviceAllow", b"a(ss)", ctypes.c_uint(len(paths)), *pairs,
        )
        if r < 0:
            said = (error.message or error.name or b"").decode(errors="replace")
            raise OSError(-r, f"systemd refused DeviceAllow= for {unit}: {said or os.strerror(-r)}")
    finally:
        if own >= 0:
            os.close(own)
        if reply:
            lib.sd_bus_message_unref(reply)
        lib.sd_bus_error_free(ctypes.byref(error))
        lib.sd_bus_flush_close_unref(bus)


def _check(r: int, what: str) -> None:
    if r < 0:
        raise OSError(-r, f"{what}: {os.strerror(-r)}")


class ReloadEvents:
    """systemd's ``Reloading`` signal as an event source of the guard (``fileno``, ``receive``, ``close``): one
    event ``("reloaded", "systemd", "daemon-reload")`` when a reload ends, so that the guard's pass gives back at
    once what a reload took (a hook's edit of a scope it could not tell systemd about). Subscribed over systemd's
    private socket (a direct connection gets the Manager's signals after ``Subscribe``). OSError where systemd
    does not run."""

    def __init__(self, path: str = PRIVATE_SOCKET) -> None:
        import ctypes

        fd = connect(path)
        if fd is None:
            raise OSError(2, f"no systemd at {path}")
        self._ctypes = ctypes
        self._lib = lib = ctypes.CDLL(LIBSYSTEMD, use_errno=True)
        for name, args in (("sd_bus_new", [ctypes.POINTER(ctypes.c_void_p)]), ("sd_bus_set_fd", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
                           ("sd_bus_start", [ctypes.c_void_p]), ("sd_bus_get_fd", [ctypes.c_void_p]),
                           ("sd_bus_process", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]),
                           ("sd_bus_message_is_signal", [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p])):
            getattr(lib, name).argtypes = args
        lib.sd_bus_message_unref.argtypes = [ctypes.c_void_p]
        lib.sd_bus_message_unref.restype = ctypes.c_void_p
        lib.sd_bus_flush_close_unref.argtypes = [ctypes.c_void_p]
        lib.sd_bus_flush_close_unref.restype = ctypes.c_void_p
        self._bus = ctypes.c_void_p()
        _check(lib.sd_bus_new(ctypes.byref(self._bus)), "sd_bus_new")
        try:
            _check(lib.sd_bus_set_fd(self._bus, fd, fd), "sd_bus_set_fd")
            _check(lib.sd_bus_start(self._bus), "connecting to systemd")
            _check(lib.sd_bus_call_method(self._bus, b"org.freedesktop.systemd1", b"/org/freedesktop/systemd1",
                                          b"org.freedesktop.systemd1.Manager", b"Subscribe", None, None, b""), "Subscribe")
            self._fd = lib.sd_bus_get_fd(self._bus)
            _check(self._fd, "sd_bus_get_fd")
        except OSError:
            self.close()
            raise

    def fileno(self) -> int:
        return self._fd

    def receive(self) -> list[tuple[str, str, str]]:
        ctypes, lib = self._ctypes, self._lib
        events: list[tuple[str, str, str]] = []
        while True:
            message = ctypes.c_void_p()
            r = lib.sd_bus_process(self._bus, ctypes.byref(message))
            if r < 0:
                return events
            if message:
                if lib.sd_bus_message_is_signal(message, b"org.freedesktop.systemd1.Manager", b"Reloading") > 0:
                    active = ctypes.c_int(1)
                    if lib.sd_bus_message_read(message, b"b", ctypes.byref(active)) > 0 and not active.value:
                        events.append(("reloaded", "systemd", "daemon-reload"))
                lib.sd_bus_message_unref(message)
            if r == 0:
                return events

    def close(self) -> None:
        if self._bus:
            self._lib.sd_bus_flush_close_unref(self._bus)
            self._bus = self._ctypes.c_void_p()
