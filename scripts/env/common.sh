# shellcheck shell=bash
# shellcheck disable=SC2034  # variables used by the scripts that source this file
# Shared settings of the nodelet test environment (a private containerd with its CRI plugin,
# a local registry, our own images). Sourced by up.sh, down.sh and the test scripts; it only
# sets variables and defines helpers, it changes nothing on the machine.

NODELET_ENV_LIB=/var/lib/nodelet-env        # kept across down.sh (except --purge)
NODELET_ENV_RUN=/run/nodelet-env            # runtime state, pid files, sockets
NODELET_ENV_LOG=/var/log/nodelet-env

# Images we build (OCI layouts) and the local registry serving them.
NODELET_IMAGES_DIR=$NODELET_ENV_LIB/images
REGISTRY=127.0.0.1:5000
REGISTRY_DIR=$NODELET_ENV_LIB/registry
REGISTRY_CONFIG=$REGISTRY_DIR/config.yml
REGISTRY_PIDFILE=$NODELET_ENV_RUN/registry.pid
REGISTRY_LOG=$NODELET_ENV_LOG/registry.log
# The same images behind a password (docker-registry's htpasswd auth), for pulls with registry
# credentials (imagePullSecrets): containerd reaches $PRIVATE_REGISTRY_NAME at this address.
PRIVATE_REGISTRY=127.0.0.1:5001
PRIVATE_REGISTRY_NAME=private.registry.test
PRIVATE_REGISTRY_USER=nodelet
PRIVATE_REGISTRY_PASSWORD=registry-pass
PRIVATE_REGISTRY_CONFIG=$REGISTRY_DIR/private.yml
PRIVATE_REGISTRY_PIDFILE=$NODELET_ENV_RUN/private-registry.pid
PRIVATE_REGISTRY_LOG=$NODELET_ENV_LOG/private-registry.log

# The private containerd.
CONTAINERD_DIR=$NODELET_ENV_LIB/containerd
CONTAINERD_CONFIG=$CONTAINERD_DIR/config.toml
CONTAINERD_ROOT=$CONTAINERD_DIR/root
CONTAINERD_STATE=$NODELET_ENV_RUN/containerd/state
CONTAINERD_CERTS_D=$CONTAINERD_DIR/certs.d
CONTAINERD_PIDFILE=$NODELET_ENV_RUN/containerd.pid
CONTAINERD_LOG=$NODELET_ENV_LOG/containerd.log
RUNC_ROOT=$NODELET_ENV_RUN/runc
SOCK=$NODELET_ENV_RUN/containerd/containerd.sock
TTRPC_SOCK=$SOCK.ttrpc

# CNI: binaries from Debian's containernetworking-plugins, config and IPAM state of our own.
CNI_BIN_DIR=/usr/lib/cni
CNI_CONF_DIR=$NODELET_ENV_LIB/cni/net.d
CNI_IPAM_DIR=$NODELET_ENV_LIB/cni/networks
CNI_NETWORK_NAME=nodelet
CNI_BRIDGE=nodelet0
CNI_SUBNET=10.88.0.0/16
IP_FORWARD_ORIG=$NODELET_ENV_LIB/ip_forward.orig

# Top-level cgroups (in every hierarchy) whose empty leftovers down.sh removes: runc removes only
# a container's leaf, and `ctr -n k8s.io run` uses /k8s.io/<id>. Set it before sourcing to add
# the agent's own cgroup root.
NODELET_CGROUP_PARENTS=${NODELET_CGROUP_PARENTS:-"k8s.io kubepods nodelet"}

# Image names that resolve (through the hosts.toml mirrors) to the local registry.
PAUSE_IMAGE=registry.k8s.io/pause:3.9
BUSYBOX_IMAGE=docker.io/library/busybox:1.36

NODELET_CRI_ENDPOINT=unix://$SOCK

export NODELET_ENV_LIB NODELET_ENV_RUN NODELET_ENV_LOG NODELET_IMAGES_DIR REGISTRY REGISTRY_DIR \
    PRIVATE_REGISTRY PRIVATE_REGISTRY_NAME PRIVATE_REGISTRY_USER PRIVATE_REGISTRY_PASSWORD \
    CONTAINERD_CONFIG CONTAINERD_ROOT CONTAINERD_STATE CONTAINERD_CERTS_D RUNC_ROOT SOCK \
    NODELET_CGROUP_PARENTS CNI_BIN_DIR CNI_CONF_DIR CNI_IPAM_DIR CNI_NETWORK_NAME CNI_BRIDGE CNI_SUBNET \
    PAUSE_IMAGE BUSYBOX_IMAGE NODELET_CRI_ENDPOINT

# ctr against the private containerd, e.g. `nodelet_ctr -n k8s.io images ls`.
nodelet_ctr() {
    ctr --address "$SOCK" "$@"
}

# True if the pid in pid file $1 is alive and its command line contains $2.
nodelet_pid_alive() {
    local pidfile=$1 needle=$2 pid i cmd=
    [[ -r $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    # A process's command line reads empty for a moment while it execs (start_daemon's shell
    # writes the pid file, then execs env, which execs the daemon), and always for a zombie:
    # read it again a few times before saying no.
    for ((i = 0; i < 5; i++)); do
        [[ -r /proc/$pid/cmdline ]] || return 1
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
        [[ -n $cmd ]] && break
        sleep 0.02
    done
    [[ $cmd == *"$needle"* ]]
}

# nodelet_stop_pidfile PIDFILE CMDLINE_NEEDLE NAME: SIGTERM, wait up to 15 s, then SIGKILL.
nodelet_stop_pidfile() {
    local pidfile=$1 needle=$2 name=$3 pid i
    if ! nodelet_pid_alive "$pidfile" "$needle"; then
        rm -f "$pidfile"
        nodelet_say "$name: not running"
        return 0
    fi
    pid=$(<"$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        nodelet_pid_alive "$pidfile" "$needle" || break
        sleep 0.1
    done
    if nodelet_pid_alive "$pidfile" "$needle"; then
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
        nodelet_say "$name: stopped (SIGKILL, pid $pid)"
    else
        nodelet_say "$name: stopped (pid $pid)"
    fi
    rm -f "$pidfile"
}

# Print a step line.
nodelet_say() {
    printf '%s\n' "$*"
}
