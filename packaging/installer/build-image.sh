#!/bin/sh
# Build the installer image with podman, offline: build-image.sh [IMAGE]
# (default localhost/ponytail-installer:latest). Needs `make binary` first and a busybox: Debian's
# busybox-static or its dynamically linked busybox (the libraries it links against come along).
# Every applet that busybox has is linked in /bin: Debian's dynamic busybox, unlike busybox-static,
# runs no applet from its shell that has no link, so a missing link would fail a step of installer.sh.
# PODMAN may hold podman with global options, e.g. PODMAN="podman --root /tmp/storage".
# BUSYBOX: the busybox to put in the image (default /bin/busybox).
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
busybox=${BUSYBOX:-/bin/busybox}
# the programs installer.sh runs (its shell's builtins aside): each must be an applet of this busybox
needed="sh cat cmp cp cut diff dirname echo kill ln ls mkdir mv nsenter pidof printf rm rmdir sed sleep stat"
applets=$("$busybox" --list) || { echo "build-image.sh: $busybox --list failed: is it a busybox?" >&2; exit 1; }
for applet in $needed; do
    printf '%s\n' "$applets" | grep -qx "$applet" \
        || { echo "build-image.sh: $busybox has no '$applet' applet, which installer.sh runs: use Debian's busybox-static or busybox" >&2; exit 1; }
done
cp "$busybox" "$root/bin/busybox"
for applet in $applets; do
    [ "$applet" = busybox ] || [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libz.so.1; do
    [ ! -e "$libdir/$lib" ] || cp -L "$libdir/$lib" "$root$libdir/"
done
# Debian's plain busybox (not busybox-static) is dynamically linked: bring what it links against
if linked=$(ldd "$busybox" 2>&1); then
    case "$linked" in *"not found"*) echo "build-image.sh: $busybox needs a library this machine lacks: $linked" >&2; exit 1 ;; esac
    for lib in $(printf '%s\n' "$linked" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
        cp -L "$lib" "$root$libdir/"
    done
else
    case "$linked" in
        *"not a dynamic executable"*) ;;  # busybox-static
        *) echo "build-image.sh: ldd $busybox failed: $linked" >&2; exit 1 ;;
    esac
fi
cp -a "$dist" "$root/opt/ponytail"
ln -s ponytail "$root/opt/ponytail/ponytail-runtime"  # the binary is the runtime shim under this name
cp "$here/installer.sh" "$root/installer.sh"
mkdir -p "$root/opt/ponytail-units"  # the /dev/char link units and udev rule (installer.sh: install_char_links)
cp "$repo/packaging/systemd/"* "$repo/packaging/udev/"* "$root/opt/ponytail-units/"
${PODMAN:-podman} build --network=none --pull=never -t "$image" -f "$here/Containerfile" "$context"
