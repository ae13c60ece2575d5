#!/bin/sh
# ponytail's node installer: runs in the installer image (deploy/kubernetes/ponytail-installer.yaml)
# with the node's root filesystem mounted at $HOST_ROOT.
#
#   installer.sh install     copy ponytail to the host, register it with the engine, restart the engine if that changed anything
#   installer.sh uninstall   take ponytail out of the engine's config (byte for byte as it was), remove the files
#   installer.sh daemon      install, then wait (a DaemonSet's pod stays Running); on SIGTERM uninstall if CLEANUP_ON_EXIT=true
#
# Settings (environment):
#   ENGINE           containerd (default) | docker | crio | podman
#   ENGINE_CONFIG    the engine's config on the host (default: the engine's usual path)
#   SET_AS_DEFAULT   true: ponytail becomes the engine's default runtime (default false: select it with runtimeClassName)
#   RESTART_MODE     systemd (default: systemctl restart on the host, needs hostPID) | signal (SIGHUP: dockerd) | none
#   INSTALL_DIR      where ponytail goes on the host (default /usr/local/ponytail)
#   ACCEPT_ENV_WHEN_UNPRIVILEGED   written to /etc/ponytail/config.toml if the host has none (default false: only
#                    the device plugin's list gives an unprivileged pod GPUs)
#   HOST_ROOT        where the host's / is mounted (default /host)
#   DEV_CHAR_LINKS   true (default): make the /dev/char links of the NVIDIA nodes now, and install and enable
#                    ponytail-dev-char-links.{service,path} (/etc/systemd/system) and
#                    71-ponytail-dev-char-links.rules (/etc/udev/rules.d) that keep them current | false
#   CDI_SPEC         containerd: where ponytail's CDI spec goes on the host (default /var/run/cdi/ponytail.yaml;
#                    empty: none). containerd 2.x (and 1.7 with enable_cdi) resolves the device plugin's CDI
#                    annotations itself from it; `ponytail cdi generate` writes it in the host's mount namespace
#                    (hostPID) at install; while the pod runs, ponytail guard writes it again on the driver's
#                    udev events (driver loaded or unloaded, a GPU added or removed, a MIG change)
#   GUARD            true (default): while the pod runs, run `ponytail guard` on the host (hostPID): it gives
#                    running GPU containers back the nodes a systemd reload took from their device rules, and
#                    keeps the /dev/char links and the CDI spec true to the driver on its udev events | false
#   GUARD_TEXTFILE   where the guard writes its Prometheus metrics on the host (node exporter's textfile
#                    collector directory; default: none)
# A second run with the same settings changes nothing and restarts nothing.
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
ENGINE=${ENGINE:-containerd}
ENGINE_CONFIG=${ENGINE_CONFIG:-}
SET_AS_DEFAULT=${SET_AS_DEFAULT:-false}
RESTART_MODE=${RESTART_MODE:-systemd}
INSTALL_DIR=${INSTALL_DIR:-/usr/local/ponytail}
ACCEPT_ENV_WHEN_UNPRIVILEGED=${ACCEPT_ENV_WHEN_UNPRIVILEGED:-false}
CLEANUP_ON_EXIT=${CLEANUP_ON_EXIT:-false}
DEV_CHAR_LINKS=${DEV_CHAR_LINKS:-true}
IMAGE_DIR=${IMAGE_DIR:-/opt/ponytail}   # what the image holds: ponytail's files, copied to INSTALL_DIR
UNITS_DIR=${UNITS_DIR:-/opt/ponytail-units}
UNITS="ponytail-dev-char-links.service ponytail-dev-char-links.path"
UDEV_RULE=71-ponytail-dev-char-links.rules
CDI_SPEC=${CDI_SPEC-/var/run/cdi/ponytail.yaml}
GUARD=${GUARD:-true}
GUARD_TEXTFILE=${GUARD_TEXTFILE:-}

say() { echo "ponytail-installer: $*"; }
fail() { echo "ponytail-installer: error: $*" >&2; exit 1; }

case "$ENGINE" in
    containerd) default_config=/etc/containerd/config.toml; service=containerd; program=ponytail-runtime ;;
    docker) default_config=/etc/docker/daemon.json; service=docker; program=ponytail-runtime ;;
    crio) default_config=/etc/crio/crio.conf; service=crio; program=ponytail-runtime ;;
    podman) default_config=/usr/share/containers/oci/hooks.d/ponytail.json; service=; program=ponytail ;;
    *) fail "ENGINE=$ENGINE: use containerd, docker, crio or podman" ;;
esac
config=${ENGINE_CONFIG:-$default_config}
[ -d "$HOST_ROOT" ] || fail "$HOST_ROOT is not mounted: mount the node's / there (hostPath)"

copy_files() {
    target="$HOST_ROOT$INSTALL_DIR"
    if [ -d "$target" ] && diff -r "$IMAGE_DIR" "$target" >/dev/null 2>&1; then
        say "$INSTALL_DIR is up to date"
        return 0
    fi
    rm -rf "$target.new" "$target.old"
    mkdir -p "$(dirname "$target")"
    cp -a "$IMAGE_DIR" "$target.new"
    [ ! -e "$target" ] || mv "$target" "$target.old"
    mv "$target.new" "$target"
    rm -rf "$target.old"
    say "installed ponytail in $INSTALL_DIR"
}

# The CRI implementation whose pods this node runs: the device plugin's CDI annotations are believed
# only from where it puts the kubelet's container annotations ([request] cri).
case "$ENGINE" in
    containerd) cri="containerd" ;;
    crio) cri="cri-o" ;;
    *) cri= ;;
esac

# policy_text ACCEPT CRI: the config.toml the installer writes
policy_text() {
    printf '# Written by the ponytail installer (see config/config.toml for every key).\n[request]\naccept_env_when_unprivileged = %s\n' "$1"
    [ -z "$2" ] || printf 'cri = "%s"\n' "$2"
}

write_policy() {
    policy="$HOST_ROOT/etc/ponytail/config.toml"
    if [ -e "$policy" ]; then
        # an earlier installer's file, untouched since, gains the CRI; any other file is the operator's
        for accept in true false; do
            if [ -n "$cri" ] && [ "$(cat "$policy")" = "$(policy_text "$accept" "")" ]; then
                policy_text "$accept" "$cri" > "$policy.tmp"
                mv "$policy.tmp" "$policy"
                say "added cri = \"$cri\" to /etc/ponytail/config.toml (the installer's own file)"
                return 0
            fi
        done
        say "/etc/ponytail/config.toml exists: left as it is"
        return 0
    fi
    mkdir -p "$(dirname "$policy")"
    policy_text "$ACCEPT_ENV_WHEN_UNPRIVILEGED" "$cri" > "$policy.tmp"
    mv "$policy.tmp" "$policy"
    say "wrote /etc/ponytail/config.toml: accept_env_when_unprivileged = $ACCEPT_ENV_WHEN_UNPRIVILEGED${cri:+, cri = \"$cri\"}"
}

# configure ARGS...: run `ponytail configure`; returns 0 when the engine's config changed
configure() {
    set -- --runtime "$ENGINE" --config-file "$HOST_ROOT$config" --state-dir "$HOST_ROOT/var/lib/ponytail/configure" "$@"
    output=$("$IMAGE_DIR/ponytail" configure "$@") || fail "ponytail configure $*: see the line above"
    echo "$output" | sed "s#$HOST_ROOT##g"
    case "$output" in *"nothing changed"*) return 1 ;; esac
    return 0
}


# put FILE CONTENT-SOURCE: write the host's FILE from the image's, with INSTALL_DIR as ponytail's path; 0 when it changed
put() {
    mkdir -p "$(dirname "$HOST_ROOT$1")"
    sed "s#/usr/local/ponytail/#$INSTALL_DIR/#g" "$2" > "$HOST_ROOT$1.tmp"
    if cmp -s "$HOST_ROOT$1.tmp" "$HOST_ROOT$1"; then rm -f "$HOST_ROOT$1.tmp"; return 1; fi
    mv "$HOST_ROOT$1.tmp" "$HOST_ROOT$1"
    say "wrote $1"
}

# The /dev/char links now, and the units and udev rule that keep them current. Enabled without a
# daemon-reload: a reload is what takes GPUs from running containers whose nodes had no link.
install_char_links() {
    [ "$DEV_CHAR_LINKS" = true ] || return 0
    # a name that is not ours is said (and left); the install goes on
    "$IMAGE_DIR/ponytail" dev-char-links --dev-root "$HOST_ROOT/dev" 2>&1 | sed "s#$HOST_ROOT##g"
    changed=false
    for unit in $UNITS; do
        if put "/etc/systemd/system/$unit" "$UNITS_DIR/$unit"; then changed=true; fi
        wants="$HOST_ROOT/etc/systemd/system/multi-user.target.wants"
        mkdir -p "$wants"
        [ -L "$wants/$unit" ] || ln -s "/etc/systemd/system/$unit" "$wants/$unit"
    done
    if put "/etc/udev/rules.d/$UDEV_RULE" "$UNITS_DIR/$UDEV_RULE"; then changed=true; fi
    [ "$changed" = true ] || { say "/dev/char link units are up to date"; return 0; }
    if [ "$RESTART_MODE" = systemd ]; then
        on_host systemctl start ponytail-dev-char-links.path || say "warning: cannot start ponytail-dev-char-links.path on the host"
        on_host udevadm control --reload || say "warning: cannot reload udev's rules on the host"
        say "enabled ponytail-dev-char-links.path and the udev rule $UDEV_RULE"
    else
        say "enabled ponytail-dev-char-links at boot; to start it now: systemctl start ponytail-dev-char-links.path && udevadm control --reload"
    fi
}

uninstall_char_links() {
    [ "$DEV_CHAR_LINKS" = true ] || return 0
    if [ "$RESTART_MODE" = systemd ] && [ -e "$HOST_ROOT/etc/systemd/system/ponytail-dev-char-links.path" ]; then
        on_host systemctl stop ponytail-dev-char-links.path || say "warning: cannot stop ponytail-dev-char-links.path on the host"
    fi
    for unit in $UNITS; do
        rm -f "$HOST_ROOT/etc/systemd/system/multi-user.target.wants/$unit" "$HOST_ROOT/etc/systemd/system/$unit"
    done
    rm -f "$HOST_ROOT/etc/udev/rules.d/$UDEV_RULE"
    say "removed the /dev/char link units and udev rule (the links stay: they are harmless and what udev makes for other devices)"
}

restart_engine() {
    [ -n "$service" ] || return 0
    case "$RESTART_MODE" in
        systemd) on_host systemctl restart "$service" || fail "cannot restart $service on the host (hostPID and privileged needed)"
                 say "restarted $service" ;;
        signal) pid=$(pidof dockerd containerd crio 2>/dev/null | cut -d' ' -f1)
                [ -n "$pid" ] || fail "no engine process to signal (hostPID needed)"
                kill -HUP "$pid" && say "sent SIGHUP to $service ($pid)" ;;
        none) say "restart $service on the node to apply" ;;
        *) fail "RESTART_MODE=$RESTART_MODE: use systemd, signal or none" ;;
    esac
}

# on_host COMMAND...: run COMMAND in the host's mount namespace (hostPID); fails, running nothing, unless
# PID 1's / there is the $HOST_ROOT ponytail was installed in
on_host() {
    here=$(stat -L -c %d:%i "$HOST_ROOT/" 2>/dev/null) || return 1
    [ "$here" = "$(nsenter -t 1 -m -- stat -L -c %d:%i / 2>/dev/null)" ] || return 1
    nsenter -t 1 -m -- "$@"
}

# write_cdi_spec: ponytail's CDI spec of the node's GPUs, for an engine that resolves CDI itself (containerd 2.x)
# (never a second spec of nvidia.com/gpu: with another generator's spec there, such as nvidia-ctk's, cdi generate
# refuses, writing nothing, and the installer says why and the way out)
cdi_spec_written=false
write_cdi_spec() {
    [ "$ENGINE" = containerd ] && [ -n "$CDI_SPEC" ] || return 0
    if ! why=$("$IMAGE_DIR/ponytail" cdi owners --root "$HOST_ROOT" --may-write "$CDI_SPEC" 2>&1); then
        why=$(printf '%s\n' "$why" | tail -n 1 | sed "s#$HOST_ROOT##g")
        say "warning: no CDI spec written: ${why#ponytail: }"
    elif ! on_host true; then
        say "warning: cannot write the CDI spec $CDI_SPEC on the host (hostPID needed): containerd 2.x then fails pods whose GPUs come as CDI annotations"
    elif why=$(on_host "$INSTALL_DIR/ponytail" cdi generate --output "$CDI_SPEC" 2>&1 >/dev/null); then
        cdi_spec_written=true
        say "wrote the CDI spec $CDI_SPEC"
    else
        why=$(printf '%s\n' "$why" | tail -n 1)
        say "warning: no CDI spec written: ${why#ponytail: error: }"
    fi
}

# warn_containerd_without_cdi: containerd 1.6 ignores the CDI devices field of CRI requests (a pod starts without its GPU)
warn_containerd_without_cdi() {
    [ "$ENGINE" = containerd ] || return 0
    version=$(on_host containerd --version 2>/dev/null | awk '{print $3}') || return 0
    case "$version" in
        v1.6.*|1.6.*|v1.5.*|1.5.*) say "warning: containerd $version ignores the CDI devices of CRI requests (the device plugin's cdi-cri strategy: pods start without their GPU, and no error): use its volume-mounts or cdi-annotations strategy with the runtime ponytail, or containerd 1.7+ with enable_cdi" ;;
    esac
}

# run_guard: `ponytail guard` in the host's mount namespace, in the background ($guard_pid); the pod waits on it.
# Without hostPID it cannot see the containers: said, and the pod only waits.
run_guard() {
    set --
    # the guard keeps the spec true to the driver only where this installer wrote it (never another owner's kind)
    if [ "$cdi_spec_written" = true ]; then set -- --cdi-spec "$CDI_SPEC"; fi
    if [ -n "$GUARD_TEXTFILE" ]; then set -- "$@" --textfile "$GUARD_TEXTFILE"; fi
    if [ "$GUARD" = true ] && on_host true; then
        on_host "$INSTALL_DIR/ponytail" guard "$@" &
        guard_pid=$!
        say "running ponytail guard on the host (process $guard_pid)"
    else
        [ "$GUARD" != true ] || say "warning: cannot run ponytail guard on the host (hostPID needed): GPUs a systemd reload takes from running containers are not given back"
        guard_pid=
    fi
}

stop_guard() {
    [ -z "$guard_pid" ] || kill "$guard_pid" 2>/dev/null || true
}

install() {
    copy_files
    write_policy
    install_char_links
    set --
    [ "$SET_AS_DEFAULT" = true ] && set -- --set-as-default
    changed=false
    configure --path "$INSTALL_DIR/$program" "$@" && changed=true
    write_cdi_spec
    warn_containerd_without_cdi
    if [ "$changed" = true ]; then restart_engine; fi
}

# /var/lib/ponytail, which configure --uninstall emptied; what someone else put there is left, and said
remove_state_dir() {
    state="$HOST_ROOT/var/lib/ponytail"
    [ -d "$state" ] || return 0
    if [ -n "$(ls -A "$state")" ]; then
        say "warning: /var/lib/ponytail holds files that are not ponytail's: left as it is"
        return 0
    fi
    rmdir "$state" || fail "cannot remove /var/lib/ponytail: see the line above"
    say "removed /var/lib/ponytail"
}

uninstall() {
    if configure --uninstall; then restart_engine; fi
    uninstall_char_links
    if [ "$ENGINE" = containerd ] && [ -n "$CDI_SPEC" ] && on_host rm -f "$CDI_SPEC"; then say "removed the CDI spec $CDI_SPEC"; fi
    rm -rf "$HOST_ROOT$INSTALL_DIR"
    remove_state_dir
    say "removed $INSTALL_DIR"
}

case "${1:-daemon}" in
    install) install ;;
    uninstall) uninstall ;;
    daemon)
        install
        guard_pid=
        if [ "$CLEANUP_ON_EXIT" = true ]; then trap 'stop_guard; uninstall; exit 0' TERM INT; else trap 'stop_guard; exit 0' TERM INT; fi
        run_guard
        say "installed; waiting"
        while :; do
            if [ -n "$guard_pid" ]; then
                wait "$guard_pid" || true
                say "warning: ponytail guard ended; starting it again in 5 s"
                sleep 5
                run_guard
            else
                sleep 3600 & wait $! || true
            fi
        done ;;
    *) fail "usage: installer.sh [install|uninstall|daemon]" ;;
esac
