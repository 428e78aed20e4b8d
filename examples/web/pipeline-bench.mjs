// Pipeline-creation timing in headless Chromium (SwiftShader when there is no GPU): how long
// createShaderModule + createComputePipeline(Async) of a WGSL variant takes, variants
// alternated round by round, each in a fresh page (a fresh device), to find what the
// browser's shader compiler spends its time on.
//     node pipeline-bench.mjs variants.json [--rounds 3] [--chromium /usr/bin/chromium]
// variants.json: [{"name": "...", "wgsl": "path", "entry": "main", "constants": {"WG": 32}}]
// Every compile gets a unique `const PIPELINE_NONCE` appended and used, so no cache (Dawn's,
// the driver's) can answer it.
import { chromiumPath, launchChromium, takeOption } from "./harness.mjs";
import { readFileSync, readdirSync } from "node:fs";
import { loadavg } from "node:os";
import { serve } from "./serve.mjs";

// CPU seconds (user + system) of a process's descendants (the browser's processes): SwiftShader compiles in
// Chromium's GPU process, and on a loaded machine CPU time is steadier than wall time.
function treeCpuSeconds(root) {
  const stats = new Map();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, "utf8");
      const f = s.slice(s.lastIndexOf(")") + 2).split(" ");
      stats.set(Number(d), { ppid: Number(f[1]), cpu: Number(f[11]) + Number(f[12]) });
    } catch {}
  }
  let total = -(stats.get(root)?.cpu ?? 0);
  const stack = [root];
  while (stack.length) {
    const pid = stack.pop();
    total += stats.get(pid)?.cpu ?? 0;
    for (const [child, s] of stats) if (s.ppid === pid) stack.push(child);
  }
  return total / 100; // clock ticks (USER_HZ = 100)
}

const args = process.argv.slice(2);
const opt = (name, fallback) => takeOption(args, name, fallback);
const executablePath = chromiumPath(args);
const rounds = Number(opt("--rounds", 3));
const nonce = opt("--nonce", "1") === "1";
const variants = JSON.parse(readFileSync(args[0], "utf8"));
for (const v of variants) v.code = readFileSync(v.wgsl, "utf8");

const server = await serve(0);
const browser = await launchChromium(executablePath);
const url = `http://127.0.0.1:${server.address().port}/`;

async function compile(v, tag) {
  const page = await browser.newPage();
  await page.goto(url).catch(() => {});
  await page.waitForTimeout(300);
  const cpu0 = treeCpuSeconds(process.pid);
  const r = await page.evaluate(async ({ code, entry, constants, mode, run }) => {
    const adapter = await navigator.gpu.requestAdapter();
    const device = await adapter.requestDevice();
    const errors = [];
    device.onuncapturederror = (e) => errors.push(e.error.message);
    const t0 = performance.now();
    const module = device.createShaderModule({ code });
    const desc = { layout: "auto", compute: { module, entryPoint: entry, constants } };
    let t1;
    if (mode === "async") {
      try {
        await device.createComputePipelineAsync(desc);
      } catch (e) {
        errors.push(e.message);
      }
      t1 = performance.now();
    } else {
      device.createComputePipeline(desc);
      await device.queue.onSubmittedWorkDone();
      t1 = performance.now();
    }
    const info = await module.getCompilationInfo();
    for (const m of info.messages) if (m.type === "error") errors.push(m.message);
    window.bench = { device, desc };
    return { ms: t1 - t0, errors };
  }, { code: nonce ? `${v.code}\nconst PIPELINE_NONCE: u32 = ${tag}u;\n` : v.code, entry: v.entry, constants: v.constants ?? {}, mode: v.mode ?? "async", run: v.run ?? null });
  r.cpu = treeCpuSeconds(process.pid) - cpu0;
  r.runs = [];
  if (v.run && r.errors.length === 0) {
    const cpu1 = treeCpuSeconds(process.pid);
    const x = await page.evaluate(async (run) => {
      const { device, desc } = window.bench;
      const errors = [];
    // With `run`: bind random inputs (the decode kernels' bindings) and time `reps` dispatches.
    const runs = [];
    let checksum = null;
    {
      const { T, H, HV, K, V, grid, reps } = run;
      let seed = 12345;
      const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
      const filled = (n, f) => Float32Array.from({ length: n }, f);
      const buf = (data, usage) => {
        const b = device.createBuffer({ size: Math.max(16, data.byteLength), usage: usage | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
        device.queue.writeBuffer(b, 0, data);
        return b;
      };
      const S = GPUBufferUsage.STORAGE, U = GPUBufferUsage.UNIFORM;
      const params = new ArrayBuffer(48);
      const pu = new Uint32Array(params), pf = new Float32Array(params);
      pu.set([T, H, HV, K, V, 0, 1, 1]); pf[8] = 1 / Math.sqrt(K); pu[9] = 1;
      const tables = new Uint32Array(16384);
      const tf = new Float32Array(tables.buffer);
      tables.set([0, T, 0]);
      for (let h = 0; h < HV; h++) { tf[3 + h] = 0; tf[3 + HV + h] = 0; }
      const bindings = [
        buf(new Uint8Array(params), U), buf(tables, U),
        buf(filled(T * H * K, () => rand() * 2 - 1), S), buf(filled(T * H * K, () => rand() * 2 - 1), S),
        buf(filled(T * HV * V, () => rand() * 2 - 1), S), buf(filled(T * HV, () => -0.1 * rand()), S),
        buf(filled(T * HV, () => rand()), S), buf(filled(HV * K * V, () => 0.1 * (rand() * 2 - 1)), S),
        buf(new Float32Array(T * HV * V), S), buf(new Float32Array(16), S),
      ];
      const pipeline = await device.createComputePipelineAsync(desc);
      const layout = pipeline.getBindGroupLayout(0);
      let group;
      for (const count of [10, 9]) {
        device.pushErrorScope("validation");
        group = device.createBindGroup({ layout, entries: bindings.slice(0, count).map((buffer, binding) => ({ binding, resource: { buffer } })) });
        if (!(await device.popErrorScope())) break;
      }
      const h0 = device.createBuffer({ size: HV * K * V * 4, usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
      { const e = device.createCommandEncoder(); e.copyBufferToBuffer(bindings[7], 0, h0, 0, HV * K * V * 4); device.queue.submit([e.finish()]); }
      for (let i = 0; i < reps; i++) {
        const e = device.createCommandEncoder();
        e.copyBufferToBuffer(h0, 0, bindings[7], 0, HV * K * V * 4);
        const pass = e.beginComputePass();
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(...grid);
        pass.end();
        await device.queue.onSubmittedWorkDone();
        const r0 = performance.now();
        device.queue.submit([e.finish()]);
        await device.queue.onSubmittedWorkDone();
        runs.push(performance.now() - r0);
      }
      const read = device.createBuffer({ size: T * HV * V * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      const e = device.createCommandEncoder();
      e.copyBufferToBuffer(bindings[8], 0, read, 0, T * HV * V * 4);
      device.queue.submit([e.finish()]);
      await read.mapAsync(GPUMapMode.READ);
      const o = new Float32Array(read.getMappedRange());
      let sum = 0, abs = 0;
      for (const x of o) { sum += x; abs += Math.abs(x); }
      checksum = `${sum.toPrecision(8)} / ${abs.toPrecision(8)}`;
    }
      return { runs, checksum };
    }, v.run);
    r.runs = x.runs;
    r.checksum = x.checksum;
    r.runCpu = treeCpuSeconds(process.pid) - cpu1;
  }
  await page.close();
  return r;
}

const times = new Map(variants.map((v) => [v.name, []]));
const cpus = new Map(variants.map((v) => [v.name, []]));
let tag = Date.now() % 1000000;
for (let round = 0; round < rounds; round++) {
  const order = round % 2 === 0 ? variants : [...variants].reverse();
  for (const v of order) {
    const r = await compile(v, tag++);
    if (r.errors.length) console.log(`${v.name}: errors: ${r.errors.join(" | ")}`);
    times.get(v.name).push(r.ms);
    cpus.get(v.name).push(r.cpu * 1000);
    const runs = r.runs.length ? `; runs ${r.runs.map((x) => x.toFixed(0)).join(" ")} ms (${(r.runCpu * 1000).toFixed(0)} ms CPU), o sums ${r.checksum}` : "";
    console.log(`round ${round + 1} ${v.name}: ${r.ms.toFixed(0)} ms wall, ${(r.cpu * 1000).toFixed(0)} ms CPU (load ${loadavg()[0].toFixed(2)})${runs}`);
  }
}
const median = (t) => [...t].sort((a, b) => a - b)[Math.floor((t.length - 1) / 2)];
for (const [name, t] of times) {
  const c = cpus.get(name);
  console.log(`${name}: wall median ${median(t).toFixed(0)} ms (${t.map((x) => x.toFixed(0)).join(" ")}); ` +
    `CPU median ${median(c).toFixed(0)} ms (${c.map((x) => x.toFixed(0)).join(" ")})`);
}
await browser.close();
server.close();
