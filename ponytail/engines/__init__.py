"""How container engines run ponytail: the hooks.d file (``hooksd``), the runtime shim for Docker (``shim``),
CDI spec files and their hook (``cdi``), and engine configuration (``configure``)."""
