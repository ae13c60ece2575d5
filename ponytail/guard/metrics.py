"""The guard's status for machines: Prometheus text (node exporter's textfile collector format).

A file, not an endpoint: the guard runs as root on every GPU node, and a file rewritten
atomically after each pass opens no port, needs no authentication and is scraped by the
node exporter most such nodes already run (``--collector.textfile.directory``).
"""

from __future__ import annotations

from ponytail.fs.atomic import replace_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.guard.watch import PassReport

_GAUGES = (
    ("containers_watched", "GPU containers ponytail started that are still running (recorded).", "watched"),
    ("containers_lost", "Watched containers whose device rules no longer allowed a GPU node they were given, in the last pass.", "lost"),
    ("containers_repaired", "Watched containers whose lost GPU nodes the last pass gave back.", "repaired"),
    ("containers_stale", "Watched containers bound to a driver that no longer runs (or started from a stale CDI spec).", "stale"),
    ("records_removed", "Records of containers that were gone, removed by the last pass.", "removed"),
)


def render_metrics(report: PassReport, repairs_total: int = 0, events_total: int = 0) -> str:
    """The text exposition of one pass (gauges) and the daemon's counters since it started."""
    values = report.as_dict()
    lines = []
    for name, meaning, key in _GAUGES:
        lines += [f"# HELP ponytail_guard_{name} {meaning}", f"# TYPE ponytail_guard_{name} gauge", f"ponytail_guard_{name} {values[key]}"]
    lines += [
        "# HELP ponytail_guard_problems Records or directories the last pass could not use.",
        "# TYPE ponytail_guard_problems gauge",
        f"ponytail_guard_problems {len(report.problems)}",
        "# HELP ponytail_guard_repairs_total Containers given back their GPU nodes since the guard started.",
        "# TYPE ponytail_guard_repairs_total counter",
        f"ponytail_guard_repairs_total {repairs_total}",
        "# HELP ponytail_guard_events_total udev events of the driver's devices seen since the guard started.",
        "# TYPE ponytail_guard_events_total counter",
        f"ponytail_guard_events_total {events_total}",
        "# HELP ponytail_guard_last_pass_timestamp_seconds When the last pass finished.",
        "# TYPE ponytail_guard_last_pass_timestamp_seconds gauge",
        f"ponytail_guard_last_pass_timestamp_seconds {report.finished:.3f}",
        "# HELP ponytail_guard_pass_duration_seconds How long the last pass took.",
        "# TYPE ponytail_guard_pass_duration_seconds gauge",
        f"ponytail_guard_pass_duration_seconds {report.duration_s:.6f}",
    ]
    return "\n".join(lines) + "\n"


def write_metrics(path: str, text: str) -> None:
    """Replace the textfile atomically (a scrape never reads half of it); 0644, as the collector reads it."""
    replace_file(path, text.encode(), 0o644)
