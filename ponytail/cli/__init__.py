"""The front ends: the click commands, `info`, `check` and `cdi` (ponytail/entry.py sends the hook's own command line past them)."""
