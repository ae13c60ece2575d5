"""Container Device Interface for engines: spec files written, listed and checked (``files``), and the
one createContainer hook a spec names (``hook``); the spec itself is the plan rendered as data (plan/cdi.py)."""
