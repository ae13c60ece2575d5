"""How container engines are told about ponytail: engine configuration (``configure``)."""
