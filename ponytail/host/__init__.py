"""Read-only probing of the host: the driver, its GPUs, its nodes and its files."""
