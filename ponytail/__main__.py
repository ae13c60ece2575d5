"""``python -m ponytail``, and the entry script of the self-contained binary.

The binary is one program for both commands: run through a link named
``ponytail-runtime`` it is the Docker runtime shim, otherwise the hook and its CLI.
"""

import os
import sys

if os.path.basename(sys.argv[0]) == "ponytail-runtime":
    from ponytail.hooks.shim.main import main as runtime_main

    raise SystemExit(runtime_main())

from ponytail.entry import run

run()
