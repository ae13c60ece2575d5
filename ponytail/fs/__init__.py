"""Low-level file system helpers: paths inside the rootfs (openat2), kernel file systems (never written)."""
