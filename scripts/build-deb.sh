#!/usr/bin/env bash
# make deb: builds dist/ponytail_<version>_all.deb from what is committed (git archive of HEAD into a
# temporary directory: nothing uncommitted or ignored gets in), offline, with Debian's tools and
# Python modules only (debhelper, pybuild's pyproject plugin; installed with apt-get where missing),
# then runs lintian on the source and binary packages: an error or a warning not overridden with its
# reason (debian/source/lintian-overrides, debian/ponytail.lintian-overrides) fails the build.
#
# Usage: scripts/build-deb.sh [--version V] [--out DIR] | --deps-only
#   --version V   build it as version V (the top entry of debian/changelog is given V; tests build
#                 an older package to upgrade from). Default: debian/changelog's.
#   --out DIR     where the .deb goes (default: dist/ in the checkout).
#   --deps-only   install what the build needs where missing, and stop (make system-packages).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=""
out="$repo/dist"
deps_only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --version) version=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --deps-only) deps_only=1; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-deb: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
start=$(date +%s)

# the build dependencies (debian/control's Build-Depends, and build-essential, which dpkg-buildpackage
# checks for every package) and lintian, from Debian's archive
need=()
for pkg in build-essential debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools \
           python3-click python3-pyudev python3-tomlkit python3-yaml dpkg-dev fakeroot lintian; do
    dpkg-query -W -f '${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "build-deb: missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
        exit 1
    fi
    echo "build-deb: installing Debian packages: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ -z "$deps_only" ] || exit 0

work=$(mktemp -d /tmp/ponytail-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/ponytail"
git -C "$repo" archive --format=tar HEAD | tar -x -C "$work/ponytail"
if [ -n "$version" ]; then
    sed -i "1s/([^)]*)/($version)/" "$work/ponytail/debian/changelog"
fi
# Debian's own interpreter and tools only: a scrubbed environment, so that no python3 of another
# install (pyenv, a venv) first on PATH builds it
clean_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work" LC_ALL=C.UTF-8)
(cd "$work/ponytail" && "${clean_env[@]}" dpkg-buildpackage -us -uc >"$work/build.log" 2>&1) || {
    echo "build-deb: dpkg-buildpackage failed; the end of its log:" >&2
    tail -40 "$work/build.log" >&2
    exit 1
}
deb=$(find "$work" -maxdepth 1 -name 'ponytail_*_all.deb')
changes=$(find "$work" -maxdepth 1 -name 'ponytail_*.changes')
# lintian as nobody where this runs as root (it advises against root); the build's files are readable
lint_as=()
if [ "$(id -u)" -eq 0 ]; then
    chmod 0755 "$work"
    lint_as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
"${clean_env[@]}" "${lint_as[@]}" lintian --fail-on error,warning --info "$changes"
mkdir -p "$out"
cp "$deb" "$out/"
echo "build-deb: $out/$(basename "$deb") ($(($(date +%s) - start)) s)"
