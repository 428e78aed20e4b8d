//! The one error type of the crate. Every variant names the parameter (tensor, option or
//! resource) it is about, and says what was expected next to what was given.

use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, typed so callers can match on the kind of mistake.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor has the wrong shape.
    #[error("{name}: expected shape {expected}, got {got}")]
    Shape {
        /// The tensor, as the API names it (`q`, `initial_state`, …).
        name: String,
        /// The expected shape, written out with its sizes.
        expected: String,
        /// The shape that was given.
        got: ShapeList,
    },

    /// A tensor has the wrong element type.
    #[error("{name}: expected dtype {expected}, got {got}")]
    DType {
        /// The tensor, as the API names it.
        name: String,
        /// The dtype (or dtypes) accepted.
        expected: String,
        /// The dtype that was given.
        got: String,
    },

    /// A value (an option, a size, a tensor entry) is out of its allowed range.
    #[error("{name}: expected {expected}, got {got}")]
    Value {
        /// The option, size or tensor the value belongs to.
        name: String,
        /// The allowed range or set, in words.
        expected: String,
        /// The value that was given.
        got: String,
    },

    /// A tensor or option the caller must give is missing.
    #[error("{name}: required {why}")]
    Missing {
        /// The tensor or option that is missing.
        name: String,
        /// Why it is needed (the message reads "`name`: required `why`").
        why: String,
    },

    /// Something valid that this build or this device does not support (yet).
    #[error("{name}: {what} is not yet supported")]
    Unsupported {
        /// The parameter or feature the request is about.
        name: String,
        /// What is not supported, in words.
        what: String,
    },

    /// A buffer, or a dispatch's workgroup count along one grid dimension, would exceed a
    /// device limit. `bytes` is counted in the limit's unit: workgroups for
    /// `max_compute_workgroups_per_dimension`, bytes otherwise.
    #[error(
        "{name}: {bytes} {} the device's {limit_name} of {limit}{}",
        too_large_words(limit_name).0,
        too_large_words(limit_name).1
    )]
    TooLarge {
        /// The buffer or pass that is too large.
        name: String,
        /// Its size, in the limit's unit (see the variant's doc).
        bytes: u64,
        /// The `wgpu::Limits` field exceeded, e.g. `max_storage_buffer_binding_size`.
        limit_name: &'static str,
        /// The device's value of that limit.
        limit: u64,
    },

    /// A plan that needs more memory than the budget it was given (the backward's windows,
    /// state checkpoints and scratch: docs/backward.md, "Memory"). Raised before anything is
    /// allocated.
    #[error("{name}: the plan needs {needed} bytes, more than the memory budget of {budget} bytes")]
    OverBudget {
        /// What was planned, e.g. `backward memory budget`.
        name: String,
        /// Bytes the least plan needs.
        needed: u64,
        /// The budget, in bytes.
        budget: u64,
    },

    /// No adapter could be found (no GPU, no driver).
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),

    /// The adapter refused the device request.
    #[error("device request failed: {0}")]
    RequestDevice(String),

    /// A wgpu validation or out-of-memory error reported by the device.
    #[error("GPU error: {0}")]
    Gpu(String),

    /// The device was lost; create a new `Context`.
    #[error("GPU device lost: {0}")]
    DeviceLost(String),

    /// The device could not allocate memory for a buffer or a pipeline; nothing was recorded
    /// into the caller's encoder after the failure. Free memory (or use smaller problems) and
    /// retry: the context stays usable.
    #[error("{name}: out of GPU memory{}: {msg}", oom_bytes(*bytes))]
    OutOfMemory {
        /// The buffer or pass that could not be allocated.
        name: String,
        /// Bytes requested, when one allocation failed.
        bytes: Option<u64>,
        /// The device's message.
        msg: String,
    },

    /// Reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read or written.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },

    /// A malformed safetensors file.
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors {
        /// The file.
        path: String,
        /// What is wrong with it, from the safetensors parser or our own checks.
        msg: String,
    },
}

/// The unit words of a `TooLarge` message: every limit is in bytes except the grid's.
fn too_large_words(limit_name: &str) -> (&'static str, &'static str) {
    if limit_name.starts_with("max_compute_workgroups") {
        ("workgroups exceed", " workgroups")
    } else {
        ("bytes exceeds", " bytes")
    }
}

fn oom_bytes(bytes: Option<u64>) -> String {
    bytes.map_or(String::new(), |b| format!(" allocating {b} bytes"))
}

/// A shape printed as `[a, b, c]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeList(pub Vec<usize>);

impl fmt::Display for ShapeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Error {
    pub(crate) fn shape(name: &str, expected: &[usize], got: &[usize]) -> Self {
        Error::Shape {
            name: name.into(),
            expected: format!("{expected:?}"),
            got: ShapeList(got.to_vec()),
        }
    }

    pub(crate) fn value(name: &str, expected: impl Into<String>, got: impl fmt::Display) -> Self {
        Error::Value {
            name: name.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    pub(crate) fn unsupported(name: &str, what: impl Into<String>) -> Self {
        Error::Unsupported {
            name: name.into(),
            what: what.into(),
        }
    }

    /// True for mistakes in what the caller passed (shapes, dtypes, values, files), as opposed
    /// to device or environment failures. The CLI maps these to exit code 2.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::Shape { .. }
                | Error::DType { .. }
                | Error::Value { .. }
                | Error::Missing { .. }
                | Error::Unsupported { .. }
                | Error::TooLarge { .. }
                | Error::OverBudget { .. }
                | Error::Io { .. }
                | Error::Safetensors { .. }
        )
    }
}
