// Headless check of the page: serve www/ on 127.0.0.1, open it in Debian's Chromium with
// WebGPU enabled (playwright-core drives /usr/bin/chromium; it never downloads a browser), run a
// fixed small problem, print the adapter and the errors, and exit 0 only when the page reports
// a relative error under the tolerance.
//     node headless-test.mjs [--chromium /usr/bin/chromium] [--timeout-s 300] [URL query, e.g. T=200&HV=4]
// `runs=N` in the query times N forward calls (upload, run, readback each) and prints the first
// (pipeline creation) and the warm ones, e.g. the issue-13 shape:
//     node headless-test.mjs 'T=2048&H=2&HV=4&K=128&V=128&steps=0&runs=6&l2norm=0' 
import { chromiumPath, launchChromium, takeOption } from "./harness.mjs";
import { serve } from "./serve.mjs";

const args = process.argv.slice(2);
const opt = (name, fallback) => takeOption(args, name, fallback);
const executablePath = chromiumPath(args);
const timeoutMs = 1000 * Number(opt("--timeout-s", 300));
// The fixed problem: GVA (HV = 2H), K != V, a partial last chunk (200 = 3·64 + 8), in-kernel
// l2norm, decode steps (the recurrent kernel) continuing from the forward's state, WebGPU's
// default limits. Without a query it runs twice: on the library's choice of forward algorithm
// (the recurrent kernel on SwiftShader, a CPU adapter) and with the chunked one forced (so
// Chrome compiles and runs every chunked pass too). A query runs once.
const query = new URLSearchParams("T=200&H=2&HV=4&K=64&V=32&steps=3&seed=7&defaults=1&l2norm=1&tol=1e-4");
for (const [k, v] of new URLSearchParams(args[0] ?? "")) query.set(k, v);
query.set("autorun", "1");
const algorithms = args[0] === undefined ? ["auto", "chunked"] : [query.get("algorithm") ?? "auto"];

const t0 = Date.now();
const log = (msg) => console.log(`headless-test [${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);

const server = await serve(0);
const browser = await launchChromium(executablePath);
const urlFor = (algorithm) => {
  query.set("algorithm", algorithm);
  return `http://127.0.0.1:${server.address().port}/?${query}`;
};
const url = urlFor(algorithms[0]);
// Open the page at `url`, wait for its result, print the report; 0 when it passed.
async function runPage(url) {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") log(`page ${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => log(`page error: ${e.message}`));
  log(`opening ${url}`);
  await page.goto(url);
  const adapter = (await page.locator("#adapter").innerText().catch(() => "")).trim();
  // Wait on the result, not on load: the WebGPU work is asynchronous.
  await page.waitForSelector("#status[data-state=done], #status[data-state=fail], #status[data-state=error], #status[data-state=no-webgpu]", { timeout: timeoutMs });
  const result = await page.evaluate(() => window.gdnResult);
  log(`browser adapter:\n${adapter.replace(/^/gm, "    ")}`);
  if (result.report) {
    const r = JSON.parse(result.report);
    const ms = (x) => (x === null ? "n/a" : `${x.toFixed(2)} ms`);
    log(`device: ${r.adapter || result.adapter} (wgpu: ${r.backend}, ${r.device_type}); limits: ${r.limits}, ` +
      `workgroup memory ${r.workgroup_bytes} B, ${r.storage_buffers} storage buffers; V-block ${r.v_block}`);
    log(`features: ${r.features.join(", ") || "none"}; decode tiling: ${r.decode_tiles ?? "-"}`);
    log(`forward algorithm: ${r.algorithm} (${r.algorithm_reason}); ${r.forward_pipelines} pipeline(s) compiled by the forward`);
    log(`forward T=${r.forward.tokens}: checksum ${r.forward.checksum}, rel error o ${r.forward.rel_o}, GPU ${ms(r.forward.gpu_ms)}, wall ${ms(r.forward.wall_ms)}`);
    if (r.decode) {
      log(`decode ${r.decode.tokens} steps: checksum ${r.decode.checksum}, rel error o ${r.decode.rel_o}, state ${r.decode.rel_state}, GPU ${ms(r.decode.gpu_ms)}, wall ${ms(r.decode.wall_ms)}`);
    }
    log(`oracle (wasm): ${ms(r.oracle_ms)}`);
    const runs = r.forward.runs_ms ?? [];
    if (runs.length > 1) {
      const warm = runs.slice(1).sort((a, b) => a - b);
      const median = warm[Math.floor((warm.length - 1) / 2)];
      log(`forward calls (upload + run + readback): context ${ms(r.context_ms)}, first ${ms(runs[0])}, ` +
        `warm median ${ms(median)}, min ${ms(warm[0])}, max ${ms(warm[warm.length - 1])} over ${warm.length}: ` +
        runs.map((x) => x.toFixed(0)).join(" "));
      // Wall minus GPU time (timestamps) per warm call: upload, submit and readback, apart
      // from the kernel's own time (which follows the machine's load).
      const gpu = r.forward.runs_gpu_ms ?? [];
      if (gpu.length === runs.length) {
        const host = runs.slice(1).map((x, i) => x - gpu[i + 1]).sort((a, b) => a - b);
        log(`warm calls outside the kernels (wall - GPU): median ${ms(host[Math.floor((host.length - 1) / 2)])}, ` +
          `min ${ms(host[0])}: ${host.map((x) => x.toFixed(0)).join(" ")}`);
      }
    }
  }
  log(`page says: ${result.text}`);
  await page.close();
  return result.state === "done" ? 0 : 1;
}

let code = 0;
try {
  log(`${browser.version()} at ${executablePath}`);
  for (const algorithm of algorithms) {
    if (await runPage(urlFor(algorithm)) !== 0) code = 1;
  }
  // The page must say plainly when WebGPU is missing: hide navigator.gpu and look.
  const bare = await browser.newPage();
  await bare.addInitScript(() => { delete Navigator.prototype.gpu; });
  await bare.goto(url);
  await bare.waitForSelector("#status:not([data-state=loading])", { timeout: 30000 });
  const missing = await bare.evaluate(() => window.gdnResult ?? { state: document.getElementById("status").dataset.state });
  log(`without navigator.gpu the page says (${missing.state}): ${missing.text}`);
  if (missing.state !== "no-webgpu") {
    log("expected the no-webgpu state");
    code = 1;
  }
} catch (e) {
  log(`failed: ${e.message}`);
  code = 1;
} finally {
  await browser.close();
  server.close();
}
log(code === 0 ? "PASS" : "FAIL");
process.exit(code);
