"""What ``ponytail check`` reports: one finding per thing looked at, and its level."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warning", "problem"


@dataclass(frozen=True)
class Finding:
    area: str  # "host", "engine", "container"
    subject: str  # what was looked at: "driver", "/dev/nvidia0", "docker", "libcuda.so.1"
    level: str  # ok, warning, problem
    message: str  # what was found; for warnings and problems also what to do
