//! Shapes, options and validation of a GDN problem, shared by every backend and the CLI.
//!
//! Conventions (FLA's `chunk_gated_delta_rule`): q, k `[B,T,H,K]`; v `[B,T,HV,V]`; g, beta
//! `[B,T,HV]`; initial/final state `[N,HV,K,V]` (or `[N,HV,V,K]` with `state_v_first`);
//! o `[B,T,HV,V]`. Without `cu_seqlens` the N = B sequences are the batch rows; with it B must
//! be 1 and the packed sequences are `cu_seqlens[i]..cu_seqlens[i+1]`.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::tensor::{DType, TensorMeta};

/// Tokens per chunk of the chunked algorithm.
pub const CHUNK: usize = 64;
/// Largest supported key / value head dimension.
pub const MAX_HEAD_DIM: usize = 256;
/// The epsilon inside the square root of the in-kernel l2norm: `x / sqrt(Σx² + EPS)`.
pub const L2NORM_EPS: f64 = 1e-6;

/// The flags of FLA's `chunk_gated_delta_rule`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Options {
    /// Output scale; `None` means `K^-1/2`.
    pub scale: Option<f32>,
    /// Normalize q and k per head vector in the kernel: `x / sqrt(Σx² + 1e-6)`.
    pub l2norm_qk: bool,
    /// `beta` holds logits; the kernel applies a sigmoid.
    pub beta_sigmoid: bool,
    /// β = 2·sigmoid(beta) ∈ (0, 2); requires `beta_sigmoid`.
    pub allow_neg_eigval: bool,
    /// `g` holds the raw gate; the decay is `−exp(A_log)·softplus(g + dt_bias)` per v-head.
    pub gate_in_kernel: bool,
    /// States are stored `[.., V, K]` instead of `[.., K, V]`.
    pub state_v_first: bool,
}

/// Sizes and options of one problem. Build it with [`Problem::new`], which validates it.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// B
    pub batch: usize,
    /// T (per batch row)
    pub tokens: usize,
    /// H: q/k heads
    pub heads_qk: usize,
    /// HV: v heads (GVA when HV > H)
    pub heads_v: usize,
    /// K
    pub key_dim: usize,
    /// V
    pub value_dim: usize,
    /// Packed sequence boundaries (requires B == 1).
    pub cu_seqlens: Option<Vec<usize>>,
    /// The FLA flags: scale, activations, in-kernel gate, state layout.
    pub options: Options,
}

/// The inputs of a forward pass, generic over the tensor type so every backend (host, wgpu,
/// later CUDA) shares one description and one validation.
#[derive(Debug, Clone, Copy)]
pub struct ForwardInputs<T> {
    /// `[B,T,H,K]`, in the storage dtype (F32, F16 or BF16), which k and v share.
    pub q: T,
    /// `[B,T,H,K]`, in the dtype of q.
    pub k: T,
    /// `[B,T,HV,V]`, in the dtype of q.
    pub v: T,
    /// `[B,T,HV]` f32: the log-decay (≤ 0), or the raw gate with `gate_in_kernel`.
    pub g: T,
    /// `[B,T,HV]` f32: β, or its logits with `beta_sigmoid`.
    pub beta: T,
    /// `[N,HV,K,V]` (or V-first) f32; `None` starts every sequence from a zero state.
    pub initial_state: Option<T>,
    /// `[HV]`, with `gate_in_kernel`.
    pub a_log: Option<T>,
    /// `[HV]`, with `gate_in_kernel`.
    pub dt_bias: Option<T>,
}

/// What a forward pass produces.
#[derive(Debug, Clone)]
pub struct ForwardOutputs<T> {
    /// `[B,T,HV,V]`, in the dtype of v.
    pub o: T,
    /// `[N,HV,K,V]` (or V-first), f32.
    pub final_state: T,
}

/// Gradients of a scalar loss w.r.t. the raw inputs of the forward.
#[derive(Debug, Clone)]
pub struct Gradients<T> {
    /// `[B,T,H,K]`, dtype of q: summed over each GVA group, through the l2norm with `l2norm_qk`.
    pub dq: T,
    /// `[B,T,H,K]`, dtype of k.
    pub dk: T,
    /// `[B,T,HV,V]`, dtype of v.
    pub dv: T,
    /// `[B,T,HV]` f32, w.r.t. the raw g (through the gate activation with `gate_in_kernel`).
    pub dg: T,
    /// `[B,T,HV]` f32, w.r.t. the raw beta (through the sigmoid and ×2 when enabled).
    pub dbeta: T,
    /// The state shape, f32; only when the forward had an initial state.
    pub dh0: Option<T>,
    /// `[HV]` f32, with `gate_in_kernel`.
    pub da_log: Option<T>,
    /// `[HV]` f32, with `gate_in_kernel`.
    pub ddt_bias: Option<T>,
}

impl<T> ForwardInputs<T> {
    /// Borrow every tensor.
    pub fn as_ref(&self) -> ForwardInputs<&T> {
        ForwardInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.initial_state.as_ref(),
            a_log: self.a_log.as_ref(),
            dt_bias: self.dt_bias.as_ref(),
        }
    }
}

impl Problem {
    /// A validated problem. `cu_seqlens`, when given, needs `batch == 1`, starts at 0, never
    /// decreases and ends at `tokens`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        tokens: usize,
        heads_qk: usize,
        heads_v: usize,
        key_dim: usize,
        value_dim: usize,
        cu_seqlens: Option<Vec<usize>>,
        options: Options,
    ) -> Result<Self> {
        let p = Problem {
            batch,
            tokens,
            heads_qk,
            heads_v,
            key_dim,
            value_dim,
            cu_seqlens,
            options,
        };
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::value("batch (B)", "at least 1", self.batch));
        }
        if self.tokens == 0 {
            return Err(Error::value("tokens (T)", "at least 1", self.tokens));
        }
        if self.heads_qk == 0 {
            return Err(Error::value("heads_qk (H)", "at least 1", self.heads_qk));
        }
        if self.heads_v == 0 || !self.heads_v.is_multiple_of(self.heads_qk) {
            return Err(Error::value(
                "heads_v (HV)",
                format!("a positive multiple of H = {} (GVA)", self.heads_qk),
                self.heads_v,
            ));
        }
        for (name, d) in [
            ("key_dim (K)", self.key_dim),
            ("value_dim (V)", self.value_dim),
        ] {
            if d == 0 || d % 16 != 0 || d > MAX_HEAD_DIM {
                return Err(Error::value(
                    name,
                    format!("a multiple of 16 in 16..={MAX_HEAD_DIM}"),
                    d,
                ));
            }
        }
        // Every tensor's element count must fit in usize (the shapes below multiply them).
        let dims = |d: &[usize]| d.iter().try_fold(1usize, |n, &x| n.checked_mul(x));
        let qk = dims(&[self.batch, self.tokens, self.heads_qk, self.key_dim]);
        let v = dims(&[self.batch, self.tokens, self.heads_v, self.value_dim]);
        let state = dims(&[self.batch, self.heads_v, self.key_dim, self.value_dim]);
        if qk.is_none() || v.is_none() || state.is_none() {
            return Err(Error::value(
                "problem size",
                "element counts of q, v and the states that fit in usize",
                format!(
                    "B = {}, T = {}, H = {}, HV = {}",
                    self.batch, self.tokens, self.heads_qk, self.heads_v
                ),
            ));
        }
        if let Some(s) = self.options.scale
            && !s.is_finite()
        {
            return Err(Error::value("scale", "a finite number", s));
        }
        if self.options.allow_neg_eigval && !self.options.beta_sigmoid {
            return Err(Error::value(
                "allow_neg_eigval",
                "use together with beta_sigmoid (β = 2·sigmoid(beta))",
                "allow_neg_eigval without beta_sigmoid",
            ));
        }
        if let Some(cu) = &self.cu_seqlens {
            if self.batch != 1 {
                return Err(Error::value(
                    "cu_seqlens",
                    "batch (B) == 1 when cu_seqlens is given",
                    format!("B = {}", self.batch),
                ));
            }
            if cu.len() < 2 {
                return Err(Error::value(
                    "cu_seqlens",
                    "at least 2 entries [0, .., T]",
                    format!("{} entries", cu.len()),
                ));
            }
            if cu[0] != 0 {
                return Err(Error::value("cu_seqlens", "first entry 0", cu[0]));
            }
            if let Some(w) = cu.windows(2).find(|w| w[1] < w[0]) {
                return Err(Error::value(
                    "cu_seqlens",
                    "non-decreasing entries",
                    format!("{} followed by {}", w[0], w[1]),
                ));
            }
            let last = *cu.last().unwrap();
            if last != self.tokens {
                return Err(Error::value(
                    "cu_seqlens",
                    format!("last entry equal to T = {}", self.tokens),
                    last,
                ));
            }
        }
        Ok(())
    }

    /// N: the number of sequences (B, or `cu_seqlens.len() − 1`).
    pub fn num_sequences(&self) -> usize {
        match &self.cu_seqlens {
            Some(cu) => cu.len() - 1,
            None => self.batch,
        }
    }

    /// Total tokens B·T (the packed token axis).
    pub fn total_tokens(&self) -> usize {
        self.batch * self.tokens
    }

    /// Token ranges of the sequences on the packed axis `[0, B·T)`.
    pub fn sequences(&self) -> Vec<Range<usize>> {
        match &self.cu_seqlens {
            Some(cu) => cu.windows(2).map(|w| w[0]..w[1]).collect(),
            None => (0..self.batch)
                .map(|b| b * self.tokens..(b + 1) * self.tokens)
                .collect(),
        }
    }

    /// Chunks of at most [`CHUNK`] tokens; chunks never straddle sequences.
    pub fn chunks(&self) -> Vec<Range<usize>> {
        self.sequences()
            .into_iter()
            .flat_map(|s| {
                (s.start..s.end)
                    .step_by(CHUNK)
                    .map(move |c| c..(c + CHUNK).min(s.end))
            })
            .collect()
    }

    /// v-heads per q/k head.
    pub fn group(&self) -> usize {
        self.heads_v / self.heads_qk
    }

    /// The output scale (default `K^-1/2`).
    pub fn scale(&self) -> f32 {
        self.options
            .scale
            .unwrap_or(1.0 / (self.key_dim as f32).sqrt())
    }

    /// `[B,T,H,K]`: the shape of q and k.
    pub fn qk_shape(&self) -> [usize; 4] {
        [self.batch, self.tokens, self.heads_qk, self.key_dim]
    }
    /// `[B,T,HV,V]`: the shape of v and o.
    pub fn v_shape(&self) -> [usize; 4] {
        [self.batch, self.tokens, self.heads_v, self.value_dim]
    }
    /// `[B,T,HV]`: the shape of g and beta.
    pub fn gate_shape(&self) -> [usize; 3] {
        [self.batch, self.tokens, self.heads_v]
    }
    /// `[N,HV,K,V]`, or `[N,HV,V,K]` with `state_v_first`.
    pub fn state_shape(&self) -> [usize; 4] {
        let (a, b) = if self.options.state_v_first {
            (self.value_dim, self.key_dim)
        } else {
            (self.key_dim, self.value_dim)
        };
        [self.num_sequences(), self.heads_v, a, b]
    }

    /// Index of state element (k, v) of sequence n, v-head hv, in the problem's state layout.
    pub fn state_index(&self, n: usize, hv: usize, k: usize, v: usize) -> usize {
        let base = (n * self.heads_v + hv) * self.key_dim * self.value_dim;
        if self.options.state_v_first {
            base + v * self.key_dim + k
        } else {
            base + k * self.value_dim + v
        }
    }

    /// Check the inputs' shapes and dtypes against the problem. `storage` lists the dtypes the
    /// backend can take for q, k, v.
    pub fn check_inputs<T: TensorMeta>(
        &self,
        inputs: &ForwardInputs<&T>,
        storage: &[DType],
    ) -> Result<()> {
        let qk = self.qk_shape();
        check_shape("q", inputs.q, &qk)?;
        check_shape("k", inputs.k, &qk)?;
        check_shape("v", inputs.v, &self.v_shape())?;
        check_shape("g", inputs.g, &self.gate_shape())?;
        check_shape("beta", inputs.beta, &self.gate_shape())?;
        let dtype = inputs.q.dtype();
        for (name, t) in [("k", inputs.k), ("v", inputs.v)] {
            if t.dtype() != dtype {
                return Err(Error::DType {
                    name: name.into(),
                    expected: format!("{dtype} (the dtype of q)"),
                    got: t.dtype().to_string(),
                });
            }
        }
        if !storage.contains(&dtype) {
            return Err(Error::unsupported(
                "q",
                format!("{dtype} storage on this backend"),
            ));
        }
        check_f32("g", inputs.g)?;
        check_f32("beta", inputs.beta)?;
        if let Some(h0) = inputs.initial_state {
            check_shape("initial_state", h0, &self.state_shape())?;
            check_f32("initial_state", h0)?;
        }
        let hv = [self.heads_v];
        match (self.options.gate_in_kernel, inputs.a_log, inputs.dt_bias) {
            (true, Some(a), Some(d)) => {
                check_shape("A_log", a, &hv)?;
                check_f32("A_log", a)?;
                check_shape("dt_bias", d, &hv)?;
                check_f32("dt_bias", d)?;
            }
            (true, None, _) => {
                return Err(Error::Missing {
                    name: "A_log".into(),
                    why: "with gate_in_kernel, shape [HV]".into(),
                });
            }
            (true, _, None) => {
                return Err(Error::Missing {
                    name: "dt_bias".into(),
                    why: "with gate_in_kernel, shape [HV]".into(),
                });
            }
            (false, Some(_), _) => {
                return Err(Error::value(
                    "A_log",
                    "no A_log unless gate_in_kernel is set",
                    "a tensor",
                ));
            }
            (false, _, Some(_)) => {
                return Err(Error::value(
                    "dt_bias",
                    "no dt_bias unless gate_in_kernel is set",
                    "a tensor",
                ));
            }
            (false, None, None) => {}
        }
        Ok(())
    }
}

/// The shape, then that the storage holds it (see [`TensorMeta::check_storage`]).
fn check_shape<T: TensorMeta>(name: &str, t: &T, expected: &[usize]) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::shape(name, expected, t.shape()));
    }
    t.check_storage(name)
}

fn check_f32<T: TensorMeta>(name: &str, t: &T) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType {
            name: name.into(),
            expected: "F32".into(),
            got: t.dtype().to_string(),
        });
    }
    Ok(())
}

/// Check host values that the kernels' numerics rely on: everything finite, and (without
/// `gate_in_kernel`) every log-decay `g ≤ 0`, so that every exponent the kernels take is ≤ 0.
/// GPU tensors cannot be checked without a readback; the GPU API documents this precondition
/// and the CLI and host helpers call this.
pub fn check_host_values(
    problem: &Problem,
    inputs: &ForwardInputs<&crate::HostTensor>,
) -> Result<()> {
    let named = [
        ("q", Some(inputs.q)),
        ("k", Some(inputs.k)),
        ("v", Some(inputs.v)),
        ("g", Some(inputs.g)),
        ("beta", Some(inputs.beta)),
        ("initial_state", inputs.initial_state),
        ("A_log", inputs.a_log),
        ("dt_bias", inputs.dt_bias),
    ];
    for (name, t) in named {
        if let Some(t) = t
            && let Some(i) = t.data.iter().position(|x| !x.is_finite())
        {
            return Err(Error::value(
                name,
                "finite values",
                format!("{} at flat index {i}", t.data[i]),
            ));
        }
    }
    if !problem.options.gate_in_kernel
        && let Some(i) = inputs.g.data.iter().position(|&x| x > 0.0)
    {
        return Err(Error::value(
            "g",
            "log-space decays ≤ 0",
            format!("{} at flat index {i}", inputs.g.data[i]),
        ));
    }
    Ok(())
}
