// What the headless scripts (headless-test, pipeline-bench, kernel-ab) share: their option
// parsing and the Chromium they launch.
import { chromium } from "playwright-core";

// `--name VALUE` taken out of `args` (so the rest stay positional), or `fallback`.
export function takeOption(args, name, fallback) {
  const i = args.indexOf(name);
  return i >= 0 ? args.splice(i, 2)[1] : fallback;
}

// The Chromium to drive: `--chromium PATH` (taken out of `args`), else $CHROMIUM, else Debian's.
export function chromiumPath(args) {
  return takeOption(args, "--chromium", process.env.CHROMIUM ?? "/usr/bin/chromium");
}

// Chromium at `executablePath` (playwright-core drives it; it never downloads a browser).
// Flags: headless without a GPU, no network chatter on a closed network, and WebGPU (which
// then comes from SwiftShader). playwright adds --headless, --no-sandbox and a fresh profile
// dir. $CHROMIUM_FLAGS (space-separated) adds flags, e.g. Dawn toggles for an experiment:
// CHROMIUM_FLAGS=--enable-dawn-features=disable_robustness.
export function launchChromium(executablePath) {
  const extra = (process.env.CHROMIUM_FLAGS ?? "").split(" ").filter(Boolean);
  return chromium.launch({
    executablePath,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--enable-unsafe-webgpu", ...extra,
    ],
  });
}
