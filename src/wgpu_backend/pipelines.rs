//! Compute pipelines, cached by (shader source, entry point, override constants): everything
//! that changes the compiled code is in the key.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Result;
use crate::wgpu_backend::Context;
use crate::wgpu_backend::config::ShaderChecks;
use crate::wgpu_backend::shaders::ShaderSource;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    source_hash: u64,
    source_len: usize,
    entry: &'static str,
    /// Override constants as (name, f64 bits), sorted by name.
    constants: Vec<(&'static str, u64)>,
}

pub(crate) struct PipelineCache {
    device: wgpu::Device,
    checks: ShaderChecks,
    pipelines: Mutex<HashMap<Key, wgpu::ComputePipeline>>,
}

/// Passes compiled with wgpu's loop-bounding counters at the default setting
/// (`ShaderChecks::None`), because NVIDIA's Vulkan driver compiled them into faster code:
/// the decode kernel ran 6–7 % faster on the H200 at B = 64 and 256 with them, while the
/// same counters written into the WGSL by hand did nothing (BENCHMARKS.md, 2026-12-02).
const LOOP_BOUNDED_PASSES: &[&str] = &["decode/recurrent_step.wgsl"];

/// What wgpu injects at each setting (`ShaderChecks` says why the default is none) into the
/// pass `name`.
impl ShaderChecks {
    fn runtime_checks(self, name: &str) -> wgpu::ShaderRuntimeChecks {
        let mut c = wgpu::ShaderRuntimeChecks::checked();
        match self {
            ShaderChecks::All => {}
            ShaderChecks::NoLoopBounding => c.force_loop_bounding = false,
            ShaderChecks::None => {
                c = wgpu::ShaderRuntimeChecks::unchecked();
                c.force_loop_bounding = LOOP_BOUNDED_PASSES.contains(&name);
            }
        }
        c
    }
}

impl PipelineCache {
    pub fn new(device: wgpu::Device, checks: ShaderChecks) -> Self {
        PipelineCache {
            device,
            checks,
            pipelines: Mutex::default(),
        }
    }

    /// The pipeline for `entry` of `source` specialized with `constants`, compiled on first use.
    /// A pipeline the device refuses (validation, out of memory) is a typed error and is not
    /// cached, so a later call tries again.
    pub fn get(
        &self,
        ctx: &Context,
        source: &ShaderSource,
        entry: &'static str,
        constants: &[(&'static str, f64)],
    ) -> Result<wgpu::ComputePipeline> {
        let mut sorted: Vec<(&'static str, u64)> =
            constants.iter().map(|&(n, v)| (n, v.to_bits())).collect();
        sorted.sort_unstable();
        let key = Key {
            source_hash: source.hash,
            source_len: source.text.len(),
            entry,
            constants: sorted,
        };
        let mut map = self.pipelines.lock().unwrap();
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        log::debug!(
            "gdn-wgpu: compiling {}::{entry} with {constants:?}",
            source.name
        );
        let pipeline = ctx.scoped(source.name, None, || self.compile(source, entry, constants))?;
        map.insert(key, pipeline.clone());
        Ok(pipeline)
    }

    fn compile(
        &self,
        source: &ShaderSource,
        entry: &'static str,
        constants: &[(&'static str, f64)],
    ) -> wgpu::ComputePipeline {
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(source.name),
            source: wgpu::ShaderSource::Wgsl(source.text.as_str().into()),
        };
        let module = match self.checks {
            ShaderChecks::All => self.device.create_shader_module(desc),
            // SAFETY: only this crate's shaders come here; see `ShaderChecks` for why they
            // need none of wgpu's injected checks (bounded loops, clamped or masked indices),
            // and the oracle tests run every kernel with them off.
            other => unsafe {
                self.device
                    .create_shader_module_trusted(desc, other.runtime_checks(source.name))
            },
        };
        self.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    // Kernels initialize what they read; zeroing costs time on every dispatch.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
    }

    /// Number of compiled pipelines (for tests and `gdn info`).
    pub fn len(&self) -> usize {
        self.pipelines.lock().unwrap().len()
    }
}
