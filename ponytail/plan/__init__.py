"""The plan as plain data (each operation with its reason), how it is made, and its renderings (-debug text, a CDI spec, a device program)."""
