#!/usr/bin/env bash
# Builds (once) and prints the path of a pristine Debian root made from Debian's archive only:
# `debootstrap --variant=minbase SUITE` (bookworm, Debian 12, unless --suite names another: sid for
# the current engines) with the components main, contrib, non-free and non-free-firmware, then
# `apt-get install` of PACKAGE... inside it (so alternatives links and ld.so.cache are exactly
# what Debian's packages make). Roots are cached outside any checkout, in
# $PONYTAIL_ROOT_CACHE (default /var/cache/ponytail-test-roots), one directory per NAME and key: a
# hash of this script, the suite, the package list and the archive's address, so a changed list builds a new root
# and a second call with the same list prints the cached one at once. Older roots of the same NAME are
# removed when a new one is complete. Concurrent calls for one root wait for each other (flock).
#
# Usage: scripts/debian-root.sh [--suite SUITE] NAME [PACKAGE...]   prints the root's path on stdout
# Exit:  0 the root is there; 3 Debian's archive cannot be reached (callers skip, saying so);
#        1 anything else failed (the build's log is printed).
# The archive's address is taken from this machine's apt sources (or $DEBIAN_MIRROR).
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -ge 1 ] && exit 0 || exit 2
fi
suite=bookworm
if [ "$1" = --suite ]; then
    [ $# -ge 3 ] || { echo "debian-root: --suite SUITE NAME [PACKAGE...]" >&2; exit 2; }
    suite=$2; shift 2
fi
case "$suite" in (*[!a-z0-9-]*|"") echo "debian-root: bad SUITE '$suite' (a Debian suite or codename: bookworm, sid)" >&2; exit 2;; esac
name=$1; shift
case "$name" in (*[!A-Za-z0-9._-]*|"") echo "debian-root: bad NAME '$name' (letters, digits, . _ -)" >&2; exit 2;; esac
[ "$(id -u)" -eq 0 ] || { echo "debian-root: must run as root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debian-root: no debootstrap (apt-get install debootstrap)" >&2; exit 1; }

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    # the first deb822 URIs of a source listing bookworm, else the first one-line "deb" entry
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        mirror=$(awk '/^URIs:/{u=$2} /^Suites:.*bookworm( |$)/{if(u!=""){print u; exit}} /^$/{u=""}' "$f")
        [ -n "$mirror" ] && break
    done
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1=="deb" && $0 ~ / bookworm /{for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "debian-root: no Debian archive in this machine's apt sources: set DEBIAN_MIRROR" >&2; exit 1; }
security=${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security}

cache=${PONYTAIL_ROOT_CACHE:-/var/cache/ponytail-test-roots}
mapfile -t packages < <(printf '%s\n' "$@" | sort -u | sed '/^$/d')
key=$( { cat "$0"; printf '%s\n' "$mirror" "$suite" "${packages[@]}"; } | sha256sum | cut -c1-12)
root="$cache/$name-$key"
mkdir -p "$cache"
chmod 0755 "$cache"
exec 9>"$cache/.lock-$name"
flock 9
if [ -f "$root/.ponytail-root-complete" ]; then
    echo "$root"
    exit 0
fi

reachable() { python3 - "$mirror/dists/$suite/Release" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=15).read(64)
except Exception as e:
    print(e, file=sys.stderr); sys.exit(1)
EOF
}
if ! reachable 2>/dev/null; then
    echo "debian-root: Debian's archive ($mirror) cannot be reached" >&2
    exit 3
fi

build="$cache/.build-$name-$key"
log="$cache/.build-$name-$key.log"
rm -rf "$build"
echo "debian-root: building $name ($suite, ${#packages[@]} package(s)) in $root; log $log" >&2
fail() { echo "debian-root: $1; the end of $log:" >&2; tail -25 "$log" >&2; rm -rf "$build"; exit 1; }
debootstrap --variant=minbase --components=main,contrib,non-free,non-free-firmware "$suite" "$build" "$mirror" >"$log" 2>&1 \
    || fail "debootstrap failed"
if [ "$suite" = bookworm ]; then
    cat >"$build/etc/apt/sources.list" <<EOF
deb $mirror bookworm main contrib non-free non-free-firmware
deb $mirror bookworm-updates main contrib non-free non-free-firmware
deb $security bookworm-security main contrib non-free non-free-firmware
EOF
else  # sid (and testing) without the updates and security suites of a release
    echo "deb $mirror $suite main contrib non-free non-free-firmware" >"$build/etc/apt/sources.list"
    # sid's Release is valid for a week only: a mirror's snapshot of it may have expired (its signature is still checked)
    echo 'Acquire::Check-Valid-Until "false";' >"$build/etc/apt/apt.conf.d/99ponytail-snapshot"
fi
# no service starts inside the root (as in a container image): the tests start what they need
printf '#!/bin/sh\nexit 101\n' >"$build/usr/sbin/policy-rc.d"
chmod 0755 "$build/usr/sbin/policy-rc.d"
in_root() {
    # shellcheck disable=SC2016  # \$1 is the inner shell's
    unshare -m --propagation private sh -c 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"' sh "$build" "$build" "$@"
}
in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$log" 2>&1 || fail "apt-get update failed in the root"
if [ ${#packages[@]} -gt 0 ]; then
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >>"$log" 2>&1 \
        || fail "apt-get install ${packages[*]} failed in the root"
fi
in_root apt-get clean >>"$log" 2>&1 || fail "apt-get clean failed in the root"
# shellcheck disable=SC2016  # dpkg-query's own format
in_root dpkg-query -W -f '${Package} ${Version}\n' >"$build/.ponytail-root-packages" 2>>"$log" \
    || fail "dpkg-query failed in the root"
touch "$build/.ponytail-root-complete"
mv "$build" "$root"
mv "$log" "$root/.ponytail-root-build.log"
# only NAME-<key>: a glob NAME-* would also take another root whose name starts with NAME-
# (building driver-535 removed driver-535-wide)
hex='[0-9a-f]'
for old in "$cache/$name"-$hex$hex$hex$hex$hex$hex$hex$hex$hex$hex$hex$hex; do
    [ "$old" = "$root" ] || [ ! -d "$old" ] || rm -rf "$old"
done
echo "$root"
