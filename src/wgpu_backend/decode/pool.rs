//! The state pool of a server: `[P, HV, K, V]` (or V-first) states addressed by slot, stored
//! as f32 (the default) or bf16 (opt-in, half the traffic), and the typed slot each sequence
//! of a decode call uses.

use crate::error::{Error, Result};
use crate::problem::Problem;
use crate::tensor::{DType, TensorMeta};
use crate::wgpu_backend::tensor::copy_elements;
use crate::wgpu_backend::{Context, GpuTensor};

/// How a state is laid out: `[K, V]` (FLA's default) or `[V, K]` (`state_v_first`).
///
/// A pool records its layout because with K = V the shapes cannot tell them apart, and
/// computing with Sᵀ gives plausible-looking wrong answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateLayout {
    /// Each slot is `[HV, K, V]` (FLA's default).
    KFirst,
    /// Each slot is `[HV, V, K]` (`state_v_first`).
    VFirst,
}

impl StateLayout {
    /// The layout a problem's options ask for.
    pub fn of(problem: &Problem) -> Self {
        if problem.options.state_v_first {
            StateLayout::VFirst
        } else {
            StateLayout::KFirst
        }
    }

    /// The two inner dimensions of a state in this layout.
    pub fn inner_shape(self, key_dim: usize, value_dim: usize) -> [usize; 2] {
        match self {
            StateLayout::KFirst => [key_dim, value_dim],
            StateLayout::VFirst => [value_dim, key_dim],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            StateLayout::KFirst => "K-first [P, HV, K, V]",
            StateLayout::VFirst => "V-first [P, HV, V, K]",
        }
    }
}

/// What one sequence of a decode call does with the pool.
///
/// Serving engines allocate a slot when they admit a request and keep it until the request
/// ends; a new request's slot holds a stale state, so "start from zero" is a property of the
/// call, not of the slot. Padding lets a prepared [`DecodePlan`](super::DecodePlan) keep a
/// fixed batch size while fewer sequences are active (as CUDA-graph servers pad their batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSlot {
    /// Continue from the state in this pool slot; the new state replaces it (in place).
    Resume(u32),
    /// Start from a zero state, ignoring the slot's content; the new state is written there.
    Fresh(u32),
    /// Start from a zero state and write nothing to the pool (o is still written).
    Padding,
}

impl StateSlot {
    /// vLLM-style slot indices: `i ≥ 0` resumes slot `i`, a negative index (their
    /// `PAD_SLOT_ID = -1`) is padding: a zero state that is not written back.
    pub fn from_index(index: i32) -> Self {
        if index >= 0 {
            StateSlot::Resume(index as u32)
        } else {
            StateSlot::Padding
        }
    }

    /// The pool slot written, if any.
    pub fn slot(self) -> Option<u32> {
        match self {
            StateSlot::Resume(s) | StateSlot::Fresh(s) => Some(s),
            StateSlot::Padding => None,
        }
    }

    /// The code the kernel reads (see `shaders/decode/recurrent_step.wgsl`): `s` resumes,
    /// `-1` is padding, `-2 - s` starts slot `s` from zero.
    pub(crate) fn code(self) -> i32 {
        match self {
            StateSlot::Resume(s) => s as i32,
            StateSlot::Fresh(s) => -2 - s as i32,
            StateSlot::Padding => -1,
        }
    }
}

/// Check slots against a pool of `pool_slots` slots and `sequences` sequences: one per
/// sequence, in range, and no pool slot written twice (workgroups would race on it).
pub fn check_slots(slots: &[StateSlot], sequences: usize, pool_slots: usize) -> Result<()> {
    if slots.len() != sequences {
        return Err(Error::value(
            "slots",
            format!("one slot per sequence (N = {sequences})"),
            format!("{} slots", slots.len()),
        ));
    }
    let mut owner: Vec<Option<usize>> = vec![None; pool_slots];
    for (n, s) in slots.iter().enumerate() {
        let Some(slot) = s.slot() else { continue };
        let slot = slot as usize;
        if slot >= pool_slots {
            return Err(Error::value(
                "slots",
                format!("pool slots in 0..{pool_slots} (the pool's P)"),
                format!("slot {slot} for sequence {n}"),
            ));
        }
        if let Some(first) = owner[slot] {
            return Err(Error::value(
                "slots",
                "a different pool slot for every sequence of a call",
                format!("slot {slot} for sequences {first} and {n}"),
            ));
        }
        owner[slot] = Some(n);
    }
    Ok(())
}

/// Storage dtypes a state pool takes: f32 (the default) and bf16 (half the bytes a decode
/// step moves; the kernels compute in f32 and round the state to bf16, to nearest even, when
/// they store it).
pub const POOL_DTYPES: [DType; 2] = [DType::F32, DType::BF16];

fn check_pool_dtype(name: &str, dtype: DType) -> Result<()> {
    if POOL_DTYPES.contains(&dtype) {
        return Ok(());
    }
    Err(Error::DType {
        name: name.into(),
        expected: "F32 or BF16 (a state pool's storage dtypes)".into(),
        got: dtype.to_string(),
    })
}

/// Slots per buffer of a pool of `slot_bytes`-byte slots on `ctx`: the most whole slots one
/// buffer ([`Context::max_buffer_bytes`]) holds, rounded down to a whole number of binding
/// windows ([`Context::max_binding_bytes`]) where a buffer holds more than one, so the decode
/// plan's pool windows are equal. At least 1 (a slot larger than a buffer is refused where
/// the buffer is made).
fn slots_per_buffer(ctx: &Context, slot_bytes: u64) -> usize {
    let slot_bytes = slot_bytes.max(4);
    let per_buffer = (ctx.max_buffer_bytes() / slot_bytes).max(1) as usize;
    let per_window = (ctx.max_binding_bytes() / slot_bytes).max(1) as usize;
    if per_buffer > per_window {
        per_buffer / per_window * per_window
    } else {
        per_buffer
    }
}

/// A pool of states `[P, HV, K, V]` (or `[P, HV, V, K]`) that decode calls update in place,
/// stored as f32 or bf16 ([`POOL_DTYPES`]); past [`Context::max_buffer_bytes`] in several
/// buffers of whole slots ([`StatePool::slots_per_buffer`]).
#[derive(Debug, Clone)]
pub struct StatePool {
    states: GpuTensor,
    layout: StateLayout,
}

impl StatePool {
    /// A zeroed f32 pool of `slots` states.
    pub fn zeros(
        ctx: &Context,
        slots: usize,
        heads_v: usize,
        key_dim: usize,
        value_dim: usize,
        layout: StateLayout,
    ) -> Result<Self> {
        Self::zeros_in(ctx, slots, heads_v, key_dim, value_dim, layout, DType::F32)
    }

    /// A zeroed pool of `slots` states stored as `dtype` (one of [`POOL_DTYPES`]).
    pub fn zeros_in(
        ctx: &Context,
        slots: usize,
        heads_v: usize,
        key_dim: usize,
        value_dim: usize,
        layout: StateLayout,
        dtype: DType,
    ) -> Result<Self> {
        if slots == 0 {
            return Err(Error::value("pool", "at least one slot", 0));
        }
        check_pool_dtype("pool", dtype)?;
        let [a, b] = layout.inner_shape(key_dim, value_dim);
        let shape = [slots, heads_v, a, b];
        let slot_bytes = (crate::tensor::element_count("pool", &shape[1..])? * dtype.size()) as u64;
        let per_buffer = slots_per_buffer(ctx, slot_bytes);
        let states =
            GpuTensor::empty_in_rows(ctx, "state pool", &shape, dtype, per_buffer * heads_v)?;
        Ok(StatePool { states, layout })
    }

    /// A zeroed f32 pool of `slots` states shaped and laid out for `problem`.
    pub fn for_problem(ctx: &Context, problem: &Problem, slots: usize) -> Result<Self> {
        Self::for_problem_in(ctx, problem, slots, DType::F32)
    }

    /// A zeroed pool of `slots` states for `problem`, stored as `dtype` (one of
    /// [`POOL_DTYPES`]).
    pub fn for_problem_in(
        ctx: &Context,
        problem: &Problem,
        slots: usize,
        dtype: DType,
    ) -> Result<Self> {
        Self::zeros_in(
            ctx,
            slots,
            problem.heads_v,
            problem.key_dim,
            problem.value_dim,
            StateLayout::of(problem),
            dtype,
        )
    }

    /// A pool over an existing tensor `[P, HV, a, b]` (f32 or bf16) holding states in
    /// `layout`; the pool's dtype is the tensor's.
    pub fn from_tensor(states: GpuTensor, layout: StateLayout) -> Result<Self> {
        if states.shape.len() != 4 || states.shape[0] == 0 {
            return Err(Error::Shape {
                name: "pool".into(),
                expected: format!("{} with P ≥ 1", layout.describe()),
                got: crate::error::ShapeList(states.shape.clone()),
            });
        }
        check_pool_dtype("pool", states.dtype)?;
        states.check_storage("pool")?;
        if let Some(rows) = states.rows_per_buffer()
            && !rows.is_multiple_of(states.shape[1])
        {
            return Err(Error::unsupported(
                "pool",
                format!(
                    "a tensor of several buffers whose buffers hold whole slots ({rows} rows \
                     of {} v-heads per buffer): make the pool with StatePool::zeros and fill \
                     it with write_range",
                    states.shape[1]
                ),
            ));
        }
        Ok(StatePool { states, layout })
    }

    /// The states, `[P, HV, K, V]` (or `[P, HV, V, K]`), in the pool's dtype.
    pub fn tensor(&self) -> &GpuTensor {
        &self.states
    }

    /// The storage dtype of the states (f32 or bf16).
    pub fn dtype(&self) -> DType {
        self.states.dtype
    }

    /// How each slot's state is laid out.
    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// P, the number of slots.
    pub fn slots(&self) -> usize {
        self.states.shape[0]
    }

    /// Bytes of one slot (all v-heads).
    pub fn slot_bytes(&self) -> u64 {
        self.states.bytes() / self.slots() as u64
    }

    /// Slots per buffer: all of them unless the pool is larger than one buffer
    /// ([`Context::max_buffer_bytes`]), when it lives in several buffers of this many whole
    /// slots (the last holding the rest).
    pub fn slots_per_buffer(&self) -> usize {
        self.states
            .rows_per_buffer()
            .map_or(self.slots(), |rows| rows / self.states.shape[1])
    }

    /// Elements of one slot.
    fn slot_elems(&self) -> usize {
        self.states.len() / self.slots()
    }

    /// Check that the pool fits `problem`: same layout, HV, K and V.
    pub fn check_fits(&self, problem: &Problem) -> Result<()> {
        let wanted = StateLayout::of(problem);
        if self.layout != wanted {
            return Err(Error::value(
                "pool",
                format!("a {} pool (the problem's state layout)", wanted.describe()),
                format!("a {} pool", self.layout.describe()),
            ));
        }
        let [a, b] = wanted.inner_shape(problem.key_dim, problem.value_dim);
        let expected = [self.slots(), problem.heads_v, a, b];
        if self.states.shape() != expected {
            return Err(Error::shape("pool", &expected, self.states.shape()));
        }
        Ok(())
    }

    /// Record a copy of entry `entry` of `states` (e.g. a prefill's `final_state`, shaped
    /// `[N, HV, ..]` in the pool's layout and dtype) into pool slot `slot`. A byte copy: the
    /// dtypes must match (an f32 state into a bf16 pool is an `Error::DType`).
    pub fn copy_into_slot(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        states: &GpuTensor,
        entry: usize,
        slot: usize,
    ) -> Result<()> {
        self.check_entry("states", states, entry, slot)?;
        let n = self.slot_elems();
        copy_elements(
            encoder,
            "states",
            (states, entry * n),
            (&self.states, slot * n),
            n,
        )
    }

    /// Record a copy of pool slot `slot` into entry `entry` of `states` (e.g. to download it,
    /// or as the `initial_state` of a chunked forward), a tensor of the pool's dtype.
    pub fn copy_from_slot(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        slot: usize,
        states: &GpuTensor,
        entry: usize,
    ) -> Result<()> {
        self.check_entry("states", states, entry, slot)?;
        let n = self.slot_elems();
        copy_elements(
            encoder,
            "states",
            (&self.states, slot * n),
            (states, entry * n),
            n,
        )
    }

    fn check_entry(&self, name: &str, states: &GpuTensor, entry: usize, slot: usize) -> Result<()> {
        let inner = &self.states.shape[1..];
        if states.shares_buffer_with(&self.states) {
            // A buffer copy onto itself is refused by wgpu at submit.
            return Err(Error::value(
                name,
                "a tensor other than the pool itself (copy through a separate tensor)",
                "the pool's own buffer",
            ));
        }
        if states.dtype != self.dtype() {
            return Err(Error::DType {
                name: name.into(),
                expected: format!("{} (the pool's dtype)", self.dtype()),
                got: states.dtype.to_string(),
            });
        }
        if states.shape.len() != 4 || &states.shape[1..] != inner {
            let expected = format!(
                "[N, {}, {}, {}] (the pool's layout)",
                inner[0], inner[1], inner[2]
            );
            return Err(Error::Shape {
                name: name.into(),
                expected,
                got: crate::error::ShapeList(states.shape.clone()),
            });
        }
        if entry >= states.shape[0] {
            return Err(Error::value(
                name,
                format!("an entry in 0..{}", states.shape[0]),
                entry,
            ));
        }
        if slot >= self.slots() {
            return Err(Error::value(
                "slot",
                format!("a pool slot in 0..{}", self.slots()),
                slot,
            ));
        }
        Ok(())
    }
}
