// Decode-kernel A/B timing in headless Chromium (SwiftShader when there is no GPU), in ONE page
// (one device): every variant's pipeline is created first, then single dispatches alternate
// A B C, C B A, … so drifts of the machine's load hit every variant alike (on a shared
// machine, the only comparison that holds; pipeline-bench.mjs times creation in fresh pages).
//     node kernel-ab.mjs kernel-ab.json [--reps 8] [--chromium /usr/bin/chromium]
// kernel-ab.json (the workgroup kernel at 32 × 32 against the column kernel col32, issue 13's
// heads at T = 512) shows the format: [{"name": "col32", "kernel": "decode/column_step.wgsl",
//   "entry": "column_step", "constants": {"WG": 16, ...}, "run": {"T": 512, "H": 2, "HV": 4, "K": 128, "V": 128,
//   "grid": [4, 4, 1]}}, ...]. `kernel` (under shaders/) is assembled as the library does for
// the decode family at f32 storage (dtype, params, state, step_common, the kernel); `wgsl`
// (a path) takes an assembled file as it is, e.g. a diagnostic copy. Inputs are random, one
// sequence from h0, l2norm on; prints per variant the creation time, the dispatch times
// (median, min, all) and Σ o / Σ |o| of the last dispatch (equal sums: the same results).
import { chromiumPath, launchChromium, takeOption } from "./harness.mjs";
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { serve } from "./serve.mjs";

const args = process.argv.slice(2);
const opt = (name, fallback) => takeOption(args, name, fallback);
const executablePath = chromiumPath(args);
const reps = Number(opt("--reps", 8));
const shaders = new URL("../../shaders/", import.meta.url);
const read = (p) => readFileSync(new URL(p, shaders), "utf8");
const variants = JSON.parse(readFileSync(args[0], "utf8"));
for (const v of variants) {
  v.code = v.wgsl
    ? readFileSync(v.wgsl, "utf8")
    : ["common/dtype_f32.wgsl", "common/params.wgsl", "decode/state_f32.wgsl", "decode/step_common.wgsl", v.kernel]
        .map(read).join("\n");
}

const server = await serve(0);
const browser = await launchChromium(executablePath);
const page = await browser.newPage();
await page.goto(`http://127.0.0.1:${server.address().port}/`).catch(() => {});
const result = await page.evaluate(async ({ variants, reps }) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();
  const errors = [];
  device.onuncapturederror = (e) => errors.push(e.error.message);
  const S = GPUBufferUsage.STORAGE, U = GPUBufferUsage.UNIFORM;
  const setups = [];
  for (const v of variants) {
    const { T, H, HV, K, V, grid } = v.run;
    let seed = 12345;
    const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
    const filled = (n, f) => Float32Array.from({ length: n }, f);
    const buf = (data, usage) => {
      const b = device.createBuffer({ size: Math.max(16, data.byteLength), usage: usage | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
      device.queue.writeBuffer(b, 0, data);
      return b;
    };
    // Params (shaders/common/params.wgsl): T, H, HV, K, V, chunks, segments = 1, flags = l2norm, scale, rows.
    const params = new ArrayBuffer(48);
    const pu = new Uint32Array(params), pf = new Float32Array(params);
    pu.set([T, H, HV, K, V, 0, 1, 1]);
    pf[8] = 1 / Math.sqrt(K);
    pu[9] = 1;
    // Tables: token starts (0, T), slot code 0 (resume slot 0), A_log = dt_bias = 0.
    const tables = new Uint32Array(16384);
    tables.set([0, T, 0]);
    const bindings = [
      buf(new Uint8Array(params), U), buf(tables, U),
      buf(filled(T * H * K, () => rand() * 2 - 1), S), buf(filled(T * H * K, () => rand() * 2 - 1), S),
      buf(filled(T * HV * V, () => rand() * 2 - 1), S), buf(filled(T * HV, () => -0.1 * rand()), S),
      buf(filled(T * HV, () => rand()), S), buf(filled(HV * K * V, () => 0.1 * (rand() * 2 - 1)), S),
      buf(new Float32Array(T * HV * V), S), buf(new Float32Array(16), S),
    ];
    const t0 = performance.now();
    const module = device.createShaderModule({ code: v.code });
    const pipeline = await device.createComputePipelineAsync({ layout: "auto", compute: { module, entryPoint: v.entry, constants: v.constants ?? {} } });
    const createMs = performance.now() - t0;
    // layout "auto" drops the bindings a kernel does not use (per-token states: 9).
    const layout = pipeline.getBindGroupLayout(0);
    let group;
    for (const count of [10, 9]) {
      device.pushErrorScope("validation");
      group = device.createBindGroup({ layout, entries: bindings.slice(0, count).map((buffer, binding) => ({ binding, resource: { buffer } })) });
      if (!(await device.popErrorScope())) break;
    }
    const stateBytes = HV * K * V * 4;
    const h0 = device.createBuffer({ size: stateBytes, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
    const e = device.createCommandEncoder();
    e.copyBufferToBuffer(bindings[7], 0, h0, 0, stateBytes);
    device.queue.submit([e.finish()]);
    setups.push({ name: v.name, pipeline, group, bindings, h0, grid, stateBytes, oBytes: T * HV * V * 4, createMs, runs: [] });
  }
  for (let i = 0; i < reps; i++) {
    const order = i % 2 === 0 ? setups : [...setups].reverse();
    for (const s of order) {
      const e = device.createCommandEncoder();
      e.copyBufferToBuffer(s.h0, 0, s.bindings[7], 0, s.stateBytes);
      const pass = e.beginComputePass();
      pass.setPipeline(s.pipeline);
      pass.setBindGroup(0, s.group);
      pass.dispatchWorkgroups(...s.grid);
      pass.end();
      await device.queue.onSubmittedWorkDone();
      const t0 = performance.now();
      device.queue.submit([e.finish()]);
      await device.queue.onSubmittedWorkDone();
      s.runs.push(performance.now() - t0);
    }
  }
  const out = [];
  for (const s of setups) {
    const readback = device.createBuffer({ size: s.oBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const e = device.createCommandEncoder();
    e.copyBufferToBuffer(s.bindings[8], 0, readback, 0, s.oBytes);
    device.queue.submit([e.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    let sum = 0, abs = 0;
    for (const x of new Float32Array(readback.getMappedRange())) { sum += x; abs += Math.abs(x); }
    out.push({ name: s.name, createMs: s.createMs, runs: s.runs, sums: `${sum.toPrecision(8)} / ${abs.toPrecision(8)}` });
  }
  return { out, errors };
}, { variants, reps });
if (result.errors.length) console.log(`errors: ${result.errors.join(" | ")}`);
const median = (t) => [...t].sort((a, b) => a - b)[Math.floor((t.length - 1) / 2)];
const first = median(result.out[0].runs);
for (const o of result.out) {
  const m = median(o.runs);
  console.log(`${o.name}: created in ${o.createMs.toFixed(0)} ms; dispatch median ${m.toFixed(0)} ms (×${(m / first).toFixed(2)} of ${result.out[0].name}), ` +
    `min ${Math.min(...o.runs).toFixed(0)}: ${o.runs.map((x) => x.toFixed(0)).join(" ")}; o sums ${o.sums}`);
}
console.log(`load average ${loadavg().map((x) => x.toFixed(1)).join(" ")}`);
await browser.close();
server.close();
