// Does the browser create a compute pipeline off the queue? In one page: create pipeline A
// (`createComputePipelineAsync`, awaited) and time one dispatch of it alone; then start the
// asynchronous creation of pipeline B and dispatch A at once (if B is compiled off the queue,
// A's dispatch finishes before B is created); then create B again with createComputePipeline
// (sync, a new module of the same code: does Dawn reuse the first?) and a fresh variant of B
// ahead of a dispatch (does a sync creation hold the queue?). Prints the times in ms.
//     node async-create.mjs A.wgsl B.wgsl [T]     (assembled column kernels, e.g. column_step
//                                                 with the decode family's snippets; T = 512)
import { chromiumPath, launchChromium } from "./harness.mjs";
import { readFileSync } from "node:fs";
import { serve } from "./serve.mjs";
const args = process.argv.slice(2);
const executablePath = chromiumPath(args);
const runCode = readFileSync(args[0], "utf8");
const bgCode = readFileSync(args[1], "utf8");
const T = Number(args[2] ?? 512);
const server = await serve(0);
const browser = await launchChromium(executablePath);
const page = await browser.newPage();
await page.goto(`http://127.0.0.1:${server.address().port}/`).catch(() => {});
const r = await page.evaluate(async ({ runCode, bgCode, T }) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();
  const H = 2, HV = 4, K = 128, V = 128;
  const constants = { WG: 16, K_DIM: 128, V_FIRST: 0, PER_TOKEN_STATES: 0, K_VEC4S: 32 };
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
  const tables = new Uint32Array(16384); tables.set([0, T, 0]);
  const bindings = [
    buf(new Uint8Array(params), U), buf(tables, U),
    buf(filled(T * H * K, () => rand() * 2 - 1), S), buf(filled(T * H * K, () => rand() * 2 - 1), S),
    buf(filled(T * HV * V, () => rand() * 2 - 1), S), buf(filled(T * HV, () => -0.1 * rand()), S),
    buf(filled(T * HV, () => rand()), S), buf(filled(HV * K * V, () => 0.1 * (rand() * 2 - 1)), S),
    buf(new Float32Array(T * HV * V), S),
  ];
  const now = () => performance.now();
  const t0 = now();
  const runPipe = await device.createComputePipelineAsync({ layout: "auto", compute: { module: device.createShaderModule({ code: runCode }), entryPoint: "column_step", constants } });
  const tRunPipe = now() - t0;
  bindings.push(buf(new Float32Array(16), S));
  let group;
  for (const count of [10, 9]) {
    device.pushErrorScope("validation");
    group = device.createBindGroup({ layout: runPipe.getBindGroupLayout(0), entries: bindings.slice(0, count).map((buffer, binding) => ({ binding, resource: { buffer } })) });
    if (!(await device.popErrorScope())) break;
  }
  const errors = [];
  device.onuncapturederror = (e) => errors.push(e.error.message);
  const dispatch = () => {
    const e = device.createCommandEncoder();
    const p = e.beginComputePass(); p.setPipeline(runPipe); p.setBindGroup(0, group); p.dispatchWorkgroups(4, 4, 1); p.end();
    device.queue.submit([e.finish()]);
    return device.queue.onSubmittedWorkDone();
  };
  const t1 = now();
  await dispatch();
  const tAlone = now() - t1;
  // The background creation, then the same dispatch at once.
  const bgDesc = (code) => ({ layout: "auto", compute: { module: device.createShaderModule({ code }), entryPoint: "column_step", constants } });
  const t2 = now();
  let tBg = null;
  const bg = device.createComputePipelineAsync(bgDesc(bgCode)).then((p) => { tBg = now() - t2; return p; });
  await dispatch();
  const tWithBg = now() - t2;
  await bg;
  // The same descriptor again (a new module of the same code), sync: Dawn's cache?
  const t3 = now();
  device.createComputePipeline(bgDesc(bgCode));
  await device.queue.onSubmittedWorkDone();
  const tSyncAgain = now() - t3;
  // And a sync creation of a fresh variant (bgCode + nonce) ahead of a dispatch: blocks it?
  const t4 = now();
  device.createComputePipeline(bgDesc(bgCode + "\nconst NONCE_X: u32 = 7u;\n"));
  await dispatch();
  const tSyncFresh = now() - t4;
  return { tRunPipe, tAlone, tBg, tWithBg, tSyncAgain, tSyncFresh, errors };
}, { runCode, bgCode, T });
console.log(JSON.stringify(r));
await browser.close();
server.close();
