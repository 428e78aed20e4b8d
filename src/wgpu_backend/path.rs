//! The forward's algorithm ([`ForwardAlgorithm`]: the chunked scan or the recurrent kernel,
//! chosen per call by [`choose_algorithm`]) and the chunked scan's compute paths: how its chunk
//! GEMMs do their arithmetic on a given adapter.
//!
//! - `Scalar`: f32 multiply-adds on every adapter (lavapipe, browsers without shader-f16).
//!   The accuracy reference: rel-L2 ≈ 1e-6 against the f64 oracle with f32 storage.
//! - `F16Math`: the scalar path's scan (same WGSL file, `Pass::StateScanF16`) with its
//!   workgroup-memory operands — the K, Q and S slices, the packed gated triangles, the W/V'
//!   tile and the state update's K slices — held as f16 and multiplied in f16 (`mat4x4<f16>`,
//!   `vec4<f16>`); every f16 sum spans at most four products and is converted to f32 before it
//!   is accumulated. The state, the gates, β, the o accumulators and the other passes stay
//!   f32. Needs the device's SHADER_F16; values must fit f16, as on the coop path. It halves
//!   the scan's workgroup-memory bytes and traffic.
//! - `CoopMatrix`: the chunk GEMMs (K·S, Q·S, A·W, (Γ⊙QKᵀ)·V', Kᵀ·V') on cooperative matrices
//!   (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX, f16 16×16×16 with f32 accumulators, i.e. tensor
//!   cores on NVIDIA). Operands are rounded to f16; the state, the gate cumsum and every
//!   accumulation stay f32. Values must fit f16 (|x| < 65504): true for GDN's normalized keys
//!   and O(1) activations, not for arbitrary inputs.
//!
//! Automatic choice: f32 storage keeps the scalar path (a caller who stores f32 asked for f32
//! accuracy); f16/bf16 storage takes cooperative matrices where the adapter reports f16
//! 16×16×16 → f32 and the shape fits (K = 128, V a multiple of 32, subgroups of 32), else the
//! scalar path. `Context::set_compute_path` or `GDN_COMPUTE_PATH=scalar|f16|coop|auto` forces
//! a path; forcing one the adapter or the problem cannot run is an error, never a silent
//! fallback.
//!
//! F16Math is never chosen automatically, only by override. Its speed is unmeasured where it
//! could be the best path — adapters with SHADER_F16 but no usable cooperative matrices (AMD,
//! Intel, Apple, browsers) — and lavapipe runs f16 on the CPU, so its timings say nothing. On the
//! H200 (one session of interleaved `gdn bench` runs, f32 storage, T = 32768; the GPU's clock
//! state moved every pass by up to 1.5× between runs, so scan times are compared relative to
//! wy_inverse's in the same run) its scan was ≈ 8% faster than the scalar one at 16/64 heads
//! and ≈ 17% at 2/8: not worth rel-L2 ~1e-3 instead of ~1e-6 for f32 storage, and far behind
//! the coop path that f16/bf16 storage takes there. Once measured on adapters without the
//! coop path, it is the candidate for f16/bf16 storage on them.

use std::fmt;

use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};
use crate::tensor::DType;

/// How the forward's chunk GEMMs compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComputePath {
    /// f32 multiply-adds, every adapter.
    Scalar,
    /// The scalar scan with f16 workgroup-memory operands multiplied in f16 and f32
    /// accumulation (needs SHADER_F16); taken only when forced.
    F16Math,
    /// f16 cooperative-matrix GEMMs with f32 accumulators.
    CoopMatrix,
}

impl ComputePath {
    /// Every path, simplest first.
    pub const ALL: [ComputePath; 3] = [
        ComputePath::Scalar,
        ComputePath::F16Math,
        ComputePath::CoopMatrix,
    ];

    /// The name used by `GDN_COMPUTE_PATH`, the CLI and reports.
    pub fn name(self) -> &'static str {
        match self {
            ComputePath::Scalar => "scalar",
            ComputePath::F16Math => "f16",
            ComputePath::CoopMatrix => "coop",
        }
    }

    /// Parses `scalar` / `f16` / `coop`; `auto` (or empty) means no override.
    pub fn parse_override(name: &str, s: &str) -> Result<Option<ComputePath>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "scalar" | "f32" => Ok(Some(ComputePath::Scalar)),
            "f16" | "f16-math" | "f16math" => Ok(Some(ComputePath::F16Math)),
            "coop" | "coop-matrix" | "cooperative-matrix" => Ok(Some(ComputePath::CoopMatrix)),
            other => Err(Error::Value {
                name: name.into(),
                expected: "one of auto, scalar, f16, coop".into(),
                got: format!("{other:?}"),
            }),
        }
    }
}

impl fmt::Display for ComputePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The path a forward will take and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChoice {
    /// The path the forward will take.
    pub path: ComputePath,
    /// Why: forced, or what the device offers or lacks.
    pub reason: String,
}

/// What the device offers for each path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathSupport {
    /// f16 16×16×16 cooperative matrices with f32 accumulators, on subgroups of exactly 32
    /// (the kernels split their tiles over 32-wide subgroups).
    pub coop_f16: bool,
    /// Why not, when `coop_f16` is false.
    pub coop_missing: &'static str,
    /// f16 arithmetic in shaders (SHADER_F16): the f16-math path.
    pub f16_math: bool,
    /// Why not, when `f16_math` is false.
    pub f16_missing: &'static str,
}

// The coop scan's fixed shape lives with the other tile facts in `tuning` (below both this
// module and the launchers, so imports point one way); re-exported here for callers.
pub use crate::wgpu_backend::tuning::{COOP_KEY_DIM, COOP_TILE, COOP_V_BLOCK};

impl PathSupport {
    /// What a device offers, from its features, cooperative-matrix properties, workgroup memory
    /// and adapter info (the coop path needs subgroups of exactly 32; `None` rules it out).
    pub fn detect(
        features: wgpu::Features,
        coop_properties: &[wgpu::CooperativeMatrixProperties],
        info: Option<&wgpu::AdapterInfo>,
        workgroup_bytes: u32,
    ) -> Self {
        let (f16_math, f16_missing) = if features.contains(wgpu::Features::SHADER_F16) {
            (true, "")
        } else {
            (false, "the device lacks SHADER_F16")
        };
        let missing = |why| PathSupport {
            coop_f16: false,
            coop_missing: why,
            f16_math,
            f16_missing,
        };
        if !features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            return missing("the device lacks EXPERIMENTAL_COOPERATIVE_MATRIX");
        }
        if !features.contains(wgpu::Features::SHADER_F16) {
            return missing("the device lacks SHADER_F16");
        }
        let f16_tile = coop_properties.iter().any(|p| {
            p.m_size == COOP_TILE
                && p.n_size == COOP_TILE
                && p.k_size == COOP_TILE
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        });
        if !f16_tile {
            return missing("the adapter reports no f16 16x16x16 -> f32 cooperative matrix");
        }
        if workgroup_bytes < crate::wgpu_backend::tuning::COOP_PATH_BYTES {
            return missing("the coop passes need more workgroup memory than the device grants");
        }
        match info {
            Some(i) if i.subgroup_min_size == 32 && i.subgroup_max_size == 32 => PathSupport {
                coop_f16: true,
                coop_missing: "",
                f16_math,
                f16_missing,
            },
            Some(_) => missing("subgroups are not exactly 32 wide"),
            None => {
                missing("the subgroup size is unknown (caller-supplied device without AdapterInfo)")
            }
        }
    }

    /// Why `problem` cannot take the coop path, if it cannot.
    pub fn coop_rejects(&self, problem: &Problem, dtype: DType) -> Option<String> {
        if !self.coop_f16 {
            return Some(self.coop_missing.to_string());
        }
        if problem.key_dim != COOP_KEY_DIM {
            return Some(format!(
                "key_dim is {} (the coop scan is written for K = {COOP_KEY_DIM})",
                problem.key_dim
            ));
        }
        if !problem.value_dim.is_multiple_of(COOP_V_BLOCK) {
            return Some(format!(
                "value_dim is {} (the coop scan needs a multiple of {COOP_V_BLOCK})",
                problem.value_dim
            ));
        }
        let _ = dtype;
        None
    }

    /// Why `problem` cannot take the f16-math path, if it cannot. It runs every shape the
    /// scalar path runs; only the device's SHADER_F16 matters.
    pub fn f16_rejects(&self, problem: &Problem, dtype: DType) -> Option<String> {
        let _ = (problem, dtype);
        (!self.f16_math).then(|| self.f16_missing.to_string())
    }

    /// The forward's path for `problem` with storage `dtype`, honouring `forced`.
    pub fn choose(
        &self,
        problem: &Problem,
        dtype: DType,
        forced: Option<ComputePath>,
    ) -> Result<PathChoice> {
        let coop_rejects = self.coop_rejects(problem, dtype);
        match forced {
            Some(ComputePath::Scalar) => Ok(PathChoice {
                path: ComputePath::Scalar,
                reason: "forced (GDN_COMPUTE_PATH or Context::set_compute_path)".into(),
            }),
            Some(ComputePath::F16Math) => match self.f16_rejects(problem, dtype) {
                None => Ok(PathChoice {
                    path: ComputePath::F16Math,
                    reason: "forced (GDN_COMPUTE_PATH or Context::set_compute_path)".into(),
                }),
                Some(why) => Err(Error::unsupported(
                    "compute path",
                    format!("forcing f16 when {why}"),
                )),
            },
            Some(ComputePath::CoopMatrix) => match coop_rejects {
                None => Ok(PathChoice {
                    path: ComputePath::CoopMatrix,
                    reason: "forced (GDN_COMPUTE_PATH or Context::set_compute_path)".into(),
                }),
                Some(why) => Err(Error::unsupported(
                    "compute path",
                    format!("forcing coop when {why}"),
                )),
            },
            None if dtype == DType::F32 => Ok(PathChoice {
                path: ComputePath::Scalar,
                reason:
                    "f32 storage keeps f32 arithmetic (rel-L2 ~1e-6); force coop for tensor cores"
                        .into(),
            }),
            None => match coop_rejects {
                None => Ok(PathChoice {
                    path: ComputePath::CoopMatrix,
                    reason: format!(
                        "{dtype} storage and f16 16x16x16 cooperative matrices on this adapter"
                    ),
                }),
                Some(why) => Ok(PathChoice {
                    path: ComputePath::Scalar,
                    reason: format!("no coop path: {why}"),
                }),
            },
        }
    }
}

/// Which algorithm the forward runs: the chunked scan or the token-by-token recurrence.
///
/// - `Chunked`: prepare_qk → prepare_gate → wy_inverse → state_scan (docs/passes.md): work
///   parallel over 64-token chunks, one sequential pass over chunk states. Several passes and
///   pipelines; its compute path ([`ComputePath`]) sets its arithmetic. The backward needs its
///   intermediates, so `forward_saved` always runs it.
/// - `Recurrent`: the decode kernel `recurrent_step` over every token of each sequence, the
///   state in registers (one pass, one pipeline, f32 arithmetic: exact to f32 whatever the
///   storage dtype). Parallel only over (V-block, v-head, sequence).
///
/// Automatic choice ([`choose_algorithm`]): decode-like calls (every sequence shorter than a
/// chunk) take the recurrent kernel on every adapter; CPU-type adapters (lavapipe,
/// SwiftShader) take it whatever the length, where it was measured faster (docs/compute-paths.md);
/// GPUs take the chunked scan for longer sequences. `GDN_FORWARD_ALGORITHM` or
/// `Context::set_forward_algorithm` forces one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardAlgorithm {
    /// The chunked scan (WY form).
    Chunked,
    /// The recurrent kernel, token by token.
    Recurrent,
}

impl ForwardAlgorithm {
    /// Both algorithms.
    pub const ALL: [ForwardAlgorithm; 2] = [ForwardAlgorithm::Chunked, ForwardAlgorithm::Recurrent];

    /// The name used by `GDN_FORWARD_ALGORITHM`, the CLI and reports.
    pub fn name(self) -> &'static str {
        match self {
            ForwardAlgorithm::Chunked => "chunked",
            ForwardAlgorithm::Recurrent => "recurrent",
        }
    }

    /// Parses `chunked` / `recurrent`; `auto` (or empty) means no override. `name` is the
    /// setting's name for the error.
    pub fn parse_override(name: &str, s: &str) -> Result<Option<ForwardAlgorithm>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "chunked" | "chunk" => Ok(Some(ForwardAlgorithm::Chunked)),
            "recurrent" => Ok(Some(ForwardAlgorithm::Recurrent)),
            other => Err(Error::value(
                name,
                "one of auto, chunked, recurrent",
                format!("{other:?}"),
            )),
        }
    }
}

impl fmt::Display for ForwardAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The algorithm a forward will run and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgorithmChoice {
    /// The algorithm the forward will run.
    pub algorithm: ForwardAlgorithm,
    /// Why: forced, the problem's sequence lengths, or the adapter's type.
    pub reason: String,
}

/// The forward's algorithm for `problem` on an adapter of `device_type` (`None`: unknown, a
/// caller-supplied device without `AdapterInfo`; treated as a GPU), honouring `forced`.
/// `recurrent_rejects` says why the recurrent kernel cannot run the problem on this device, if
/// it cannot ([`recurrent_rejects`](crate::wgpu_backend::forward::recurrent_rejects)).
///
/// The rule, from measurements (docs/compute-paths.md, "Chunked or recurrent"):
/// 1. every sequence shorter than a chunk (64 tokens): recurrent — a decode-like call gains
///    nothing from chunking and pays for five passes (in Chromium on SwiftShader, B = 4, T = 1
///    took 1.1 s through the chunked forward against 62 ms through the decode kernel);
/// 2. a CPU-type adapter (lavapipe, SwiftShader): recurrent — measured faster at every shape
///    tried there;
/// 3. otherwise (GPUs, long sequences): chunked.
///
/// Forcing `Recurrent` where the kernel cannot run is `Error::Unsupported`, never a silent
/// fallback; the automatic choice falls back to the chunked scan and says why.
pub fn choose_algorithm(
    device_type: Option<wgpu::DeviceType>,
    problem: &Problem,
    recurrent_rejects: Option<String>,
    forced: Option<ForwardAlgorithm>,
) -> Result<AlgorithmChoice> {
    const FORCED: &str = "forced (GDN_FORWARD_ALGORITHM or Context::set_forward_algorithm)";
    let choice = |algorithm, reason: String| Ok(AlgorithmChoice { algorithm, reason });
    match (forced, recurrent_rejects) {
        (Some(ForwardAlgorithm::Chunked), _) => choice(ForwardAlgorithm::Chunked, FORCED.into()),
        (Some(ForwardAlgorithm::Recurrent), Some(why)) => Err(Error::unsupported(
            "forward algorithm",
            format!("forcing recurrent when {why}"),
        )),
        (Some(ForwardAlgorithm::Recurrent), None) => {
            choice(ForwardAlgorithm::Recurrent, FORCED.into())
        }
        (None, Some(why)) => choice(
            ForwardAlgorithm::Chunked,
            format!("the recurrent kernel cannot run this call: {why}"),
        ),
        (None, None) => {
            let longest = problem
                .sequences()
                .iter()
                .map(|s| s.len())
                .max()
                .unwrap_or(0);
            if longest < CHUNK {
                choice(
                    ForwardAlgorithm::Recurrent,
                    format!(
                        "every sequence is shorter than a chunk (longest {longest} < {CHUNK} \
                         tokens): decode-like"
                    ),
                )
            } else if device_type == Some(wgpu::DeviceType::Cpu) {
                choice(
                    ForwardAlgorithm::Recurrent,
                    "a CPU-type adapter, where the recurrent kernel was measured faster".into(),
                )
            } else {
                choice(
                    ForwardAlgorithm::Chunked,
                    format!("sequences of up to {longest} tokens on a GPU"),
                )
            }
        }
    }
}
