"""What ``ponytail check`` reports: one finding per thing looked at, and its level."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass

from ponytail.errors import one_line

OK, WARN, FAIL = "ok", "warning", "problem"


@dataclass(frozen=True)
class Finding:
    area: str  # "host", "engine", "container"
    subject: str  # what was looked at: "driver", "/dev/nvidia0", "docker", "libcuda.so.1"
    level: str  # ok, warning, problem
    message: str  # what was found; for warnings and problems also what to do


def report(findings: list[Finding], as_json: bool, width: int | None = None) -> tuple[str, int]:
    """The findings as text (one line each, wrapped at ``width`` with continuations under the message)
    or JSON, and the exit status: 0 only when every finding is ok."""
    status = 0 if all(f.level == OK for f in findings) else 1
    if as_json:
        document = {"ok": status == 0, "findings": [asdict(f) for f in findings]}
        return json.dumps(document, indent=2) + "\n", status
    lines = [f"{f.level:8} {f.area:9} {one_line(f.subject)}: {one_line(f.message)}" for f in findings]
    if width is not None:
        lines = [wrapped for line in lines for wrapped in textwrap.wrap(line, max(width, 60), subsequent_indent=" " * 19, break_on_hyphens=False)]
    bad = sum(1 for f in findings if f.level != OK)
    lines.append("all is well" if status == 0 else f"{bad} finding(s) need attention")
    return "\n".join(lines) + "\n", status
