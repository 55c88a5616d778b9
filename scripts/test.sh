#!/usr/bin/env bash
# Command 2 of the README: run every test, in two stages.
#
# 1. The fast stage needs neither root nor containerd, only protoc (installed first on a bare
#    machine run as root; about 3 minutes on 2 cores from a cold cache, seconds after):
#    formatting (cargo fmt --check), lints (cargo clippy, warnings are errors; clippy.toml and
#    Cargo.toml's [lints] hold the project's own rules), the API docs (cargo doc, warnings are
#    errors) and the unit tests. A failure here stops the run.
# 2. The integration stage brings the environment up (idempotent) and drives the real containerd
#    it starts: every test target, then the cgroup v2 test set in the guest.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"

# A one-shot build: no incremental caches (they added 1.3 GB to a clean run's target/). Set
# CARGO_INCREMENTAL=1 to keep them between runs of your own.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# A clean run fills about NEED_GB of target/ (Cargo.toml's [profile.dev] keeps line tables only);
# a machine with less free says so before the build, not with a linker's bus error after it.
NEED_GB=5
target=${CARGO_TARGET_DIR:-$REPO/target}
mkdir -p "$target"
free_gb=$(df --output=avail -BG "$target" | tail -1 | tr -dc 0-9)
if ((free_gb < NEED_GB)); then
    echo "test.sh: WARNING: ${free_gb} GB free on the filesystem of $target, a clean run needs" \
        "about ${NEED_GB} GB: free space there or set CARGO_TARGET_DIR to a larger filesystem" >&2
fi

# The build needs protoc (containerd-client's build script makes its gRPC code with it). On a
# bare machine, as root, the environment's package step installs it (and the rest of what the
# integration stage needs) first.
if ! command -v protoc >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then
        bash "$HERE/env/up.sh" --packages
    else
        echo "test.sh: the build needs protoc: apt-get install protobuf-compiler (or run" \
            "scripts/env/up.sh as root, which installs it)" >&2
        exit 1
    fi
fi

echo "test.sh: fast stage: cargo fmt --check"
cargo fmt --check
echo "test.sh: fast stage: cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
echo "test.sh: fast stage: cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
echo "test.sh: fast stage: unit tests"
cargo test --lib --quiet

echo "test.sh: integration stage"
[[ $(id -u) -eq 0 ]] || { echo "test.sh: the integration stage must run as root (containerd, cgroups)" >&2; exit 1; }
bash "$HERE/env/up.sh"
# The control plane of the cluster-mode tests (tests/cluster.rs): etcd and kube-apiserver v1.20,
# built once per machine (about 8 minutes the first time).
bash "$HERE/env/cluster.sh"
# shellcheck source=env/common.sh
. "$HERE/env/common.sh"
cd "$REPO"
# The benchmarks are built (not run) so that they cannot rot.
cargo build --benches --quiet
rc=0
cargo test --no-fail-fast "$@" || rc=$?

# Months of uptime in three minutes (benches/churn.rs): a pod created and removed every 2 s
# beside crash-looping and log-rotating pods; the node must end where it started (sandboxes,
# containers, images, cgroups, pod and log directories, the agent's descriptors and threads)
# with the agent's RSS grown less than 1 MiB. The debug build (the one just tested), nodelet
# alone: the comparison with kubelet is the benchmark's own run (benches/README.md, "churn").
if [[ $# -eq 0 ]]; then
    echo "test.sh: the churn benchmark, 3-minute form"
    CHURN_SECONDS=180 CHURN_PEER=0 cargo bench --profile dev --bench churn || rc=1
fi

# The cgroup v2 test set (tests/modern_node.rs, ignored on this cgroup v1 host) runs in a Debian
# guest with cgroup v2 alone and systemd as PID 1 (scripts/env/vm.sh): the guest image is built
# once per machine, booted afresh (15-45 s under software emulation), and shut down after.
# NODELET_SKIP_VM=1 leaves it out (the run then says so).
if [[ ${NODELET_SKIP_VM:-} == 1 ]]; then
    echo "test.sh: SKIPPED the cgroup v2 guest test set (NODELET_SKIP_VM=1)"
else
    bin=$(cargo test --test modern_node --no-run 2>&1 |
        sed -n 's/.*Executable tests\/modern_node.rs (\(.*\))/\1/p')
    [[ -n $bin ]] || { echo "test.sh: cannot find the modern_node test binary" >&2; exit 1; }
    bash "$HERE/env/vm.sh" down >/dev/null # a guest an interrupted run left
    bash "$HERE/env/vm.sh" build
    trap 'bash "$HERE/env/vm.sh" down >/dev/null 2>&1 || true' EXIT
    bash "$HERE/env/vm.sh" up
    echo "test.sh: the cgroup v2 test set in the guest ($bin)"
    VM_EXEC_TIMEOUT=1500 bash "$HERE/env/vm.sh" exec \
        "cd '$REPO' && NODELET_CRI_ENDPOINT=unix:///run/containerd-cgroupfs/containerd.sock '$bin' --ignored --test-threads 1" ||
        rc=1
    # Last, from the host: nodelet as the guest's systemd service, and a poweroff that waits for
    # the pods (tests/node_shutdown.rs powers the guest off).
    echo "test.sh: nodelet under the guest's systemd, and graceful node shutdown"
    cargo test --test node_shutdown -- --ignored || rc=1
    bash "$HERE/env/vm.sh" down
fi
exit "$rc"
