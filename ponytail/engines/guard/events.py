"""Where the guard daemon's events come from: the kernel's uevents through pyudev, or, for tests, a FIFO.

Both sources have one shape: ``fileno()`` to wait on, ``receive()`` the events ready now
(without blocking) as (action, subsystem, name) tuples, ``close()``. The daemon acts on the
events ``relevant`` accepts: the NVIDIA driver's modules loaded or unloaded, an NVIDIA PCI
function added, removed, bound or unbound, and the driver's device nodes (nvidia-caps, MIG's
capability nodes, among them) appearing or going.
"""

from __future__ import annotations

import os

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


def relevant(event: Event, also: tuple[tuple[str, str], ...] = ()) -> bool:
    """Whether ``event`` concerns the NVIDIA driver's devices (or one of ``also``: (subsystem, name), "" any name)."""
    _, subsystem, name = event
    if any(subsystem == s and (not n or name == n) for s, n in also):
        return True
    if subsystem == "module":
        return name.startswith("nvidia")
    if subsystem == "pci":
        return name.startswith("nvidia-pci:")
    return name.startswith("nvidia") or subsystem.startswith("nvidia")
