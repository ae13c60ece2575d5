#!/bin/sh
# Build the installer image with podman, offline: build-image.sh [IMAGE]
# (default localhost/ponytail-installer:latest). Needs `make binary` first and busybox-static.
# PODMAN may hold podman with global options, e.g. PODMAN="podman --root /tmp/storage".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
image=${1:-localhost/ponytail-installer:latest}
dist=$repo/dist/ponytail
libdir=/lib/x86_64-linux-gnu
[ -x "$dist/ponytail" ] || { echo "build-image.sh: $dist/ponytail is missing: run make binary first" >&2; exit 1; }
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
root=$context/rootfs
mkdir -p "$root/bin" "$root/lib64" "$root$libdir" "$root/opt" "$root/tmp" "$root/host"
cp /bin/busybox "$root/bin/busybox"
for applet in sh cat cmp cp cut diff dirname echo kill ln mkdir mv nsenter pidof printf rm sed sleep stat; do
    ln -s busybox "$root/bin/$applet"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libz.so.1; do
    [ ! -e "$libdir/$lib" ] || cp -L "$libdir/$lib" "$root$libdir/"
done
# Debian's plain busybox (not busybox-static) is dynamically linked: bring what it links against
ldd /bin/busybox 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    cp -L "$lib" "$root$libdir/"
done
cp -a "$dist" "$root/opt/ponytail"
ln -s ponytail "$root/opt/ponytail/ponytail-runtime"  # the binary is the runtime shim under this name
cp "$here/installer.sh" "$root/installer.sh"
mkdir -p "$root/opt/ponytail-units"  # the /dev/char link units and udev rule (installer.sh: install_char_links)
cp "$repo/packaging/systemd/"* "$repo/packaging/udev/"* "$root/opt/ponytail-units/"
${PODMAN:-podman} build --network=none --pull=never -t "$image" -f "$here/Containerfile" "$context"
