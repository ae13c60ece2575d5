"""ponytail's console script, timed phase by phase (bench/nvidiabench.py; bench only).

    PYTHON bench/phases.py RESULT-FILE [ponytail arguments...]

Run by the same interpreter as the console script (the venv's python, no -I), under
bench/measure.c. The work is bench/phaselib.py; this file stays tiny because a main
script is compiled on every start, never cached.
"""
import time

FIRST_LINE_NS = time.monotonic_ns()
FIRST_LINE_CPU_NS = time.process_time_ns()

import phaselib  # noqa: E402

phaselib.main(FIRST_LINE_NS, FIRST_LINE_CPU_NS)
