"""``ponytail guard``: one pass (``--once``), or the node agent that runs the pass on the driver's udev events.

The pass is ponytail.guard.watch's. The daemon waits on its event sources
(ponytail.guard.events: the kernel's uevents through pyudev, or a test FIFO, and the
nodes made or removed in /dev and /dev/nvidia-caps, which send no uevent); on the
driver's events (its modules loaded or unloaded, a GPU added or removed, nvidia-caps nodes
made or removed by a MIG change) it first makes the node's files true to the driver again
(the /dev/char links, ponytail.guard.devchar, and the CDI specs it was given, with
``cdi generate``'s code), then runs a pass; and it runs one every ``[guard] interval`` seconds
anyway. Its records are files (ponytail.apply.containerrecord): a guard killed and started
again finds them as they were.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time

from ponytail.apply.systemdbus import ReloadEvents
from ponytail.cdi.files import SPEC_DIRS
from ponytail.cdi.generate import run_generate
from ponytail.cdi.nvidiahooks import unserved
from ponytail.cdi.owners import scan
from ponytail.errors import PonytailError
from ponytail.guard.devchar import make_char_links
from ponytail.guard.events import FifoEvents, NodeEvents, UdevEvents, relevant
from ponytail.guard.metrics import render_metrics, write_metrics
from ponytail.guard.watch import PassReport, guard_pass
from ponytail.logfile import RunLog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.config import Config

SETTLE_S = 0.3  # events come in bursts (a module load makes every node): act once the burst is over


def run_once(config: Config, repair: bool, as_json: bool, textfile: str) -> int:
    """One pass; its lines (or JSON) on stdout, one log line per container with news. 0 all well, 1 something found."""
    log = RunLog(config.log_file)
    log.context = "guard"
    log.open()
    try:
        report = _pass(config, repair, log, textfile)
    finally:
        log.close()
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for line in report_lines(report):
            print(line)
    return 1 if report.found_something else 0


def report_lines(report: PassReport) -> list[str]:
    lines = [c.line() for c in report.containers]
    lines += [f"problem: {p}" for p in report.problems]
    mode = "repair on" if report.repair else "report only"
    lines.append(
        f"{report.watched} container(s) watched, {report.count('lost') + report.count('repaired')} lost access, "
        f"{report.count('repaired')} repaired, {report.stale} on a stale driver, {report.count('gone')} gone ({mode}; records in "
        f"{report.records_dir or 'none'})"
    )
    return lines


class Daemon:
    """The guard's loop: events and the safety interval, each ending in a pass."""

    def __init__(self, config: Config, config_file: str | None, repair: bool, textfile: str, interval: float,
                 sources: list[FifoEvents | UdevEvents | NodeEvents | ReloadEvents], cdi_specs: tuple[str, ...], also: tuple[tuple[str, str], ...]) -> None:
        self.config = config
        self.config_file = config_file
        self.repair = repair
        self.textfile = textfile
        self.interval = interval
        self.sources = sources
        self.cdi_specs = cdi_specs
        self.also = also
        self.log = RunLog(config.log_file)
        self.log.context = "guard"
        self.repairs_total = 0
        self.events_total = 0
        self.stopping = False
        self._wake = (-1, -1)

    def run(self) -> int:
        self.log.open()
        self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake[1])
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.log.write("info", f"guard started: records in {self.config.records_dir or 'none'}, repair {'on' if self.repair else 'off'}, "
                               f"a pass every {self.interval:g} s and on the driver's udev events")
        self._run_pass("start")
        next_pass = time.monotonic() + self.interval
        while not self.stopping:  # a signal only sets the flag and wakes the select: a pass is never cut in half
            ready, _, _ = select.select([*self.sources, self._wake[0]], [], [], max(0.0, next_pass - time.monotonic()))
            if self.stopping:
                break
            if any(source in ready for source in self.sources):
                events = [e for source in self.sources if source in ready for e in source.receive() if relevant(e, self.also)]
                if not events:
                    continue
                time.sleep(SETTLE_S)
                events += [e for source in self.sources for e in source.receive() if relevant(e, self.also)]
                self.events_total += len(events)
                if any(e[1] != "systemd" for e in events):  # the driver's: a reload changes no node
                    self._refresh_node(events)
                self._run_pass(f"{len(events)} event(s): {', '.join(' '.join(e) for e in events[:4])}")
            elif not ready:
                self._run_pass("interval")
            else:
                continue
            next_pass = time.monotonic() + self.interval
        self.log.write("info", "guard stopped")
        for source in self.sources:
            source.close()
        self.log.close()
        return 0

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _refresh_node(self, events: list) -> None:
        """The /dev/char links and the CDI specs, made true to the driver again; the hook command lines
        of NVIDIA's specs (in the spec directories and beside those specs) that ponytail would not serve, logged."""
        try:
            lines, _ = make_char_links(self.config.dev_root, self.config.proc_root)
            self.log.write_all("info", [f"dev-char-links: {line}" for line in lines if not line.startswith("no NVIDIA")])
        except (PonytailError, OSError) as e:
            self.log.write("warning", f"dev-char-links: {getattr(e, 'message', None) or e}")
        for spec in self.cdi_specs:
            status = run_generate(output=spec, config=self.config_file)
            self.log.write("info" if status == 0 else "warning", f"cdi generate --output {spec}: exit {status}")
        dirs: dict[str, str] = {}  # each directory once (/var/run is /run)
        for directory in (*SPEC_DIRS, *(os.path.dirname(os.path.abspath(spec)) for spec in self.cdi_specs)):
            dirs.setdefault(os.path.realpath(directory), directory)
        fail = self.config.unknown_nvidia_hooks == "fail"
        for f in scan("/", tuple(dirs.values()), whole=False):  # NVIDIA's specs too: their hook lines, before a start reads them
            for hook in unserved(f.hooks):
                self.log.write("warning", f"CDI hook: {hook.said(f.label, fail)}")

    def _run_pass(self, why: str) -> None:
        report = _pass(self.config, self.repair, self.log, self.textfile, self, why)
        self.repairs_total += report.count("repaired")


def _pass(config: Config, repair: bool, log: RunLog, textfile: str, daemon: Daemon | None = None, why: str = "once") -> PassReport:
    report = guard_pass(config, repair)
    for container in report.containers:
        if container.state != "ok" or container.stale or container.notes:
            log.write("warning" if container.state in ("lost",) or container.stale else "info", container.line())
    log.write_all("warning", report.problems)
    log.write("info", f"pass ({why}): {report_lines(report)[-1]}; {report.duration_s * 1000:.1f} ms")
    if textfile:
        repairs = (daemon.repairs_total if daemon else 0) + report.count("repaired")
        try:
            write_metrics(textfile, render_metrics(report, repairs, daemon.events_total if daemon else 0))
        except OSError as e:
            log.write("warning", f"cannot write the metrics file {textfile}: {e.strerror}")
    return report


def run_daemon(config: Config, config_file: str | None, repair: bool, textfile: str, interval: float | None,
               events: str | None, cdi_specs: tuple[str, ...], also: tuple[str, ...]) -> int:
    sources: list[FifoEvents | UdevEvents | NodeEvents | ReloadEvents] = [FifoEvents(events) if events else UdevEvents(), NodeEvents(config.dev_root)]
    try:  # systemd's reloads: a pass at once gives back what a reload took (docs/cgroup-v2-and-systemd.md)
        sources += [ReloadEvents()] if events is None else []
    except OSError:
        pass  # no systemd here (a container): the interval's passes remain
    watch = tuple((a.partition(":")[0], a.partition(":")[2]) for a in also)
    daemon = Daemon(config, config_file, repair, textfile, interval or config.guard_interval, sources, cdi_specs, watch)
    return daemon.run()
