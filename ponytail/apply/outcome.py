"""What one run of the executor did, for the log."""

from __future__ import annotations

from ponytail.lite.records import field, record


@record
class Outcome:
    """What a run did, for the log: one line per change, and what was already there."""

    done: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    attached: list[int] = field(default_factory=list, repr=False)  # a descriptor of each mount made
