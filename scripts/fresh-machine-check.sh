#!/usr/bin/env bash
# The test suite as a fresh machine runs it, so that something installed by hand on this
# one cannot hide a missing install step: a clean clone of what is committed (uncommitted
# changes are not in it), a new venv made by the system's python3, a scrubbed environment
# (no PATH entries but the system's, no user site-packages, an empty HOME and pip cache),
# and pytest started from outside the checkout: first the unit tests as nobody, then every test
# as root (Hypothesis's ci profile, as make test). Debian packages are installed as `make
# test` installs them. Usage: make fresh-check  (or scripts/fresh-machine-check.sh [REV])
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rev=${1:-HEAD}
work=$(mktemp -d /tmp/ponytail-fresh-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone -q --no-hardlinks "$repo" "$work/ponytail"
git -C "$work/ponytail" checkout -q "$rev"
mkdir "$work/home"
clean_env=(env -i HOME="$work/home" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
           LANG=C.UTF-8 PYTHONNOUSERSITE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TERM=dumb)
echo "fresh-check: $(git -C "$work/ponytail" log -1 --format='%h %s') in $work/ponytail, python3 = $("${clean_env[@]}" sh -c 'command -v python3')"
"${clean_env[@]}" make -C "$work/ponytail" setup binary
cd /
# the unit tests as an ordinary user (nobody): they need no root; the clone is made readable to it
chmod -R a+rX "$work"
"${clean_env[@]}" GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0="$work/ponytail" \
  setpriv --reuid 65534 --regid 65534 --clear-groups "$work/ponytail/.venv/bin/python" -m pytest -q -p no:cacheprovider -m unit "$work/ponytail/tests"
"${clean_env[@]}" HYPOTHESIS_PROFILE=ci "$work/ponytail/.venv/bin/python" -m pytest -q -p no:cacheprovider "$work/ponytail/tests"
