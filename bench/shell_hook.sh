#!/bin/sh
# The yardstick for bench/hookbench.py: ponytail's job done by hand in shell, as an
# OCI prestart hook. No checks, no plan, no safe path resolution: the plain way.
#
#   shell_hook.sh PROC_ROOT DEV_ROOT DRIVER_ROOT LIBDIR "BINARY..." LIBRARY... < OCI state
#
# Reads the pid and bundle from the state and root.path from config.json, enters the
# container's mount namespace once (nsenter), bind-mounts every GPU node, the control
# nodes, each LIBRARY.so.<driver version> and each BINARY from /usr/bin, remounts each
# read-only (nodes: nosuid,noexec), then runs ldconfig -r on the rootfs once.
set -eu
proc=$1 dev=$2 driver=$3 libdir=$4 binaries=$5
shift 5
state=$(cat)
pid=$(printf '%s\n' "$state" | sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p')
bundle=$(printf '%s\n' "$state" | sed -n 's/.*"bundle": *"\([^"]*\)".*/\1/p')
root=$(sed -n 's/.*"root": *{[^}]*"path": *"\([^"]*\)".*/\1/p' "$bundle/config.json")
case $root in /*) ;; *) root=$bundle/$root ;; esac
version=$(sed -n 's/^NVRM version:.*  \([0-9][0-9.]*\)  .*/\1/p' "$proc/driver/nvidia/version")

exec nsenter -t "$pid" -m /bin/sh -eu -s "$root" "$dev" "$driver" "$libdir" "$version" "$binaries" "$@" <<'EOF'
root=$1 dev=$2 driver=$3 libdir=$4 version=$5 binaries=$6
shift 6
bind() {  # SOURCE TARGET REMOUNT-OPTIONS
    [ -e "$2" ] || { mkdir -p "${2%/*}"; : > "$2"; }
    mount --bind "$1" "$2"
    mount -o "remount,bind,$3" "$2"
}
for node in "$dev"/nvidia[0-9]* "$dev/nvidiactl" "$dev/nvidia-uvm" "$dev/nvidia-uvm-tools"; do
    bind "$node" "$root/dev/${node##*/}" nosuid,noexec
done
for name; do
    bind "$driver$libdir/$name.so.$version" "$root$libdir/$name.so.$version" ro,nosuid,nodev
done
for name in $binaries; do
    bind "$driver/usr/bin/$name" "$root/usr/bin/$name" ro,nosuid,nodev
done
mkdir -p "$root/etc/ld.so.conf.d"
echo "$libdir" > "$root/etc/ld.so.conf.d/00-shell-hook.conf"
ldconfig -r "$root"
EOF
