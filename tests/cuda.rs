//! The CUDA backend (feature `cuda`).
//!
//! Without a GPU: every `shaders/cuda/*.cu` compiles with NVRTC for sm_90a, sm_80 and
//! compute_80 (needs libnvrtc on LD_LIBRARY_PATH; a missing NVRTC fails the test), the kernel
//! cache, and a typed error (not a panic) from `Context::new` when there is no driver.
//!
//! With a CUDA device: the forward (the chunked tensor-core path for f16/bf16 with K ≤ 128,
//! the recurrent kernel for f32 and K = 256, and the recurrent kernel forced for every dtype),
//! decode and the backward (every gradient) against the f64 oracle on the hard cases (T not a
//! multiple of 64, T = 1, varlen with empty and length-1 sequences, GVA,
//! g = 0 and g ≈ −20 heads, β near 0 and near 2, h0 on/off, every option, every dtype), outputs
//! NaN-poisoned before the kernels run, tolerances from `gdn_wgpu::tolerance`. Without a
//! device they print "not run", unless `GDN_REQUIRE_CUDA=1`, which makes them fail.
#![cfg(feature = "cuda")]

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::cases::{
    HardCase, backward_case, check, check_gradients_with, fail_on, hard_cases, inputs_and_oracle,
};
use common::problem;
use gdn_wgpu::cuda_backend::nvrtc::{self, Target};
use gdn_wgpu::cuda_backend::{
    self, BackwardPath, CHAIN_VALUE_BLOCKS, ChunkPlan, Context, CudaTensor, ForwardPath,
    PlanOptions, Segments, SeqBounds, backward_path, forward_path, kernels,
};
use gdn_wgpu::tolerance::{Arithmetic, Op};
use gdn_wgpu::wgpu_backend::{SegmentPaths, SegmentWindow};
use gdn_wgpu::{
    Backend, DType, Error, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec,
    reference,
};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

// ---------------------------------------------------------------------------------------------
// Without a GPU

fn require_nvrtc() {
    assert!(
        nvrtc::nvrtc_available(),
        "NVRTC (libnvrtc.so) could not be loaded: run shared/tools/cuda/fetch-nvrtc.sh and put \
         its lib folder on LD_LIBRARY_PATH"
    );
}

#[test]
fn every_cuda_source_is_registered() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shaders/cuda");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut registered: Vec<String> = kernels::SOURCES.iter().map(|s| s.file.into()).collect();
    registered.sort();
    assert_eq!(on_disk, registered, "shaders/cuda/*.cu vs kernels::SOURCES");
    for s in kernels::SOURCES {
        let text = std::fs::read_to_string(dir.join(s.file)).unwrap();
        assert_eq!(text, s.text, "{} is stale in the build", s.file);
    }
    // Headers: every *.cuh but the prelude is registered (and so compiled by the test below
    // through the passes that include it).
    let mut headers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cuh") && n != "common.cuh")
        .collect();
    headers.sort();
    let mut registered: Vec<String> = kernels::HEADERS.iter().map(|h| h.file.into()).collect();
    registered.sort();
    assert_eq!(
        headers, registered,
        "shaders/cuda/*.cuh vs kernels::HEADERS"
    );
    for h in kernels::HEADERS {
        let text = std::fs::read_to_string(dir.join(h.file)).unwrap();
        assert_eq!(text, h.text, "{} is stale in the build", h.file);
        assert!(
            kernels::SOURCES
                .iter()
                .any(|s| s.headers.iter().any(|x| x.file == h.file)),
            "{} is included by no pass",
            h.file
        );
    }
}

const TARGETS: [Target; 3] = [Target::Sm90a, Target::Sm80, Target::Compute80Ptx];

/// NVRTC's image of `source` for `target`, compiled once per test process (a compile takes
/// seconds; the compile checks below share their images, and a test asking for an image
/// another is compiling waits for it instead of compiling it again).
fn compiled(source: &kernels::Source, target: Target) -> std::sync::Arc<nvrtc::Image> {
    type Slot = std::sync::Arc<OnceLock<std::sync::Arc<nvrtc::Image>>>;
    static IMAGES: OnceLock<std::sync::Mutex<std::collections::HashMap<(&str, Target), Slot>>> =
        OnceLock::new();
    let slot = IMAGES
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry((source.file, target))
        .or_default()
        .clone();
    slot.get_or_init(|| {
        let image = nvrtc::compile(source.file, &source.full_text(), target)
            .unwrap_or_else(|e| panic!("{}", e));
        std::sync::Arc::new(image)
    })
    .clone()
}

#[test]
fn every_cuda_source_compiles_for_sm90a_sm80_and_compute80() {
    require_nvrtc();
    eprintln!("CUDA include folders: {:?}", nvrtc::include_dirs());
    // Every (source, target) on as many threads as the machine has cores (CI has 2): the
    // compiles are independent and each is single-threaded.
    let jobs: Vec<(&kernels::Source, Target)> = kernels::SOURCES
        .iter()
        .flat_map(|s| TARGETS.map(|t| (s, t)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(jobs.len()) {
            scope.spawn(|| {
                while let Some(&(source, target)) =
                    jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    compiled(source, target);
                }
            });
        }
    });
    for (source, target) in jobs {
        let image = compiled(source, target);
        if target == Target::Compute80Ptx {
            let ptx = String::from_utf8_lossy(&image.bytes);
            assert!(
                ptx.contains(".target sm_80"),
                "{}: not sm_80 PTX",
                source.file
            );
        } else {
            assert!(
                image.bytes.starts_with(b"\x7fELF"),
                "{}: not a cubin",
                source.file
            );
        }
        assert_eq!(image.target, target, "{}", source.file);
        eprintln!(
            "{} for {}: {} bytes",
            source.file,
            target.arch(),
            image.bytes.len()
        );
    }
}

#[test]
fn the_recurrent_kernel_exports_every_dtype() {
    require_nvrtc();
    let image = compiled(&kernels::RECURRENT, Target::Compute80Ptx);
    let ptx = String::from_utf8_lossy(&image.bytes);
    for name in [
        "gdn_recurrent_f32",
        "gdn_recurrent_f16",
        "gdn_recurrent_bf16",
    ] {
        assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
    }
}

#[test]
fn the_chunked_kernels_export_every_16_bit_dtype() {
    require_nvrtc();
    let image = compiled(&kernels::CHUNKED, Target::Compute80Ptx);
    let ptx = String::from_utf8_lossy(&image.bytes);
    for dtype in ["f16", "bf16"] {
        for pass in [
            "l2norm",
            "chunk_prep",
            "chunk_fwd32",
            "chunk_fwd64",
            "chunk_fwd128",
            "chunk_fwd32r",
            "chunk_fwd64r",
            "chunk_fwd64w",
        ] {
            let name = format!("gdn_{pass}_{dtype}");
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    }
    let image = compiled(&kernels::CHUNK_COMBINE, Target::Compute80Ptx);
    let ptx = String::from_utf8_lossy(&image.bytes);
    assert!(
        ptx.contains(".entry gdn_chunk_combine("),
        "gdn_chunk_combine missing"
    );
    // The chunked backward's kernels: the chains a source per dtype, the rest in one.
    const CHAINS: &[&str] = &[
        "chunk_bwd_states32",
        "chunk_bwd_states64",
        "chunk_bwd_states128",
        "chunk_bwd_dh32",
        "chunk_bwd_dh64",
        "chunk_bwd_dh128",
        "chunk_bwd_chains32",
        "chunk_bwd_chains64",
        "chunk_bwd_states32p",
        "chunk_bwd_states64p",
        "chunk_bwd_dh32p",
        "chunk_bwd_dh64p",
        "chunk_bwd_chains32p",
        "chunk_bwd_apart32p",
    ];
    for (source, dtypes, passes) in [
        (&kernels::CHUNK_BWD_CHAIN_F16, &["f16"][..], CHAINS),
        (&kernels::CHUNK_BWD_CHAIN_BF16, &["bf16"][..], CHAINS),
        (
            &kernels::CHUNK_BWD_GRAD,
            &["f16", "bf16"][..],
            &["chunk_bwd_prep", "chunk_bwd_grad"][..],
        ),
    ] {
        let image = compiled(source, Target::Compute80Ptx);
        let ptx = String::from_utf8_lossy(&image.bytes);
        for dtype in dtypes {
            for pass in passes {
                let name = format!("gdn_{pass}_{dtype}");
                assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
            }
        }
    }
}

#[test]
fn a_compile_error_is_a_typed_error_with_the_log() {
    require_nvrtc();
    let err = nvrtc::compile("broken.cu", "this is not C++;", Target::Sm80).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Gpu(_)), "{err:?}");
    assert!(msg.contains("broken.cu") && msg.contains("sm_80"), "{msg}");
}

#[test]
fn the_kernel_cache_hits_and_never_fails_the_call() {
    require_nvrtc();
    let dir = std::env::temp_dir().join(format!("gdn-cuda-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = kernels::RECURRENT.full_text();
    let target = Target::Sm80;
    let path = nvrtc::cache_path(&dir, "recurrent.cu", &src, target);

    let first = nvrtc::compile_cached("recurrent.cu", &src, target, Some(&dir)).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        first.bytes,
        "miss writes the entry"
    );
    // A hit returns the stored bytes (marked, so a recompile would show).
    let mut marked = first.bytes.clone();
    marked.extend_from_slice(b"cached");
    std::fs::write(&path, &marked).unwrap();
    let hit = nvrtc::compile_cached("recurrent.cu", &src, target, Some(&dir)).unwrap();
    assert_eq!(hit.bytes, marked);
    // Keys differ by source and by target.
    assert_ne!(
        path,
        nvrtc::cache_path(&dir, "recurrent.cu", &format!("{src}\n"), target)
    );
    assert_ne!(
        path,
        nvrtc::cache_path(&dir, "recurrent.cu", &src, Target::Sm90a)
    );
    // A corrupt entry is recompiled and replaced.
    std::fs::write(&path, b"garbage").unwrap();
    let again = nvrtc::compile_cached("recurrent.cu", &src, target, Some(&dir)).unwrap();
    assert!(again.bytes.starts_with(b"\x7fELF"));
    assert_eq!(std::fs::read(&path).unwrap(), again.bytes);
    // A cache folder that cannot be created (under a file) still compiles.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, b"x").unwrap();
    let through = nvrtc::compile_cached("recurrent.cu", &src, target, Some(&blocked.join("sub")));
    assert!(through.unwrap().bytes.starts_with(b"\x7fELF"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cuda_defines_become_define_options_and_malformed_ones_are_refused() {
    assert_eq!(
        nvrtc::parse_defines(" GDN_PREP_BLOCKS=3\tGDN_X  B=-1.5e+2 ").unwrap(),
        [
            "--define-macro=GDN_PREP_BLOCKS=3",
            "--define-macro=GDN_X",
            "--define-macro=B=-1.5e+2"
        ]
    );
    assert!(nvrtc::parse_defines("").unwrap().is_empty());
    for bad in ["3X=1", "A=", "A=(1)", "A-B", "=1", "A=1;B"] {
        match nvrtc::parse_defines(bad) {
            Err(Error::Value { name, got, .. }) => {
                assert_eq!(name, "GDN_CUDA_DEFINES");
                assert_eq!(got, bad);
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn targets_follow_the_compute_capability() {
    assert_eq!(Target::for_capability(9, 0).unwrap(), Target::Sm90a);
    for minor in [0, 6, 7, 9] {
        assert_eq!(Target::for_capability(8, minor).unwrap(), Target::Sm80);
    }
    assert_eq!(Target::for_capability(10, 0).unwrap(), Target::Compute80Ptx);
    assert_eq!(Target::for_capability(12, 0).unwrap(), Target::Compute80Ptx);
    assert!(matches!(
        Target::for_capability(7, 5),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn no_driver_or_device_is_a_typed_error_not_a_panic() {
    match Context::new() {
        Ok(ctx) => eprintln!("CUDA device present: {}", ctx.describe()),
        Err(e) => {
            assert!(matches!(e, Error::NoAdapter(_)), "{e:?}");
            eprintln!("no CUDA device (expected on this machine): {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// With a CUDA device

/// The shared context, or `None` with "not run" when there is no CUDA device; with
/// `GDN_REQUIRE_CUDA=1` a missing device fails the test.
fn cuda() -> Option<&'static Context> {
    static CTX: OnceLock<Result<Context, String>> = OnceLock::new();
    let ctx = CTX.get_or_init(|| {
        Context::new()
            .inspect(|c| eprintln!("{}", c.describe()))
            .map_err(|e| e.to_string())
    });
    match ctx {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("GDN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("GDN_REQUIRE_CUDA=1 but no CUDA context: {e}");
            }
            eprintln!("not run (no CUDA device; GDN_REQUIRE_CUDA=1 fails instead): {e}");
            None
        }
    }
}

/// `precompile` compiles every source into the cache (the default folder, so a cold cache
/// warms for the other tests) and loads them all; a second call has nothing left to do.
#[test]
fn precompile_caches_and_loads_every_source() {
    let Some(_) = cuda() else { return };
    let Some(dir) = nvrtc::default_cache_dir() else {
        panic!("no default cache folder: set GDN_CUDA_CACHE or HOME");
    };
    let ctx = Context::new().unwrap().with_cache_dir(Some(dir.clone()));
    let mut done: Vec<&str> = ctx.precompile().unwrap().iter().map(|p| p.0).collect();
    done.sort_unstable();
    let mut every: Vec<&str> = kernels::SOURCES.iter().map(|s| s.file).collect();
    every.sort_unstable();
    assert_eq!(done, every);
    for source in kernels::SOURCES {
        let path = nvrtc::cache_path(&dir, source.file, &source.full_text(), ctx.target());
        assert!(
            path.is_file(),
            "{} is not cached at {}",
            source.file,
            path.display()
        );
    }
    assert!(
        ctx.precompile().unwrap().is_empty(),
        "every module is loaded"
    );
}

fn upload(ctx: &Context, inputs: &ForwardInputs<HostTensor>) -> ForwardInputs<CudaTensor> {
    let up = |name: &str, t: &HostTensor| CudaTensor::upload(ctx, name, t).unwrap();
    ForwardInputs {
        q: up("q", &inputs.q),
        k: up("k", &inputs.k),
        v: up("v", &inputs.v),
        g: up("g", &inputs.g),
        beta: up("beta", &inputs.beta),
        initial_state: inputs.initial_state.as_ref().map(|t| up("h0", t)),
        a_log: inputs.a_log.as_ref().map(|t| up("A_log", t)),
        dt_bias: inputs.dt_bias.as_ref().map(|t| up("dt_bias", t)),
    }
}

/// The path the forward is expected to take: chunked for 16-bit storage with K ≤ 128.
fn expected_path(problem: &Problem, dtype: DType) -> ForwardPath {
    if dtype != DType::F32 && problem.key_dim <= cuda_backend::chunked::MAX_CHUNKED_KEY_DIM {
        ForwardPath::Chunked
    } else {
        ForwardPath::Recurrent
    }
}

/// The arithmetic of `path` for `dtype`.
fn arithmetic_of(path: ForwardPath, dtype: DType) -> Arithmetic {
    match (path, dtype) {
        (ForwardPath::Recurrent, _) | (_, DType::F32) => Arithmetic::F32,
        (ForwardPath::Chunked, DType::BF16) => Arithmetic::Bf16Operands,
        (ForwardPath::Chunked, DType::F16) => Arithmetic::F16Operands,
    }
}

/// Run the forward of `case` in `dtype` into NaN-poisoned outputs: through `forward_into`
/// (its own path choice) or forced onto the recurrent kernel.
fn run_forward(
    ctx: &Context,
    case: &HardCase,
    inputs: &ForwardInputs<HostTensor>,
    dtype: DType,
    force_recurrent: bool,
) -> ForwardOutputs<HostTensor> {
    let p = &case.problem;
    let dev = upload(ctx, inputs);
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
    let state = CudaTensor::filled(ctx, "state", &p.state_shape(), DType::F32, f32::NAN).unwrap();
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    if force_recurrent {
        cuda_backend::forward_recurrent_into(ctx, p, &seq, &dev.as_ref(), &outputs).unwrap();
    } else {
        cuda_backend::forward_into(ctx, p, &seq, &dev.as_ref(), &outputs).unwrap();
    }
    ctx.synchronize().unwrap();
    ForwardOutputs {
        o: o.download(ctx).unwrap(),
        final_state: state.download(ctx).unwrap(),
    }
}

#[test]
fn forward_matches_the_oracle_on_the_hard_cases_every_dtype() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    let mut chunked_runs = 0;
    for case in hard_cases() {
        for dtype in DTYPES {
            let p = &case.problem;
            let path = forward_path(ctx, p, dtype).unwrap();
            assert_eq!(path, expected_path(p, dtype), "[{}] {dtype}", case.name);
            assert_eq!(
                ctx.arithmetic(Op::Forward, p, dtype),
                arithmetic_of(path, dtype)
            );
            assert_eq!(ctx.arithmetic(Op::Decode, p, dtype), Arithmetic::F32);
            chunked_runs += usize::from(path == ForwardPath::Chunked);
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let got = run_forward(ctx, &case, &inputs, dtype, false);
            let what = format!("forward ({path:?})");
            let arithmetic = arithmetic_of(path, dtype);
            if let Err(e) = check(
                &what,
                &case,
                Op::Forward,
                dtype,
                arithmetic,
                &got,
                &expected,
            ) {
                failures.push(e);
            }
        }
    }
    assert!(chunked_runs > 0, "no case ran the chunked path");
    fail_on(failures);
}

#[test]
fn the_recurrent_forward_matches_the_oracle_for_every_dtype() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    for case in hard_cases() {
        for dtype in [DType::F16, DType::BF16] {
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let got = run_forward(ctx, &case, &inputs, dtype, true);
            let (what, f32_math) = ("forward (forced Recurrent)", Arithmetic::F32);
            if let Err(e) = check(what, &case, Op::Forward, dtype, f32_math, &got, &expected) {
                failures.push(e);
            }
        }
    }
    fail_on(failures);
}

#[test]
fn the_split_state_option_matches_the_oracle() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    for case in hard_cases() {
        for dtype in [DType::F16, DType::BF16] {
            let p = &case.problem;
            if forward_path(ctx, p, dtype).unwrap() != ForwardPath::Chunked {
                continue;
            }
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let dev = upload(ctx, &inputs);
            let plan = ChunkPlan::new(ctx, p, dtype)
                .unwrap()
                .with_split_state(true);
            assert!(plan.split_state());
            let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
            let state =
                CudaTensor::filled(ctx, "state", &p.state_shape(), DType::F32, f32::NAN).unwrap();
            let outputs = ForwardOutputs {
                o: &o,
                final_state: &state,
            };
            cuda_backend::launch_chunked(ctx, p, &plan, &dev.as_ref(), &outputs).unwrap();
            let got = ForwardOutputs {
                o: o.download(ctx).unwrap(),
                final_state: state.download(ctx).unwrap(),
            };
            let arithmetic = arithmetic_of(ForwardPath::Chunked, dtype);
            let what = "forward (Chunked, split state)";
            if let Err(e) = check(what, &case, Op::Forward, dtype, arithmetic, &got, &expected) {
                failures.push(e);
            }
        }
    }
    fail_on(failures);
}

/// Every V-block of the sequential pass, and sequence parallelism with segments as short as
/// one chunk (the local pass, the combine and segments starting mid-sequence), against the
/// oracle on every hard case that takes the chunked path.
#[test]
fn every_value_block_and_segment_length_matches_the_oracle() {
    let Some(ctx) = cuda() else { return };
    let variant = |segments, value_block, roles| PlanOptions {
        segments,
        value_block,
        roles: Some(roles),
        wgmma: Some(false),
        wgmma_stages: None,
    };
    // The roles' main pass on warpgroup MMAs (sm_90a only; elsewhere the plan says no), with
    // two and with three stages.
    let wgmma = |segments, value_block, stages| PlanOptions {
        wgmma: Some(true),
        wgmma_stages: Some(stages),
        ..variant(segments, value_block, true)
    };
    let variants = [
        variant(Segments::Off, Some(32), false),
        variant(Segments::Off, Some(64), false),
        variant(Segments::Off, Some(128), false),
        variant(Segments::Chunks(1), Some(32), false),
        variant(Segments::Chunks(2), Some(64), false),
        variant(Segments::Chunks(1), Some(128), false),
        variant(Segments::Chunks(3), None, false),
        variant(Segments::Off, Some(32), true),
        variant(Segments::Off, Some(64), true),
        variant(Segments::Chunks(1), Some(32), true),
        variant(Segments::Chunks(2), Some(64), true),
        wgmma(Segments::Off, Some(64), 3),
        wgmma(Segments::Chunks(2), Some(64), 3),
        wgmma(Segments::Off, Some(64), 2),
        wgmma(Segments::Chunks(3), Some(64), 2),
    ];
    let mut failures = Vec::new();
    let mut segmented_runs = 0;
    for case in hard_cases() {
        for dtype in [DType::F16, DType::BF16] {
            let p = &case.problem;
            if forward_path(ctx, p, dtype).unwrap() != ForwardPath::Chunked {
                continue;
            }
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let dev = upload(ctx, &inputs);
            for options in variants {
                let plan = ChunkPlan::with_options(ctx, p, dtype, options).unwrap();
                if let Some(bv) = options.value_block {
                    assert_eq!(plan.value_block(), bv);
                    assert_eq!(plan.roles(), options.roles == Some(true) && bv <= 64);
                }
                if let Some(n) = options.wgmma_stages {
                    assert_eq!(plan.wgmma_stages(), n);
                }
                let hopper = ctx.target() == Target::Sm90a;
                assert_eq!(
                    plan.wgmma(),
                    options.wgmma == Some(true)
                        && plan.roles()
                        && plan.value_block() == 64
                        && hopper
                );
                let longest = p
                    .sequences()
                    .iter()
                    .map(|s| (s.end - s.start).div_ceil(64))
                    .max();
                let cut = match options.segments {
                    Segments::Chunks(n) => longest.is_some_and(|c| c > n),
                    _ => false,
                };
                assert_eq!(plan.segment_chunks().is_some(), cut, "[{}]", case.name);
                segmented_runs += usize::from(cut);
                let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
                let state =
                    CudaTensor::filled(ctx, "state", &p.state_shape(), DType::F32, f32::NAN)
                        .unwrap();
                let outputs = ForwardOutputs {
                    o: &o,
                    final_state: &state,
                };
                cuda_backend::launch_chunked(ctx, p, &plan, &dev.as_ref(), &outputs).unwrap();
                let got = ForwardOutputs {
                    o: o.download(ctx).unwrap(),
                    final_state: state.download(ctx).unwrap(),
                };
                let arithmetic = arithmetic_of(ForwardPath::Chunked, dtype);
                let what = format!(
                    "forward (Chunked, {:?}, V-block {}, roles {}, wgmma {} stages {})",
                    options.segments,
                    plan.value_block(),
                    plan.roles(),
                    plan.wgmma(),
                    plan.wgmma_stages()
                );
                if let Err(e) = check(
                    &what,
                    &case,
                    Op::Forward,
                    dtype,
                    arithmetic,
                    &got,
                    &expected,
                ) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(segmented_runs > 0, "no case was cut into segments");
    fail_on(failures);
}

/// One chunked forward through a plan of `options` with the gate-driven `window`, into
/// NaN-poisoned outputs: o, the final state and the plan's report.
fn run_windowed(
    ctx: &Context,
    p: &Problem,
    dev: &ForwardInputs<CudaTensor>,
    dtype: DType,
    options: PlanOptions,
    window: Option<SegmentWindow>,
) -> (ForwardOutputs<HostTensor>, Option<SegmentPaths>) {
    let mut plan = ChunkPlan::with_options(ctx, p, dtype, options).unwrap();
    plan.set_segment_window(window);
    assert_eq!(plan.segment_window(), window);
    let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
    let state = CudaTensor::filled(ctx, "state", &p.state_shape(), DType::F32, f32::NAN).unwrap();
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    cuda_backend::launch_chunked(ctx, p, &plan, &dev.as_ref(), &outputs).unwrap();
    let paths = plan.segment_paths(ctx).unwrap();
    let got = ForwardOutputs {
        o: o.download(ctx).unwrap(),
        final_state: state.download(ctx).unwrap(),
    };
    (got, paths)
}

/// The gate-driven window (docs/sequence-parallelism.md) on every hard case that takes the
/// chunked path, with segments of 1 and 2 chunks at every V-block, against the oracle; the
/// report covers every (segment, v-head) pair.
#[test]
fn the_gate_window_matches_the_oracle_on_the_hard_cases() {
    let Some(ctx) = cuda() else { return };
    let window = Some(SegmentWindow::DEFAULT);
    let variants = [
        (Segments::Chunks(1), Some(32)),
        (Segments::Chunks(2), Some(64)),
        (Segments::Chunks(1), Some(128)),
    ];
    let mut failures = Vec::new();
    let mut windowed_pairs = 0;
    for case in hard_cases() {
        for dtype in [DType::F16, DType::BF16] {
            let p = &case.problem;
            if forward_path(ctx, p, dtype).unwrap() != ForwardPath::Chunked {
                continue;
            }
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let dev = upload(ctx, &inputs);
            for (segments, value_block) in variants {
                let options = PlanOptions {
                    segments,
                    value_block,
                    ..PlanOptions::default()
                };
                let (got, paths) = run_windowed(ctx, p, &dev, dtype, options, window);
                if let Some(paths) = paths {
                    let plan = ChunkPlan::with_options(ctx, p, dtype, options).unwrap();
                    assert!(plan.segment_chunks().is_some(), "[{}]", case.name);
                    assert!(
                        paths.windowed + paths.exact >= p.heads_v,
                        "[{}] {paths:?}",
                        case.name
                    );
                    windowed_pairs += paths.windowed;
                }
                let what =
                    format!("forward (Chunked, {segments:?}, V-block {value_block:?}, window)");
                let arithmetic = arithmetic_of(ForwardPath::Chunked, dtype);
                if let Err(e) = check(
                    &what,
                    &case,
                    Op::Forward,
                    dtype,
                    arithmetic,
                    &got,
                    &expected,
                ) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(windowed_pairs > 0, "no pair took the window");
    fail_on(failures);
}

/// The window's report counts what ran (per-token gates whose chunk decays are −0 (never),
/// −1280, −6.4 and −1.92, as tests/segment_window.rs on wgpu), and heads that never decay
/// are bit for bit the exact path.
#[test]
fn the_gate_window_reports_each_path_and_keeps_g0_heads_exact() {
    let Some(ctx) = cuda() else { return };
    // 16 whole chunks in segments of 4: four segments per head.
    let p = problem(1, 16 * 64, 1, 4, 32, 32, None, Options::default());
    let dtype = DType::BF16;
    let mut inputs = RandomSpec::default().generate(&p);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let gates = [0.0f32, -20.0, -0.1, -0.03];
    for (i, g) in inputs.g.data.iter_mut().enumerate() {
        *g = gates[i % 4];
    }
    let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
    let dev = upload(ctx, &inputs);
    let options = PlanOptions {
        segments: Segments::Chunks(4),
        ..PlanOptions::default()
    };
    let window = |t, m| Some(SegmentWindow::new(t, m).unwrap());
    let case = HardCase {
        name: "T1024 gates 0, -20, -0.1, -0.03".into(),
        problem: p.clone(),
        spec: RandomSpec::default(),
    };
    let (exact, exact_paths) = run_windowed(ctx, &p, &dev, dtype, options, None);
    let mut failures = Vec::new();
    for (w, want) in [
        // Head 1 needs 1 chunk, head 2 two (−12.8), head 3 more than a segment (−7.68).
        (window(-10.0, None), (8, 8, 2)),
        // At most one chunk: head 2 falls back too.
        (window(-10.0, Some(1)), (4, 12, 1)),
        // At −5: head 2 needs one chunk, head 3 three (−5.76).
        (window(-5.0, None), (12, 4, 3)),
        (None, (0, 16, 0)),
    ] {
        let (got, paths) = run_windowed(ctx, &p, &dev, dtype, options, w);
        let want = SegmentPaths {
            windowed: want.0,
            exact: want.1,
            longest_warmup_chunks: want.2,
        };
        assert_eq!(paths, Some(want), "{w:?}");
        if let Err(e) = check(
            &format!("forward (Chunked, segments of 4, {w:?})"),
            &case,
            Op::Forward,
            dtype,
            arithmetic_of(ForwardPath::Chunked, dtype),
            &got,
            &expected,
        ) {
            failures.push(e);
        }
        // Head 0 (g = 0) is exact in every run: its o columns and state bit for bit.
        let (v, k) = (p.value_dim, p.key_dim);
        for t in 0..p.total_tokens() {
            let at = t * 4 * v;
            assert_eq!(
                got.o.data[at..at + v],
                exact.o.data[at..at + v],
                "{w:?}: o of the g = 0 head at token {t}"
            );
        }
        assert_eq!(
            got.final_state.data[..k * v],
            exact.final_state.data[..k * v],
            "{w:?}: the g = 0 head's state"
        );
    }
    assert_eq!(
        exact_paths,
        Some(SegmentPaths {
            windowed: 0,
            exact: 16,
            longest_warmup_chunks: 0
        })
    );
    // Without segments there is no report.
    let whole = PlanOptions {
        segments: Segments::Off,
        ..PlanOptions::default()
    };
    assert_eq!(
        run_windowed(ctx, &p, &dev, dtype, whole, window(-10.0, None)).1,
        None
    );
    fail_on(failures);
}

/// Bad plan overrides are typed errors; the automatic choice keeps a many-head problem whole.
#[test]
fn plan_overrides_are_checked() {
    let Some(ctx) = cuda() else { return };
    let p = problem(1, 300, 1, 2, 128, 128, None, Options::default());
    let with = |segments, value_block| {
        ChunkPlan::with_options(
            ctx,
            &p,
            DType::BF16,
            PlanOptions {
                segments,
                value_block,
                ..PlanOptions::default()
            },
        )
    };
    let mut bad = Vec::new();
    for value_block in [16, 48, 256] {
        bad.push(with(Segments::Auto, Some(value_block)));
    }
    bad.push(with(Segments::Chunks(0), None));
    for err in bad {
        let err = err.unwrap_err();
        assert!(matches!(err, Error::Value { .. }), "{err:?}");
    }
    let many_heads = problem(1, 2048, 16, 64, 128, 128, None, Options::default());
    let plan = ChunkPlan::new(ctx, &many_heads, DType::BF16).unwrap();
    assert_eq!(plan.segment_chunks(), None);
}

#[test]
fn a_chunk_plan_is_reusable_and_checked() {
    let Some(ctx) = cuda() else { return };
    let cases = hard_cases();
    let case = &cases[0];
    let p = &case.problem;
    let dtype = DType::BF16;
    let (inputs, _) = inputs_and_oracle(case, dtype);
    let dev = upload(ctx, &inputs);
    let plan = ChunkPlan::new(ctx, p, dtype).unwrap();
    assert!(plan.workspace_bytes() > 0);
    let mut results = Vec::new();
    for _ in 0..2 {
        let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
        let state =
            CudaTensor::filled(ctx, "state", &p.state_shape(), DType::F32, f32::NAN).unwrap();
        let outputs = ForwardOutputs {
            o: &o,
            final_state: &state,
        };
        cuda_backend::launch_chunked(ctx, p, &plan, &dev.as_ref(), &outputs).unwrap();
        results.push((o.download(ctx).unwrap(), state.download(ctx).unwrap()));
    }
    assert_eq!(
        results[0].0.data, results[1].0.data,
        "o differs between runs"
    );
    assert_eq!(
        results[0].1.data, results[1].1.data,
        "state differs between runs"
    );
    // A plan of another problem or dtype is a typed error, as is a plan for f32 storage.
    let other = problem(3, 130, 2, 4, 64, 64, None, Options::default());
    let o = CudaTensor::zeros(ctx, "o", &other.v_shape(), dtype).unwrap();
    let state = CudaTensor::zeros(ctx, "state", &other.state_shape(), DType::F32).unwrap();
    let other_inputs = RandomSpec::default().generate(&other);
    let mut other_inputs = other_inputs;
    for t in [
        &mut other_inputs.q,
        &mut other_inputs.k,
        &mut other_inputs.v,
    ] {
        *t = t.clone().with_dtype(dtype);
    }
    let other_dev = upload(ctx, &other_inputs);
    let err = cuda_backend::launch_chunked(
        ctx,
        &other,
        &plan,
        &other_dev.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Value { .. }), "{err:?}");
    assert!(matches!(
        ChunkPlan::new(ctx, p, DType::F32),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn decode_matches_the_oracle_on_the_hard_cases_every_dtype() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    for case in hard_cases() {
        for dtype in DTYPES {
            for tokens_per_step in [1, 5] {
                let p = &case.problem;
                let (inputs, expected) = inputs_and_oracle(&case, dtype);
                let dev = upload(ctx, &inputs);
                let seq = SeqBounds::upload(ctx, p).unwrap();
                let pool = match &inputs.initial_state {
                    Some(h0) => CudaTensor::upload(ctx, "pool", h0).unwrap(),
                    None => CudaTensor::zeros(ctx, "pool", &p.state_shape(), DType::F32).unwrap(),
                };
                let o = CudaTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
                cuda_backend::decode_into(ctx, p, &seq, &dev.as_ref(), &o, &pool, tokens_per_step)
                    .unwrap();
                ctx.synchronize().unwrap();
                let got = ForwardOutputs {
                    o: o.download(ctx).unwrap(),
                    final_state: pool.download(ctx).unwrap(),
                };
                let what = format!("decode ({tokens_per_step}/step)");
                // The decode kernel (decode.cu) multiplies in f32.
                let f32_math = Arithmetic::F32;
                if let Err(e) = check(&what, &case, Op::Decode, dtype, f32_math, &got, &expected) {
                    failures.push(e);
                }
            }
        }
    }
    fail_on(failures);
}

#[test]
fn the_backend_trait_runs_forward_and_decode() {
    let Some(ctx) = cuda() else { return };
    assert_eq!(ctx.name(), "cuda");
    assert_eq!(ctx.storage_dtypes(Op::Forward), DTYPES.to_vec());
    let cases = hard_cases();
    let mut failures = Vec::new();
    for case in [&cases[0], &cases[3], cases.last().unwrap()] {
        let dtype = DType::BF16;
        let (inputs, expected) = inputs_and_oracle(case, dtype);
        let fwd = ctx.forward(&case.problem, &inputs.as_ref()).unwrap();
        let dec = ctx.decode(&case.problem, &inputs.as_ref(), 3).unwrap();
        let fwd_math = ctx.arithmetic(Op::Forward, &case.problem, dtype);
        for (what, op, out, arithmetic) in [
            ("Backend::forward", Op::Forward, fwd, fwd_math),
            ("Backend::decode", Op::Decode, dec, Arithmetic::F32),
        ] {
            assert_eq!(out.final_state.shape, case.problem.state_shape().to_vec());
            if let Err(e) = check(what, case, op, dtype, arithmetic, &out, &expected) {
                failures.push(e);
            }
        }
    }
    fail_on(failures);
}

#[test]
fn bad_input_is_a_typed_error() {
    let Some(ctx) = cuda() else { return };
    let case = &hard_cases()[0];
    let p = &case.problem;
    let inputs = case.spec.generate(p);
    assert!(matches!(
        ctx.decode(p, &inputs.as_ref(), 0),
        Err(Error::Value { .. })
    ));
    // A positive log-decay is refused before anything runs.
    let mut bad = inputs.clone();
    bad.g.data[3] = 0.5;
    assert!(matches!(
        ctx.forward(p, &bad.as_ref()),
        Err(Error::Value { .. })
    ));
    // o in the wrong dtype for the launcher.
    let dev = upload(ctx, &inputs);
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let o = CudaTensor::zeros(ctx, "o", &p.v_shape(), DType::BF16).unwrap();
    let state = CudaTensor::zeros(ctx, "state", &p.state_shape(), DType::F32).unwrap();
    let err = cuda_backend::forward_into(
        ctx,
        p,
        &seq,
        &dev.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err:?}");
    // Sequence bounds of another problem.
    let other = problem(3, 130, 2, 4, 64, 64, None, Options::default());
    let seq3 = SeqBounds::upload(ctx, &other).unwrap();
    let o = CudaTensor::zeros(ctx, "o", &p.v_shape(), DType::F32).unwrap();
    let err = cuda_backend::forward_into(
        ctx,
        p,
        &seq3,
        &dev.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Value { .. }), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// The backward against the f64 BPTT oracle: the chunked path (chunk_bwd_*.cu) for f16/bf16
// with K, V ≤ 128, the exact path (backward.cu) for f32 and the rest, and forced for every dtype

/// The backward path expected for `dtype`: chunked for 16-bit storage with K, V ≤ 128.
fn expected_backward_path(problem: &Problem, dtype: DType) -> BackwardPath {
    if dtype != DType::F32
        && problem.key_dim <= cuda_backend::chunked::MAX_CHUNKED_KEY_DIM
        && problem.value_dim <= cuda_backend::MAX_CHUNKED_BWD_VALUE_DIM
    {
        BackwardPath::Chunked
    } else {
        BackwardPath::Exact
    }
}

/// The arithmetic of backward `path` for `dtype`.
fn backward_arithmetic_of(path: BackwardPath, dtype: DType) -> Arithmetic {
    match (path, dtype) {
        (BackwardPath::Exact, _) | (_, DType::F32) => Arithmetic::F32,
        (BackwardPath::Chunked, DType::BF16) => Arithmetic::Bf16Operands,
        (BackwardPath::Chunked, DType::F16) => Arithmetic::F16Operands,
    }
}

/// The backward of `inputs` on `path` into NaN-poisoned gradients, downloaded.
fn run_backward(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
    path: BackwardPath,
    options: BackwardOptions,
) -> gdn_wgpu::Gradients<HostTensor> {
    let p = problem;
    let dtype = inputs.q.dtype;
    let dev = upload(ctx, inputs);
    let dev = dev.as_ref();
    let d_o = CudaTensor::upload(ctx, "do", d_o).unwrap();
    let dht = dht.map(|t| CudaTensor::upload(ctx, "dht", t).unwrap());
    let ws = BackwardWorkspace::with_options(ctx, p, dtype, path, options).unwrap();
    assert_eq!(ws.path(), path);
    if path == BackwardPath::Chunked {
        if options.chains != ChainSchedule::Auto {
            assert_eq!(ws.chain_schedule(), Some(options.chains));
        }
        if options.value_block.is_some() {
            assert_eq!(ws.value_block(), options.value_block);
        }
        if let Some(pairs) = options.warp_pairs {
            assert_eq!(ws.warp_pairs(), Some(pairs));
        }
        // Forced segments cut every sequence longer than a segment, and only those.
        let longest = p.sequences().iter().map(|s| s.len().div_ceil(64)).max();
        match options.segments {
            Segments::Off => assert_eq!(ws.segment_chunks(), None),
            Segments::Chunks(n) => assert_eq!(
                ws.segment_chunks(),
                longest.filter(|&c| c > n).map(|_| n),
                "segments of {n}"
            ),
            Segments::Auto => {}
        }
    }
    let grads = cuda_backend::backward::alloc_gradients(ctx, p, &dev, f32::NAN).unwrap();
    backward_into(
        ctx,
        p,
        &ws,
        &dev,
        &d_o,
        dht.as_ref(),
        &cuda_backend::backward::gradients_ref(&grads),
    )
    .unwrap();
    ctx.synchronize().unwrap();
    download_gradients(ctx, &grads)
}

#[test]
fn backward_matches_the_oracle_on_the_hard_cases_every_dtype() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    let mut chunked_runs = 0;
    for case in hard_cases() {
        for dtype in DTYPES {
            let p = &case.problem;
            let path = backward_path(ctx, p, dtype).unwrap();
            assert_eq!(
                path,
                expected_backward_path(p, dtype),
                "[{}] {dtype}",
                case.name
            );
            assert_eq!(
                ctx.arithmetic(Op::Backward, p, dtype),
                backward_arithmetic_of(path, dtype)
            );
            // The exact path also runs where the chunked one is chosen (forced, as
            // GDN_CUDA_BACKWARD=exact does), and the chunked one with its chains one after
            // the other (the automatic choice runs them apart in one launch, with warp pairs,
            // on these small grids) and with and without warp pairs both ways, together, and
            // apart, each with segments forced off; then with segments of 1 and 2 chunks
            // (local passes, both combines) together and apart with pairs, one after the
            // other without, and at V-block 128.
            let auto = BackwardOptions::default();
            let mut runs = vec![(path, auto)];
            if path == BackwardPath::Chunked {
                let serial = BackwardOptions {
                    chains: ChainSchedule::Serial,
                    ..auto
                };
                for (chains, pairs) in [
                    (ChainSchedule::Serial, false),
                    (ChainSchedule::Serial, true),
                    (ChainSchedule::Together, false),
                    (ChainSchedule::Together, true),
                    (ChainSchedule::Apart, true),
                ] {
                    let options = BackwardOptions {
                        chains,
                        warp_pairs: Some(pairs),
                        segments: Segments::Off,
                        ..serial
                    };
                    runs.push((path, options));
                }
                for (chains, pairs, value_block, n) in [
                    (ChainSchedule::Together, true, None, 1),
                    (ChainSchedule::Apart, true, None, 2),
                    (ChainSchedule::Serial, false, None, 2),
                    (ChainSchedule::Serial, false, Some(128), 1),
                ] {
                    let options = BackwardOptions {
                        chains,
                        value_block,
                        warp_pairs: Some(pairs),
                        segments: Segments::Chunks(n),
                    };
                    runs.push((path, options));
                }
                runs.push((BackwardPath::Exact, auto));
                chunked_runs += 1;
            }
            for with_dht in [false, true] {
                let (inputs, d_o, dht, expected) = backward_case(&case, dtype, with_dht);
                for &(run_path, options) in &runs {
                    let got = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), run_path, options);
                    let what = format!(
                        "{} backward{} (chains {}{}{})",
                        run_path.name(),
                        if with_dht { " + dht" } else { "" },
                        options.chains.name(),
                        if options.warp_pairs == Some(true) {
                            ", warp pairs"
                        } else {
                            ""
                        },
                        match options.segments {
                            Segments::Chunks(n) => format!(", segments of {n}"),
                            _ => String::new(),
                        }
                    );
                    failures.extend(check_gradients_with(
                        &what,
                        &case,
                        dtype,
                        backward_arithmetic_of(run_path, dtype),
                        &got,
                        &expected,
                    ));
                }
            }
        }
    }
    assert!(
        chunked_runs > 20,
        "the chunked backward ran {chunked_runs} cases"
    );
    fail_on(failures);
}

/// Many chunks per sequence (the chains carry S and dS' across 31 chunks), every V-block of the
/// chains one after the other and together, with and without warp pairs, both 16-bit dtypes;
/// two runs bitwise equal (no atomics), every schedule and V-block bitwise equal to the others
/// of its kind (single warps, warp pairs), each kind within the oracle's bounds.
#[test]
fn the_chunked_backward_over_many_chunks_is_deterministic_and_matches_the_oracle() {
    let Some(ctx) = cuda() else { return };
    let case = HardCase {
        name: "T1990 + 10 K128 V128 GVA2 special gates".into(),
        problem: problem(
            1,
            2000,
            1,
            2,
            128,
            128,
            Some(vec![0, 1990, 2000]),
            Options::default(),
        ),
        spec: RandomSpec {
            zero_gate_heads: 1,
            ..common::cases::spec(51, true)
        },
    };
    let p = &case.problem;
    let mut failures = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
        let chunked = BackwardPath::Chunked;
        let auto = BackwardOptions::default();
        // The automatic rule here (2 v-heads, 4 V-blocks of 32: 32 blocks for both sequences,
        // most SMs idle): the 32-chunk sequence in segments of 16 (the shortest the rule
        // cuts), both chains apart in one launch (3 units: 48 blocks, one per SM).
        let ws = BackwardWorkspace::with_options(ctx, p, dtype, chunked, auto).unwrap();
        assert_eq!(ws.segment_chunks(), Some(16), "{dtype} automatic segments");
        assert_eq!(ws.chain_schedule(), Some(ChainSchedule::Apart), "{dtype}");
        assert_eq!(ws.warp_pairs(), Some(true), "{dtype}");
        drop(ws);
        let first = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), chunked, auto);
        let second = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), chunked, auto);
        for ((name, a), (_, b)) in gradient_list(&first)
            .into_iter()
            .zip(gradient_list(&second))
        {
            if let Err(e) = same_bits(&format!("{dtype} {name} run twice"), a, b) {
                failures.push(e);
            }
        }
        // Every schedule and V-block, without and with warp pairs: bitwise the same within
        // each (the same arithmetic per column; pairs sum K·S in two halves, another rounding
        // order).
        let single: Vec<(ChainSchedule, usize)> = CHAIN_VALUE_BLOCKS
            .iter()
            .map(|&bv| (ChainSchedule::Serial, bv))
            .chain([32, 64].map(|bv| (ChainSchedule::Together, bv)))
            .collect();
        let pairs = vec![
            (ChainSchedule::Serial, 32),
            (ChainSchedule::Serial, 64),
            (ChainSchedule::Together, 32),
            (ChainSchedule::Apart, 32),
        ];
        let mut representatives = vec![("automatic".to_string(), first)];
        for (warp_pairs, runs) in [(false, single), (true, pairs)] {
            let got: Vec<(String, gdn_wgpu::Gradients<HostTensor>)> = runs
                .into_iter()
                .map(|(chains, bv)| {
                    let options = BackwardOptions {
                        chains,
                        value_block: Some(bv),
                        warp_pairs: Some(warp_pairs),
                        segments: Segments::Off,
                    };
                    let what = format!(
                        "chains {} at V-block {bv}{}",
                        chains.name(),
                        if warp_pairs { " with warp pairs" } else { "" }
                    );
                    let g = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), chunked, options);
                    (what, g)
                })
                .collect();
            for (what, other) in &got[1..] {
                for ((name, a), (_, b)) in gradient_list(&got[0].1)
                    .into_iter()
                    .zip(gradient_list(other))
                {
                    if let Err(e) = same_bits(&format!("{dtype} {name} {what}"), a, b) {
                        failures.push(e);
                    }
                }
            }
            representatives.extend(got.into_iter().take(1));
        }
        // Sequence parallelism: segments of 7 chunks (the 1990-token sequence's 32 chunks in
        // 5 units, the 10-token one whole), together and apart with pairs and one after the
        // other at V-block 64; two runs bitwise equal, each within the oracle's bounds.
        for (chains, bv, pairs) in [
            (ChainSchedule::Together, 32, true),
            (ChainSchedule::Apart, 32, true),
            (ChainSchedule::Serial, 64, false),
        ] {
            let options = BackwardOptions {
                chains,
                value_block: Some(bv),
                warp_pairs: Some(pairs),
                segments: Segments::Chunks(7),
            };
            let what = format!("chains {} at V-block {bv}, segments of 7", chains.name());
            let a = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), chunked, options);
            let b = run_backward(ctx, p, &inputs, &d_o, dht.as_ref(), chunked, options);
            for ((name, x), (_, y)) in gradient_list(&a).into_iter().zip(gradient_list(&b)) {
                if let Err(e) = same_bits(&format!("{dtype} {name} {what} run twice"), x, y) {
                    failures.push(e);
                }
            }
            representatives.push((what, a));
        }
        for (what, got) in &representatives {
            failures.extend(check_gradients_with(
                &format!("chunked backward, {what}"),
                &case,
                dtype,
                backward_arithmetic_of(BackwardPath::Chunked, dtype),
                got,
                &expected,
            ));
        }
    }
    fail_on(failures);
}

#[test]
fn the_backend_trait_runs_forward_backward() {
    let Some(ctx) = cuda() else { return };
    assert_eq!(ctx.storage_dtypes(Op::Backward), DTYPES.to_vec());
    let cases = hard_cases();
    let mut failures = Vec::new();
    for (case, dtype) in [
        (&cases[0], DType::F32),
        (&cases[3], DType::BF16),
        (cases.last().unwrap(), DType::F16),
    ] {
        let (inputs, d_o, dht, expected) = backward_case(case, dtype, true);
        let (out, grads) = ctx
            .forward_backward(&case.problem, &inputs.as_ref(), &d_o, dht.as_ref())
            .unwrap();
        let fwd = reference::forward(&case.problem, &inputs.as_ref()).unwrap();
        let what = "Backend::forward_backward";
        if let Err(e) = check(
            what,
            case,
            Op::Forward,
            dtype,
            ctx.arithmetic(Op::Forward, &case.problem, dtype),
            &out,
            &fwd,
        ) {
            failures.push(e);
        }
        failures.extend(check_gradients_with(
            what,
            case,
            dtype,
            ctx.arithmetic(Op::Backward, &case.problem, dtype),
            &grads,
            &expected,
        ));
    }
    fail_on(failures);
}

#[test]
fn backward_bad_input_is_a_typed_error() {
    let Some(ctx) = cuda() else { return };
    let case = &hard_cases()[0];
    let p = &case.problem;
    let (inputs, d_o, _, _) = backward_case(case, DType::F32, false);
    // do in another dtype than v.
    let err = ctx
        .forward_backward(
            p,
            &inputs.as_ref(),
            &d_o.clone().with_dtype(DType::BF16),
            None,
        )
        .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err:?}");
    let dev = upload(ctx, &inputs);
    let dev = dev.as_ref();
    let d_o = CudaTensor::upload(ctx, "do", &d_o).unwrap();
    let grads = cuda_backend::backward::alloc_gradients(ctx, p, &dev, 0.0).unwrap();
    let run = |ws_problem: &Problem, grads: &gdn_wgpu::Gradients<&CudaTensor>| {
        let ws = BackwardWorkspace::new(ctx, ws_problem, DType::F32).unwrap();
        backward_into(ctx, p, &ws, &dev, &d_o, None, grads)
    };
    let all = cuda_backend::backward::gradients_ref(&grads);
    run(p, &all).unwrap();
    // A workspace made for another problem.
    let other = problem(3, 130, 2, 4, 64, 64, None, Options::default());
    assert!(matches!(run(&other, &all), Err(Error::Value { .. })));
    // dh0 missing although the forward had an initial state.
    let no_dh0 = gdn_wgpu::Gradients { dh0: None, ..all };
    assert!(matches!(run(p, &no_dh0), Err(Error::Missing { .. })));
    // dq in the wrong dtype.
    let bad = CudaTensor::zeros(ctx, "dq", &p.qk_shape(), DType::BF16).unwrap();
    let wrong = gdn_wgpu::Gradients { dq: &bad, ..all };
    assert!(matches!(run(p, &wrong), Err(Error::DType { .. })));
    // A workspace made for another storage dtype.
    let ws16 = BackwardWorkspace::new(ctx, p, DType::BF16).unwrap();
    assert_eq!(ws16.path(), BackwardPath::Chunked);
    let err = backward_into(ctx, p, &ws16, &dev, &d_o, None, &all).unwrap_err();
    assert!(matches!(err, Error::Value { .. }), "{err:?}");
    // The chunked path forced where it cannot run: f32 storage, K = 256.
    for (problem, dtype) in [(p, DType::F32), (&hard_cases()[5].problem, DType::BF16)] {
        let err =
            BackwardWorkspace::with_path(ctx, problem, dtype, BackwardPath::Chunked).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    }
    assert_eq!(
        BackwardPath::parse_override("GDN_CUDA_BACKWARD", "Exact").unwrap(),
        Some(BackwardPath::Exact)
    );
    assert!(BackwardPath::parse_override("GDN_CUDA_BACKWARD", "fast").is_err());
    ctx.synchronize().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Interop: a caller's stream and caller-owned device memory (as PyTorch hands them over), and
// CUDA-graph capture + replay

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use gdn_wgpu::cuda_backend::backward::{
    BackwardOptions, BackwardWorkspace, ChainSchedule, backward_into,
};
use gdn_wgpu::{Gradients, TensorMeta};

/// The caller's side: its own cudarc context (the device's primary context, as the CUDA
/// runtime's) and stream, and the device memory it allocated.
struct Caller {
    stream: Arc<CudaStream>,
    buffers: Vec<CudaSlice<u8>>,
}

impl Caller {
    fn new() -> Self {
        let ctx = CudaContext::new(0).unwrap();
        Caller {
            stream: ctx.new_stream().unwrap(),
            buffers: Vec::new(),
        }
    }

    /// An interop context enqueuing on the caller's stream.
    fn context(&self) -> Context {
        // SAFETY: the stream is the caller's, of device 0's primary context, and outlives the
        // context (both live for the test).
        unsafe { Context::from_raw_stream(0, self.stream.cu_stream()) }.unwrap()
    }

    /// Caller memory holding `bytes` (at least 16), wrapped without a copy.
    fn wrap(&mut self, ctx: &Context, bytes: Vec<u8>, shape: &[usize], dtype: DType) -> CudaTensor {
        let mut bytes = bytes;
        bytes.resize(bytes.len().max(16), 0);
        let buf = self.stream.clone_htod(&bytes).unwrap();
        let ptr = buf.device_ptr(&self.stream).0;
        self.buffers.push(buf);
        // SAFETY: `buf` holds the tensor's bytes on device 0 and lives in `self.buffers` until
        // the end of the test, after every launch on it has been waited for.
        unsafe { CudaTensor::from_raw(ctx, ptr, shape, dtype) }.unwrap()
    }
}

fn encode(t: &HostTensor) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(t.data.len() * t.dtype.size());
    for &x in &t.data {
        match t.dtype {
            DType::F32 => bytes.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => bytes.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            DType::BF16 => bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
        }
    }
    bytes
}

/// Where a run's tensors live: memory the crate allocates on the shared context, or caller
/// memory wrapped by an interop context on the caller's stream.
enum Mem<'a> {
    Owning(&'a Context),
    Caller(&'a Context, &'a mut Caller),
}

impl Mem<'_> {
    fn ctx(&self) -> &Context {
        match self {
            Mem::Owning(ctx) | Mem::Caller(ctx, _) => ctx,
        }
    }

    fn input(&mut self, t: &HostTensor) -> CudaTensor {
        match self {
            Mem::Owning(ctx) => CudaTensor::upload(ctx, "input", t).unwrap(),
            Mem::Caller(ctx, caller) => caller.wrap(ctx, encode(t), &t.shape, t.dtype),
        }
    }

    /// NaN in every element (all-ones bits are NaN in f32, f16 and bf16).
    fn poisoned(&mut self, shape: &[usize], dtype: DType) -> CudaTensor {
        match self {
            Mem::Owning(ctx) => CudaTensor::filled(ctx, "output", shape, dtype, f32::NAN).unwrap(),
            Mem::Caller(ctx, caller) => {
                let bytes = vec![0xff; shape.iter().product::<usize>() * dtype.size()];
                caller.wrap(ctx, bytes, shape, dtype)
            }
        }
    }

    fn inputs(&mut self, inputs: &ForwardInputs<HostTensor>) -> ForwardInputs<CudaTensor> {
        ForwardInputs {
            q: self.input(&inputs.q),
            k: self.input(&inputs.k),
            v: self.input(&inputs.v),
            g: self.input(&inputs.g),
            beta: self.input(&inputs.beta),
            initial_state: inputs.initial_state.as_ref().map(|t| self.input(t)),
            a_log: inputs.a_log.as_ref().map(|t| self.input(t)),
            dt_bias: inputs.dt_bias.as_ref().map(|t| self.input(t)),
        }
    }

    fn gradients(
        &mut self,
        p: &Problem,
        inputs: &ForwardInputs<HostTensor>,
    ) -> Gradients<CudaTensor> {
        let gate = p.options.gate_in_kernel;
        Gradients {
            dq: self.poisoned(&p.qk_shape(), inputs.q.dtype),
            dk: self.poisoned(&p.qk_shape(), inputs.k.dtype),
            dv: self.poisoned(&p.v_shape(), inputs.v.dtype),
            dg: self.poisoned(&p.gate_shape(), DType::F32),
            dbeta: self.poisoned(&p.gate_shape(), DType::F32),
            dh0: inputs
                .initial_state
                .as_ref()
                .map(|_| self.poisoned(&p.state_shape(), DType::F32)),
            da_log: gate.then(|| self.poisoned(&[p.heads_v], DType::F32)),
            ddt_bias: gate.then(|| self.poisoned(&[p.heads_v], DType::F32)),
        }
    }
}

fn download_outputs(
    ctx: &Context,
    o: &CudaTensor,
    state: &CudaTensor,
) -> ForwardOutputs<HostTensor> {
    ForwardOutputs {
        o: o.download(ctx).unwrap(),
        final_state: state.download(ctx).unwrap(),
    }
}

fn download_gradients(ctx: &Context, g: &Gradients<CudaTensor>) -> Gradients<HostTensor> {
    let down = |t: &CudaTensor| t.download(ctx).unwrap();
    Gradients {
        dq: down(&g.dq),
        dk: down(&g.dk),
        dv: down(&g.dv),
        dg: down(&g.dg),
        dbeta: down(&g.dbeta),
        dh0: g.dh0.as_ref().map(down),
        da_log: g.da_log.as_ref().map(down),
        ddt_bias: g.ddt_bias.as_ref().map(down),
    }
}

fn gradient_list(g: &Gradients<HostTensor>) -> Vec<(&'static str, &HostTensor)> {
    let mut list = vec![
        ("dq", &g.dq),
        ("dk", &g.dk),
        ("dv", &g.dv),
        ("dg", &g.dg),
        ("dbeta", &g.dbeta),
    ];
    for (name, t) in [
        ("dh0", &g.dh0),
        ("dA_log", &g.da_log),
        ("ddt_bias", &g.ddt_bias),
    ] {
        if let Some(t) = t {
            list.push((name, t));
        }
    }
    list
}

/// `a` and `b` hold the same bits; a failure message otherwise.
fn same_bits(what: &str, a: &HostTensor, b: &HostTensor) -> Result<(), String> {
    let bits = |t: &HostTensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if a.shape != b.shape || a.dtype != b.dtype || bits(a) != bits(b) {
        let differ = a
            .data
            .iter()
            .zip(&b.data)
            .filter(|(x, y)| x.to_bits() != y.to_bits());
        return Err(format!(
            "{what}: not bitwise equal ({} elements differ)",
            differ.count()
        ));
    }
    Ok(())
}

/// What one run of every launcher gave.
struct LauncherRuns {
    chunked: Option<ForwardOutputs<HostTensor>>,
    recurrent: ForwardOutputs<HostTensor>,
    decode: ForwardOutputs<HostTensor>,
    grads: Gradients<HostTensor>,
}

/// The chunked bf16 forward (with a plan, where the case takes that path), the recurrent f32
/// forward, decode one token per step over a pool, and the bf16 backward with a workspace and
/// dht, every output NaN-poisoned first.
fn run_launchers(mem: &mut Mem<'_>, case: &HardCase) -> LauncherRuns {
    let p = &case.problem;
    let chunked = (expected_path(p, DType::BF16) == ForwardPath::Chunked).then(|| {
        let (inputs, _) = inputs_and_oracle(case, DType::BF16);
        let dev = mem.inputs(&inputs);
        let o = mem.poisoned(&p.v_shape(), DType::BF16);
        let state = mem.poisoned(&p.state_shape(), DType::F32);
        let ctx = mem.ctx();
        let plan = ChunkPlan::new(ctx, p, DType::BF16).unwrap();
        let outputs = ForwardOutputs {
            o: &o,
            final_state: &state,
        };
        cuda_backend::launch_chunked(ctx, p, &plan, &dev.as_ref(), &outputs).unwrap();
        ctx.synchronize().unwrap();
        download_outputs(ctx, &o, &state)
    });
    let (inputs, _) = inputs_and_oracle(case, DType::F32);
    let dev = mem.inputs(&inputs);
    let o = mem.poisoned(&p.v_shape(), DType::F32);
    let state = mem.poisoned(&p.state_shape(), DType::F32);
    let pool = match &inputs.initial_state {
        Some(h0) => mem.input(h0),
        None => mem.input(&HostTensor {
            shape: p.state_shape().to_vec(),
            dtype: DType::F32,
            data: vec![0.0; p.state_shape().iter().product()],
        }),
    };
    let o_dec = mem.poisoned(&p.v_shape(), DType::F32);
    let (bwd_inputs, d_o, dht, _) = backward_case(case, DType::BF16, true);
    let bwd_dev = mem.inputs(&bwd_inputs);
    let d_o = mem.input(&d_o);
    let dht = dht.map(|t| mem.input(&t));
    let grads = mem.gradients(p, &bwd_inputs);
    let ctx = mem.ctx();
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    cuda_backend::forward_recurrent_into(ctx, p, &seq, &dev.as_ref(), &outputs).unwrap();
    cuda_backend::decode_into(ctx, p, &seq, &dev.as_ref(), &o_dec, &pool, 1).unwrap();
    let ws = BackwardWorkspace::new(ctx, p, DType::BF16).unwrap();
    let g = cuda_backend::backward::gradients_ref(&grads);
    backward_into(ctx, p, &ws, &bwd_dev.as_ref(), &d_o, dht.as_ref(), &g).unwrap();
    ctx.synchronize().unwrap();
    LauncherRuns {
        chunked,
        recurrent: download_outputs(ctx, &o, &state),
        decode: download_outputs(ctx, &o_dec, &pool),
        grads: download_gradients(ctx, &grads),
    }
}

#[test]
fn launches_on_a_caller_stream_over_caller_memory_match_the_owning_path_and_the_oracle() {
    let Some(own) = cuda() else { return };
    let mut caller = Caller::new();
    let ctx = caller.context();
    assert!(ctx.borrows_stream() && !own.borrows_stream());
    let mut failures = Vec::new();
    for case in hard_cases() {
        let theirs = run_launchers(&mut Mem::Caller(&ctx, &mut caller), &case);
        let ours = run_launchers(&mut Mem::Owning(own), &case);
        let name = &case.name;
        let mut pairs = vec![
            ("recurrent o", &theirs.recurrent.o, &ours.recurrent.o),
            (
                "recurrent state",
                &theirs.recurrent.final_state,
                &ours.recurrent.final_state,
            ),
            ("decode o", &theirs.decode.o, &ours.decode.o),
            (
                "decode pool",
                &theirs.decode.final_state,
                &ours.decode.final_state,
            ),
        ];
        if let (Some(a), Some(b)) = (&theirs.chunked, &ours.chunked) {
            pairs.push(("chunked o", &a.o, &b.o));
            pairs.push(("chunked state", &a.final_state, &b.final_state));
        }
        for ((what, a), (_, b)) in gradient_list(&theirs.grads)
            .into_iter()
            .zip(gradient_list(&ours.grads))
        {
            pairs.push((what, a, b));
        }
        for (what, a, b) in pairs {
            if let Err(e) = same_bits(&format!("interop {what} [{name}]"), a, b) {
                failures.push(e);
            }
        }
        // And the oracle, as the owning path is checked.
        if let Some(got) = &theirs.chunked {
            let (_, expected) = inputs_and_oracle(&case, DType::BF16);
            let math = arithmetic_of(ForwardPath::Chunked, DType::BF16);
            failures.extend(
                check(
                    "interop chunked",
                    &case,
                    Op::Forward,
                    DType::BF16,
                    math,
                    got,
                    &expected,
                )
                .err(),
            );
        }
        let (_, expected) = inputs_and_oracle(&case, DType::F32);
        let f32_math = Arithmetic::F32;
        failures.extend(
            check(
                "interop recurrent",
                &case,
                Op::Forward,
                DType::F32,
                f32_math,
                &theirs.recurrent,
                &expected,
            )
            .err(),
        );
        failures.extend(
            check(
                "interop decode",
                &case,
                Op::Decode,
                DType::F32,
                f32_math,
                &theirs.decode,
                &expected,
            )
            .err(),
        );
        let (_, _, _, expected) = backward_case(&case, DType::BF16, true);
        failures.extend(check_gradients_with(
            "interop backward",
            &case,
            DType::BF16,
            own.arithmetic(Op::Backward, &case.problem, DType::BF16),
            &theirs.grads,
            &expected,
        ));
    }
    fail_on(failures);
}

#[test]
fn caller_memory_is_checked_not_trusted() {
    if cuda().is_none() {
        return;
    }
    let mut caller = Caller::new();
    let ctx = caller.context();
    let t = caller.wrap(&ctx, vec![0; 64], &[16], DType::F32);
    let ptr = t.device_ptr();
    assert!(t.is_borrowed());
    let wrap = |ptr: u64, len: usize| {
        // SAFETY: every call below is refused by the checks before the memory is touched.
        unsafe { CudaTensor::from_raw(&ctx, ptr, &[len], DType::F32) }
    };
    // Misaligned, past the allocation, null: typed errors.
    assert!(matches!(wrap(ptr + 4, 4), Err(Error::Value { .. })));
    assert!(matches!(wrap(ptr, 1 << 30), Err(Error::Value { .. })));
    assert!(matches!(wrap(0, 4), Err(Error::Value { .. })));
    // A stream of a context other than the device's primary one is refused.
    let other = CudaContext::new_non_primary(0, 0).unwrap();
    let foreign = other.new_stream().unwrap();
    // SAFETY: a live stream; refused before use.
    let err = unsafe { Context::from_raw_stream(0, foreign.cu_stream()) }.unwrap_err();
    assert!(matches!(err, Error::Value { .. }), "{err:?}");
    // Dropping a borrowed tensor frees nothing: the caller's buffer still reads back.
    drop(t);
    let back = caller.stream.clone_dtoh(&caller.buffers[0]).unwrap();
    assert_eq!(back, vec![0u8; 64]);
}

/// Every node of `graph` is a kernel launch: no allocation, memset, copy or event node was
/// captured.
fn graph_node_types(graph: sys::CUgraph) -> Vec<sys::CUgraphNodeType> {
    let mut count = 0usize;
    // SAFETY: a live graph; the first call asks for the count, the second fills `nodes`.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }
        .result()
        .unwrap();
    let mut nodes = vec![std::ptr::null_mut(); count];
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }
        .result()
        .unwrap();
    nodes
        .iter()
        .map(|&node| {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of the live graph.
            unsafe { sys::cuGraphNodeGetType(node, &mut kind) }
                .result()
                .unwrap();
            kind
        })
        .collect()
}

#[test]
fn cuda_graph_capture_and_replay_give_the_eager_result() {
    if cuda().is_none() {
        return;
    }
    let mut caller = Caller::new();
    let ctx = caller.context();
    let case = &hard_cases()[0];
    let p = &case.problem;
    assert_eq!(expected_path(p, DType::BF16), ForwardPath::Chunked);
    let mut mem = Mem::Caller(&ctx, &mut caller);
    // Forward: chunked bf16 with a plan, recurrent f32.
    let (fwd16, _) = inputs_and_oracle(case, DType::BF16);
    let fwd16 = mem.inputs(&fwd16);
    let (fwd32, _) = inputs_and_oracle(case, DType::F32);
    let fwd32 = mem.inputs(&fwd32);
    // Decode: one token per sequence over a pool seeded with h0.
    let dp = problem(4, 1, 2, 4, 64, 64, None, Options::default());
    let dec = mem.inputs(&common::cases::spec(7, true).generate(&dp));
    let pool0 = dec.initial_state.as_ref().unwrap();
    let pool = mem.poisoned(&dp.state_shape(), DType::F32);
    // Backward: bf16 with a workspace and dht.
    let (bwd, d_o, dht, _) = backward_case(case, DType::BF16, true);
    let grads = mem.gradients(p, &bwd);
    let bwd = mem.inputs(&bwd);
    let d_o = mem.input(&d_o);
    let dht = mem.input(dht.as_ref().unwrap());
    let outs = [
        mem.poisoned(&p.v_shape(), DType::BF16),
        mem.poisoned(&p.state_shape(), DType::F32),
        mem.poisoned(&p.v_shape(), DType::F32),
        mem.poisoned(&p.state_shape(), DType::F32),
        mem.poisoned(&dp.v_shape(), DType::F32),
    ];
    let plan = ChunkPlan::new(&ctx, p, DType::BF16).unwrap();
    let seq = SeqBounds::upload(&ctx, p).unwrap();
    let dseq = SeqBounds::upload(&ctx, &dp).unwrap();
    let ws = BackwardWorkspace::new(&ctx, p, DType::BF16).unwrap();
    assert_eq!(ws.path(), BackwardPath::Chunked);
    let g = cuda_backend::backward::gradients_ref(&grads);
    let mut written: Vec<&CudaTensor> = outs.iter().collect();
    written.extend([&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta]);
    written.extend(g.dh0.iter().chain(&g.da_log).chain(&g.ddt_bias));
    let stream = ctx.stream().cu_stream();
    let bytes = |t: &CudaTensor| t.shape().iter().product::<usize>() * t.dtype().size();
    // Before every run, outside any graph: outputs poisoned, the pool reset to h0.
    let reset = || {
        for t in &written {
            // SAFETY: the tensor's own bytes, on the stream every launch uses.
            unsafe {
                cudarc::driver::result::memset_d8_async(t.device_ptr(), 0xff, bytes(t), stream)
            }
            .unwrap();
        }
        // SAFETY: both hold the decode problem's state, f32.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                pool.device_ptr(),
                pool0.device_ptr(),
                bytes(&pool),
                stream,
            )
        }
        .unwrap();
    };
    let launch_all = || {
        let fwd = |o, final_state| ForwardOutputs { o, final_state };
        cuda_backend::launch_chunked(&ctx, p, &plan, &fwd16.as_ref(), &fwd(&outs[0], &outs[1]))
            .unwrap();
        cuda_backend::forward_recurrent_into(
            &ctx,
            p,
            &seq,
            &fwd32.as_ref(),
            &fwd(&outs[2], &outs[3]),
        )
        .unwrap();
        cuda_backend::decode_into(&ctx, &dp, &dseq, &dec.as_ref(), &outs[4], &pool, 1).unwrap();
        backward_into(&ctx, p, &ws, &bwd.as_ref(), &d_o, Some(&dht), &g).unwrap();
    };
    let results = || -> Vec<HostTensor> {
        ctx.synchronize().unwrap();
        written
            .iter()
            .chain([&&pool])
            .map(|t| t.download(&ctx).unwrap())
            .collect()
    };
    // Eager (also compiles and loads every kernel: nothing of that may happen in a capture).
    reset();
    launch_all();
    let eager = results();
    assert!(eager.iter().all(|t| t.data.iter().all(|x| x.is_finite())));
    reset();
    ctx.synchronize().unwrap();
    // Capture on the caller's stream (thread-local mode: an allocation, a synchronisation or
    // any other unsafe call of this thread invalidates the capture).
    let capture = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    caller_stream_of(&ctx).begin_capture(capture).unwrap();
    launch_all();
    let graph = caller_stream_of(&ctx)
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a captured graph");
    let kinds = graph_node_types(graph.cu_graph());
    eprintln!("captured graph: {} nodes {kinds:?}", kinds.len());
    assert!(kinds.len() >= 5, "{kinds:?}");
    assert!(
        kinds
            .iter()
            .all(|&k| k == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL),
        "only kernel launches may be captured: {kinds:?}"
    );
    for replay in 0..2 {
        reset();
        graph.launch().unwrap();
        let got = results();
        let mut failures = Vec::new();
        for (i, (a, b)) in got.iter().zip(&eager).enumerate() {
            failures.extend(same_bits(&format!("replay {replay}, tensor {i}"), a, b).err());
        }
        fail_on(failures);
    }
}

/// The interop context's stream as cudarc's stream object (for its graph API).
fn caller_stream_of(ctx: &Context) -> &Arc<CudaStream> {
    ctx.stream()
}

// ---------------------------------------------------------------------------------------------
// The decode kernel (decode.cu): `decode_into` routes every window to it.

/// Decode cases for the warp-per-16-columns kernel: both state layouts, GVA, K not a multiple
/// of 32 (partial k-groups), V not a multiple of 32 (a block with one warp past V), K = 256
/// (the large-register instantiation), varlen with empty and length-1 sequences, every option.
fn decode_kernel_cases() -> Vec<HardCase> {
    let d = Options::default();
    let all = Options {
        scale: Some(0.3),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: false,
    };
    let v_first = Options {
        state_v_first: true,
        ..d
    };
    let all_v_first = Options {
        state_v_first: true,
        ..all
    };
    let case = |name: &str, problem: Problem, seed: u64| HardCase {
        name: name.into(),
        problem,
        spec: RandomSpec {
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..common::cases::spec(seed, true)
        },
    };
    vec![
        case(
            "dec B3 T4 GVA2 K128 V128",
            problem(3, 4, 2, 4, 128, 128, None, d),
            41,
        ),
        case(
            "dec B3 T4 GVA2 K128 V128 V-first",
            problem(3, 4, 2, 4, 128, 128, None, v_first),
            42,
        ),
        case(
            "dec B2 T3 K48 V80 all options",
            problem(2, 3, 1, 2, 48, 80, None, all),
            43,
        ),
        case(
            "dec B2 T3 K48 V80 all options V-first",
            problem(2, 3, 1, 2, 48, 80, None, all_v_first),
            44,
        ),
        case(
            "dec B2 T2 GVA4 K256 V64",
            problem(2, 2, 1, 4, 256, 64, None, d),
            45,
        ),
        case(
            "dec B1 T2 K256 V32 V-first all",
            problem(1, 2, 2, 2, 256, 32, None, all_v_first),
            46,
        ),
        case(
            "dec varlen empty/len-1 K64 V128",
            problem(1, 7, 2, 4, 64, 128, Some(vec![0, 0, 1, 4, 4, 7]), all),
            47,
        ),
        case(
            "dec varlen empty/len-1 K16 V16 V-first",
            problem(1, 7, 1, 1, 16, 16, Some(vec![0, 3, 3, 4, 7]), v_first),
            48,
        ),
    ]
}

/// Decode `case` in `dtype` through `decode_into` (`tokens_per_step` per step) into a
/// NaN-poisoned o over a pool seeded from h0; o and the pool after the last step.
fn run_decode(
    ctx: &Context,
    case: &HardCase,
    inputs: &ForwardInputs<HostTensor>,
    tokens_per_step: usize,
) -> ForwardOutputs<HostTensor> {
    let p = &case.problem;
    let dev = upload(ctx, inputs);
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let h0 = inputs.initial_state.as_ref().unwrap();
    let pool = CudaTensor::upload(ctx, "pool", h0).unwrap();
    let o = CudaTensor::filled(ctx, "o", &p.v_shape(), inputs.q.dtype, f32::NAN).unwrap();
    cuda_backend::decode_into(ctx, p, &seq, &dev.as_ref(), &o, &pool, tokens_per_step).unwrap();
    ctx.synchronize().unwrap();
    ForwardOutputs {
        o: o.download(ctx).unwrap(),
        final_state: pool.download(ctx).unwrap(),
    }
}

#[test]
fn the_decode_kernel_matches_the_oracle_step_by_step_every_dtype_and_layout() {
    let Some(ctx) = cuda() else { return };
    let mut failures = Vec::new();
    for case in decode_kernel_cases() {
        for dtype in DTYPES {
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            for tokens_per_step in [1, 2, 3] {
                let got = run_decode(ctx, &case, &inputs, tokens_per_step);
                let what = format!("decode kernel ({tokens_per_step}/step)");
                if let Err(e) = check(
                    &what,
                    &case,
                    Op::Decode,
                    dtype,
                    Arithmetic::F32,
                    &got,
                    &expected,
                ) {
                    failures.push(e);
                }
                // An empty sequence's slot is never touched: bit-equal to its h0.
                let p = &case.problem;
                let slot = p.heads_v * p.key_dim * p.value_dim;
                let h0 = &inputs.initial_state.as_ref().unwrap().data;
                for (n, s) in p.sequences().iter().enumerate() {
                    let r = n * slot..(n + 1) * slot;
                    if s.is_empty() && got.final_state.data[r.clone()] != h0[r] {
                        failures.push(format!("{}: empty sequence {n}'s slot changed", case.name));
                    }
                }
            }
        }
    }
    fail_on(failures);
}

#[test]
fn a_decode_window_past_every_sequence_touches_nothing() {
    let Some(ctx) = cuda() else { return };
    let case = &decode_kernel_cases()[2];
    let p = &case.problem;
    let (inputs, _) = inputs_and_oracle(case, DType::BF16);
    let dev = upload(ctx, &inputs);
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let h0 = inputs.initial_state.as_ref().unwrap();
    let pool = CudaTensor::upload(ctx, "pool", h0).unwrap();
    let o = CudaTensor::filled(ctx, "o", &p.v_shape(), DType::BF16, f32::NAN).unwrap();
    let window = cuda_backend::Window {
        begin: p.tokens,
        len: 4,
    };
    cuda_backend::decode::launch_decode(ctx, p, &seq, &dev.as_ref(), &o, &pool, window).unwrap();
    ctx.synchronize().unwrap();
    assert_eq!(pool.download(ctx).unwrap().data, h0.data);
    assert!(o.download(ctx).unwrap().data.iter().all(|x| x.is_nan()));
}

#[test]
fn the_decode_kernel_refuses_a_bad_pool_with_a_typed_error() {
    let Some(ctx) = cuda() else { return };
    let case = &decode_kernel_cases()[0];
    let p = &case.problem;
    let (inputs, _) = inputs_and_oracle(case, DType::F16);
    let dev = upload(ctx, &inputs);
    let seq = SeqBounds::upload(ctx, p).unwrap();
    let o = CudaTensor::zeros(ctx, "o", &p.v_shape(), DType::F16).unwrap();
    let window = cuda_backend::Window { begin: 0, len: 1 };
    let launch = |pool: &CudaTensor, o: &CudaTensor| {
        cuda_backend::decode::launch_decode(ctx, p, &seq, &dev.as_ref(), o, pool, window)
    };
    let half_pool = CudaTensor::zeros(ctx, "pool", &p.state_shape(), DType::F16).unwrap();
    assert!(matches!(launch(&half_pool, &o), Err(Error::DType { .. })));
    let mut shape = p.state_shape().to_vec();
    shape[0] += 1;
    let big_pool = CudaTensor::zeros(ctx, "pool", &shape, DType::F32).unwrap();
    assert!(matches!(launch(&big_pool, &o), Err(Error::Shape { .. })));
    let pool = CudaTensor::zeros(ctx, "pool", &p.state_shape(), DType::F32).unwrap();
    let o32 = CudaTensor::zeros(ctx, "o", &p.v_shape(), DType::F32).unwrap();
    assert!(matches!(launch(&pool, &o32), Err(Error::DType { .. })));
}

// ---------------------------------------------------------------------------------------------
// The host emulator of the chunked backward (benches/cuda-emu)

/// Writes each hard case the chunked backward takes (both 16-bit dtypes, with and without dht)
/// with the oracle's gradients into `$EMU_CASES`, for benches/cuda-emu's `hard_case` runner
/// (format: its README). Needs no GPU; run with `--ignored`.
#[test]
#[ignore]
fn export_hard_cases_for_the_host_emulator() {
    use std::io::Write;
    let dir = std::env::var("EMU_CASES").expect("EMU_CASES: the folder to write to");
    for (ci, case) in hard_cases().iter().enumerate() {
        let p = &case.problem;
        if expected_backward_path(p, DType::BF16) != BackwardPath::Chunked {
            continue;
        }
        for (di, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
            for with_dht in [false, true] {
                let (inputs, d_o, dht, exp) = backward_case(case, dtype, with_dht);
                let path = format!("{dir}/case{ci:02}_{dtype}_{}.bin", with_dht as u8);
                let mut out = Vec::new();
                let o = p.options;
                let flags = [
                    o.l2norm_qk,
                    o.beta_sigmoid,
                    o.allow_neg_eigval,
                    o.gate_in_kernel,
                    o.state_v_first,
                ]
                .iter()
                .enumerate()
                .fold(0i32, |acc, (bit, &on)| acc | ((on as i32) << bit));
                let mut ints = vec![
                    p.num_sequences() as i32,
                    p.total_tokens() as i32,
                    p.heads_qk as i32,
                    p.heads_v as i32,
                    p.key_dim as i32,
                    p.value_dim as i32,
                    flags,
                    inputs.initial_state.is_some() as i32,
                    dht.is_some() as i32,
                    di as i32 + 1,
                    0,
                ];
                ints.extend(p.sequences().iter().map(|s| s.end as i32));
                ints.iter().for_each(|x| out.extend(x.to_le_bytes()));
                out.extend(p.scale().to_le_bytes());
                let mut f32s: Vec<&[f32]> = vec![
                    &inputs.q.data,
                    &inputs.k.data,
                    &inputs.v.data,
                    &inputs.g.data,
                    &inputs.beta.data,
                ];
                f32s.extend(inputs.initial_state.as_ref().map(|t| &t.data[..]));
                if o.gate_in_kernel {
                    f32s.push(&inputs.a_log.as_ref().unwrap().data);
                    f32s.push(&inputs.dt_bias.as_ref().unwrap().data);
                }
                f32s.push(&d_o.data);
                f32s.extend(dht.as_ref().map(|t| &t.data[..]));
                f32s.iter()
                    .flat_map(|x| x.iter())
                    .for_each(|x| out.extend(x.to_le_bytes()));
                let mut f64s: Vec<&[f64]> = vec![&exp.dq, &exp.dk, &exp.dv, &exp.dg, &exp.dbeta];
                f64s.extend(exp.dh0.as_deref());
                f64s.extend(exp.da_log.as_deref());
                f64s.extend(exp.ddt_bias.as_deref());
                f64s.iter()
                    .flat_map(|x| x.iter())
                    .for_each(|x| out.extend(x.to_le_bytes()));
                std::fs::File::create(&path)
                    .unwrap()
                    .write_all(&out)
                    .unwrap();
                eprintln!("{path}: {} {dtype}", case.name);
            }
        }
    }
}
