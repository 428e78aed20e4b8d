#!/usr/bin/env bash
# Build the page: the wasm module (release, wasm32-unknown-unknown) and its JavaScript glue
# (wasm-bindgen --target web) into www/pkg/. Then serve www/ on localhost:
#     node examples/web/serve.mjs        # prints http://127.0.0.1:8000/
# Needs the wasm32-unknown-unknown target and wasm-bindgen-cli of exactly the version in
# Cargo.lock (run-headless-test.sh installs both when missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

want=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [[ "$have" != "$want" ]]; then
    echo "build.sh: need wasm-bindgen-cli $want (found: ${have:-none}); install it with" >&2
    echo "    cargo install wasm-bindgen-cli --version $want" >&2
    exit 1
fi

# The library's target dir, shared with native builds (its own wasm32 subfolder).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cargo build --release --target wasm32-unknown-unknown --lib
wasm-bindgen --target web --no-typescript --out-dir www/pkg \
    "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/gdn_web.wasm"
echo "build.sh: built $(du -h www/pkg/gdn_web_bg.wasm | cut -f1) www/pkg/gdn_web_bg.wasm"
