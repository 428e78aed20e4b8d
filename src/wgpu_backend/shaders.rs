//! WGSL sources. Each pass is one file under `shaders/`; the Rust side prepends the common
//! snippets (the uniform parameter block and the storage-dtype load/store helpers). Tile sizes
//! are `override` constants, set per pipeline.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::tensor::DType;

/// A pass's WGSL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// `forward/prepare_qk.wgsl`: the in-kernel l2norm of q and k.
    PrepareQk,
    /// `forward/prepare_gate.wgsl`: gate and β activations, chunk-local gate cumsum.
    PrepareGate,
    /// `forward/wy_inverse.wgsl`: the gate-free WY inverse A and the scan's gated matrices (f32).
    WyInverse,
    /// `forward/state_scan.wgsl`: the sequential inter-chunk scan, f32 arithmetic.
    StateScan,
    /// The scalar scan's f16-math variant (same file): f16 operands in workgroup memory,
    /// multiplied in f16, accumulated in f32.
    StateScanF16,
    /// `forward/wy_inverse_coop.wgsl`: the coop path's wy_inverse, writing the coop scan's f16
    /// operands (gated matrices, k, γ ⊙ q); f32 arithmetic, no cooperative matrices.
    WyInverseCoop,
    /// The sequential scan on cooperative matrices.
    StateScanCoop,
    /// The same scan with each chunk's K staged through workgroup memory
    /// (`shaders/forward/coop_k_staged.wgsl`, `GDN_COOP_STAGE=on`).
    StateScanCoopStaged,
    /// `forward/state_chain_coop.wgsl`: the split coop forward's chain (states and V' only).
    StateChainCoop,
    /// `forward/chunk_output_coop.wgsl`: the split coop forward's o, every chunk at once.
    ChunkOutputCoop,
    /// Intra-device sequence parallelism: segment start states from transitions and ends.
    SegmentCombine,
    /// `forward/segment_window.wgsl`: the gate-driven warm-up length per (segment, v-head).
    SegmentWindow,
    /// `backward/state_recompute.wgsl`: the forward scan replayed for the backward.
    StateRecompute,
    /// `backward/state_recompute_coop.wgsl`: the replay with its chunk GEMMs on cooperative
    /// matrices (the coop path's backward).
    StateRecomputeCoop,
    /// The coop replay with each chunk's K staged through workgroup memory (`GDN_COOP_STAGE`).
    StateRecomputeCoopStaged,
    /// `backward/dh_scan.wgsl`: the reverse scan of the state gradient.
    DhScan,
    /// `backward/dh_scan_coop.wgsl`: the reverse scan with its chunk GEMMs on cooperative
    /// matrices (the coop path's backward).
    DhScanCoop,
    /// The coop reverse scan with each chunk's K staged through workgroup memory
    /// (`GDN_COOP_STAGE`).
    DhScanCoopStaged,
    /// `backward/value_grams.wgsl`: dP and dAb per chunk.
    ValueGrams,
    /// `backward/value_grams_coop.wgsl`: the same on cooperative matrices (the coop path's).
    ValueGramsCoop,
    /// `backward/wy_grad.wgsl`: gradients through A·diag(β) and the WY inverse.
    WyGrad,
    /// `backward/wy_grad_coop.wgsl`: the same on cooperative matrices (the coop path's).
    WyGradCoop,
    /// `backward/state_grad.wgsl`: the dq, dk and gate terms through the states.
    StateGrad,
    /// `backward/state_grad_coop.wgsl`: the same on cooperative matrices (the coop path's).
    StateGradCoop,
    /// `backward/qk_grad.wgsl`: dq and dk per v-head, and dg.
    QkGrad,
    /// `backward/qk_grad_coop.wgsl`: the same on cooperative matrices (the coop path's).
    QkGradCoop,
    /// `backward/qk_finish.wgsl`: GVA group sums and the l2norm backward of dq, dk; dv to storage.
    QkFinish,
    /// `backward/gate_finish.wgsl`: β and gate activation chain rules, dA_log and ddt_bias.
    GateFinish,
    /// `decode/recurrent_step.wgsl`: decode tokens on pooled f32 states, reductions through
    /// workgroup memory (runs everywhere).
    RecurrentStep,
    /// The same kernel on a bf16 state pool (rounded on store).
    RecurrentStepBf16State,
    /// `decode/subgroup_step.wgsl`: decode tokens on pooled f32 states, reductions by subgroup
    /// shuffles (devices with subgroups of at least 8 invocations).
    SubgroupStep,
    /// The subgroup kernel on a bf16 state pool.
    SubgroupStepBf16State,
    /// `decode/column_step.wgsl`: decode tokens on pooled f32 states, two value columns per
    /// invocation, no cross-invocation sums (made for SwiftShader: the forward's kernel in
    /// the browser on CPU adapters; opt-in elsewhere).
    ColumnStep,
    /// `validate/find_nonfinite.wgsl`: the first NaN/±Inf (or positive log-decay) of a tensor.
    FindNonfinite,
}

impl Pass {
    /// Every pass, each once.
    pub const ALL: [Pass; 34] = [
        Pass::PrepareQk,
        Pass::PrepareGate,
        Pass::WyInverse,
        Pass::StateScan,
        Pass::StateScanF16,
        Pass::WyInverseCoop,
        Pass::StateScanCoop,
        Pass::StateScanCoopStaged,
        Pass::StateChainCoop,
        Pass::ChunkOutputCoop,
        Pass::SegmentCombine,
        Pass::SegmentWindow,
        Pass::StateRecompute,
        Pass::StateRecomputeCoop,
        Pass::StateRecomputeCoopStaged,
        Pass::DhScan,
        Pass::DhScanCoop,
        Pass::DhScanCoopStaged,
        Pass::ValueGrams,
        Pass::ValueGramsCoop,
        Pass::WyGrad,
        Pass::WyGradCoop,
        Pass::StateGrad,
        Pass::StateGradCoop,
        Pass::QkGrad,
        Pass::QkGradCoop,
        Pass::QkFinish,
        Pass::GateFinish,
        Pass::RecurrentStep,
        Pass::RecurrentStepBf16State,
        Pass::SubgroupStep,
        Pass::SubgroupStepBf16State,
        Pass::ColumnStep,
        Pass::FindNonfinite,
    ];

    /// Path under `shaders/`.
    pub fn file(self) -> &'static str {
        match self {
            Pass::PrepareQk => "forward/prepare_qk.wgsl",
            Pass::PrepareGate => "forward/prepare_gate.wgsl",
            Pass::WyInverse => "forward/wy_inverse.wgsl",
            Pass::StateScan => "forward/state_scan.wgsl",
            Pass::StateScanF16 => "forward/state_scan.wgsl",
            Pass::WyInverseCoop => "forward/wy_inverse_coop.wgsl",
            Pass::StateScanCoop | Pass::StateScanCoopStaged => "forward/state_scan_coop.wgsl",
            Pass::StateChainCoop => "forward/state_chain_coop.wgsl",
            Pass::ChunkOutputCoop => "forward/chunk_output_coop.wgsl",
            Pass::SegmentCombine => "forward/segment_combine.wgsl",
            Pass::SegmentWindow => "forward/segment_window.wgsl",
            Pass::StateRecompute => "backward/state_recompute.wgsl",
            Pass::StateRecomputeCoop | Pass::StateRecomputeCoopStaged => {
                "backward/state_recompute_coop.wgsl"
            }
            Pass::DhScan => "backward/dh_scan.wgsl",
            Pass::DhScanCoop | Pass::DhScanCoopStaged => "backward/dh_scan_coop.wgsl",
            Pass::ValueGrams => "backward/value_grams.wgsl",
            Pass::ValueGramsCoop => "backward/value_grams_coop.wgsl",
            Pass::WyGrad => "backward/wy_grad.wgsl",
            Pass::WyGradCoop => "backward/wy_grad_coop.wgsl",
            Pass::StateGrad => "backward/state_grad.wgsl",
            Pass::StateGradCoop => "backward/state_grad_coop.wgsl",
            Pass::QkGrad => "backward/qk_grad.wgsl",
            Pass::QkGradCoop => "backward/qk_grad_coop.wgsl",
            Pass::QkFinish => "backward/qk_finish.wgsl",
            Pass::GateFinish => "backward/gate_finish.wgsl",
            Pass::RecurrentStep | Pass::RecurrentStepBf16State => "decode/recurrent_step.wgsl",
            Pass::SubgroupStep | Pass::SubgroupStepBf16State => "decode/subgroup_step.wgsl",
            Pass::ColumnStep => "decode/column_step.wgsl",
            Pass::FindNonfinite => "validate/find_nonfinite.wgsl",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Pass::PrepareQk => include_str!("../../shaders/forward/prepare_qk.wgsl"),
            Pass::PrepareGate => include_str!("../../shaders/forward/prepare_gate.wgsl"),
            Pass::WyInverse => include_str!("../../shaders/forward/wy_inverse.wgsl"),
            Pass::WyInverseCoop => include_str!("../../shaders/forward/wy_inverse_coop.wgsl"),
            Pass::StateScan | Pass::StateScanF16 => {
                include_str!("../../shaders/forward/state_scan.wgsl")
            }
            Pass::StateScanCoop | Pass::StateScanCoopStaged => {
                include_str!("../../shaders/forward/state_scan_coop.wgsl")
            }
            Pass::StateChainCoop => include_str!("../../shaders/forward/state_chain_coop.wgsl"),
            Pass::ChunkOutputCoop => include_str!("../../shaders/forward/chunk_output_coop.wgsl"),
            Pass::SegmentCombine => include_str!("../../shaders/forward/segment_combine.wgsl"),
            Pass::SegmentWindow => include_str!("../../shaders/forward/segment_window.wgsl"),
            Pass::StateRecompute => include_str!("../../shaders/backward/state_recompute.wgsl"),
            Pass::StateRecomputeCoop | Pass::StateRecomputeCoopStaged => {
                include_str!("../../shaders/backward/state_recompute_coop.wgsl")
            }
            Pass::DhScan => include_str!("../../shaders/backward/dh_scan.wgsl"),
            Pass::DhScanCoop | Pass::DhScanCoopStaged => {
                include_str!("../../shaders/backward/dh_scan_coop.wgsl")
            }
            Pass::ValueGrams => include_str!("../../shaders/backward/value_grams.wgsl"),
            Pass::ValueGramsCoop => include_str!("../../shaders/backward/value_grams_coop.wgsl"),
            Pass::WyGrad => include_str!("../../shaders/backward/wy_grad.wgsl"),
            Pass::WyGradCoop => include_str!("../../shaders/backward/wy_grad_coop.wgsl"),
            Pass::StateGrad => include_str!("../../shaders/backward/state_grad.wgsl"),
            Pass::StateGradCoop => include_str!("../../shaders/backward/state_grad_coop.wgsl"),
            Pass::QkGrad => include_str!("../../shaders/backward/qk_grad.wgsl"),
            Pass::QkGradCoop => include_str!("../../shaders/backward/qk_grad_coop.wgsl"),
            Pass::QkFinish => include_str!("../../shaders/backward/qk_finish.wgsl"),
            Pass::GateFinish => include_str!("../../shaders/backward/gate_finish.wgsl"),
            Pass::RecurrentStep | Pass::RecurrentStepBf16State => {
                include_str!("../../shaders/decode/recurrent_step.wgsl")
            }
            Pass::SubgroupStep | Pass::SubgroupStepBf16State => {
                include_str!("../../shaders/decode/subgroup_step.wgsl")
            }
            Pass::ColumnStep => include_str!("../../shaders/decode/column_step.wgsl"),
            Pass::FindNonfinite => include_str!("../../shaders/validate/find_nonfinite.wgsl"),
        }
    }
}

const PARAMS: &str = include_str!("../../shaders/common/params.wgsl");
const DTYPE_F32: &str = include_str!("../../shaders/common/dtype_f32.wgsl");
const DTYPE_F16: &str = include_str!("../../shaders/common/dtype_f16.wgsl");
const DTYPE_BF16: &str = include_str!("../../shaders/common/dtype_bf16.wgsl");

/// Storage dtypes every kernel family (forward, backward, decode) takes in this build.
pub const STORAGE_DTYPES: [DType; 1] = [DType::F32];

/// Storage dtypes of the forward passes. F16 also needs the device's `SHADER_F16`
/// (see [`crate::wgpu_backend::Context::forward_storage_dtypes`]); bf16 is packed in u32 words and runs
/// everywhere.
pub const FORWARD_STORAGE_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl Pass {
    /// Storage dtypes this pass has been written (and tested) for.
    pub fn storage_dtypes(self) -> &'static [DType] {
        match self {
            Pass::PrepareQk
            | Pass::PrepareGate
            | Pass::WyInverse
            | Pass::StateScan
            | Pass::StateScanF16
            | Pass::WyInverseCoop
            | Pass::StateScanCoop
            | Pass::StateScanCoopStaged
            | Pass::StateChainCoop
            | Pass::ChunkOutputCoop => &FORWARD_STORAGE_DTYPES,
            // The backward takes the forward's storage dtypes (q, k, v, do in; dq, dk, dv out).
            Pass::StateRecompute
            | Pass::StateRecomputeCoop
            | Pass::StateRecomputeCoopStaged
            | Pass::DhScan
            | Pass::DhScanCoop
            | Pass::DhScanCoopStaged
            | Pass::ValueGrams
            | Pass::ValueGramsCoop
            | Pass::WyGrad
            | Pass::WyGradCoop
            | Pass::StateGrad
            | Pass::StateGradCoop
            | Pass::QkGrad
            | Pass::QkGradCoop
            | Pass::QkFinish => &FORWARD_STORAGE_DTYPES,
            Pass::RecurrentStep
            | Pass::RecurrentStepBf16State
            | Pass::SubgroupStep
            | Pass::SubgroupStepBf16State => &FORWARD_STORAGE_DTYPES,
            // One element per word: each invocation writes its own column's o.
            Pass::ColumnStep => &[DType::F32, DType::F16],
            _ => &STORAGE_DTYPES,
        }
    }
}

impl Pass {
    /// Files under `shaders/` (and their text) that a pass includes besides `common/`: helpers
    /// shared by a family of passes with the same declarations (they do not validate alone).
    pub fn family_snippets(self) -> &'static [(&'static str, &'static str)] {
        const BACKWARD_SCAN_TILES: (&str, &str) = (
            "backward/scan_tiles.wgsl",
            include_str!("../../shaders/backward/scan_tiles.wgsl"),
        );
        const COOP_SCAN_TILES: (&str, &str) = (
            "forward/coop_scan_tiles.wgsl",
            include_str!("../../shaders/forward/coop_scan_tiles.wgsl"),
        );
        const COOP_K_DIRECT: (&str, &str) = (
            "forward/coop_k_direct.wgsl",
            include_str!("../../shaders/forward/coop_k_direct.wgsl"),
        );
        const COOP_K_STAGED: (&str, &str) = (
            "forward/coop_k_staged.wgsl",
            include_str!("../../shaders/forward/coop_k_staged.wgsl"),
        );
        const WY_SOLVE: (&str, &str) = (
            "forward/wy_solve.wgsl",
            include_str!("../../shaders/forward/wy_solve.wgsl"),
        );
        const WY_GRAM: (&str, &str) = (
            "forward/wy_gram.wgsl",
            include_str!("../../shaders/forward/wy_gram.wgsl"),
        );
        const SCAN_OPERAND_F32: (&str, &str) = (
            "forward/scan_operand_f32.wgsl",
            include_str!("../../shaders/forward/scan_operand_f32.wgsl"),
        );
        const SCAN_OPERAND_F16: (&str, &str) = (
            "forward/scan_operand_f16.wgsl",
            include_str!("../../shaders/forward/scan_operand_f16.wgsl"),
        );
        const STATE_F32: (&str, &str) = (
            "decode/state_f32.wgsl",
            include_str!("../../shaders/decode/state_f32.wgsl"),
        );
        const STATE_BF16: (&str, &str) = (
            "decode/state_bf16.wgsl",
            include_str!("../../shaders/decode/state_bf16.wgsl"),
        );
        const STEP_COMMON: (&str, &str) = (
            "decode/step_common.wgsl",
            include_str!("../../shaders/decode/step_common.wgsl"),
        );
        match self {
            Pass::RecurrentStep | Pass::SubgroupStep | Pass::ColumnStep => {
                &[STATE_F32, STEP_COMMON]
            }
            Pass::RecurrentStepBf16State | Pass::SubgroupStepBf16State => {
                &[STATE_BF16, STEP_COMMON]
            }
            Pass::StateRecompute | Pass::DhScan => &[BACKWARD_SCAN_TILES],
            Pass::StateScanCoop
            | Pass::StateChainCoop
            | Pass::StateRecomputeCoop
            | Pass::DhScanCoop => &[COOP_SCAN_TILES, COOP_K_DIRECT],
            Pass::StateScanCoopStaged | Pass::StateRecomputeCoopStaged | Pass::DhScanCoopStaged => {
                &[COOP_SCAN_TILES, COOP_K_STAGED]
            }
            Pass::StateScan => &[SCAN_OPERAND_F32],
            Pass::StateScanF16 => &[SCAN_OPERAND_F16],
            Pass::WyInverse | Pass::WyInverseCoop => &[WY_GRAM, WY_SOLVE],
            _ => &[],
        }
    }

    /// WGSL extensions the pass needs whatever the storage dtype (emitted before everything
    /// else, since `enable` must precede every declaration).
    pub fn enables(self) -> &'static [&'static str] {
        match self {
            Pass::StateScanF16 => &["f16"],
            Pass::WyInverseCoop => &["f16"],
            Pass::StateScanCoop
            | Pass::StateScanCoopStaged
            | Pass::StateChainCoop
            | Pass::ChunkOutputCoop
            | Pass::StateRecomputeCoop
            | Pass::StateRecomputeCoopStaged
            | Pass::DhScanCoop
            | Pass::DhScanCoopStaged
            | Pass::ValueGramsCoop
            | Pass::WyGradCoop
            | Pass::StateGradCoop
            | Pass::QkGradCoop => &["f16", "wgpu_cooperative_matrix"],
            _ => &[],
        }
    }

    /// Whether the pass needs the device's SUBGROUP feature.
    pub fn needs_subgroups(self) -> bool {
        matches!(self, Pass::SubgroupStep | Pass::SubgroupStepBf16State)
    }

    /// Whether the pass needs the device's EXPERIMENTAL_COOPERATIVE_MATRIX.
    pub fn needs_coop(self) -> bool {
        self.enables().contains(&"wgpu_cooperative_matrix")
    }
}

fn dtype_snippet(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => DTYPE_F32,
        DType::F16 => DTYPE_F16,
        DType::BF16 => DTYPE_BF16,
    }
}

/// An assembled shader: its text and a hash of it, computed once.
#[derive(Debug)]
pub struct ShaderSource {
    /// The pass's file under `shaders/` ([`Pass::file`]).
    pub name: &'static str,
    /// The assembled WGSL: enables, dtype snippet, params block, family snippets, the pass.
    pub text: String,
    /// A hash of `text`, a cheap key for caches.
    pub hash: u64,
}

/// The assembled source of `pass` for storage `dtype`, built once per process.
pub fn source(pass: Pass, dtype: DType) -> Result<&'static ShaderSource> {
    static SOURCES: OnceLock<Mutex<HashMap<(Pass, DType), &'static ShaderSource>>> =
        OnceLock::new();
    let mut map = SOURCES.get_or_init(Mutex::default).lock().unwrap();
    if let Some(s) = map.get(&(pass, dtype)) {
        return Ok(s);
    }
    if !pass.storage_dtypes().contains(&dtype) {
        return Err(Error::unsupported(
            "storage dtype",
            format!("{dtype} storage in {}", pass.file()),
        ));
    }
    // The dtype snippet goes first: `enable f16;` must precede every declaration.
    let family: String = pass
        .family_snippets()
        .iter()
        .map(|(_, text)| format!("{text}\n"))
        .collect();
    let enables: String = pass
        .enables()
        .iter()
        .map(|e| format!("enable {e};\n"))
        .collect();
    let text = format!(
        "{enables}{}\n{PARAMS}\n{family}{}",
        dtype_snippet(dtype),
        pass.body()
    );
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    let s: &'static ShaderSource = Box::leak(Box::new(ShaderSource {
        name: pass.file(),
        text,
        hash: h.finish(),
    }));
    map.insert((pass, dtype), s);
    Ok(s)
}
