#!/usr/bin/env bash
# The browser test: install what is missing (Debian's chromium, playwright-core from
# package-lock.json, the wasm32 target, wasm-bindgen-cli matching Cargo.lock), build the page,
# serve it on 127.0.0.1, run a fixed small problem in headless Chromium with
# --enable-unsafe-webgpu (SwiftShader's WebGPU when there is no GPU), print the adapter and the
# relative errors, and exit 0 only if the page reports an error under tolerance.
#     bash examples/web/run-headless-test.sh ['T=512&HV=8&tol=1e-4']   (query overrides the problem)
# Never lets a tool download its own browser: playwright-core drives /usr/bin/chromium
# (CHROMIUM=... to use another).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
start=$SECONDS
step() { echo "web-test [$((SECONDS - start))s] $*"; }
as_root() {
    if [[ $(id -u) == 0 ]]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "web-test: need root to run: $*" >&2; exit 1
    fi
}
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
chromium="${CHROMIUM:-/usr/bin/chromium}"

if [[ ! -x "$chromium" ]]; then
    step "installing Debian's chromium (apt)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# (Debian's wrapper script prints a harmless shell warning on stderr.)
step "browser: $("$chromium" --version 2>/dev/null)"

if ! command -v node >/dev/null || (( $(node -p 'process.versions.node.split(".")[0]') < 20 )); then
    echo "web-test: need Node.js >= 20 with npm (playwright-core's requirement)" >&2
    exit 1
fi
want_pw=$(node -p 'require("./package-lock.json").packages["node_modules/playwright-core"].version')
have_pw=$(node -p 'try { require("./node_modules/playwright-core/package.json").version } catch { "" }')
if [[ "$have_pw" != "$want_pw" ]]; then
    step "installing playwright-core $want_pw (npm ci; it downloads no browser)"
    npm ci --no-audit --no-fund --loglevel=error
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    step "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
fi
want_wb=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')
have_wb=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [[ "$have_wb" != "$want_wb" ]]; then
    step "installing wasm-bindgen-cli $want_wb (cargo install, several minutes on 2 cores)"
    # --locked first; a registry mirror that lacks a locked version gets a fresh resolution.
    # --force: cargo's records may claim it is installed when the binary is gone or another.
    cargo install -q --force wasm-bindgen-cli --version "$want_wb" --locked \
        || cargo install -q --force wasm-bindgen-cli --version "$want_wb"
    step "$(wasm-bindgen --version)"
fi

step "building the page (examples/web/build.sh)"
./build.sh
step "running the page in headless Chromium"
status=0
timeout 900 node headless-test.mjs --chromium "$chromium" "$@" || status=$?
step "done (exit $status)"
exit $status
