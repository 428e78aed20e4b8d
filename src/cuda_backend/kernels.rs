//! The CUDA sources (`shaders/cuda/*.cu`, one file per pass) built into the crate, each
//! compiled after the shared prelude `shaders/cuda/common.cuh` and the headers it names
//! (`shaders/cuda/*.cuh`, e.g. `chunk.cuh`, shared by the chunked forward and backward).

use crate::problem::Problem;

/// The prelude every pass is compiled after (dtype conversions, activations, option bits).
pub const PRELUDE: &str = include_str!("../../shaders/cuda/common.cuh");

/// A header shared by several passes (`shaders/cuda/*.cuh`, besides the prelude).
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// File name under `shaders/cuda/`.
    pub file: &'static str,
    /// The CUDA C++ text.
    pub text: &'static str,
}

/// What the chunked forward and backward share: tensor-core tile helpers, chunk constants,
/// the per-chunk prep pass.
pub const CHUNK_HEADER: Header = Header {
    file: "chunk.cuh",
    text: include_str!("../../shaders/cuda/chunk.cuh"),
};

/// Every header besides the prelude; the `cuda` test checks that this lists every
/// `shaders/cuda/*.cuh` but `common.cuh`.
pub const HEADERS: &[Header] = &[CHUNK_HEADER, CHUNK_BWD_CHAIN_HEADER, WGMMA_HEADER];

/// Hopper warpgroup-MMA wrappers (sm_90a only: empty on other targets), for the forward's
/// `gdn_chunk_fwd64w_*`.
pub const WGMMA_HEADER: Header = Header {
    file: "wgmma.cuh",
    text: include_str!("../../shaders/cuda/wgmma.cuh"),
};

/// The chunked backward's sequential passes (the states and dh chains, apart or in one block),
/// included by one source per dtype.
pub const CHUNK_BWD_CHAIN_HEADER: Header = Header {
    file: "chunk_bwd_chain.cuh",
    text: include_str!("../../shaders/cuda/chunk_bwd_chain.cuh"),
};

/// One pass: its file name under `shaders/cuda/` and its source.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name under `shaders/cuda/` (also the NVRTC program name in compile logs).
    pub file: &'static str,
    /// The CUDA C++ text, without the prelude.
    pub text: &'static str,
    /// Headers compiled between the prelude and the pass, in order.
    pub headers: &'static [Header],
}

impl Source {
    /// What NVRTC compiles: the prelude, the headers, then the pass (`#line`s keep
    /// diagnostics on each file's own line numbers).
    pub fn full_text(&self) -> String {
        let mut text = format!("{PRELUDE}\n");
        for h in self.headers {
            text.push_str(&format!("#line 1 \"{}\"\n{}\n", h.file, h.text));
        }
        text.push_str(&format!("#line 1 \"{}\"\n{}", self.file, self.text));
        text
    }
}

/// The recurrent (token-by-token) forward and decode kernel.
pub const RECURRENT: Source = Source {
    file: "recurrent.cu",
    text: include_str!("../../shaders/cuda/recurrent.cu"),
    headers: &[],
};

/// The chunked tensor-core forward (l2norm, per-chunk prep, sequential state pass).
pub const CHUNKED: Source = Source {
    file: "chunked.cu",
    text: include_str!("../../shaders/cuda/chunked.cu"),
    headers: &[CHUNK_HEADER, WGMMA_HEADER],
};

/// Sequence parallelism's combine step: each segment's start state from E and M.
pub const CHUNK_COMBINE: Source = Source {
    file: "chunk_combine.cu",
    text: include_str!("../../shaders/cuda/chunk_combine.cu"),
    headers: &[],
};

/// Sequence parallelism's gate-driven window: each (segment, v-head)'s warm-up.
pub const SEGMENT_WINDOW: Source = Source {
    file: "segment_window.cu",
    text: include_str!("../../shaders/cuda/segment_window.cu"),
    headers: &[],
};

/// The exact backward: BPTT kernel, dq/dk and gate finishing kernels.
pub const BACKWARD: Source = Source {
    file: "backward.cu",
    text: include_str!("../../shaders/cuda/backward.cu"),
    headers: &[],
};

/// The chunked backward's sequential passes for f16 storage: chunk start states and end-state
/// gradients (a source per dtype, so that the two compile on parallel threads).
pub const CHUNK_BWD_CHAIN_F16: Source = Source {
    file: "chunk_bwd_chain_f16.cu",
    text: include_str!("../../shaders/cuda/chunk_bwd_chain_f16.cu"),
    headers: &[CHUNK_HEADER, CHUNK_BWD_CHAIN_HEADER],
};

/// [`CHUNK_BWD_CHAIN_F16`] for bf16 storage.
pub const CHUNK_BWD_CHAIN_BF16: Source = Source {
    file: "chunk_bwd_chain_bf16.cu",
    text: include_str!("../../shaders/cuda/chunk_bwd_chain_bf16.cu"),
    headers: &[CHUNK_HEADER, CHUNK_BWD_CHAIN_HEADER],
};

/// The chains' source for a kernel-name dtype suffix (`f16`, `bf16`); `None` for any other.
pub fn chunk_bwd_chain_source(suffix: &str) -> Option<&'static Source> {
    match suffix {
        "f16" => Some(&CHUNK_BWD_CHAIN_F16),
        "bf16" => Some(&CHUNK_BWD_CHAIN_BF16),
        _ => None,
    }
}

/// The chunked backward's parallel passes: prep, the gradients inside each chunk and through
/// its states.
pub const CHUNK_BWD_GRAD: Source = Source {
    file: "chunk_bwd_grad.cu",
    text: include_str!("../../shaders/cuda/chunk_bwd_grad.cu"),
    headers: &[CHUNK_HEADER],
};

/// The decode kernel: a window of tokens per sequence over an in-place state pool.
pub const DECODE: Source = Source {
    file: "decode.cu",
    text: include_str!("../../shaders/cuda/decode.cu"),
    headers: &[],
};

/// Every pass; the `cuda` test checks that this lists every `shaders/cuda/*.cu`.
pub const SOURCES: &[Source] = &[
    RECURRENT,
    CHUNKED,
    CHUNK_COMBINE,
    SEGMENT_WINDOW,
    BACKWARD,
    CHUNK_BWD_CHAIN_F16,
    CHUNK_BWD_CHAIN_BF16,
    CHUNK_BWD_GRAD,
    DECODE,
];

// Option bits of `RecurrentParams::flags` and friends, as in common.cuh.
const L2NORM_QK: i32 = 1;
const BETA_SIGMOID: i32 = 2;
const NEG_EIGVAL: i32 = 4;
const GATE_IN_KERNEL: i32 = 8;
const STATE_V_FIRST: i32 = 16;

/// The option bits of common.cuh for `problem`'s options.
pub(crate) fn option_flags(problem: &Problem) -> i32 {
    let o = problem.options;
    [
        (o.l2norm_qk, L2NORM_QK),
        (o.beta_sigmoid, BETA_SIGMOID),
        (o.allow_neg_eigval, NEG_EIGVAL),
        (o.gate_in_kernel, GATE_IN_KERNEL),
        (o.state_v_first, STATE_V_FIRST),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0, |acc, (_, bit)| acc | bit)
}
