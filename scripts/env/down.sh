#!/usr/bin/env bash
# Tear the nodelet test environment down (the reverse of up.sh), as root:
#   - kill and remove every task and container in the private containerd (CRI pods included),
#   - stop containerd and the local registry,
#   - unmount what is left under containerd's state and root dirs (pod netns, shm, rootfs),
#   - delete the CNI bridge and its IP allocations, put net.ipv4.ip_forward back.
# Built images, containerd's content/snapshots and the registry storage are kept so the next
# up.sh is fast; `down.sh --purge` removes /var/lib/nodelet-env (and our run and log dirs) too.
# Idempotent.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

die() { echo "down.sh: $*" >&2; exit 1; }
say() { nodelet_say "$@"; }

PURGE=
for arg in "$@"; do
    case $arg in
    --purge) PURGE=1 ;;
    -h | --help)
        sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument: $arg (only --purge)" ;;
    esac
done

[[ $(id -u) -eq 0 ]] || die "must run as root"

if [[ -d $NODELET_ENV_RUN ]]; then
    exec 9>"$NODELET_ENV_RUN/lock"
    flock -w 120 9 || die "another up.sh/down.sh holds $NODELET_ENV_RUN/lock"
fi

have() { command -v "$1" >/dev/null 2>&1; }

# The cluster-mode control plane (cluster.sh), if it runs.
bash "$HERE/cluster.sh" down >/dev/null

containerd_answers() {
    [[ -S $SOCK ]] && have ctr &&
        ctr --address "$SOCK" --connect-timeout 2s --timeout 5s version >/dev/null 2>&1
}


# Pids of the containerd shims that belong to our containerd.
our_shims() {
    local d cmd
    for d in /proc/[0-9]*; do
        [[ -r $d/cmdline ]] || continue
        cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
        [[ $cmd == *containerd-shim* && $cmd == *"-address $SOCK "* ]] && echo "${d#/proc/}"
    done
    return 0
}

# Mount points at or under one of the given directories, deepest first.
mounts_under() {
    local dir
    for dir in "$@"; do
        # mountinfo field 5 is the mount point, with space, tab, newline, backslash as \ooo.
        awk -v d="$dir" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' \
            /proc/self/mountinfo
    done | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2- | uniq
}

# ---------------------------------------------------------------------------------------------
# 1. Tasks and containers (CRI pods are containers in the k8s.io namespace)
# ---------------------------------------------------------------------------------------------
if containerd_answers; then
    c() { ctr --address "$SOCK" --connect-timeout 5s --timeout 30s "$@"; }
    for ns in $(c namespaces ls -q 2>/dev/null); do
        tasks=$(c -n "$ns" tasks ls -q 2>/dev/null || true)
        for t in $tasks; do
            c -n "$ns" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        for t in $tasks; do
            # Wait for the kill to land, then delete (a force delete if it is still running).
            for ((i = 0; i < 50; i++)); do
                status=$(c -n "$ns" tasks ls 2>/dev/null | awk -v t="$t" '$1 == t { print $3 }')
                [[ $status == RUNNING || $status == PAUSED || $status == PAUSING ]] || break
                sleep 0.1
            done
            c -n "$ns" tasks rm -f "$t" >/dev/null 2>&1 || true
        done
        containers=$(c -n "$ns" containers ls -q 2>/dev/null || true)
        for ctrid in $containers; do
            c -n "$ns" containers rm "$ctrid" >/dev/null 2>&1 ||
                say "containers: could not remove $ns/$ctrid"
        done
        n_t=$(wc -w <<<"$tasks")
        n_c=$(wc -w <<<"$containers")
        say "containers: namespace $ns: killed $n_t task(s), removed $n_c container(s)"
    done
else
    say "containers: containerd does not answer, nothing to remove through it"
fi

# ---------------------------------------------------------------------------------------------
# 2. containerd, left-over shims and runc containers, the registry
# ---------------------------------------------------------------------------------------------
nodelet_stop_pidfile "$CONTAINERD_PIDFILE" "$CONTAINERD_CONFIG" containerd
rm -f "$NODELET_ENV_RUN/containerd.config.sha256"

# Containers whose shim or containerd died: kill them through runc with our runc root.
if have runc && [[ -d $RUNC_ROOT ]]; then
    for root in "$RUNC_ROOT"/*/; do
        [[ -d $root ]] || continue
        for id in $(runc --root "$root" list -q 2>/dev/null || true); do
            runc --root "$root" kill "$id" KILL >/dev/null 2>&1 || true
            runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
            say "runc: removed left-over container $id"
        done
    done
fi
shims=$(our_shims)
if [[ -n $shims ]]; then
    # shellcheck disable=SC2086
    kill -KILL $shims 2>/dev/null || true
    say "shims: killed left-over $(wc -w <<<"$shims") shim(s)"
    sleep 0.2
fi

nodelet_stop_pidfile "$REGISTRY_PIDFILE" "$REGISTRY_CONFIG" registry
nodelet_stop_pidfile "$PRIVATE_REGISTRY_PIDFILE" "$PRIVATE_REGISTRY_CONFIG" "private registry"

# ---------------------------------------------------------------------------------------------
# 3. Mounts (pod netns, sandbox shm, container rootfs) and containerd's runtime state
# ---------------------------------------------------------------------------------------------
mounts=$(mounts_under "$CONTAINERD_STATE" "$CONTAINERD_ROOT" "$NODELET_ENV_RUN")
n=0
while IFS= read -r m; do
    [[ -n $m ]] || continue
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "mounts: could not unmount $m"
    n=$((n + 1))
done <<<"$mounts"
say "mounts: unmounted $n"

if [[ -z $(our_shims) && -z $(mounts_under "$CONTAINERD_STATE") ]]; then
    rm -rf "$CONTAINERD_STATE" "$RUNC_ROOT"
    rm -f "$SOCK" "$TTRPC_SOCK"
else
    say "state: shims or mounts remain, keeping $CONTAINERD_STATE"
fi

# Empty cgroups that runc leaves behind (it removes only a container's own leaf): every
# hierarchy's $NODELET_CGROUP_PARENTS subtrees, deepest first. rmdir only ever removes an empty
# cgroup, so one that still has processes stays.
n=0
for parent in $NODELET_CGROUP_PARENTS; do
    for dir in /sys/fs/cgroup/"${parent#/}" /sys/fs/cgroup/*/"${parent#/}"; do
        [[ -d $dir ]] || continue
        while IFS= read -r d; do
            rmdir "$d" 2>/dev/null && n=$((n + 1))
        done < <(find "$dir" -depth -type d 2>/dev/null)
    done
done
say "cgroups: removed $n empty cgroup dir(s) under: $NODELET_CGROUP_PARENTS"

# ---------------------------------------------------------------------------------------------
# 4. Network: bridge, IP allocations, ip_forward
# ---------------------------------------------------------------------------------------------
if have ip && ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    ip link delete "$CNI_BRIDGE"
    say "network: deleted bridge $CNI_BRIDGE"
else
    say "network: no bridge $CNI_BRIDGE"
fi
# The pods were killed without a CNI DEL: their host-local allocations are stale.
rm -rf "$CNI_IPAM_DIR"

if [[ -f $IP_FORWARD_ORIG ]]; then
    orig=$(<"$IP_FORWARD_ORIG")
    if [[ $orig == 0 || $orig == 1 ]]; then
        echo "$orig" >/proc/sys/net/ipv4/ip_forward
        say "network: net.ipv4.ip_forward restored to $orig"
    fi
    rm -f "$IP_FORWARD_ORIG"
fi

# The benchmarks' file system (benches/agent/mod.rs, bench_fs: a loop-mounted ext4 image under
# $NODELET_ENV_LIB), if mounted; the image is kept for the next benchmark.
if mountpoint -q "$NODELET_ENV_RUN/benchfs" 2>/dev/null; then
    umount "$NODELET_ENV_RUN/benchfs"
    say "benchmarks: unmounted $NODELET_ENV_RUN/benchfs"
fi

# ---------------------------------------------------------------------------------------------
# 5. --purge
# ---------------------------------------------------------------------------------------------
if [[ -n $PURGE ]]; then
    left=$(mounts_under "$NODELET_ENV_LIB" "$NODELET_ENV_RUN")
    [[ -z $left ]] || die "--purge: still mounted, not removing anything: $left"
    rm -rf "$NODELET_ENV_LIB" "$NODELET_ENV_LOG"
    # The lock file is ours and held: remove the rest of the run dir around it.
    find "$NODELET_ENV_RUN" -mindepth 1 -maxdepth 1 ! -name lock -exec rm -rf {} + 2>/dev/null || true
    rm -f "$NODELET_ENV_RUN/lock"
    rmdir "$NODELET_ENV_RUN" 2>/dev/null || true
    say "purge: removed $NODELET_ENV_LIB, $NODELET_ENV_RUN and $NODELET_ENV_LOG"
fi

say "environment is down"
