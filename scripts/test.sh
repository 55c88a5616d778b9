#!/usr/bin/env bash
# Command 2 of the README: run every test. Brings the environment up first (idempotent), because
# the integration tests drive the real containerd it starts. Unit tests need nothing. Formatting
# (cargo fmt --check) and lints (cargo clippy, warnings are errors) are checked before the tests;
# either failing fails the run.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
[[ $(id -u) -eq 0 ]] || { echo "test.sh: must run as root (containerd, cgroups)" >&2; exit 1; }

bash "$HERE/env/up.sh"
# The control plane of the cluster-mode tests (tests/cluster.rs): etcd and kube-apiserver v1.20,
# built once per machine (about 8 minutes the first time).
bash "$HERE/env/cluster.sh"
# shellcheck source=env/common.sh
. "$HERE/env/common.sh"
cd "$REPO"
echo "test.sh: cargo fmt --check"
cargo fmt --check
echo "test.sh: cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
cargo build --benches --quiet
cargo test --no-fail-fast "$@"
