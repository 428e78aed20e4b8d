// The page: checks for WebGPU, loads the wasm module built by build.sh, runs the demo with the
// sizes from the form and shows the report. URL parameters fill the form (T, H, HV, K, V,
// steps, runs, algorithm=auto|chunked|recurrent, seed, defaults=0|1, l2norm=0|1, tol; tiles=VxN (or colV, the column kernel)
// runs the forward through the recurrent kernel at that tiling, for tiling sweeps) and `autorun=1` runs at once (the headless test
// uses it). The outcome is in #status: data-state = done | fail | error | no-webgpu, and
// window.gdnResult.

const $ = (id) => document.getElementById(id);
const form = $("form");
const params = new URLSearchParams(location.search);
const tolerance = Number(params.get("tol") ?? 1e-4);

function setStatus(state, text, extra = {}) {
  const el = $("status");
  el.dataset.state = state;
  el.textContent = text;
  for (const [k, v] of Object.entries(extra)) el.dataset[k] = v;
  window.gdnResult = { state, text, ...extra };
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "—" : Number(x).toPrecision(digits));
const fmtMs = (x) => (x === null || x === undefined ? "n/a" : `${Number(x).toFixed(2)} ms`);

for (const [name, value] of params) {
  const input = form.elements[name];
  if (!input) continue;
  if (input.type === "checkbox") input.checked = value !== "0" && value !== "false";
  else input.value = value;
}

async function describeAdapter() {
  if (!("gpu" in navigator)) return null;
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return null;
  const info = adapter.info ?? {};
  const fallback = info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false;
  const l = adapter.limits;
  const name = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" / ") || "(no name given)";
  $("adapter").innerHTML = `
    <table>
      <tr><th>adapter</th><td>${name}${fallback ? " (fallback adapter, e.g. SwiftShader on the CPU)" : ""}</td></tr>
      <tr><th>features</th><td>${[...adapter.features].sort().join(", ") || "none"}</td></tr>
      <tr><th>adapter limits</th><td>workgroup memory ${l.maxComputeWorkgroupStorageSize} B,
        ${l.maxComputeInvocationsPerWorkgroup} invocations, ${l.maxStorageBuffersPerShaderStage} storage buffers per stage,
        ${l.maxStorageBufferBindingSize} B per binding</td></tr>
    </table>`;
  return { name, fallback, features: [...adapter.features].sort() };
}

let adapterName = "the WebGPU adapter";

function render(r, ok) {
  const phase = (label, p) => p ? `
    <tr><th>${label}</th><td class="num">${p.tokens}</td><td class="num">${fmt(p.checksum, 8)}</td>
      <td class="num">${fmt(p.abs_sum, 8)}</td><td class="num">${fmt(p.rel_o)}</td>
      <td class="num">${p.rel_state === null ? "—" : fmt(p.rel_state)}</td>
      <td class="num">${fmtMs(p.gpu_ms)}</td><td class="num">${fmtMs(p.wall_ms)}</td></tr>` : "";
  $("report").innerHTML = `
    <table>
      <tr><th></th><th>tokens</th><th>Σ o</th><th>Σ |o|</th><th>rel. error o</th><th>rel. error state</th><th>GPU time</th><th>wall time</th></tr>
      ${phase("forward", r.forward)}
      ${phase("decode steps", r.decode)}
    </table>
    ${runsLine(r)}
    <p>Largest relative L2 error against the f64 oracle: <b>${fmt(r.max_rel)}</b>
      (${ok ? "within" : "NOT within"} tolerance ${tolerance}); the oracle checked
      ${r.oracle_heads.length} v-head(s) in ${fmtMs(r.oracle_ms)} of wasm.</p>
    <table>
      <tr><th>device</th><td>${r.adapter || adapterName} — wgpu sees ${r.backend}, ${r.device_type}</td></tr>
      <tr><th>limits requested</th><td>${r.limits}: workgroup memory ${r.workgroup_bytes} B, ${r.invocations} invocations,
        ${r.storage_buffers} storage buffers per stage, ${r.binding_bytes} B per binding</td></tr>
      <tr><th>features used</th><td>${r.features.join(", ") || "none"} (no shader-f16, no subgroups)</td></tr>
      <tr><th>forward algorithm</th><td>${r.algorithm} (${r.algorithm_reason}); ${r.forward_pipelines} pipeline(s) compiled by the forward</td></tr>
      <tr><th>forward (state_scan)</th><td>V-block ${r.v_block}${r.algorithm === "chunked" ? "" : " (not run)"}</td></tr>
      <tr><th>decode (recurrent_step)</th><td>${r.decode_tiles ?? "—"}</td></tr>
      <tr><th>options</th><td>${r.l2norm_qk ? "in-kernel l2norm of q, k" : "defaults"}</td></tr>
    </table>
    <p class="muted">GPU time: timestamp queries around the passes (needs the adapter's timestamp-query;
      browsers may coarsen them). Wall time: performance.now() from recording to results back, including
      first-use shader compilation. Decode steps run the recurrent decode kernel (a prepared DecodePlan,
      one compute pass per token) on the forward's final state, in place.</p>`;
}

// Forward calls in order (upload, record, submit, readback each): the first creates the
// pipelines, the others are warm.
function runsLine(r) {
  const runs = r.forward.runs_ms ?? [];
  if (runs.length < 2) return `<p>Context (adapter and device): ${fmtMs(r.context_ms)}.</p>`;
  const warm = runs.slice(1).sort((a, b) => a - b);
  const median = warm[Math.floor((warm.length - 1) / 2)];
  return `<p>Forward calls (upload, run, readback): first ${fmtMs(runs[0])}, warm median ${fmtMs(median)}
    of ${warm.length} (${runs.slice(1).map((x) => x.toFixed(0)).join(", ")} ms); context ${fmtMs(r.context_ms)}.</p>`;
}

async function run(wasm) {
  const f = form.elements;
  const n = (name) => Math.max(0, Math.floor(Number(f[name].value)));
  $("run").disabled = true;
  setStatus("running", "Running…");
  try {
    const json = await wasm.run_demo(n("T"), n("H"), n("HV"), n("K"), n("V"), n("steps"), n("seed"), f.defaults.checked, f.l2norm.checked, Math.max(1, n("runs")), f.algorithm.value, params.get("tiles") ?? "");
    const r = JSON.parse(json);
    const ok = r.max_rel !== null && r.max_rel < tolerance;
    render(r, ok);
    setStatus(ok ? "done" : "fail",
      `${ok ? "OK" : "FAILED"}: largest relative error ${fmt(r.max_rel)} (tolerance ${tolerance}) on ${r.adapter || adapterName}`,
      { maxRel: String(r.max_rel), adapter: adapterName, report: json });
  } catch (e) {
    setStatus("error", `Error: ${e && e.message ? e.message : e}`);
  } finally {
    $("run").disabled = false;
  }
}

async function main() {
  if (!("gpu" in navigator)) {
    setStatus("no-webgpu", "WebGPU is not available in this browser (navigator.gpu is missing). " +
      "Use a browser with WebGPU (Chrome/Edge 113+, or Chromium started with --enable-unsafe-webgpu), " +
      "over https or http://localhost.");
    return;
  }
  const adapter = await describeAdapter();
  if (!adapter) {
    setStatus("no-webgpu", "WebGPU is present but the browser gave no adapter (navigator.gpu.requestAdapter() returned null): " +
      "it may be disabled or blocklisted for this GPU. In Chromium, --enable-unsafe-webgpu enables it.");
    return;
  }
  adapterName = adapter.name + (adapter.fallback ? " (fallback adapter)" : "");
  let wasm;
  try {
    wasm = await import("./pkg/gdn_web.js");
    await wasm.default();
  } catch (e) {
    setStatus("error", `Could not load the wasm module (build it with examples/web/build.sh): ${e}`);
    return;
  }
  form.addEventListener("submit", (ev) => { ev.preventDefault(); run(wasm); });
  $("run").disabled = false;
  setStatus("ready", `Ready on ${adapter.name}. Choose sizes and press Run.`);
  if (params.get("autorun") === "1") await run(wasm);
}

main();
