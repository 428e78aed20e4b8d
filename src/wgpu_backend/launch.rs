//! The one way a launcher records a pass: look up the pipeline, bind its buffers, check the
//! grid against the device's limits, dispatch into the caller's encoder. Launchers describe a
//! pass with a [`Launch`] and own its tiling (constants and grid); nothing here chooses tiles.

use crate::error::{Error, Result};
use crate::wgpu_backend::shaders::ShaderSource;
use crate::wgpu_backend::{Context, GpuTensor};

/// Something a pass binds: a whole buffer (uniform blocks, tables, scratch) or a tensor, which
/// may be a view of part of a larger buffer (a window).
pub(crate) trait Bind {
    fn resource(&self) -> wgpu::BindingResource<'_>;
    /// Bytes bound, and whether it is a storage binding (checked against the binding limit).
    fn bound(&self) -> (u64, bool);
}

impl Bind for wgpu::Buffer {
    fn resource(&self) -> wgpu::BindingResource<'_> {
        self.as_entire_binding()
    }
    fn bound(&self) -> (u64, bool) {
        (
            self.size(),
            self.usage().contains(wgpu::BufferUsages::STORAGE),
        )
    }
}

impl Bind for GpuTensor {
    fn resource(&self) -> wgpu::BindingResource<'_> {
        self.binding()
    }
    fn bound(&self) -> (u64, bool) {
        (self.binding_bytes(), true)
    }
}

/// The buffers of a pass, at group 0.
#[derive(Clone, Copy)]
pub(crate) enum Bindings<'a> {
    /// At bindings 0, 1, 2, … in order.
    Ordered(&'a [&'a dyn Bind]),
    /// At the given bindings (an entry point that uses some of its module's bindings).
    At(&'a [(u32, &'a dyn Bind)]),
}

/// Workgroups along x, y, z, each with what it counts (named in a limit error). Counts stay
/// `usize` until checked, so a count past `u32` is an error rather than a wrapped grid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid(pub [(usize, &'static str); 3]);

impl Grid {
    /// `groups` workgroups of a 1-D pass, folded into y past 65535 (WebGPU's least
    /// per-dimension limit; shaders recover the index with `flat_index`).
    pub fn folded(groups: usize, what: &'static str) -> Self {
        let groups = groups.max(1);
        if groups <= 65535 {
            Grid([(groups, what), (1, ""), (1, "")])
        } else {
            Grid([(65535, what), (groups.div_ceil(65535), what), (1, "")])
        }
    }

    /// Workgroups for `items` invocations of a 64-wide 1-D pass (see [`Grid::folded`]).
    pub fn items_64(items: usize, what: &'static str) -> Self {
        Self::folded(items.div_ceil(64), what)
    }
}

/// One pass: its shader source (for a storage dtype), entry point, override constants,
/// buffers and grid. `name` labels the bind group and compute pass and names the pass in
/// errors.
pub(crate) struct Launch<'a> {
    pub name: &'static str,
    pub source: &'static ShaderSource,
    pub entry: &'static str,
    pub constants: &'a [(&'static str, f64)],
    pub bindings: Bindings<'a>,
    pub grid: Grid,
}

/// A pass ready to record any number of times (the decode hot path records one per step).
#[derive(Debug)]
pub(crate) struct Prepared {
    name: &'static str,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
}

impl Launch<'_> {
    /// Check the grid and the bindings' sizes (before compiling anything), then the cached
    /// pipeline and a bind group.
    pub fn prepare(&self, ctx: &Context) -> Result<Prepared> {
        let grid = checked_grid(ctx, self.name, &self.grid)?;
        let bound: Vec<(u32, &dyn Bind)> = match self.bindings {
            Bindings::Ordered(buffers) => buffers
                .iter()
                .enumerate()
                .map(|(i, &b)| (i as u32, b))
                .collect(),
            Bindings::At(buffers) => buffers.to_vec(),
        };
        check_bindings(ctx, self.name, &bound)?;
        let pipeline = ctx
            .pipelines
            .get(ctx, self.source, self.entry, self.constants)?;
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry> = bound
            .iter()
            .map(|&(binding, b)| wgpu::BindGroupEntry {
                binding,
                resource: b.resource(),
            })
            .collect();
        // A binding the device refuses (e.g. a buffer that failed to allocate) fails here,
        // before anything is recorded into the caller's encoder.
        let bind_group = ctx.scoped(self.name, None, || {
            ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(self.name),
                layout: &layout,
                entries: &entries,
            })
        })?;
        Ok(Prepared {
            name: self.name,
            pipeline,
            bind_group,
            grid,
        })
    }

    /// [`Launch::prepare`] and record one dispatch into `encoder`.
    pub fn record(&self, ctx: &Context, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        self.prepare(ctx)?.record(encoder);
        Ok(())
    }
}

impl Prepared {
    /// Record one dispatch as its own compute pass. Timestamps stay outside it: callers mark
    /// spans between passes with `GpuTimer::mark` on the encoder.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(self.name),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.grid;
        pass.dispatch_workgroups(x, y, z);
    }
}

/// `Error::TooLarge` naming the pass and binding when a storage binding exceeds the
/// context's binding limit ([`Context::max_binding_bytes`]: the device's, or a lower
/// `GDN_MAX_BINDING_BYTES`). Passes over tensors larger than a binding bind windows of them;
/// this is where a pass that does not would be caught, before wgpu's validation.
fn check_bindings(ctx: &Context, pass: &str, bound: &[(u32, &dyn Bind)]) -> Result<()> {
    let limit = ctx.max_binding_bytes();
    for &(binding, b) in bound {
        let (bytes, storage) = b.bound();
        if storage && bytes > limit {
            return Err(Error::TooLarge {
                name: format!("{pass} binding {binding}"),
                bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit,
            });
        }
    }
    Ok(())
}

/// The grid as u32s, or `Error::TooLarge` naming the pass and the first dimension past the
/// device's `max_compute_workgroups_per_dimension`.
fn checked_grid(ctx: &Context, pass: &str, grid: &Grid) -> Result<[u32; 3]> {
    let limit = ctx.limits().max_compute_workgroups_per_dimension;
    let mut out = [0u32; 3];
    for ((slot, &(count, what)), axis) in out.iter_mut().zip(&grid.0).zip(["x", "y", "z"]) {
        match u32::try_from(count) {
            Ok(c) if c <= limit => *slot = c,
            _ => {
                return Err(Error::TooLarge {
                    name: format!("{pass} grid {axis} ({what})"),
                    bytes: count as u64,
                    limit_name: "max_compute_workgroups_per_dimension",
                    limit: limit as u64,
                });
            }
        }
    }
    Ok(out)
}
