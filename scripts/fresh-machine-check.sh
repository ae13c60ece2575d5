#!/usr/bin/env bash
# The README's test command (`make test`) as a fresh Debian 12 machine runs it, so that nothing
# installed or left on this machine (Debian packages, /etc/docker, a busybox, a .venv) can hide a
# missing install step:
#   - a pristine Debian 12 root from Debian's archive (scripts/debian-root.sh, cached under
#     /var/cache/ponytail-test-roots, keyed by the package list below: what a fresh machine of CI's
#     kind has; `make test` installs the rest itself), used through a per-run writable overlay, so the
#     cached root stays pristine;
#   - made the / of its own mount and PID namespaces (pivot_root; nothing it starts outlives the run), this
#     machine's /dev, /sys (with its cgroups) and network, a private /run, and /tmp and /var/tmp on
#     this machine's disk; the host's pip and CA configuration and resolv.conf are copied in so that
#     pip reaches PyPI as it does here;
#   - a clean clone of what is committed at /work/ponytail (uncommitted changes are not in it), with
#     this checkout's ../shared beside it, read-only;
#   - `make test` run there as root with an environment of nothing but the system's PATH, then the
#     unit tests as nobody (they need no root).
# Usage: make fresh-check  (or scripts/fresh-machine-check.sh [REV])
# Exit: that of the first step that failed; 3 when Debian's archive cannot be reached (nothing checked).
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rev=${1:-HEAD}
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: must run as root (debootstrap, namespaces, the suite)" >&2; exit 1; }
started=$SECONDS
elapsed() { echo "$(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s"; }

# a fresh Debian 12 machine of CI's kind: Debian's python3 with venv, git, make, CA certificates, the
# plain (dynamically linked) busybox that initramfs-tools brings, and the usual base tools
packages=(python3 python3-venv git make ca-certificates busybox procps iproute2 kmod xz-utils)
rc=0
root=$("$repo/scripts/debian-root.sh" fresh-check "${packages[@]}") || rc=$?
if [ "$rc" -eq 3 ]; then
    echo "fresh-check: Debian's archive cannot be reached: no pristine root, nothing was checked" >&2
    exit 3
elif [ "$rc" -ne 0 ]; then
    echo "fresh-check: the pristine root could not be built (scripts/debian-root.sh exited $rc)" >&2
    exit "$rc"
fi

work=$(mktemp -d /var/tmp/ponytail-fresh-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/upper" "$work/overlay-work" "$work/merged" "$work/tmp" "$work/var-tmp"
chmod 1777 "$work/tmp" "$work/var-tmp"
git clone -q --no-hardlinks "$repo" "$work/ponytail"
git -C "$work/ponytail" checkout -q "$rev"
chmod -R a+rX "$work/ponytail"  # the unit tests run as nobody
shared=$(cd "$repo/.." && pwd)/shared
echo "fresh-check: $(git -C "$work/ponytail" log -1 --format='%h %s') in a pristine Debian 12 root ($root, overlay in $work)"

# the run inside: as a fresh machine's root user runs the README's command
# shellcheck disable=SC2016  # expanded by the inner shell
inside='
set -eu
cd /work/ponytail
echo "fresh-check: in the root: python3 = $(command -v python3) ($(python3 --version)), /bin/busybox from $(dpkg -S /bin/busybox 2>&1)"
start=$(date +%s)
make test
echo "fresh-check: make test passed in $(( $(date +%s) - start )) s"
# the unit tests as an ordinary user (nobody): they need no root
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0=/work/ponytail \
  setpriv --reuid 65534 --regid 65534 --clear-groups .venv/bin/python -m pytest -q -p no:cacheprovider -m unit tests
echo "fresh-check: the unit tests passed as nobody"
'
# shellcheck disable=SC2016  # expanded by the namespace's shell
setup='
set -eu
root=$1 work=$2 shared=$3 inside=$4
m=$work/merged
mount -t overlay overlay -o "lowerdir=$root,upperdir=$work/upper,workdir=$work/overlay-work" "$m"
mount --rbind /dev "$m/dev"
mount --rbind /sys "$m/sys"
mount -t proc proc "$m/proc"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$m/run"
mount --bind "$work/tmp" "$m/tmp"
mount --bind "$work/var-tmp" "$m/var/tmp"
mkdir -p "$m/work/ponytail"
mount --bind "$work/ponytail" "$m/work/ponytail"
if [ -d "$shared" ]; then
    mkdir -p "$m/work/shared"
    mount --bind "$shared" "$m/work/shared"
    mount -o remount,bind,ro "$m/work/shared"
fi
# reach Debian and PyPI as this machine does: its resolver, pip configuration and local CAs
rm -f "$m/etc/resolv.conf"
cp /etc/resolv.conf "$m/etc/resolv.conf"
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$m/etc/pip.conf"
if [ -d /etc/xdg/pip ]; then mkdir -p "$m/etc/xdg" && cp -r /etc/xdg/pip "$m/etc/xdg/pip"; fi
if [ -d /usr/local/share/ca-certificates ] && [ -n "$(ls -A /usr/local/share/ca-certificates)" ]; then
    cp -r /usr/local/share/ca-certificates/. "$m/usr/local/share/ca-certificates/"
    chroot "$m" update-ca-certificates >/dev/null
fi
# the root becomes this namespace'"'"'s / (pivot_root, not chroot: a process that enters a mount namespace,
# as the hook enters the container'"'"'s, gets that namespace'"'"'s real root, which a chroot would not change)
mkdir "$m/run/.old-root"
cd "$m"
pivot_root . run/.old-root
cd /
umount -l /run/.old-root
rmdir /run/.old-root
exec /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb /bin/sh -c "$inside"
'
rc=0
unshare --mount --pid --fork --propagation private bash -c "$setup" fresh-check "$root" "$work" "$shared" "$inside" || rc=$?
if [ "$rc" -eq 0 ]; then
    echo "fresh-check: passed in a pristine Debian 12 root in $(elapsed)"
else
    echo "fresh-check: FAILED (exit $rc) in a pristine Debian 12 root after $(elapsed)" >&2
fi
exit "$rc"
