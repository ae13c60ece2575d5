"""Where the guard daemon's events come from: the kernel's uevents through pyudev (or, for tests, a FIFO),
and the driver's nodes made or removed in /dev (inotify).

The sources have one shape: ``fileno()`` to wait on, ``receive()`` the events ready now
(without blocking) as (action, subsystem, name) tuples, ``close()``. The daemon acts on the
events ``relevant`` accepts: the NVIDIA driver's modules loaded or unloaded, an NVIDIA PCI
function added, removed, bound or unbound, and the driver's device nodes (nvidia-caps, MIG's
capability nodes, among them) appearing or going. When the kernel's inotify queue overflowed
(events lost, which ones unknown), ``NodeEvents`` says so with one ``OVERFLOW`` event, which is
relevant: the node is made true to the driver again and a pass runs, as on any driver event.
"""

from __future__ import annotations

import os
import struct

from ponytail.fs.libc import check, libc

Event = tuple[str, str, str]  # action, subsystem, name
NVIDIA_PCI_VENDOR = "10DE"


class UdevEvents:
    """Kernel uevents (no udev daemon needed: the kernel's netlink group, as root)."""

    def __init__(self) -> None:
        import pyudev

        self._monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
        self._monitor.start()

    def fileno(self) -> int:
        return self._monitor.fileno()

    def receive(self) -> list[Event]:
        events: list[Event] = []
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                return events
            properties = device.properties
            vendor = properties.get("PCI_ID", "").partition(":")[0].upper()
            name = device.sys_name or ""
            if device.subsystem == "pci" and vendor == NVIDIA_PCI_VENDOR:
                name = "nvidia-pci:" + name
            events.append((device.action or "", device.subsystem or "", name))

    def close(self) -> None:
        self._monitor = None  # pyudev closes the netlink socket with the monitor


class FifoEvents:
    """Test-only: one event a line ("ACTION SUBSYSTEM NAME") written to a FIFO."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)  # RDWR: never EOF when writers come and go
        self._pending = b""

    def fileno(self) -> int:
        return self._fd

    def receive(self) -> list[Event]:
        try:
            self._pending += os.read(self._fd, 65536)
        except BlockingIOError:
            pass
        *lines, self._pending = self._pending.split(b"\n")
        events = []
        for line in lines:
            parts = line.decode("utf-8", "replace").split()
            if len(parts) == 3:
                events.append((parts[0], parts[1], parts[2]))
        return events

    def close(self) -> None:
        os.close(self._fd)


IN_CREATE, IN_DELETE, IN_MOVED_TO, IN_NONBLOCK, IN_CLOEXEC = 0x100, 0x200, 0x80, 0o4000, 0o2000000
IN_Q_OVERFLOW = 0x4000  # the kernel's queue was full: events were lost, which ones is not known
OVERFLOW: Event = ("overflow", "inotify", "events lost")  # relevant: the node is looked at again as on any driver event
_INOTIFY_HEADER = 16  # struct inotify_event: int wd; uint32 mask, cookie, len; then the name


class NodeEvents:
    """Entries made or removed in the /dev directory and its nvidia-caps/ (inotify): nvidia-modprobe makes
    the driver's nodes, MIG's capability nodes among them, with mknod, which sends no uevent."""

    def __init__(self, dev_root: str) -> None:
        self._libc = libc()
        self._fd = check(self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        self._dev_root = dev_root
        self._watches: dict[int, str] = {}
        self._watch(dev_root)
        self._watch(os.path.join(dev_root, "nvidia-caps"))

    def _watch(self, path: str) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_CREATE | IN_DELETE | IN_MOVED_TO)
        if wd >= 0:
            self._watches[wd] = os.path.basename(path)

    def fileno(self) -> int:
        return self._fd

    def receive(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return events
            offset = 0
            while offset + _INOTIFY_HEADER <= len(data):
                wd, mask, _, length = struct.unpack_from("=iIII", data, offset)
                name = data[offset + _INOTIFY_HEADER:offset + _INOTIFY_HEADER + length].split(b"\0", 1)[0].decode("utf-8", "replace")
                offset += _INOTIFY_HEADER + length
                if mask & IN_Q_OVERFLOW:
                    if OVERFLOW not in events:
                        events.append(OVERFLOW)
                    continue
                action = "remove" if mask & IN_DELETE else "add"
                events.append((action, "dev" if self._watches.get(wd) != "nvidia-caps" else "nvidia-caps", name))
                if name == "nvidia-caps" and action == "add":
                    self._watch(os.path.join(self._dev_root, "nvidia-caps"))

    def close(self) -> None:
        os.close(self._fd)


def relevant(event: Event, also: tuple[tuple[str, str], ...] = ()) -> bool:
    """Whether ``event`` concerns the NVIDIA driver's devices (or one of ``also``: (subsystem, name), "" any name)."""
    if event == OVERFLOW:
        return True
    _, subsystem, name = event
    if subsystem == "systemd":  # a daemon-reload ended (ponytail.apply.systemdbus.ReloadEvents)
        return True
    if any(subsystem == s and (not n or name == n) for s, n in also):
        return True
    if subsystem == "module":
        return name.startswith("nvidia")
    if subsystem == "pci":
        return name.startswith("nvidia-pci:")
    return name.startswith("nvidia") or subsystem.startswith("nvidia")
