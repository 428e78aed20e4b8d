//! The one place the `gdn` tool chooses a backend (`--backend`) for `gdn run` and `gdn bench`.
//! Everything else reaches it through [`gdn_wgpu::Backend`]; only GPU timing (timestamps,
//! workspaces, decode plans) asks for the wgpu [`Context`] itself. A new backend (e.g. CUDA
//! behind a cargo feature) is one [`BackendKind`] value, one [`Engine`] variant and one arm
//! in [`Engine::open`] and [`Engine::backend`].

use clap::ValueEnum;
use gdn_wgpu::wgpu_backend::{self, Context};
use gdn_wgpu::{Backend, Error, Oracle, Result};

/// What `--backend` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// wgpu when a GPU context can be created, else cpu
    Auto,
    /// The WGSL kernels through wgpu
    Wgpu,
    /// The f64 oracle (slow; for checking)
    Cpu,
    /// The CUDA kernels (NVIDIA; built with the `cuda` feature)
    #[cfg(feature = "cuda")]
    Cuda,
}

/// An opened backend.
pub enum Engine {
    /// The wgpu kernels on one device.
    Wgpu(Box<Context>),
    /// The f64 oracle.
    Cpu(Oracle),
    /// The CUDA kernels on one device.
    #[cfg(feature = "cuda")]
    Cuda(Box<gdn_wgpu::cuda_backend::Context>),
}

impl Engine {
    /// Open `kind`. `adapter` picks the first wgpu adapter whose name contains it
    /// (case-insensitive); `None` takes the best one. With `Auto`, failing to open a GPU is a
    /// note on stderr and the oracle runs instead.
    pub fn open(kind: BackendKind, adapter: Option<&str>) -> Result<Engine> {
        match kind {
            BackendKind::Cpu => Ok(Engine::Cpu(Oracle)),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                gdn_wgpu::cuda_backend::Context::new().map(|ctx| Engine::Cuda(Box::new(ctx)))
            }
            BackendKind::Wgpu => open_wgpu(adapter).map(|ctx| Engine::Wgpu(Box::new(ctx))),
            BackendKind::Auto => Ok(match open_wgpu(adapter) {
                Ok(ctx) => Engine::Wgpu(Box::new(ctx)),
                Err(e) => {
                    eprintln!("note: no usable GPU ({e}); using the cpu backend (f64 oracle)");
                    Engine::Cpu(Oracle)
                }
            }),
        }
    }

    /// The backend behind the common interface.
    pub fn backend(&self) -> &dyn Backend {
        match self {
            Engine::Wgpu(ctx) => &**ctx,
            Engine::Cpu(oracle) => oracle,
            #[cfg(feature = "cuda")]
            Engine::Cuda(ctx) => &**ctx,
        }
    }

    /// The wgpu context, for what only wgpu offers (GPU timing, forced kernel variants).
    pub fn wgpu(&self) -> Option<&Context> {
        match self {
            Engine::Wgpu(ctx) => Some(ctx),
            _ => None,
        }
    }

    /// [`Engine::wgpu`], mutable (forcing a compute path or a V-block).
    pub fn wgpu_mut(&mut self) -> Option<&mut Context> {
        match self {
            Engine::Wgpu(ctx) => Some(ctx),
            _ => None,
        }
    }
}

/// A wgpu context on the first adapter whose name contains `filter`, or the best adapter.
fn open_wgpu(filter: Option<&str>) -> Result<Context> {
    let Some(f) = filter else {
        return Context::new_blocking();
    };
    let wanted = f.to_lowercase();
    let adapter = pollster::block_on(wgpu_backend::list_adapters())
        .into_iter()
        .find(|a| a.get_info().name.to_lowercase().contains(&wanted))
        .ok_or_else(|| Error::Value {
            name: "--adapter".into(),
            expected: "a substring of an adapter's name (see `gdn info`)".into(),
            got: f.into(),
        })?;
    pollster::block_on(Context::from_adapter(adapter))
}
