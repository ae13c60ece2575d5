"""Hand parsers held to the time of the standard module they stand in for, on worst cases: at most
RATIO times its time plus a small constant. The reference is the standard module's pure-Python
code (json's own Python scanner; tomllib), the same class of algorithm in the same language, so
the bound measures the algorithm: generous enough for a loaded 2-core machine, while a parser that
rescans its input (quadratic) misses it by a wide margin on a document of a few hundred KiB."""

from __future__ import annotations

import time
from collections.abc import Callable

RATIO = 5
SLACK_S = 0.05


def best_of(run: Callable[[], object], runs: int = 3) -> float:
    """The fastest of ``runs`` calls, in seconds (the others were slowed by other work)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def assert_as_fast(plain: Callable[[], object], standard: Callable[[], object], what: str, reference: str = "the standard module") -> None:
    ours, theirs = best_of(plain), best_of(standard)
    assert ours <= RATIO * theirs + SLACK_S, f"{what}: {ours * 1000:.1f} ms against {reference}'s {theirs * 1000:.1f} ms"
