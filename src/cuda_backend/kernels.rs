//! The CUDA sources (`shaders/cuda/*.cu`, one file per pass) built into the crate, each
//! compiled after the shared prelude `shaders/cuda/common.cuh`.

/// The prelude every pass is compiled after (dtype conversions, activations, option bits).
pub const PRELUDE: &str = include_str!("../../shaders/cuda/common.cuh");

/// One pass: its file name under `shaders/cuda/` and its source.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name under `shaders/cuda/` (also the NVRTC program name in compile logs).
    pub file: &'static str,
    /// The CUDA C++ text, without the prelude.
    pub text: &'static str,
}

impl Source {
    /// What NVRTC compiles: the prelude, then the pass (a `#line` keeps diagnostics on the
    /// pass's own line numbers).
    pub fn full_text(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file, self.text)
    }
}

/// The recurrent (token-by-token) forward and decode kernel.
pub const RECURRENT: Source = Source {
    file: "recurrent.cu",
    text: include_str!("../../shaders/cuda/recurrent.cu"),
};

/// The chunked tensor-core forward (l2norm, per-chunk prep, sequential state pass).
pub const CHUNKED: Source = Source {
    file: "chunked.cu",
    text: include_str!("../../shaders/cuda/chunked.cu"),
};

/// The exact backward: BPTT kernel, dq/dk and gate finishing kernels.
pub const BACKWARD: Source = Source {
    file: "backward.cu",
    text: include_str!("../../shaders/cuda/backward.cu"),
};

/// Every pass; the `cuda` test checks that this lists every `shaders/cuda/*.cu`.
pub const SOURCES: &[Source] = &[RECURRENT, CHUNKED, BACKWARD];
