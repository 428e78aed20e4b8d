#!/usr/bin/env bash
# Packs what one device session needs into the git-ignored .carry2/final/ (run here, where Rust
# is): the release `gdn` and the GPU test binaries with `--features cuda`, stripped and xz'd,
# session.sh and shapes.json. Then, on the device:
#   run(command="source .gl/prelude.sh && bash .carry2/final/session.sh", carry=[".gl", ".carry2", ".whl"])
set -eu
root=$(git rev-parse --show-toplevel); cd "$root"
out=.carry2/final; rm -rf "$out"; mkdir -p "$out"
# BASE=<rev>: also `gdn` of that revision (as gdn-base), for session.sh's `ab` stage, built from
# a temporary worktree into the same target folder (so only the crate itself is rebuilt).
if [ -n "${BASE:-}" ]; then
    base_tree=$(mktemp -d); git worktree add --detach "$base_tree" "$BASE" >/dev/null
    (cd "$base_tree" && CARGO_TARGET_DIR="$root/target" cargo build --release --features cuda -p gdn-cli)
    cp target/release/gdn "$out/gdn-base"; git rev-parse --short "$BASE" > "$out/gdn-base.rev"
    git worktree remove --force "$base_tree"
    # The worktree's crates get the same artifact names and newer fingerprints than this
    # tree's sources, so cargo would take them as this tree's (2026-12-03: a `gdn` that was
    # the base): drop them, so that the build below is of this tree.
    cargo clean --release -p gdn-wgpu -p gdn-cli
fi
cargo build --release --features cuda -p gdn-cli
cp target/release/gdn "$out/gdn"; git rev-parse --short HEAD > "$out/gdn.rev"
# The test binaries' paths, from cargo's own report of what it built.
cargo test --release --features cuda --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
        case "$name" in cuda|forward|backward|segment_window|decode) cp "$exe" "$out/$name-bin" ;; esac
    done
bins=("$out"/gdn "$out"/*-bin); [ -f "$out/gdn-base" ] && bins+=("$out/gdn-base")
strip "${bins[@]}"
xz -T2 -6 "${bins[@]}"
cp benches/device/session.sh benches/device/shapes.json "$out/"
[ -f .carry2/triton-cache.tar.xz ] && cp .carry2/triton-cache.tar.xz "$out/"
du -sh "$out"; ls "$out"
