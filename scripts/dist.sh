#!/usr/bin/env bash
# The packaged binary, target/dist/nodelet: profile `dist` (optimised for size, one optimisation
# unit across crates), relative relocations packed (DT_RELR: 12 KB where RELA took 0.6 MB, all
# read at start), and the functions a node's life runs linked together at the start of the text,
# so that the kernel maps less of it (benches/text_order.rs; at 110 pods 5.9 MiB of text
# resident instead of 10, benches/README.md "text_order"). As root, on a machine where
# scripts/env/up.sh runs (it is run first): the order is measured by running the first build on
# the private containerd. About 10 minutes on 2 cores after the dependencies are built.
#   1. cargo rustc --profile dist: the build, as linked without an order;
#   2. benches/text_order.rs: that build lives 110 pods from a file system without read-ahead;
#      the functions in the pages it ran go to target/dist/text-order.txt;
#   3. cargo rustc --profile dist again, linked with that file (lld --symbol-ordering-file), and
#      checked: the functions listed lie together.
# Needs glibc 2.36 or later where it runs (DT_RELR), as Debian 12 has.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
[[ $(id -u) -eq 0 ]] || { echo "dist.sh: must run as root (the order is measured on the private containerd)" >&2; exit 1; }
T0=$SECONDS

bash "$HERE/env/up.sh"
cd "$REPO"
LINK=(-C link-arg=-Wl,-z,pack-relative-relocs)
ORDER=target/dist/text-order.txt
echo "dist.sh: 1/3 building (cargo rustc --profile dist)"
cargo rustc --quiet --profile dist --bin nodelet -- "${LINK[@]}"
# The order is given to the linker as lld reads it (--symbol-ordering-file); rustc links with its
# own lld on x86_64 Linux from Rust 1.90 on.
if ! readelf -p .comment target/dist/nodelet | grep -q 'Linker: LLD'; then
    echo "dist.sh: target/dist/nodelet was not linked by lld, which the text order needs:" \
        "use Rust 1.90 or later on x86_64 Linux (rustc's own lld), or install lld and set" \
        "RUSTFLAGS='-C link-arg=-fuse-ld=lld'" >&2
    exit 1
fi
echo "dist.sh: 2/3 the functions a node's life runs (benches/text_order.rs, about 2 minutes)"
NODELET_BIN=target/dist/nodelet TEXT_ORDER=$ORDER cargo bench --quiet --profile dev --bench text_order
echo "dist.sh: 3/3 linking them together"
cargo rustc --quiet --profile dist --bin nodelet -- "${LINK[@]}" \
    -C link-arg=-Wl,--symbol-ordering-file=$ORDER -C link-arg=-Wl,--no-warn-symbol-ordering
NODELET_BIN=target/dist/nodelet TEXT_ORDER=$ORDER TEXT_ORDER_CHECK=1 \
    cargo bench --quiet --profile dev --bench text_order
echo "dist.sh: target/dist/nodelet in $((SECONDS - T0)) s"
