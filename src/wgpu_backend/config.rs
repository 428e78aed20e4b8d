//! Every setting the wgpu backend takes from outside the code, read once into a [`Config`]
//! that the [`Context`](crate::wgpu_backend::Context) keeps. The environment is read here and
//! nowhere else in the library; every bad value is an `Error::Value` naming the variable.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::wgpu_backend::path::{ComputePath, ForwardAlgorithm};
use crate::wgpu_backend::tuning::{CoopGrads, V_BLOCK_WIDTHS};

/// The environment variables a [`Config`] reads.
pub const VARIABLES: [&str; 16] = [
    "GDN_ADAPTER",
    "GDN_FORWARD_ALGORITHM",
    "GDN_COMPUTE_PATH",
    "GDN_V_BLOCK",
    "GDN_SEGMENT_CHUNKS",
    "GDN_SEGMENT_WINDOW",
    "GDN_SEGMENT_WARMUP",
    "GDN_SHADER_CHECKS",
    "GDN_MAX_BINDING_BYTES",
    "GDN_MAX_BUFFER_BYTES",
    "GDN_BACKWARD_BUDGET",
    "GDN_BACKWARD_PATH",
    "GDN_SCAN_SPLIT",
    "GDN_COOP_STAGE",
    "GDN_COOP_GRADS",
    "GDN_COOP_UNIFORM_STRIDES",
];

/// The runtime checks wgpu compiles into our shaders (`GDN_SHADER_CHECKS`).
///
/// Default `None`: the kernels are this library's own, every loop has a bound taken from the
/// dispatch's parameters, and every index is clamped or masked in the kernel (padded buffers
/// on the coop path). wgpu's injected checks (index clamping, a counter in every loop,
/// guarded integer division) cost time on the sequential scans — measured on the H200
/// (quickstart, T = 32768, K = V = 128): f32 scalar 2/8 heads 19.7 → 11.1 ms, 16/64
/// 29.7 → 24.7 ms; bf16 coop 2/8 7.1 → 6.1 ms, 16/64 19.9 → 17.2 ms. The platform's own
/// robustness (Vulkan's robustBufferAccess) still applies. The decode kernel
/// (`decode/recurrent_step.wgsl`) keeps wgpu's loop counters at this setting: NVIDIA's
/// driver compiles it into faster code with them (6–7 % on the H200, BENCHMARKS.md).
/// `GDN_SHADER_CHECKS=all` restores wgpu's checks, `no-loop-bounding` keeps all but the loop
/// counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShaderChecks {
    /// wgpu's defaults: bounds checks, loop bounding, integer-division checks.
    All,
    /// No loop-bounding counters.
    NoLoopBounding,
    /// No checks wgpu adds itself.
    #[default]
    None,
}

/// How the forward cuts long sequences into segments that are scanned at once (intra-device
/// sequence parallelism, exact; docs/sequence-parallelism.md): `GDN_SEGMENT_CHUNKS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SegmentChoice {
    /// Chosen per problem and adapter (`auto` or unset):
    /// `forward::auto_segment_chunks`.
    #[default]
    Auto,
    /// Never (`off` or `0`).
    Off,
    /// Every sequence longer than this many chunks is cut into segments of this many (n ≥ 1).
    Chunks(usize),
}

/// The gate-driven window of sequence parallelism (FlashQLA's, docs/sequence-parallelism.md):
/// a segment boundary whose preceding chunks' gates have decayed the state by less than
/// `e^threshold` takes the end state of a short warm-up scan from zero instead of the exact
/// transition. Off (`None` where it is taken) means exact only, the default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentWindow {
    threshold: f32,
    max_warmup_chunks: Option<usize>,
}

/// Finite by construction (see [`SegmentWindow::new`]), so equality is an equivalence.
impl Eq for SegmentWindow {}

impl SegmentWindow {
    /// FlashQLA's threshold: a boundary state whose history decayed by e^-10 ≈ 4.5·10^-5.
    pub const DEFAULT_THRESHOLD: f32 = -10.0;

    /// The window with FlashQLA's threshold and warm-ups up to a whole segment.
    pub const DEFAULT: SegmentWindow = SegmentWindow {
        threshold: Self::DEFAULT_THRESHOLD,
        max_warmup_chunks: None,
    };

    /// A window at `threshold` (natural-log decay, finite and < 0), with warm-ups of at most
    /// `max_warmup_chunks` chunks (≥ 1; `None`: up to the whole segment). A (segment, v-head)
    /// whose last chunks do not decay below the threshold within that many chunks takes the
    /// exact transition.
    pub fn new(threshold: f32, max_warmup_chunks: Option<usize>) -> Result<Self> {
        if !threshold.is_finite() || threshold >= 0.0 {
            return Err(Error::value(
                "segment window threshold",
                "a finite log-decay below 0 (e.g. -10)",
                threshold,
            ));
        }
        if max_warmup_chunks == Some(0) {
            return Err(Error::value(
                "segment window maximum warm-up",
                "at least 1 chunk",
                0,
            ));
        }
        Ok(SegmentWindow {
            threshold,
            max_warmup_chunks,
        })
    }

    /// The log-decay below which a boundary takes the warm-up's state.
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// The longest warm-up, in chunks (`None`: the whole segment).
    pub fn max_warmup_chunks(&self) -> Option<usize> {
        self.max_warmup_chunks
    }
}

impl std::fmt::Display for SegmentWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gate window e^{}", self.threshold)?;
        match self.max_warmup_chunks {
            Some(n) => write!(f, ", warm-up ≤ {n} chunks"),
            None => write!(f, ", warm-up ≤ a segment"),
        }
    }
}

/// The backend's settings. `Default` is what an empty environment gives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `GDN_ADAPTER`: keep only adapters whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// `GDN_FORWARD_ALGORITHM` (`chunked`, `recurrent`; `auto` or unset: `None`): force the
    /// forward's algorithm (`forward_saved` always runs the chunked one).
    pub forward_algorithm: Option<ForwardAlgorithm>,
    /// `GDN_COMPUTE_PATH` (`scalar`, `f16`, `coop`; `auto` or unset: `None`): force the
    /// forward's compute path.
    pub compute_path: Option<ComputePath>,
    /// `GDN_V_BLOCK` (16, 32 or 64): force the scans' V-block width; a context whose device
    /// cannot fit it refuses to start.
    pub v_block: Option<u32>,
    /// `GDN_SEGMENT_CHUNKS` (`auto` or unset, `off` or `0`, or n ≥ 1): whether and how the
    /// chunked forward runs sequence-parallel.
    pub segments: SegmentChoice,
    /// `GDN_SEGMENT_WINDOW` (`exact` or `off`, unset: `None`; `on`: threshold -10; or a
    /// negative threshold such as `-15`) with `GDN_SEGMENT_WARMUP` (n ≥ 1 chunks, or
    /// `segment`, the default): the gate-driven window of sequence parallelism.
    pub segment_window: Option<SegmentWindow>,
    /// `GDN_SHADER_CHECKS` (`all`, `no-loop-bounding`, `none`).
    pub shader_checks: ShaderChecks,
    /// `GDN_MAX_BINDING_BYTES` (bytes, or with a `KiB`/`MiB`/`GiB` suffix; at least
    /// [`MIN_BINDING_BYTES`]): the largest storage binding the library makes, lowered below
    /// the device's `max_storage_buffer_binding_size` (never raised past it). Tensors and
    /// scratch larger than a binding are processed in windows, so this also bounds the
    /// forward's scratch (docs/configuration.md).
    pub max_binding_bytes: Option<u64>,
    /// `GDN_MAX_BUFFER_BYTES` (same format and least value): the largest buffer the library
    /// creates for one tensor, lowered below the device's `max_buffer_size`. A tensor larger
    /// than this is stored in several buffers of whole rows (docs/windows.md); lowering it
    /// tests that on small problems.
    pub max_buffer_bytes: Option<u64>,
    /// `GDN_BACKWARD_BUDGET` (bytes with an optional `KiB`/`MiB`/`GiB` suffix, `Nx` for N
    /// times the backward's inputs, or `unbounded`): the memory the backward plans with when
    /// no budget is given in the call (`None`: [`MemoryBudget::DEFAULT`]; docs/backward.md).
    pub backward_budget: Option<MemoryBudget>,
    /// `GDN_BACKWARD_PATH` (`scalar`, `coop`; `auto` or unset: `None`): force the backward's
    /// compute path; unset, the backward follows the forward's (coop where the forward takes
    /// it, else scalar; `wgpu_backend::backward::backward_path`).
    pub backward_path: Option<ComputePath>,
    /// `GDN_SCAN_SPLIT` (`on` or `off`, unset: off): the coop forward's split scan — the
    /// sequential chain computes only V' and the chunk-start states, and a parallel pass
    /// (`chunk_output_coop`) computes o from them (docs/passes.md).
    pub scan_split: bool,
    /// `GDN_COOP_STAGE` (`on` or `off`, unset: off): the coop scans (`state_scan_coop`,
    /// `state_recompute_coop`, `dh_scan_coop`) stage each chunk's K through workgroup memory
    /// with 16-byte loads instead of cooperative loads from storage, on devices with
    /// [`STATE_SCAN_COOP_STAGED_BYTES`](crate::wgpu_backend::tuning::STATE_SCAN_COOP_STAGED_BYTES)
    /// of workgroup memory (docs/configuration.md).
    pub coop_stage: bool,
    /// `GDN_COOP_UNIFORM_STRIDES=on`: the coop scans take their head counts (so their tile
    /// strides) from the uniform parameters instead of pipeline constants (the A/B switch of
    /// `coop_scan::head_constants`; off by default).
    pub coop_uniform_strides: bool,
    /// `GDN_COOP_GRADS` (`all`, `none`, `default`, or a comma-separated list of
    /// `value_grams`, `wy_grad`, `state_grad`, `qk_grad`; unset: `None`, the default): the coop backward's per-chunk
    /// passes that run on cooperative matrices ([`CoopGrads`]).
    pub coop_grads: Option<CoopGrads>,
}

/// The least `GDN_MAX_BINDING_BYTES`: one 64-token chunk of the forward's largest per-token
/// scratch at one v-head (512 B per token) with its alignment slack and padding fits.
pub const MIN_BINDING_BYTES: u64 = 1 << 16;

impl Config {
    /// The settings in the process environment. A variable that is not UTF-8 is an error too.
    pub fn from_env() -> Result<Self> {
        let mut values = HashMap::new();
        for name in VARIABLES {
            if let Some(value) = env_value(name)? {
                values.insert(name, value);
            }
        }
        Self::from_lookup(|name| values.get(name).cloned())
    }

    /// The settings from `lookup(variable)` (`None`: unset), e.g. a map in tests, so no caller
    /// has to touch the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let compute_path = match lookup("GDN_COMPUTE_PATH") {
            Some(s) => ComputePath::parse_override("GDN_COMPUTE_PATH", &s)?,
            None => None,
        };
        let backward_path = match lookup("GDN_BACKWARD_PATH") {
            Some(s) => match ComputePath::parse_override("GDN_BACKWARD_PATH", &s)? {
                Some(ComputePath::F16Math) => {
                    return Err(Error::value(
                        "GDN_BACKWARD_PATH",
                        "one of auto, scalar, coop (the backward has no f16-math passes)",
                        format!("{s:?}"),
                    ));
                }
                path => path,
            },
            None => None,
        };
        let forward_algorithm = match lookup("GDN_FORWARD_ALGORITHM") {
            Some(s) => ForwardAlgorithm::parse_override("GDN_FORWARD_ALGORITHM", &s)?,
            None => None,
        };
        Ok(Config {
            adapter: lookup("GDN_ADAPTER"),
            forward_algorithm,
            compute_path,
            v_block: lookup("GDN_V_BLOCK")
                .map(|s| parse_v_block(&s))
                .transpose()?,
            segments: lookup("GDN_SEGMENT_CHUNKS")
                .map(|s| parse_segments(&s))
                .transpose()?
                .unwrap_or_default(),
            segment_window: parse_segment_window(
                lookup("GDN_SEGMENT_WINDOW").as_deref(),
                lookup("GDN_SEGMENT_WARMUP").as_deref(),
            )?,
            shader_checks: match lookup("GDN_SHADER_CHECKS") {
                Some(s) => parse_shader_checks(&s)?,
                None => ShaderChecks::None,
            },
            max_binding_bytes: lookup("GDN_MAX_BINDING_BYTES")
                .map(|s| parse_limit_bytes("GDN_MAX_BINDING_BYTES", &s))
                .transpose()?,
            max_buffer_bytes: lookup("GDN_MAX_BUFFER_BYTES")
                .map(|s| parse_limit_bytes("GDN_MAX_BUFFER_BYTES", &s))
                .transpose()?,
            backward_budget: lookup("GDN_BACKWARD_BUDGET")
                .map(|s| MemoryBudget::parse("GDN_BACKWARD_BUDGET", &s))
                .transpose()?,
            backward_path,
            scan_split: parse_on_off("GDN_SCAN_SPLIT", lookup("GDN_SCAN_SPLIT").as_deref())?,
            coop_stage: parse_on_off("GDN_COOP_STAGE", lookup("GDN_COOP_STAGE").as_deref())?,
            coop_uniform_strides: parse_on_off(
                "GDN_COOP_UNIFORM_STRIDES",
                lookup("GDN_COOP_UNIFORM_STRIDES").as_deref(),
            )?,
            coop_grads: lookup("GDN_COOP_GRADS")
                .map(|s| CoopGrads::parse("GDN_COOP_GRADS", &s))
                .transpose()?,
        })
    }

    /// Whether `name` passes the `GDN_ADAPTER` filter.
    pub fn adapter_matches(&self, name: &str) -> bool {
        self.adapter
            .as_ref()
            .is_none_or(|f| name.to_lowercase().contains(&f.to_lowercase()))
    }
}

/// An `on`/`off` switch (unset: off).
fn parse_on_off(name: &str, value: Option<&str>) -> Result<bool> {
    match value.map(str::trim) {
        None | Some("off") => Ok(false),
        Some("on") => Ok(true),
        Some(other) => Err(Error::value(name, "on or off", format!("{other:?}"))),
    }
}

/// One variable of the environment (`None`: unset).
fn env_value(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(s) => Ok(Some(s)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(raw)) => Err(Error::value(
            name,
            "UTF-8 text",
            format!("{:?}", raw.to_string_lossy()),
        )),
    }
}

/// The `GDN_ADAPTER` filter of the environment, for [`list_adapters`] without a config (a
/// value that is not UTF-8 filters by its lossy text: a listing has no error to return).
///
/// [`list_adapters`]: crate::wgpu_backend::list_adapters
pub(crate) fn adapter_filter_from_env() -> Config {
    Config {
        adapter: std::env::var_os("GDN_ADAPTER").map(|s| s.to_string_lossy().into_owned()),
        ..Config::default()
    }
}

fn parse_v_block(s: &str) -> Result<u32> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|bv| V_BLOCK_WIDTHS.contains(bv))
        .ok_or_else(|| Error::value("GDN_V_BLOCK", "16, 32 or 64", format!("{s:?}")))
}

fn parse_segments(s: &str) -> Result<SegmentChoice> {
    match s.trim() {
        "auto" => Ok(SegmentChoice::Auto),
        "off" | "0" => Ok(SegmentChoice::Off),
        t => t.parse::<usize>().map(SegmentChoice::Chunks).map_err(|_| {
            Error::value(
                "GDN_SEGMENT_CHUNKS",
                "auto, off, or a number of chunks",
                format!("{s:?}"),
            )
        }),
    }
}

/// `GDN_SEGMENT_WINDOW` and `GDN_SEGMENT_WARMUP` (the warm-up cap is checked even while the
/// window is off, so a typo is never silently ignored).
fn parse_segment_window(
    window: Option<&str>,
    warmup: Option<&str>,
) -> Result<Option<SegmentWindow>> {
    SegmentWindow::parse(
        ("GDN_SEGMENT_WINDOW", window),
        ("GDN_SEGMENT_WARMUP", warmup),
    )
}

impl SegmentWindow {
    /// Parse a window setting as `GDN_SEGMENT_WINDOW` takes it (`exact`, `off` or unset:
    /// `None`; `on`; or a threshold below 0) with a warm-up cap as `GDN_SEGMENT_WARMUP`
    /// takes it (chunks ≥ 1, `segment` or unset: the whole segment); each is (the name the
    /// error gives, the value). The cap is checked even while the window is off.
    pub fn parse(
        (window_name, window): (&str, Option<&str>),
        (warmup_name, warmup): (&str, Option<&str>),
    ) -> Result<Option<SegmentWindow>> {
        let max_warmup = match warmup.map(str::trim) {
            None | Some("segment") => None,
            Some(t) => Some(t.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                Error::value(
                    warmup_name,
                    "a number of chunks (at least 1) or segment",
                    format!("{t:?}"),
                )
            })?),
        };
        let threshold = match window.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("exact") | Some("off") => return Ok(None),
            Some("on") => SegmentWindow::DEFAULT_THRESHOLD,
            Some(t) => t
                .parse::<f32>()
                .ok()
                .filter(|x| x.is_finite() && *x < 0.0)
                .ok_or_else(|| {
                    Error::value(
                        window_name,
                        "exact, off, on, or a log-decay threshold below 0 (e.g. -10)",
                        format!("{t:?}"),
                    )
                })?,
        };
        SegmentWindow::new(threshold, max_warmup).map(Some)
    }
}

/// Bytes, optionally with a binary suffix (`KiB`, `MiB`, `GiB`), a multiple of 4 (bindings
/// are word-sized) and at least [`MIN_BINDING_BYTES`].
fn parse_limit_bytes(variable: &str, s: &str) -> Result<u64> {
    parse_bytes(s)
        .filter(|&b| b >= MIN_BINDING_BYTES && b % 4 == 0)
        .ok_or_else(|| {
            Error::value(
                variable,
                format!(
                    "a byte count (optionally with KiB, MiB or GiB), a multiple of 4 and at \
                     least {MIN_BINDING_BYTES}"
                ),
                format!("{s:?}"),
            )
        })
}

/// A byte count, optionally with a binary suffix (`KiB`, `MiB`, `GiB`); `None` if it is not
/// one or overflows.
pub(crate) fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim();
    let (digits, unit) = [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)]
        .into_iter()
        .find_map(|(suffix, unit)| t.strip_suffix(suffix).map(|d| (d.trim(), unit)))
        .unwrap_or((t, 1));
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

fn parse_shader_checks(s: &str) -> Result<ShaderChecks> {
    match s {
        "all" => Ok(ShaderChecks::All),
        "no-loop-bounding" => Ok(ShaderChecks::NoLoopBounding),
        "none" => Ok(ShaderChecks::None),
        other => Err(Error::value(
            "GDN_SHADER_CHECKS",
            "all, no-loop-bounding or none",
            format!("{other:?}"),
        )),
    }
}

/// How much device memory a backward plan may use: its workspace (scratch for one window,
/// tables) plus the state checkpoints `forward_saved` keeps for it (`backward::PlanBytes`). The
/// caller's inputs, what the forward keeps besides checkpoints, and the gradients are not
/// part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBudget {
    /// At most this many bytes.
    Bytes(u64),
    /// This many times the backward's inputs (`backward::input_bytes`: q, k, v, g, β, do), or the
    /// least plan where that is more (problems of a few chunks per sequence, whose one-chunk
    /// windows and states outweigh their tokens).
    TimesInputs(u32),
    /// No budget: windows only where a binding requires them (the whole problem at once
    /// otherwise; the fastest plan).
    Unbounded,
}

impl MemoryBudget {
    /// Twice the inputs. The backward then holds about four times its inputs at its peak
    /// (the inputs, gradients of their size, and this budget) instead of ~11× (f32 storage
    /// ~6×) with its whole-problem workspace, and windows of a fifth of the tokens or longer
    /// at K = V = 128 keep every pass's grid full on large problems (docs/backward.md).
    pub const DEFAULT: MemoryBudget = MemoryBudget::TimesInputs(2);

    /// Parse `unbounded`, `Nx` (N ≥ 1 times the inputs) or a byte count with an optional
    /// `KiB`/`MiB`/`GiB` suffix (at least 1); `name` names the setting in the error.
    pub fn parse(name: &str, s: &str) -> Result<Self> {
        let t = s.trim();
        let parsed = if t.eq_ignore_ascii_case("unbounded") {
            Some(MemoryBudget::Unbounded)
        } else if let Some(n) = t.strip_suffix(['x', 'X']) {
            n.trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .map(MemoryBudget::TimesInputs)
        } else {
            parse_bytes(t).filter(|&b| b > 0).map(MemoryBudget::Bytes)
        };
        parsed.ok_or_else(|| {
            Error::value(
                name,
                "a byte count (optionally with KiB, MiB or GiB), Nx (N times the \
                 backward's inputs) or unbounded",
                format!("{s:?}"),
            )
        })
    }
}
