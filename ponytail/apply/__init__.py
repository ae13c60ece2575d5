"""The only code that changes anything: mounts, links, files and the linker cache in the rootfs."""
