#!/usr/bin/env bash
# Bring the nodelet test environment up on a Debian 12 machine, as root:
#   - install the Debian packages it needs (only what is missing),
#   - build our pause and busybox OCI images (only when their sources changed),
#   - run a local registry on 127.0.0.1:5000 and push the images to it, and serve the same
#     images behind a password on 127.0.0.1:5001 (private.registry.test, for pull credentials),
#   - run a private containerd (CRI plugin, runc, cgroupfs, CNI bridge) whose registry hosts for
#     docker.io, registry.k8s.io and any other registry (_default) are that registry only,
#   - check the whole chain (ctr pulls with the hosts dir, CRI Version and PullImage over gRPC).
# Prints one line per step and, last, the CRI endpoint. Logs: /var/log/nodelet-env.
# Idempotent: a second run while everything is up changes nothing. See down.sh for teardown.
# `up.sh --packages` installs the packages and stops there.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

die() { echo "up.sh: $*" >&2; exit 1; }
say() { nodelet_say "$@"; }

[[ $(id -u) -eq 0 ]] || die "must run as root"

mkdir -p "$NODELET_ENV_LIB" "$NODELET_ENV_RUN" "$NODELET_ENV_LOG"
exec 9>"$NODELET_ENV_RUN/lock"
flock -w 120 9 || die "another up.sh/down.sh holds $NODELET_ENV_RUN/lock"

# Write $2 to file $1 only if it differs; returns 0 if the file changed, 1 if not.
write_if_changed() {
    local path=$1 content=$2
    if [[ -f $path ]] && [[ $(<"$path") == "$content" ]]; then
        return 1
    fi
    mkdir -p "$(dirname "$path")"
    printf '%s\n' "$content" >"$path.tmp.$$"
    mv -f "$path.tmp.$$" "$path"
    return 0
}

# Start "$@" as a daemon in its own session; its pid goes to pid file $1 (shifted off).
start_daemon() {
    local pidfile=$1 log=$2
    shift 2
    rm -f "$pidfile"
    # shellcheck disable=SC2016  # $$ and $@ are for the inner sh
    setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" >>"$log" 2>&1 </dev/null 9>&- &
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s $pidfile ]] && return 0
        sleep 0.02
    done
    die "could not start $1"
}


# ---------------------------------------------------------------------------------------------
# 1. Packages
# ---------------------------------------------------------------------------------------------
# tmux drives `nodelet exec -it` in a real terminal (tests/node_cli.rs).
# containernetworking-plugins depends on iptables (the bridge plugin uses it only for ipMasq,
# which we keep off). systemd is only for `systemd-analyze verify`: the package alone does not
# become init (that is systemd-sysv, which we do not install).
PACKAGES=(
    containerd runc containernetworking-plugins docker-registry skopeo
    busybox-static musl-tools gcc protobuf-compiler iproute2 iptables systemd python3 curl
    util-linux ca-certificates tmux
)

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        if [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) != installed ]]; then
            missing+=("$p")
        fi
    done
    if ((${#missing[@]} == 0)); then
        say "packages: all present"
        return
    fi
    say "packages: installing ${missing[*]}"
    local apt_log=$NODELET_ENV_LOG/apt.log our_policy=
    # Packaged services (docker-registry's init script, containerd) must not be started by the
    # install: a policy-rc.d that says 101 stops invoke-rc.d/deb-systemd-invoke. An existing
    # policy-rc.d is left alone.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\n# nodelet-env: temporary, no service starts during install\nexit 101\n' \
            >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        our_policy=1
        trap 'grep -qs nodelet-env /usr/sbin/policy-rc.d && rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    local rc=0
    {
        apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
    } >>"$apt_log" 2>&1 || rc=$?
    if [[ -n $our_policy ]]; then
        grep -qs nodelet-env /usr/sbin/policy-rc.d && rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    if ((rc != 0)); then
        tail -n 30 "$apt_log" >&2
        die "apt-get failed (full log: $apt_log)"
    fi
    say "packages: installed"
}

install_packages
# `up.sh --packages`: this step alone (scripts/test.sh, before its build: containerd-client's
# build script needs protoc).
if [[ ${1:-} == --packages ]]; then
    command -v protoc >/dev/null || die "protoc not found after installing protobuf-compiler"
    exit 0
fi

for cmd in containerd ctr runc containerd-shim-runc-v2 docker-registry skopeo musl-gcc \
    python3 curl ip setsid flock tmux; do
    command -v "$cmd" >/dev/null || die "$cmd not found after installing packages"
done
[[ -x /bin/busybox ]] || die "/bin/busybox (busybox-static) not found"
[[ -x $CNI_BIN_DIR/bridge && -x $CNI_BIN_DIR/host-local && -x $CNI_BIN_DIR/loopback ]] ||
    die "CNI plugins not found in $CNI_BIN_DIR"
PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)

# ---------------------------------------------------------------------------------------------
# 2. Images (OCI layouts under $NODELET_IMAGES_DIR), rebuilt only when their inputs change
# ---------------------------------------------------------------------------------------------
BUILD_OCI=$REPO/images/build-oci.py
PAUSE_SRC=$REPO/images/pause/pause.c
IMG_PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p "$NODELET_IMAGES_DIR"

# build_image NAME HASH_INPUT_TEXT -- build-oci.py args...
# The layout goes to $NODELET_IMAGES_DIR/NAME, its manifest digest to NAME.digest, and a hash of
# everything that went in to NAME.inputs; the build is skipped while that hash is unchanged.
build_image() {
    local name=$1 inputs=$2
    shift 3
    local out=$NODELET_IMAGES_DIR/$name hash
    hash=$({
        printf '%s\n' "$inputs" "$@"
        sha256sum "$BUILD_OCI"
    } | sha256sum | cut -d' ' -f1)
    if [[ -f $out/index.json && -s $NODELET_IMAGES_DIR/$name.digest &&
        $(cat "$NODELET_IMAGES_DIR/$name.inputs" 2>/dev/null) == "$hash" ]]; then
        say "image $name: up to date ($(<"$NODELET_IMAGES_DIR/$name.digest"))"
        return
    fi
    local digest
    digest=$("$PYTHON" "$BUILD_OCI" --out "$out" "$@")
    echo "$digest" >"$NODELET_IMAGES_DIR/$name.digest"
    echo "$hash" >"$NODELET_IMAGES_DIR/$name.inputs"
    say "image $name: built ($digest)"
}

# pause: our static C program.
PAUSE_BIN=$NODELET_IMAGES_DIR/build/pause
pause_src_hash=$({
    sha256sum "$PAUSE_SRC"
    dpkg-query -W -f='${Package} ${Version}\n' musl-tools musl-dev gcc
} | sha256sum | cut -d' ' -f1)
if [[ ! -x $PAUSE_BIN || $(cat "$PAUSE_BIN.inputs" 2>/dev/null) != "$pause_src_hash" ]]; then
    mkdir -p "$(dirname "$PAUSE_BIN")"
    musl-gcc -static -Os -s -Wall -Wextra -Werror -o "$PAUSE_BIN.tmp" "$PAUSE_SRC"
    mv -f "$PAUSE_BIN.tmp" "$PAUSE_BIN"
    echo "$pause_src_hash" >"$PAUSE_BIN.inputs"
    say "pause: compiled ($(stat -c %s "$PAUSE_BIN") bytes)"
fi
build_image pause "$(sha256sum "$PAUSE_BIN")" -- \
    --tag 3.9 --entrypoint '["/pause"]' --file "/pause:0755=$PAUSE_BIN"

# busybox: Debian's static busybox, a /bin symlink per applet, a minimal /etc.
busybox_args=(
    --cmd '["sh"]' --env "$IMG_PATH_ENV"
    --file "/bin/busybox:0755=/bin/busybox" --applet-links "/bin=/bin/busybox"
    --text "/etc/passwd=root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
"
    --text "/etc/group=root:x:0:
nobody:x:65534:
"
    --dir /tmp:1777 --dir /root:0700 --dir /var --dir /proc --dir /sys --dir /dev --dir /etc
)
busybox_hash=$(sha256sum /bin/busybox)
build_image busybox "$busybox_hash" -- --tag 1.36 --tag latest "${busybox_args[@]}"
# 1.35: the same files, a different config (a label), so a tag change is also an image change.
build_image busybox-1.35 "$busybox_hash" -- --tag 1.35 --label org.nodelet.test.variant=1.35 \
    "${busybox_args[@]}"

# filler: 32 MiB that do not compress (a fixed pseudo-random stream, the same on every machine),
# for the garbage collection tests (tests/garbage_collection.rs): removing it frees about 64 MiB
# (its layer and its unpacked snapshot), a step no other disk traffic of a test run blurs.
FILLER_BIN=$NODELET_IMAGES_DIR/build/filler.bin
if [[ $(stat -c %s "$FILLER_BIN" 2>/dev/null) != 33554432 ]]; then
    mkdir -p "$(dirname "$FILLER_BIN")"
    "$PYTHON" -c 'import random, sys; sys.stdout.buffer.write(random.Random(35).randbytes(32 << 20))' \
        >"$FILLER_BIN.tmp"
    mv -f "$FILLER_BIN.tmp" "$FILLER_BIN"
fi
build_image filler "$(sha256sum "$FILLER_BIN")" -- --tag gc --file "/filler:0644=$FILLER_BIN"

# etcd: Debian's etcd-server (its binary and the two files of libc it links), in the place of
# registry.k8s.io/etcd, for kubeadm-shaped static pods. The package is downloaded and unpacked,
# never installed (installing would start an etcd service on the host).
ETCD_BUILD=$NODELET_IMAGES_DIR/build/etcd-server
etcd_version=$(apt-cache policy etcd-server | awk '/Candidate:/ {print $2}')
[[ -n $etcd_version && $etcd_version != "(none)" ]] || die "no etcd-server package in the apt sources"
if [[ $(cat "$ETCD_BUILD.version" 2>/dev/null) != "$etcd_version" || ! -x $ETCD_BUILD/usr/bin/etcd ]]; then
    rm -rf "$ETCD_BUILD" "$ETCD_BUILD.deb.d"
    mkdir -p "$ETCD_BUILD.deb.d"
    (cd "$ETCD_BUILD.deb.d" && apt-get download -q "etcd-server=$etcd_version" >/dev/null 2>&1) ||
        die "cannot download etcd-server $etcd_version"
    dpkg-deb -x "$ETCD_BUILD.deb.d"/etcd-server_*.deb "$ETCD_BUILD"
    rm -rf "$ETCD_BUILD.deb.d"
    echo "$etcd_version" >"$ETCD_BUILD.version"
    say "etcd-server $etcd_version: unpacked"
fi
LIBC=/lib/x86_64-linux-gnu/libc.so.6
LDSO=$(readlink -f /lib64/ld-linux-x86-64.so.2)
# kubeadm's tag scheme: <etcd version>-0.
ETCD_TAG=$(sed -E 's/^([0-9]+\.[0-9]+\.[0-9]+).*/\1/' <<<"$etcd_version")-0
build_image etcd "$(sha256sum "$ETCD_BUILD/usr/bin/etcd" "$LIBC" "$LDSO")" -- --tag "$ETCD_TAG" \
    --entrypoint '["/usr/local/bin/etcd"]' --env "$IMG_PATH_ENV" \
    --file "/usr/local/bin/etcd:0755=$ETCD_BUILD/usr/bin/etcd" \
    --file "/lib/x86_64-linux-gnu/libc.so.6:0755=$LIBC" \
    --file "/lib64/ld-linux-x86-64.so.2:0755=$LDSO" \
    --dir /tmp:1777 --dir /var --dir /var/lib --dir /proc --dir /sys --dir /dev --dir /etc

# ---------------------------------------------------------------------------------------------
# 3. Local registry on 127.0.0.1:5000 (and on 127.0.0.1:5001 behind a password)
# ---------------------------------------------------------------------------------------------
# registry_config ADDR [EXTRA]: a docker-registry configuration serving the registry's storage
# on ADDR, EXTRA (YAML) appended.
registry_config() {
    printf '%s%s' "# nodelet-env: local registry (written by scripts/env/up.sh)
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $1
  headers:
    X-Content-Type-Options: [nosniff]" "${2:-}"
}
REGISTRY_CONFIG_TEXT=$(registry_config "$REGISTRY")

mkdir -p "$REGISTRY_DIR/data"
registry_config_changed=
write_if_changed "$REGISTRY_CONFIG" "$REGISTRY_CONFIG_TEXT" && registry_config_changed=1

# serve_registry LABEL CHANGED PIDFILE CONFIG LOG ADDR [CURL_ARGS...]: docker-registry serving
# CONFIG on ADDR, (re)started unless it runs with an unchanged config (CHANGED empty) and answers.
serve_registry() {
    local label=$1 changed=$2 pidfile=$3 config=$4 log=$5 addr=$6 i
    shift 6
    answers() { curl -sf -o /dev/null --max-time 2 "$@" "http://$addr/v2/"; }
    if nodelet_pid_alive "$pidfile" "$config" && [[ -z $changed ]] && answers "$@"; then
        say "$label: already running on $addr"
        return 0
    fi
    if nodelet_pid_alive "$pidfile" "$config"; then
        say "$label: restarting (config changed or not answering)"
        nodelet_stop_pidfile "$pidfile" "$config" "$label"
    fi
    if curl -s -o /dev/null --max-time 2 "http://$addr/v2/"; then
        die "something else answers on http://$addr/v2/ (not our $label); stop it first"
    fi
    start_daemon "$pidfile" "$log" /usr/bin/docker-registry serve "$config"
    for ((i = 0; i < 100; i++)); do
        answers "$@" && break
        nodelet_pid_alive "$pidfile" "$config" ||
            { tail -n 20 "$log" >&2; die "$label exited (log: $log)"; }
        sleep 0.1
    done
    answers "$@" || { tail -n 20 "$log" >&2; die "$label does not answer"; }
    say "$label: started on $addr (pid $(<"$pidfile"))"
}

serve_registry registry "$registry_config_changed" "$REGISTRY_PIDFILE" "$REGISTRY_CONFIG" \
    "$REGISTRY_LOG" "$REGISTRY"

# The same storage behind a password. The bcrypt hash (docker-registry reads no other) is of
# $PRIVATE_REGISTRY_PASSWORD, a test credential that guards nothing.
PRIVATE_HTPASSWD=$REGISTRY_DIR/private.htpasswd
private_changed=
write_if_changed "$PRIVATE_HTPASSWD" \
    "$PRIVATE_REGISTRY_USER:\$2b\$05\$nodeletnodeletnodeletuUnn5fqqTlv66BkfycqEXkmWSEyi4iBa" &&
    private_changed=1
write_if_changed "$PRIVATE_REGISTRY_CONFIG" "$(registry_config "$PRIVATE_REGISTRY" "
auth:
  htpasswd:
    realm: nodelet-env
    path: $PRIVATE_HTPASSWD")" && private_changed=1
serve_registry "private registry" "$private_changed" "$PRIVATE_REGISTRY_PIDFILE" \
    "$PRIVATE_REGISTRY_CONFIG" "$PRIVATE_REGISTRY_LOG" "$PRIVATE_REGISTRY" \
    -u "$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD"

# ---------------------------------------------------------------------------------------------
# 4. Push the images (skipped when the registry already has the same manifest digest)
# ---------------------------------------------------------------------------------------------
registry_digest() { # NAME TAG
    curl -sf --max-time 5 -o /dev/null -D - -I \
        -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY/v2/$1/manifests/$2" |
        tr -d '\r' | awk 'tolower($1) == "docker-content-digest:" { print $2 }'
}

push() { # LAYOUT TAG NAME
    local layout=$1 tag=$2 name=$3 want have
    want=$(<"$NODELET_IMAGES_DIR/$layout.digest")
    have=$(registry_digest "${name%:*}" "${name##*:}" || true)
    if [[ $have == "$want" ]]; then
        say "push $REGISTRY/$name: already there"
        return
    fi
    skopeo copy --quiet --dest-tls-verify=false \
        "oci:$NODELET_IMAGES_DIR/$layout:$tag" "docker://$REGISTRY/$name"
    have=$(registry_digest "${name%:*}" "${name##*:}" || true)
    [[ $have == "$want" ]] ||
        die "push $name: registry has digest '$have', expected $want (did skopeo convert it?)"
    say "push $REGISTRY/$name: pushed ($want)"
}

push busybox 1.36 library/busybox:1.36
push busybox latest library/busybox:latest
push busybox-1.35 1.35 library/busybox:1.35
push pause 3.9 pause:3.9
push etcd "$ETCD_TAG" "etcd:$ETCD_TAG"
push filler gc nodelet-test/filler:gc

# ---------------------------------------------------------------------------------------------
# 5. containerd configuration: registry mirrors, CNI, config.toml
# ---------------------------------------------------------------------------------------------
# docker.io and registry.k8s.io are mirrored by the local registry only; _default (any other
# registry host) too, so that no image name ever makes containerd reach out of the machine.
for upstream in docker.io registry.k8s.io _default; do
    write_if_changed "$CONTAINERD_CERTS_D/$upstream/hosts.toml" "# nodelet-env: served by the local registry only, never by the real host.
server = \"http://$REGISTRY\"

[host.\"http://$REGISTRY\"]
  capabilities = [\"pull\", \"resolve\"]" && say "containerd: wrote $CONTAINERD_CERTS_D/$upstream/hosts.toml"
done
# The password-protected registry under its own name, so that only credentials open it.
write_if_changed "$CONTAINERD_CERTS_D/$PRIVATE_REGISTRY_NAME/hosts.toml" "# nodelet-env: the local registry's images behind a password.
server = \"http://$PRIVATE_REGISTRY\"

[host.\"http://$PRIVATE_REGISTRY\"]
  capabilities = [\"pull\", \"resolve\"]" && say "containerd: wrote $CONTAINERD_CERTS_D/$PRIVATE_REGISTRY_NAME/hosts.toml"

# No default route in pods and no masquerading: pod traffic stays on the bridge (the host is
# reachable at the gateway address).
CNI_GATEWAY=${CNI_SUBNET%.*/*}.1
write_if_changed "$CNI_CONF_DIR/10-$CNI_NETWORK_NAME.conflist" "{
  \"cniVersion\": \"1.0.0\",
  \"name\": \"$CNI_NETWORK_NAME\",
  \"plugins\": [
    {
      \"type\": \"bridge\",
      \"bridge\": \"$CNI_BRIDGE\",
      \"isGateway\": true,
      \"ipMasq\": false,
      \"ipam\": {
        \"type\": \"host-local\",
        \"dataDir\": \"$CNI_IPAM_DIR\",
        \"ranges\": [[{ \"subnet\": \"$CNI_SUBNET\", \"gateway\": \"$CNI_GATEWAY\" }]]
      }
    }
  ]
}" && say "containerd: wrote $CNI_CONF_DIR/10-$CNI_NETWORK_NAME.conflist"

CONTAINERD_CONFIG_TEXT="# nodelet-env: private containerd (written by scripts/env/up.sh; edits are overwritten)
version = 2
root = \"$CONTAINERD_ROOT\"
state = \"$CONTAINERD_STATE\"
disabled_plugins = [
  \"io.containerd.snapshotter.v1.aufs\",
  \"io.containerd.snapshotter.v1.btrfs\",
  \"io.containerd.snapshotter.v1.devmapper\",
  \"io.containerd.snapshotter.v1.zfs\",
  \"io.containerd.tracing.processor.v1.otlp\",
  \"io.containerd.internal.v1.tracing\",
]

[grpc]
  address = \"$SOCK\"

[ttrpc]
  address = \"$TTRPC_SOCK\"

[debug]
  address = \"\"
  level = \"info\"

[metrics]
  address = \"\"

[plugins.\"io.containerd.internal.v1.opt\"]
  path = \"$CONTAINERD_DIR/opt\"

[plugins.\"io.containerd.grpc.v1.cri\"]
  sandbox_image = \"$PAUSE_IMAGE\"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = \"127.0.0.1\"
  stream_server_port = \"0\"
  enable_selinux = false

  [plugins.\"io.containerd.grpc.v1.cri\".containerd]
    snapshotter = \"overlayfs\"
    default_runtime_name = \"runc\"

    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]
      runtime_type = \"io.containerd.runc.v2\"

      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]
        Root = \"$RUNC_ROOT\"
        SystemdCgroup = false

  [plugins.\"io.containerd.grpc.v1.cri\".cni]
    bin_dir = \"$CNI_BIN_DIR\"
    conf_dir = \"$CNI_CONF_DIR\"
    max_conf_num = 1

  [plugins.\"io.containerd.grpc.v1.cri\".registry]
    config_path = \"$CONTAINERD_CERTS_D\""

write_if_changed "$CONTAINERD_CONFIG" "$CONTAINERD_CONFIG_TEXT" && say "containerd: wrote $CONTAINERD_CONFIG"
config_hash=$(sha256sum "$CONTAINERD_CONFIG" | cut -d' ' -f1)
CONFIG_HASH_FILE=$NODELET_ENV_RUN/containerd.config.sha256

# ---------------------------------------------------------------------------------------------
# 6. containerd
# ---------------------------------------------------------------------------------------------
containerd_answers() {
    [[ -S $SOCK ]] && ctr --address "$SOCK" --connect-timeout 2s --timeout 5s version >/dev/null 2>&1
}

if [[ ! -f $IP_FORWARD_ORIG ]]; then
    cat /proc/sys/net/ipv4/ip_forward >"$IP_FORWARD_ORIG"
    say "ip_forward: recorded $(<"$IP_FORWARD_ORIG") in $IP_FORWARD_ORIG"
fi

if nodelet_pid_alive "$CONTAINERD_PIDFILE" "$CONTAINERD_CONFIG" &&
    [[ $(cat "$CONFIG_HASH_FILE" 2>/dev/null) == "$config_hash" ]] && containerd_answers; then
    say "containerd: already running (pid $(<"$CONTAINERD_PIDFILE"))"
else
    if nodelet_pid_alive "$CONTAINERD_PIDFILE" "$CONTAINERD_CONFIG"; then
        say "containerd: restarting (config changed or not answering; containers keep running)"
        nodelet_stop_pidfile "$CONTAINERD_PIDFILE" "$CONTAINERD_CONFIG" containerd
    fi
    containerd_answers && die "another containerd answers on $SOCK; stop it first"
    mkdir -p "$CONTAINERD_ROOT" "$CONTAINERD_STATE" "$RUNC_ROOT" "$(dirname "$SOCK")" "$CNI_IPAM_DIR"
    echo "$config_hash" >"$CONFIG_HASH_FILE"
    start_daemon "$CONTAINERD_PIDFILE" "$CONTAINERD_LOG" \
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        /usr/bin/containerd --config "$CONTAINERD_CONFIG"
    for ((i = 0; i < 300; i++)); do
        containerd_answers && break
        nodelet_pid_alive "$CONTAINERD_PIDFILE" "$CONTAINERD_CONFIG" ||
            { tail -n 30 "$CONTAINERD_LOG" >&2; die "containerd exited (log: $CONTAINERD_LOG)"; }
        sleep 0.1
    done
    containerd_answers || { tail -n 30 "$CONTAINERD_LOG" >&2; die "containerd does not answer on $SOCK"; }
    say "containerd: started (pid $(<"$CONTAINERD_PIDFILE"))"
fi

# ---------------------------------------------------------------------------------------------
# 7. Checks
# ---------------------------------------------------------------------------------------------
cri_line=$(ctr --address "$SOCK" --connect-timeout 5s plugins ls 2>/dev/null | awk '$1 == "io.containerd.grpc.v1" && $2 == "cri"')
if [[ $(awk '{ print $NF }' <<<"$cri_line") != ok ]]; then
    grep -i 'cri' "$CONTAINERD_LOG" | tail -n 20 >&2 || true
    die "CRI plugin did not load: '$cri_line' (log: $CONTAINERD_LOG)"
fi
say "containerd: CRI plugin ok"

# A raw gRPC call on the CRI socket with curl (HTTP/2 over the unix socket). The request body
# is a hand-encoded protobuf; prints the response body, fails unless grpc-status is 0.
cri_call() { # SERVICE/METHOD HEX_PROTOBUF
    local method=$1 msg=$2 tmp len
    tmp=$(mktemp -d)
    len=$((${#msg} / 2))
    {
        printf '\\x00\\x%02x\\x%02x\\x%02x\\x%02x' $((len >> 24 & 255)) $((len >> 16 & 255)) \
            $((len >> 8 & 255)) $((len & 255))
        # shellcheck disable=SC2001
        sed 's/../\\x&/g' <<<"$msg"
    } | tr -d '\n' >"$tmp/fmt"
    # shellcheck disable=SC2059
    printf "$(<"$tmp/fmt")" >"$tmp/req"
    if ! curl -s --max-time 60 --http2-prior-knowledge --unix-socket "$SOCK" \
        -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @"$tmp/req" \
        -D "$tmp/hdr" -o "$tmp/body" "http://localhost/$method" ||
        ! tr -d '\r' <"$tmp/hdr" | grep -qix 'grpc-status: 0'; then
        echo "CRI $method failed:" >&2
        tr -d '\r' <"$tmp/hdr" | grep -i '^grpc-' >&2 || true
        rm -rf "$tmp"
        return 1
    fi
    tr -c '[:print:]' ' ' <"$tmp/body"
    rm -rf "$tmp"
}

hex_str() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }
hex_len() { printf '%02x' "$1"; } # lengths here are < 128: one-byte varints
pull_request() { # IMAGE -> hex of runtime.v1.PullImageRequest{image: ImageSpec{image: IMAGE}}
    local img
    ((${#1} < 120)) || die "image name too long for this little encoder: $1"
    img=0a$(hex_len ${#1})$(hex_str "$1")
    printf '0a%s%s' "$(hex_len $((${#img} / 2)))" "$img"
}

# The CRI plugin initializes after containerd answers (it loads every container first):
# "server is not initialized yet" until then. Asked again for up to 30 s.
for ((i = 0; i < 60; i++)); do
    version=$(cri_call runtime.v1.RuntimeService/Version "" 2>"$NODELET_ENV_LOG/cri-version.err") && break
    grep -q "not initialized yet" "$NODELET_ENV_LOG/cri-version.err" ||
        { cat "$NODELET_ENV_LOG/cri-version.err" >&2; die "CRI Version call failed"; }
    sleep 0.5
done
[[ -n ${version:-} ]] || { cat "$NODELET_ENV_LOG/cri-version.err" >&2; die "CRI Version call failed (not initialized after 30 s)"; }
say "CRI: Version answers ($(grep -o 'containerd *v\?[0-9][0-9.]*' <<<"$version" | head -n1 | tr -s ' '))"

for image in "$BUSYBOX_IMAGE" "$PAUSE_IMAGE"; do
    start=$(date +%s%N)
    ctr --address "$SOCK" -n k8s.io images pull --hosts-dir "$CONTAINERD_CERTS_D" --plain-http \
        "$image" >"$NODELET_ENV_LOG/pull.log" 2>&1 ||
        { cat "$NODELET_ENV_LOG/pull.log" >&2; die "ctr pull $image failed"; }
    # And the same through the CRI, which uses containerd's own registry config.
    ref=$(cri_call runtime.v1.ImageService/PullImage "$(pull_request "$image")") ||
        die "CRI PullImage $image failed"
    ms=$((($(date +%s%N) - start) / 1000000))
    say "pull $image: ok via ctr and CRI ($(grep -o 'sha256:[0-9a-f]\{12\}' <<<"$ref" | head -n1), ${ms} ms)"
done

say "images: docker.io/library/busybox:{latest,1.36,1.35} (also busybox, busybox:1.36), registry.k8s.io/pause:3.9, registry.k8s.io/etcd:$ETCD_TAG, docker.io/nodelet-test/filler:gc (pulled by the tests that need it), all from $REGISTRY"
say "CRI endpoint: $NODELET_CRI_ENDPOINT"
