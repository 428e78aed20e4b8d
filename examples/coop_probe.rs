//! What a cooperative-matrix op costs on this GPU: GPU time (timestamp queries) of kernels
//! that repeat one kind of op (examples/coop_probe_wgsl/), per subgroup and op, at 1, 2 and 4
//! subgroups per workgroup and grids of 132..2048 workgroups. The ops are the ones the coop
//! scans issue per chunk (docs/compute-paths.md counts them):
//!
//! - `mma_dep`: a dependent chain of coopMultiplyAdd (16×16×16 f16 → f32) on register-resident
//!   matrices (latency); `mma_ind`: four independent chains (the scans' pattern);
//! - `load_rt`, `load_const`, `load_col`: 8 A tiles of a K-shaped f16 buffer from storage per
//!   iteration, loaded one iteration ahead, row-major with the stride from a uniform, with a
//!   constant stride, column-major; `load_v4`, `load_v4col`: the same through a `vec4<f16>`
//!   pointer (8-byte elements); each tile feeds one product, so compare with `mma_ind`;
//! - `wgload_wg`, `wgload_wg4`: 8 B tiles from workgroup memory (f16 elements, vec4<f16>);
//! - `roundtrip`: f32 tiles coopStoreT to workgroup memory, barrier, coopLoadT back, barrier;
//! - `republish`: the scans' per-chunk publish of the f32 state as f16 (store, barrier, an
//!   element loop rounding to f16, barrier) and 8 B-tile loads + products on it;
//! - `barriers`: two barriers per iteration and nothing else;
//! - `load_colconst`: column-major with a constant stride; `stage8`: the 8 tiles staged by
//!   hand (16-byte plain loads one iteration ahead, stored to the subgroup's own workgroup
//!   tiles, a subgroup barrier, cooperative loads from workgroup memory).
//!
//! `--scan-file NAME=PATH` (repeatable) times a replacement for
//! shaders/forward/state_scan_coop.wgsl beside the scan (as `x_NAME`, its o compared with the
//! scan's bit for bit); `--scan-only` skips the op probes and the built-in ablations.
//!
//! Every line: mode, invocations per workgroup, workgroups, GPU ms (median of `--reps`),
//! ns per iteration of one subgroup (8 ops, or one publish for `republish`, 2 barriers for
//! `barriers`) and ns per op. A warm-up of ≥ 300 ms of work comes first (the H200 idles at
//! 345 MHz). Without cooperative matrices (lavapipe, most non-NVIDIA Vulkan drivers) it says
//! so and exits 0: `--check` then only validates the kernels with naga.
//!
//! ```text
//! cargo run --release --example coop_probe [-- --iters 1024 --reps 3 --wg 32,64,128
//!           --grids 132,264,528,1056,2048 --modes mma_dep,load_rt,... | --check]
//! ```

use std::time::Instant;

use gdn_wgpu::wgpu_backend::{Context, GpuTimer, list_adapters};
use rand::{Rng, SeedableRng};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const PROBE: &str = include_str!("coop_probe_wgsl/probe.wgsl");
const LOAD_TEMPLATE: &str = include_str!("coop_probe_wgsl/load_template.wgsl");
const WG_TEMPLATE: &str = include_str!("coop_probe_wgsl/wg_template.wgsl");

/// The storage-load helpers of probe.wgsl, each given an entry point `load_<suffix>`.
const LOADS: &[&str] = &[
    "ld_rt",
    "ld_const",
    "ld_col",
    "ld_colconst",
    "ld_v4",
    "ld_v4col",
];
/// The workgroup-tile helpers, each given an entry point `wgload_<prefix>`.
const TILES: &[&str] = &["wg_tile", "wg4_tile"];

/// Tokens of the K-shaped buffer (a power of two) and its qk-heads (K = 128 each).
const ROWS: u32 = 8192;
const HEADS: u32 = 16;

struct Args {
    iters: u32,
    reps: usize,
    wgs: Vec<u32>,
    grids: Vec<u32>,
    modes: Option<Vec<String>>,
    check: bool,
    /// Tokens of the scan ablations (0: none).
    scan_tokens: u32,
    scan_heads: Vec<(u32, u32)>,
    /// Where `--check` writes the scan ablations' sources.
    dump: Option<String>,
    /// `--scan-file NAME=PATH`: scan variants read at run time, each a replacement for
    /// shaders/forward/state_scan_coop.wgsl (timed as `x_NAME`, checked against the scan's o).
    scan_files: Vec<(String, String)>,
    /// `--scan-only`: no op probes and no built-in ablations (the scan and the files only).
    scan_only: bool,
}

fn parse_list(s: &str) -> Res<Vec<u32>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .map_err(|e| format!("{x:?}: {e}").into())
        })
        .collect()
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        iters: 1024,
        reps: 3,
        wgs: vec![32, 64, 128],
        grids: vec![132, 264, 528, 1056, 2048],
        modes: None,
        check: false,
        scan_tokens: 8192,
        scan_heads: vec![(16, 64), (2, 8)],
        dump: None,
        scan_files: Vec::new(),
        scan_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--iters" => a.iters = value()?.parse()?,
            "--reps" => a.reps = value()?.parse()?,
            "--wg" => a.wgs = parse_list(&value()?)?,
            "--grids" => a.grids = parse_list(&value()?)?,
            "--modes" => a.modes = Some(value()?.split(',').map(str::to_owned).collect()),
            "--check" => a.check = true,
            "--dump" => a.dump = Some(value()?),
            "--scan-tokens" => a.scan_tokens = value()?.parse()?,
            "--scan-file" => {
                let v = value()?;
                let (name, path) = v.split_once('=').ok_or("--scan-file: NAME=PATH")?;
                a.scan_files.push((name.to_owned(), path.to_owned()));
            }
            "--scan-only" => a.scan_only = true,
            "--scan-heads" => {
                a.scan_heads = value()?
                    .split(',')
                    .map(|hv| -> Res<(u32, u32)> {
                        let (h, v) = hv.split_once('/').ok_or("--scan-heads: H/HV,...")?;
                        Ok((h.parse()?, v.parse()?))
                    })
                    .collect::<Res<_>>()?
            }
            other => return Err(format!("unknown argument {other:?} (see the file's doc)").into()),
        }
    }
    if a.wgs.iter().any(|&w| ![32, 64, 128].contains(&w)) {
        return Err("--wg: 32, 64 or 128 invocations (1, 2 or 4 subgroups)".into());
    }
    if !a.scan_tokens.is_multiple_of(64)
        || a.scan_heads
            .iter()
            .any(|&(h, v)| h == 0 || !v.is_multiple_of(h))
    {
        return Err("--scan-tokens: a multiple of 64; --scan-heads: HV a multiple of H".into());
    }
    if a.iters == 0 || a.reps == 0 || a.grids.contains(&0) {
        return Err("--iters, --reps and every grid must be positive".into());
    }
    Ok(a)
}

/// probe.wgsl with one entry point per load helper and per workgroup-tile helper.
fn assembled() -> (String, Vec<String>) {
    let mut text = PROBE.to_owned();
    let mut modes: Vec<String> = ["mma_dep", "mma_ind"].map(String::from).to_vec();
    for h in LOADS {
        let entry = format!("load_{}", &h[3..]);
        text += &LOAD_TEMPLATE
            .replace("LOAD_ENTRY", &entry)
            .replace("LOAD(", &format!("{h}("));
        modes.push(entry);
    }
    for h in TILES {
        let entry = format!("wgload_{}", h.split('_').next().unwrap());
        text += &WG_TEMPLATE
            .replace("WG_ENTRY", &entry)
            .replace("TILE(", &format!("{h}("));
        modes.push(entry);
    }
    modes.extend(["roundtrip", "republish", "barriers", "stage8"].map(String::from));
    (text, modes)
}

/// naga's validation of the assembled kernels and their SPIR-V, each entry point at each
/// workgroup size, as wgpu's Vulkan backend writes it (what `--check` runs; no GPU needed:
/// naga's SPIR-V writer has panicked on cooperative stores that pass validation).
fn validate(text: &str, modes: &[String], wgs: &[u32], iters: Option<u32>) -> Res<()> {
    let scan_heads = [
        ("HEADS_QK_CONST".to_owned(), 16.0),
        ("HEADS_V_CONST".to_owned(), 64.0),
    ];
    let module = naga::front::wgsl::parse_str(text).map_err(|e| e.emit_to_string(text))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| e.emit_to_string(text))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    for mode in modes {
        for &wg in wgs {
            let constants = match iters {
                Some(iters) => naga::back::PipelineConstants::from([
                    ("WG".into(), wg as f64),
                    ("ITERS".into(), iters as f64),
                ]),
                None => naga::back::PipelineConstants::from(scan_heads.clone()),
            };
            let (m, i) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, mode)),
                &constants,
            )?;
            let pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: mode.clone(),
            };
            naga::back::spv::write_vec(&m, &i, &options, Some(&pipeline))?;
        }
    }
    Ok(())
}

/// `make` with the device's validation and internal errors caught: a kernel the driver or
/// wgpu refuses is reported and skipped, not the end of the run.
fn caught<T>(device: &wgpu::Device, make: impl FnOnce() -> T) -> Result<T, String> {
    use futures::FutureExt;
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let made = make();
    for scope in [internal.pop(), validation.pop()] {
        if let Some(Some(e)) = scope.now_or_never() {
            return Err(e.to_string());
        }
    }
    Ok(made)
}

/// Timing variants of `state_scan_coop` (bf16 storage), each the scan's source with a part
/// of the chunk step taken out (wrong results, same control flow): what that part costs.
/// The edits apply to the scan's entry function, not to the snippets it includes.
fn scan_ablations() -> Res<Vec<(&'static str, String)>> {
    use gdn_wgpu::wgpu_backend::shaders::{Pass, source};
    let text = &source(Pass::StateScanCoop, gdn_wgpu::DType::BF16)?.text;
    let at = text
        .find("fn state_scan_coop(")
        .ok_or("the scan's entry point moved")?;
    let (head, body) = text.split_at(at);
    let edit = |name: &'static str, f: &dyn Fn(&str) -> String| -> Res<(&'static str, String)> {
        let new = f(body);
        if new == body {
            return Err(format!("ablation {name} no longer matches state_scan_coop.wgsl").into());
        }
        Ok((name, format!("{head}{new}")))
    };
    let map_lines = |b: &str, f: &dyn Fn(&str) -> Option<String>| -> String {
        b.lines()
            .filter_map(|l| match f(l.trim_start()) {
                None => Some(l.to_owned()),
                Some(r) if r.is_empty() => None,
                Some(r) => Some(format!("        {r}")),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let no_publish = |b: &str| {
        b.replace(
            "        if (c + 1u < n_chunks) {\n            publish_half(t, sg, 0u, s00, s01);\n            publish_half(t, sg, 1u, s10, s11);\n        }\n",
            "",
        )
    };
    let no_elem = |b: &str| {
        map_lines(b, &|l| l.starts_with("w_elem(t, ").then(String::new))
            .replace("n < BV / 2u; n++", "n < 0u; n++")
            .replace("n < BV / 4u; n++", "n < 0u; n++")
    };
    let no_barrier = |b: &str| {
        let loop_at = b.find("for (var c = 0u;").unwrap_or(0);
        let (pre, post) = b.split_at(loop_at);
        format!("{pre}{}", post.replace("        workgroupBarrier();\n", ""))
    };
    let no_reload = |b: &str| {
        map_lines(b, &|l| {
            ((l.starts_with("ka") && l.contains("= k_rows(next"))
                || (l.starts_with("qa") && l.contains("= q_rows(next")))
            .then(String::new)
        })
    };
    let no_tile_loads = |b: &str| {
        map_lines(b, &|l| {
            let name = l.strip_prefix("let ")?.split(' ').next()?;
            (l.contains("= gated_rows(") || l.contains("= k_cols("))
                .then(|| format!("let {name} = ka{};", &name[2..3]))
        })
    };
    let no_wg_loads = |b: &str| {
        map_lines(b, &|l| {
            let name = l.strip_prefix("let ")?.split(' ').next()?;
            (l.contains("= s_tile(") || l.contains("= x_tile("))
                .then(|| format!("let {name} = bfix;"))
        })
        .replace(
            "    for (var c = 0u; c < n_chunks; c++) {",
            "    let bfix = s_tile(0u, 0u);\n    for (var c = 0u; c < n_chunks; c++) {",
        )
    };
    let no_stores = |b: &str| map_lines(b, &|l| l.starts_with("store_tile(").then(String::new));
    let floor = |b: &str| {
        no_stores(&no_wg_loads(&no_tile_loads(&no_reload(&no_barrier(
            &no_elem(&no_publish(b)),
        )))))
    };
    // The coop loads through vec4<f16> pointers (8-byte elements; stride and index in those):
    // storage operands (q, k, the gated matrices), and the f16 workgroup tiles (s16, x16,
    // whose element writes become component writes).
    let whole = |name: &'static str, pairs: &[(&str, &str)]| -> Res<(&'static str, String)> {
        let mut t = text.clone();
        for (from, to) in pairs {
            if !t.contains(from) {
                return Err(
                    format!("ablation {name}: {from:?} is not in the scan's source").into(),
                );
            }
            t = t.replace(from, to);
        }
        Ok((name, t))
    };
    let v4_storage: &[(&str, &str)] = &[
        (
            "var<storage, read> qg16: array<f16>;",
            "var<storage, read> qg16: array<vec4<f16>>;",
        ),
        (
            "var<storage, read> gated16: array<f16>;",
            "var<storage, read> gated16: array<vec4<f16>>;",
        ),
        ("alias K16 = f16;", "alias K16 = vec4<f16>;"),
        (
            "return coopLoadT<coop_mat16x16<f16, A>>(&qg16[i], stride);",
            "let w = i / 4u;\n    let s = stride / 4u;\n    return coopLoadT<coop_mat16x16<f16, A>>(&qg16[w], s);",
        ),
        (
            "return coopLoadT<coop_mat16x16<f16, A>>(&gated16[i], stride);",
            "let w = i / 4u;\n    let s = stride / 4u;\n    return coopLoadT<coop_mat16x16<f16, A>>(&gated16[w], s);",
        ),
        (
            "return coopLoad<coop_mat16x16<f16, A>>(&gated16[i], stride);",
            "let w = i / 4u;\n    let s = stride / 4u;\n    return coopLoad<coop_mat16x16<f16, A>>(&gated16[w], s);",
        ),
        (
            "return coopLoadT<coop_mat16x16<f16, A>>(&k16[i], hk);",
            "let w = i / 4u;\n    let s = hk / 4u;\n    return coopLoadT<coop_mat16x16<f16, A>>(&k16[w], s);",
        ),
        (
            "return coopLoad<coop_mat16x16<f16, A>>(&k16[i], hk);",
            "let w = i / 4u;\n    let s = hk / 4u;\n    return coopLoad<coop_mat16x16<f16, A>>(&k16[w], s);",
        ),
    ];
    let v4_wg: &[(&str, &str)] = &[
        (
            "var<workgroup> s16: array<f16, 128u * BV>;",
            "var<workgroup> s16: array<vec4<f16>, 128u * BV / 4u>;",
        ),
        (
            "var<workgroup> x16: array<f16, 64u * BV>;",
            "var<workgroup> x16: array<vec4<f16>, 64u * BV / 4u>;",
        ),
        (
            "let i = 16u * (r * SP + c);\n    return coopLoadT<coop_mat16x16<f16, B>>(&s16[i], SP);",
            "let i = 4u * (r * SP + c);\n    return coopLoadT<coop_mat16x16<f16, B>>(&s16[i], SP / 4u);",
        ),
        (
            "let i = 16u * (r * SP + c);\n    return coopLoadT<coop_mat16x16<f16, B>>(&x16[i], SP);",
            "let i = 4u * (r * SP + c);\n    return coopLoadT<coop_mat16x16<f16, B>>(&x16[i], SP / 4u);",
        ),
        ("x16[e] = ", "x16[e >> 2u][e & 3u] = "),
        (
            "s16[(row + 16u * (g + upper)) * SP + col] = f16(stage[row * FP + col]);",
            "let si = (row + 16u * (g + upper)) * SP + col;\n        s16[si >> 2u][si & 3u] = f16(stage[row * FP + col]);",
        ),
    ];
    let v4_both: Vec<(&str, &str)> = v4_storage.iter().chain(v4_wg).copied().collect();
    Ok(vec![
        ("full", text.clone()),
        whole("v4_storage", v4_storage)?,
        whole("v4_wg", v4_wg)?,
        whole("v4_both", &v4_both)?,
        edit("no_publish", &no_publish)?,
        edit("no_elem", &no_elem)?,
        edit("no_barrier", &no_barrier)?,
        edit("no_reload", &no_reload)?,
        edit("no_tile_loads", &no_tile_loads)?,
        edit("no_wg_loads", &no_wg_loads)?,
        edit("no_stores", &no_stores)?,
        edit("mma_floor", &floor)?,
        ("full", text.clone()),
    ])
}

/// naga's SPIR-V of the scan `text` as wgpu's Vulkan backend writes it without runtime
/// checks (SPIR-V 1.6, unchecked bounds, no workgroup zeroing, no loop bounding), with an
/// `Aligned 16` memory operand added to every cooperative-matrix load and store whose pointer
/// is into a storage buffer (`aligned == Some(false)`) or into any memory (`Some(true)`);
/// naga writes none. The scan's tiles start at multiples of 16 elements with strides of
/// multiples of 8 f16 (16 bytes), so the claim holds for its storage buffers (bound at offset
/// 0); for workgroup memory it holds only if the driver places the arrays 16-aligned.
fn scan_spirv(
    text: &str,
    aligned: Option<bool>,
    constants: &[(&str, f64)],
) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(text).map_err(|e| e.emit_to_string(text))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| e.emit_to_string(text))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "state_scan_coop".into(),
    };
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, "state_scan_coop")),
        &constants.iter().map(|&(n, v)| (n.to_owned(), v)).collect(),
    )
    .map_err(|e| e.to_string())?;
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| e.to_string())?;
    let Some(all) = aligned else {
        return Ok(words);
    };
    // Storage class of each pointer type, and the pointer type of each result id.
    const OP_TYPE_POINTER: u32 = 32;
    const OP_VARIABLE: u32 = 59;
    const OP_ACCESS_CHAIN: u32 = 65;
    const OP_COOP_LOAD: u32 = 4457;
    const OP_COOP_STORE: u32 = 4458;
    const STORAGE_BUFFER: u32 = 12;
    const ALIGNED: u32 = 0x2;
    let mut class = std::collections::HashMap::new();
    let mut ptr_type = std::collections::HashMap::new();
    let mut out = words[..5].to_vec();
    let mut i = 5;
    let mut patched = 0;
    while i < words.len() {
        let count = (words[i] >> 16) as usize;
        let op = words[i] & 0xffff;
        let inst = &words[i..i + count];
        match op {
            OP_TYPE_POINTER => {
                class.insert(inst[1], inst[2]);
            }
            OP_VARIABLE | OP_ACCESS_CHAIN => {
                ptr_type.insert(inst[2], inst[1]);
            }
            _ => {}
        }
        let pointer = match op {
            OP_COOP_LOAD if count == 6 => Some(inst[3]),
            OP_COOP_STORE if count == 5 => Some(inst[1]),
            _ => None,
        };
        let storage = pointer
            .and_then(|p| ptr_type.get(&p))
            .and_then(|t| class.get(t))
            .is_some_and(|&c| c == STORAGE_BUFFER);
        if pointer.is_some() && (all || storage) {
            out.push((((count + 2) as u32) << 16) | op);
            out.extend_from_slice(&inst[1..]);
            out.extend_from_slice(&[ALIGNED, 16]);
            patched += 1;
        } else {
            out.extend_from_slice(inst);
        }
        i += count;
    }
    if patched == 0 {
        return Err("no cooperative load or store to patch".into());
    }
    Ok(out)
}

/// Time the ablations of `scan_ablations` on zeroed inputs of `args.scan_tokens` tokens, one
/// segment, K = V = 128, at each of `args.scan_heads`: GPU ms (median) and ns per chunk.
fn time_scan_ablations(ctx: &Context, args: &Args, timer: &GpuTimer) -> Res<()> {
    let mut variants = scan_ablations()?;
    if args.scan_only {
        variants.truncate(1);
    }
    let full = variants[0].1.clone();
    let body = include_str!("../shaders/forward/state_scan_coop.wgsl");
    for (name, path) in &args.scan_files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let name: &'static str = Box::leak(format!("x_{name}").into_boxed_str());
        if !full.contains(body) {
            return Err(
                "the scan's assembled source no longer contains state_scan_coop.wgsl".into(),
            );
        }
        variants.push((name, full.replace(body, &text)));
    }
    let device = &ctx.device;
    let t = args.scan_tokens as u64;
    let h_max = args.scan_heads.iter().map(|x| x.0).max().unwrap() as u64;
    let hv_max = args.scan_heads.iter().map(|x| x.1).max().unwrap() as u64;
    let buffer = |size: u64, usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("coop_probe scan"),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let st = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let qg16 = buffer((t + 64) * hv_max * 128 * 2, st);
    let k16 = buffer((t + 64) * h_max * 128 * 2, st);
    let v = buffer(t * hv_max * 128 * 2, st);
    let gate_beta = buffer(t * hv_max * 8, st);
    let gated16 = buffer((t + 64) * hv_max * 128 * 2, st);
    let segments = buffer(16, st);
    let state = buffer(hv_max * 128 * 128 * 4, st);
    let o_bytes = t * hv_max * 128 * 2;
    let o = buffer(o_bytes, st | wgpu::BufferUsages::COPY_SRC);
    let o_read = buffer(
        o_bytes,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    );
    // Small random f16 operands (and bf16 v: the same bits' upper halves are fine), so that
    // the exact variants (v4_*) can be compared with the scan bit for bit; gates stay 0.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    for b in [&qg16, &k16, &v, &gated16] {
        let halves: Vec<u16> = (0..b.size() / 2)
            .map(|_| half::f16::from_f32(rng.random_range(-0.02f32..0.02)).to_bits())
            .collect();
        ctx.queue.write_buffer(b, 0, bytemuck::cast_slice(&halves));
    }
    let params = buffer(
        48,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    );
    ctx.queue
        .write_buffer(&segments, 0, bytemuck::cast_slice(&[0u32, t as u32, 0, 0]));
    let entry = |binding: u32, ty| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let read = wgpu::BufferBindingType::Storage { read_only: true };
    let write = wgpu::BufferBindingType::Storage { read_only: false };
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("coop_probe scan"),
        entries: &[
            entry(0, wgpu::BufferBindingType::Uniform),
            entry(1, read),
            entry(2, read),
            entry(3, read),
            entry(4, read),
            entry(5, read),
            entry(6, read),
            entry(7, write),
            entry(8, write),
        ],
    });
    let buffers = [
        &params, &qg16, &k16, &v, &gate_beta, &gated16, &segments, &state, &o,
    ];
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("coop_probe scan"),
        layout: &layout,
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("coop_probe scan"),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    ctx.check()?;
    let chunks = t / 64;
    println!("scan heads variant gpu_ms ns_per_chunk (T = {t}, one segment, K = V = 128)");
    for &(h, hv) in &args.scan_heads {
        let words: [u32; 12] = [
            t as u32,
            h,
            hv,
            128,
            128,
            chunks as u32,
            1,
            0,
            1f32.to_bits(),
            0,
            0,
            0,
        ];
        ctx.queue
            .write_buffer(&params, 0, bytemuck::cast_slice(&words));
        let heads_c = [("HEADS_QK_CONST", h as f64), ("HEADS_V_CONST", hv as f64)];
        let mut pipelines: Vec<(&str, wgpu::ComputePipeline)> = Vec::new();
        for (name, text) in &variants {
            let made = caught(device, || {
                // SAFETY: as for the probe's kernels; the library creates this pass the same way.
                let module = unsafe {
                    device.create_shader_module_trusted(
                        wgpu::ShaderModuleDescriptor {
                            label: Some(name),
                            source: wgpu::ShaderSource::Wgsl(text.as_str().into()),
                        },
                        wgpu::ShaderRuntimeChecks::unchecked(),
                    )
                };
                device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(name),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some("state_scan_coop"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &heads_c,
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                })
            });
            match made {
                Ok(p) => pipelines.push((name, p)),
                Err(e) => println!("scan {name} refused: {}", e.replace('\n', " ")),
            }
        }
        if device
            .features()
            .contains(wgpu::Features::PASSTHROUGH_SHADERS)
        {
            let text = &variants[0].1;
            for (name, aligned) in [
                ("spv_plain", None),
                ("spv_aligned_storage", Some(false)),
                ("spv_aligned_all", Some(true)),
            ] {
                let made = scan_spirv(text, aligned, &heads_c).and_then(|words| {
                    caught(device, || {
                        // SAFETY: naga's own SPIR-V of the scan (validated above by naga), with
                        // alignment operands whose claims the bit-for-bit check below tests.
                        let module = unsafe {
                            device.create_shader_module_passthrough(
                                wgpu::ShaderModuleDescriptorPassthrough {
                                    label: Some(name),
                                    entry_points: std::borrow::Cow::Borrowed(&[
                                        wgpu::PassthroughShaderEntryPoint {
                                            name: std::borrow::Cow::Borrowed("state_scan_coop"),
                                            workgroup_size: (128, 1, 1),
                                        },
                                    ]),
                                    spirv: Some(std::borrow::Cow::Owned(words)),
                                    ..Default::default()
                                },
                            )
                        };
                        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(name),
                            layout: Some(&pipeline_layout),
                            module: &module,
                            entry_point: Some("state_scan_coop"),
                            compilation_options: Default::default(),
                            cache: None,
                        })
                    })
                });
                match made {
                    Ok(p) => pipelines.push((name, p)),
                    Err(e) => println!("scan {name} refused: {}", e.replace('\n', " ")),
                }
            }
        }
        ctx.check()?;
        // The exact variants against the scan: o after one dispatch from a zero state.
        let mut reference: Option<Vec<u32>> = None;
        for (name, p) in &pipelines {
            if !(*name == "full"
                || name.starts_with("v4_")
                || name.starts_with("spv_")
                || name.starts_with("x_"))
            {
                continue;
            }
            let mut encoder = device.create_command_encoder(&Default::default());
            encoder.clear_buffer(&state, 0, None);
            encoder.clear_buffer(&o, 0, None);
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(p);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(1, hv, 128 / 32);
            }
            let used = t * hv as u64 * 128 * 2;
            encoder.copy_buffer_to_buffer(&o, 0, &o_read, 0, used);
            ctx.queue.submit([encoder.finish()]);
            let slice = o_read.slice(..used);
            slice.map_async(wgpu::MapMode::Read, |_| {});
            device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .map_err(|e| e.to_string())?;
            let words: Vec<u32> = bytemuck::cast_slice(&slice.get_mapped_range()?).to_vec();
            o_read.unmap();
            match &reference {
                None => {
                    let finite = words
                        .iter()
                        .flat_map(|w| [w & 0xffff, w >> 16])
                        .filter(|&b| (b & 0x7f80) != 0x7f80)
                        .count();
                    println!(
                        "scan {h}/{hv} check {name}: reference o, {finite} of {} elements finite",
                        2 * words.len()
                    );
                    reference = Some(words);
                }
                Some(r) => {
                    let differ = r.iter().zip(&words).filter(|(a, b)| a != b).count();
                    println!(
                        "scan {h}/{hv} check {name}: {differ} of {} o words differ from the scan's",
                        words.len()
                    );
                }
            }
        }
        ctx.check()?;
        // The check's readbacks leave the GPU idle: ≥ 300 ms of the scan before timing.
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < 0.3 {
            let mut encoder = device.create_command_encoder(&Default::default());
            for _ in 0..8 {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&pipelines[0].1);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(1, hv, 128 / 32);
            }
            ctx.queue.submit([encoder.finish()]);
            device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .map_err(|e| e.to_string())?;
        }
        for (name, p) in &pipelines {
            let mut encoder = device.create_command_encoder(&Default::default());
            let dispatch = |encoder: &mut wgpu::CommandEncoder| {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(p);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(1, hv, 128 / 32);
            };
            dispatch(&mut encoder);
            timer.reset();
            timer.mark(&mut encoder, "start");
            for _ in 0..args.reps {
                dispatch(&mut encoder);
                timer.mark(&mut encoder, "rep");
            }
            timer.resolve(&mut encoder);
            ctx.queue.submit([encoder.finish()]);
            let mut ms: Vec<f64> = timer.read_spans(ctx)?.iter().map(|s| s.1).collect();
            ms.sort_by(f64::total_cmp);
            let ms = ms[ms.len() / 2];
            println!(
                "scan {h}/{hv} {name} {ms:.4} {:.0}",
                ms * 1e6 / chunks as f64
            );
        }
        ctx.check()?;
    }
    Ok(())
}

fn main() -> Res<()> {
    let args = parse_args()?;
    let (text, all_modes) = assembled();
    if args.check {
        validate(&text, &all_modes, &args.wgs, Some(args.iters))?;
        for (name, variant) in scan_ablations()? {
            let modes = ["state_scan_coop".to_owned()];
            validate(&variant, &modes, &[128], None)
                .map_err(|e| format!("scan ablation {name}: {e}"))?;
            if let Some(dir) = &args.dump {
                std::fs::write(format!("{dir}/{name}.wgsl"), &variant)?;
            }
            if name == "full" {
                for aligned in [None, Some(false), Some(true)] {
                    let words = scan_spirv(
                        &variant,
                        aligned,
                        &[("HEADS_QK_CONST", 16.0), ("HEADS_V_CONST", 64.0)],
                    )?;
                    if let Some(dir) = &args.dump {
                        let file = format!("{dir}/scan_{aligned:?}.spv");
                        std::fs::write(file, bytemuck::cast_slice::<u32, u8>(&words))?;
                    }
                }
            }
        }
        let full = &scan_ablations()?[0].1;
        let body = include_str!("../shaders/forward/state_scan_coop.wgsl");
        for (name, path) in &args.scan_files {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            validate(
                &full.replace(body, &text),
                &["state_scan_coop".to_owned()],
                &[128],
                None,
            )
            .map_err(|e| format!("scan file {name}: {e}"))?;
        }
        println!(
            "coop_probe: {} kernels and the scan's ablations validate and translate to SPIR-V",
            all_modes.len()
        );
        return Ok(());
    }
    let modes: Vec<String> = match &args.modes {
        _ if args.scan_only => Vec::new(),
        Some(m) => {
            if let Some(bad) = m.iter().find(|x| !all_modes.contains(x)) {
                return Err(format!("unknown mode {bad:?}; modes: {}", all_modes.join(",")).into());
            }
            m.clone()
        }
        None => all_modes,
    };

    // The library's features plus PASSTHROUGH_SHADERS (the scan's SPIR-V with alignment
    // operands, below), on the first adapter as Context::new picks it.
    let adapter = pollster::block_on(list_adapters())
        .into_iter()
        .next()
        .ok_or("no adapter")?;
    let info = adapter.get_info();
    let name = info.name.clone();
    let need = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    if !adapter.features().contains(need) {
        println!(
            "coop_probe: {name} has no cooperative matrices with f16 (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX, SHADER_F16): nothing to time"
        );
        return Ok(());
    }
    let features = adapter.features()
        & (need
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::PASSTHROUGH_SHADERS
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("coop_probe"),
        required_features: features,
        required_limits: adapter.limits(),
        // SAFETY: cooperative matrices are used by the probe's kernels and the coop scan only.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    }))?;
    device.on_uncaptured_error(std::sync::Arc::new(|e: wgpu::Error| {
        println!("coop_probe: device error: {e}");
    }));
    let ctx = Context::from_device(device, queue, Some(info.clone()))?;
    println!("coop_probe: adapter {name} ({:?})", info.backend);
    for p in adapter.cooperative_matrix_properties() {
        println!("coop_probe: cooperative matrix {p:?}");
    }
    println!(
        "coop_probe: passthrough SPIR-V {}",
        features.contains(wgpu::Features::PASSTHROUGH_SHADERS)
    );
    let Some(timer) = GpuTimer::new(&ctx, 2 + args.reps as u32) else {
        println!("coop_probe: {name} has no timestamp queries inside encoders: nothing to time");
        return Ok(());
    };

    let device = &ctx.device;
    // SAFETY: the probe's kernels index only inside their buffers (rows wrap at ROWS, the
    // output has a 256-float tile per subgroup of the largest grid); the library's own
    // passes are created the same way (ShaderChecks::None, pipelines.rs).
    let module = unsafe {
        device.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor {
                label: Some("coop_probe"),
                source: wgpu::ShaderSource::Wgsl(text.as_str().into()),
            },
            wgpu::ShaderRuntimeChecks::unchecked(),
        )
    };
    let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("coop_probe"),
        entries: &[
            wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            },
            storage(1, true),
            storage(2, true),
            storage(3, false),
        ],
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("coop_probe"),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let max_grid = *args.grids.iter().max().unwrap();
    let stride = HEADS * 128;
    let buffer = |size: u64, usage| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("coop_probe"),
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    // Zeroed by wgpu: the values do not matter to the time of these ops.
    let src = buffer(
        2 * (ROWS * stride) as u64 + 4096,
        wgpu::BufferUsages::STORAGE,
    );
    let out = buffer(max_grid as u64 * 4 * 256 * 4, wgpu::BufferUsages::STORAGE);
    let uniform = buffer(
        16,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    );
    ctx.queue.write_buffer(
        &uniform,
        0,
        bytemuck::cast_slice(&[stride, ROWS, HEADS, 0u32]),
    );
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("coop_probe"),
        layout: &layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: out.as_entire_binding(),
            },
        ],
    });
    let pipeline = |entry: &str, wg: u32| {
        caught(device, || {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &[("WG", wg as f64), ("ITERS", args.iters as f64)],
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })
    };
    let dispatch = |encoder: &mut wgpu::CommandEncoder, p: &wgpu::ComputePipeline, grid: u32| {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(p);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(grid, 1, 1);
    };
    // One submission: an untimed dispatch, then `reps` timed ones; the median in ms.
    let time = |p: &wgpu::ComputePipeline, grid: u32| -> Res<f64> {
        let mut encoder = device.create_command_encoder(&Default::default());
        dispatch(&mut encoder, p, grid);
        timer.reset();
        timer.mark(&mut encoder, "start");
        for _ in 0..args.reps {
            dispatch(&mut encoder, p, grid);
            timer.mark(&mut encoder, "rep");
        }
        timer.resolve(&mut encoder);
        ctx.queue.submit([encoder.finish()]);
        let mut ms: Vec<f64> = timer.read_spans(&ctx)?.iter().map(|s| s.1).collect();
        ms.sort_by(f64::total_cmp);
        Ok(ms[ms.len() / 2])
    };

    // Warm-up: products on every SM until 300 ms of wall time have passed.
    let warm = pipeline("mma_ind", 128)?;
    let t0 = Instant::now();
    let mut warm_ms = 0.0;
    while t0.elapsed().as_secs_f64() < 0.3 {
        warm_ms += time(&warm, max_grid)? * args.reps as f64;
    }
    ctx.check()?;
    println!(
        "coop_probe: warm-up {warm_ms:.1} ms GPU in {:.0} ms; iters {} reps {} (GPU ms = median)",
        t0.elapsed().as_secs_f64() * 1e3,
        args.iters,
        args.reps
    );
    println!("mode wg grid gpu_ms ns_per_iter ns_per_op");
    for mode in &modes {
        for &wg in &args.wgs {
            let p = match pipeline(mode, wg) {
                Ok(p) => p,
                Err(e) => {
                    println!("{mode} {wg} refused: {}", e.replace('\n', " "));
                    continue;
                }
            };
            for &grid in &args.grids {
                let ms = time(&p, grid)?;
                let per_iter = ms * 1e6 / args.iters as f64;
                println!(
                    "{mode} {wg} {grid} {ms:.4} {per_iter:.1} {:.2}",
                    per_iter / 8.0
                );
            }
            ctx.check()?;
        }
    }
    if args.scan_tokens > 0 {
        time_scan_ablations(&ctx, &args, &timer)?;
    }
    Ok(())
}
