#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for nodelet's cluster-mode tests, as root:
#   - kube-apiserver v1.20 built from Debian's `kubernetes` source package (bookworm, with its
#     vendored Go dependencies and Debian's Go), once per machine, into a cache kept across
#     down.sh (about 8 minutes on 2 cores the first time);
#   - etcd from Debian's etcd-server package (the copy up.sh unpacks), kubectl from
#     kubernetes-client;
#   - certificates made by openssl: a CA, the apiserver's serving certificate, an admin client
#     (group system:masters) and, on request, a node client (system:node:<name> in system:nodes);
#   - etcd on 127.0.0.1:22379 (clear of kubeadm's 2379 and tests/kubeadm_etcd.rs's 12379) and
#     kube-apiserver on https://127.0.0.1:16443 with the Node and RBAC authorizers and the
#     NodeRestriction admission plugin; the `default` ServiceAccount (there is no controller
#     manager to create it).
# Usage:
#   cluster.sh                        bring it up (idempotent); prints the admin kubeconfig path
#   cluster.sh node-kubeconfig NAME   print the path of a kubeconfig for node NAME (made once)
#   cluster.sh apiserver-start PORT   one more kube-apiserver on PORT (16444-16499), same etcd:
#                                     for a test that stops its apiserver without stopping others'
#   cluster.sh apiserver-stop PORT    stop it
#   cluster.sh down                   stop etcd and every kube-apiserver, drop etcd's data
# Needs up.sh to have run (it unpacks etcd). Logs: /var/log/nodelet-env/{etcd,kube-apiserver}.log.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

die() { echo "cluster.sh: $*" >&2; exit 1; }
say() { nodelet_say "$@"; }

[[ $(id -u) -eq 0 ]] || die "must run as root"

CLUSTER_DIR=$NODELET_ENV_LIB/cluster
PKI=$CLUSTER_DIR/pki
BUILD=$CLUSTER_DIR/build
APISERVER_BIN=$CLUSTER_DIR/bin/kube-apiserver
ETCD_BIN=$NODELET_IMAGES_DIR/build/etcd-server/usr/bin/etcd
ETCD_DATA=$NODELET_ENV_RUN/cluster/etcd
ETCD_PIDFILE=$NODELET_ENV_RUN/cluster/etcd.pid
APISERVER_PIDFILE=$NODELET_ENV_RUN/cluster/kube-apiserver.pid
ADMIN_KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
SERVER=https://127.0.0.1:16443

running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() { # PIDFILE
    if running "$1"; then
        local pid
        pid=$(cat "$1")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

# A key and a certificate signed by the CA: NAME SUBJECT [EXTENSIONS]
issue() {
    local name=$1 subj=$2 ext=${3:-}
    [[ -s $PKI/$name.crt ]] && return 0
    openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
    openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    local extfile=$PKI/$name.ext
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" >"$extfile"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 3650 -extfile "$extfile" -out "$PKI/$name.crt.tmp" 2>/dev/null
    mv "$PKI/$name.crt.tmp" "$PKI/$name.crt"
}

# A kubeconfig with the certificates inline: FILE CERT-NAME USER
kubeconfig() {
    local file=$1 name=$2 user=$3
    cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodelet-test
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: $user@nodelet-test
  context: {cluster: nodelet-test, user: $user}
current-context: $user@nodelet-test
EOF
    chmod 0600 "$file.tmp"
    mv "$file.tmp" "$file"
}

# One writer of the PKI at a time: tests ask for node credentials in parallel (openssl's serial
# file). Held on fd 8 until pki_unlock, which must come before any daemon is started: a daemon
# would inherit fd 8 and hold the lock for as long as it runs.
pki_lock() {
    mkdir -p "$CLUSTER_DIR"
    exec 8>"$CLUSTER_DIR/pki.lock"
    flock -w 60 8 || die "another cluster.sh holds $CLUSTER_DIR/pki.lock"
}
pki_unlock() { exec 8>&-; }

pki() { # with pki_lock held
    mkdir -p "$PKI"
    chmod 0700 "$PKI"
    if [[ ! -s $PKI/ca.crt ]]; then
        openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
            -days 3650 -subj /CN=nodelet-test-ca 2>/dev/null
    fi
    issue apiserver /CN=kube-apiserver \
        "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    issue admin "/O=system:masters/CN=nodelet-test-admin" "extendedKeyUsage=clientAuth"
    # The API server's client certificate to the nodes' API (logs, exec, port-forward), as
    # kubeadm's apiserver-kubelet-client; nodes trust the cluster CA (clientCAFile).
    issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
    [[ -s $PKI/sa.key ]] || openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    [[ -s $PKI/sa.pub ]] || openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    [[ -s $ADMIN_KUBECONFIG ]] || kubeconfig "$ADMIN_KUBECONFIG" admin nodelet-test-admin
    # A static bearer token (user token-user, no RBAC rights): what the nodes' API checks with a
    # TokenReview in tests/cluster.rs.
    [[ -s $PKI/tokens.csv ]] || echo "nodelet-test-token-$(openssl rand -hex 16),token-user,token-user-uid,token-group" >"$PKI/tokens.csv"
}

node_kubeconfig() { # NAME
    local name=$1
    [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ && ${#name} -le 253 ]] || die "not a node name: $name"
    pki_lock
    pki
    mkdir -p "$CLUSTER_DIR/nodes"
    local file=$CLUSTER_DIR/nodes/$name.kubeconfig
    if [[ ! -s $file ]]; then
        issue "node-$name" "/O=system:nodes/CN=system:node:$name" "extendedKeyUsage=clientAuth"
        kubeconfig "$file" "node-$name" "system:node:$name"
    fi
    pki_unlock
    echo "$file"
}

# Debian's source packages for `apt-get source`: our own deb-src entry, unless another file
# already has one for bookworm (the kubelet peer's script adds its own; two make apt warn "Target
# Sources ... is configured multiple times" on every update), in which case ours is removed.
ensure_deb_src() {
    local ours=/etc/apt/sources.list.d/nodelet-deb-src.sources others
    others=$(grep -lsE '^[[:space:]]*(Types:.*deb-src|deb-src[[:space:]].*bookworm)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources |
        grep -vxF "$ours" | xargs -r grep -lw bookworm || true)
    if [[ -n $others ]]; then
        if [[ -f $ours ]]; then
            rm -f "$ours"
            apt-get update -q >/dev/null || die "apt-get update failed"
        fi
        return 0
    fi
    [[ -f $ours ]] && return 0
    cat >"$ours" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt-get update -q >/dev/null || die "apt-get update failed"
}

build_apiserver() {
    local want=1.20
    if [[ -x $APISERVER_BIN ]] && "$APISERVER_BIN" --version 2>/dev/null | grep -q "v$want\."; then
        return 0
    fi
    say "kube-apiserver: building from Debian's kubernetes source package (once per machine, ~8 min)"
    ensure_deb_src
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        golang-go rsync jq dpkg-dev >/dev/null || die "cannot install the Go toolchain"
    rm -rf "$BUILD"
    mkdir -p "$BUILD"
    (cd "$BUILD" && apt-get source -q kubernetes >"$NODELET_ENV_LOG/kubernetes-source.log" 2>&1) ||
        die "apt-get source kubernetes failed (see $NODELET_ENV_LOG/kubernetes-source.log)"
    local tree
    tree=$(find "$BUILD" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n1)
    [[ -n $tree ]] || die "no source tree after apt-get source"
    # As Debian's debian/rules: GOPATH inside the tree, the tree linked as k8s.io/kubernetes.
    mkdir -p "$tree/.go/src/k8s.io"
    ln -sfn ../../.. "$tree/.go/src/k8s.io/kubernetes"
    (cd "$tree" && env GOPATH="$tree/.go" CGO_ENABLED=0 HOME="$BUILD/home" \
        PATH=/usr/lib/go/bin:$PATH make WHAT=cmd/kube-apiserver) \
        >"$NODELET_ENV_LOG/kube-apiserver-build.log" 2>&1 ||
        die "kube-apiserver build failed (see $NODELET_ENV_LOG/kube-apiserver-build.log)"
    mkdir -p "$(dirname "$APISERVER_BIN")"
    cp "$tree/_output/bin/kube-apiserver" "$APISERVER_BIN"
    rm -rf "$BUILD"
    say "kube-apiserver: $("$APISERVER_BIN" --version)"
}

admin_curl() { # PATH
    curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$SERVER$1"
}

# Ephemeral containers (`kubectl debug`) are alpha in 1.20: the ephemeralcontainers subresource
# exists only with the gate.
APISERVER_GATES=--feature-gates=EphemeralContainers=true

# kube-apiserver on PORT against the etcd, if not running; waits until it is ready.
start_apiserver() { # PORT PIDFILE LOG
    local port=$1 pidfile=$2 log=$3 start
    # One started before its flags changed (the feature gates below) is started again.
    if running "$pidfile" && ! tr '\0' ' ' <"/proc/$(cat "$pidfile")/cmdline" | grep -q -- "$APISERVER_GATES"; then
        say "kube-apiserver: restarting on :$port (its flags changed)"
        stop "$pidfile"
    fi
    if ! running "$pidfile"; then
        "$APISERVER_BIN" --etcd-servers=http://127.0.0.1:22379 \
            --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" --insecure-port=0 \
            --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
            --client-ca-file="$PKI/ca.crt" \
            --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
            --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
            --kubelet-preferred-address-types=InternalIP,Hostname \
            --token-auth-file="$PKI/tokens.csv" \
            --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
            --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
            --service-account-issuer=https://kubernetes.default.svc.cluster.local \
            --service-cluster-ip-range=10.96.0.0/12 --allow-privileged=true \
            "$APISERVER_GATES" \
            >"$log" 2>&1 &
        echo $! >"$pidfile"
        say "kube-apiserver: started on https://127.0.0.1:$port"
    fi
    start=$(date +%s)
    until curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
        "https://127.0.0.1:$port/readyz" >/dev/null; do
        running "$pidfile" || die "kube-apiserver exited (see $log)"
        (($(date +%s) - start < 90)) || die "kube-apiserver not ready in 90 s"
        sleep 0.5
    done
}

extra_port() { # PORT: one of the ports tests may use for their own apiserver
    [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 16444 && $1 <= 16499)) ||
        die "extra apiserver port must be 16444-16499, got: $1"
}

up() {
    [[ -x $ETCD_BIN ]] || die "no etcd at $ETCD_BIN: run scripts/env/up.sh first"
    command -v kubectl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends kubernetes-client >/dev/null || die "cannot install kubectl"
    command -v openssl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >/dev/null
    build_apiserver
    pki_lock
    pki
    pki_unlock
    mkdir -p "$NODELET_ENV_RUN/cluster" "$NODELET_ENV_LOG"
    if ! running "$ETCD_PIDFILE"; then
        rm -rf "$ETCD_DATA"
        mkdir -p "$ETCD_DATA"
        "$ETCD_BIN" --name nodelet-test --data-dir "$ETCD_DATA" \
            --listen-client-urls http://127.0.0.1:22379 --advertise-client-urls http://127.0.0.1:22379 \
            --listen-peer-urls http://127.0.0.1:22380 --initial-advertise-peer-urls http://127.0.0.1:22380 \
            --initial-cluster nodelet-test=http://127.0.0.1:22380 \
            >"$NODELET_ENV_LOG/etcd.log" 2>&1 &
        echo $! >"$ETCD_PIDFILE"
        say "etcd: started on 127.0.0.1:22379"
    fi
    start_apiserver 16443 "$APISERVER_PIDFILE" "$NODELET_ENV_LOG/kube-apiserver.log"
    # No controller manager: the ServiceAccount admission plugin refuses pods until it exists.
    kubectl --kubeconfig "$ADMIN_KUBECONFIG" -n default get serviceaccount default >/dev/null 2>&1 ||
        kubectl --kubeconfig "$ADMIN_KUBECONFIG" -n default create serviceaccount default >/dev/null
    say "cluster: ready ($(admin_curl /version | jq -r .gitVersion)); admin kubeconfig $ADMIN_KUBECONFIG"
}

case ${1:-up} in
up) up ;;
node-kubeconfig)
    [[ $# -eq 2 ]] || die "usage: cluster.sh node-kubeconfig NAME"
    node_kubeconfig "$2"
    ;;
apiserver-start)
    [[ $# -eq 2 ]] || die "usage: cluster.sh apiserver-start PORT"
    extra_port "$2"
    running "$ETCD_PIDFILE" || die "etcd is not running: run cluster.sh first"
    mkdir -p "$NODELET_ENV_RUN/cluster" "$NODELET_ENV_LOG"
    start_apiserver "$2" "$NODELET_ENV_RUN/cluster/kube-apiserver-$2.pid" "$NODELET_ENV_LOG/kube-apiserver-$2.log"
    ;;
apiserver-stop)
    [[ $# -eq 2 ]] || die "usage: cluster.sh apiserver-stop PORT"
    extra_port "$2"
    stop "$NODELET_ENV_RUN/cluster/kube-apiserver-$2.pid"
    ;;
down)
    for f in "$NODELET_ENV_RUN"/cluster/kube-apiserver-*.pid; do [[ -e $f ]] && stop "$f"; done
    stop "$APISERVER_PIDFILE"
    stop "$ETCD_PIDFILE"
    rm -rf "$ETCD_DATA"
    say "cluster: stopped"
    ;;
*) die "unknown command: $1 (up, node-kubeconfig NAME, apiserver-start PORT, apiserver-stop PORT, down)" ;;
esac
