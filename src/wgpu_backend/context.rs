//! The wgpu context: adapter choice, device, queue, error capture and per-device tuning.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::problem::Problem;
use crate::tensor::DType;
use crate::wgpu_backend::config::{self, Config};
use crate::wgpu_backend::path::{ComputePath, ForwardAlgorithm, PathChoice, PathSupport};
use crate::wgpu_backend::pipelines::PipelineCache;
use crate::wgpu_backend::tuning::Tuning;

/// A device and queue plus everything the launchers need: capabilities, tile choices and the
/// pipeline cache. Cheap to share by reference; create one per device.
pub struct Context {
    /// The device every buffer and pipeline of this context is created on.
    pub device: wgpu::Device,
    /// The device's queue, which the context's blocking helpers submit to.
    pub queue: wgpu::Queue,
    /// Adapter description, when known (not for a caller-supplied device without it).
    pub adapter_info: Option<wgpu::AdapterInfo>,
    pub(crate) tuning: Tuning,
    pub(crate) pipelines: PipelineCache,
    config: Config,
    path_support: PathSupport,
    forced_path: Option<ComputePath>,
    binding_limit: Option<u64>,
    buffer_limit: Option<u64>,
    forced_algorithm: Option<ForwardAlgorithm>,
    errors: Arc<Mutex<Vec<DeviceError>>>,
    lost: Arc<Mutex<Option<String>>>,
}

/// A device error that reached the context's uncaptured-error handler (outside any of the
/// library's error scopes), kept until [`Context::check`] reports it.
#[derive(Debug)]
enum DeviceError {
    OutOfMemory(String),
    Other(String),
}

impl DeviceError {
    fn from_wgpu(e: &wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => DeviceError::OutOfMemory(e.to_string()),
            _ => DeviceError::Other(e.to_string()),
        }
    }
}

/// The typed error for a device error caught while making or recording `name`.
#[cfg(not(target_arch = "wasm32"))]
fn typed(name: &str, bytes: Option<u64>, e: wgpu::Error) -> Error {
    match e {
        wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory {
            name: name.into(),
            bytes,
            msg: e.to_string(),
        },
        wgpu::Error::Validation { description, .. } | wgpu::Error::Internal { description, .. } => {
            Error::Gpu(format!("{name}: {description}"))
        }
    }
}

/// Features the library uses when the adapter has them: timestamps feed `gdn bench`,
/// SHADER_F16 enables f16 storage, SUBGROUP the subgroup decode kernel, cooperative matrices
/// the coop compute path.
fn wanted_features(adapter: wgpu::Features) -> wgpu::Features {
    adapter
        & (wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
}

/// Ranks adapters: real GPUs before virtual/CPU ones, and Vulkan/Metal/DX12 before GL (GL on
/// the same hardware lacks features and compiles slowly).
fn adapter_rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan
        | wgpu::Backend::Metal
        | wgpu::Backend::Dx12
        | wgpu::Backend::BrowserWebGpu => 0,
        _ => 1,
    };
    (backend, ty)
}

/// Every adapter the instance can see, best first. `GDN_ADAPTER=substring` keeps only adapters
/// whose name contains it (case-insensitive).
pub async fn list_adapters() -> Vec<wgpu::Adapter> {
    list_adapters_matching(&config::adapter_filter_from_env()).await
}

/// Every adapter the instance can see that passes `config`'s adapter filter, best first.
pub async fn list_adapters_matching(config: &Config) -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    // GL only when no Vulkan/Metal/DX12 adapter exists: on the same hardware it lacks
    // features, compiles slowly, and its EGL probing prints noise on headless machines.
    #[cfg(not(target_arch = "wasm32"))]
    let mut adapters = match instance.enumerate_adapters(wgpu::Backends::PRIMARY).await {
        primary if !primary.is_empty() => primary,
        _ => instance.enumerate_adapters(wgpu::Backends::all()).await,
    };
    #[cfg(target_arch = "wasm32")]
    let mut adapters: Vec<wgpu::Adapter> = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        })
        .await
        .into_iter()
        .collect();
    adapters.retain(|a| config.adapter_matches(&a.get_info().name));
    adapters.sort_by_key(|a| adapter_rank(&a.get_info()));
    adapters
}

impl Context {
    /// A context on the best adapter (see [`list_adapters`]), requesting the adapter's limits
    /// and the features the library uses, configured from the environment
    /// ([`Config::from_env`], read once here).
    pub async fn new() -> Result<Self> {
        Self::with_config(Config::from_env()?).await
    }

    /// [`Context::new`] with the caller's configuration; the environment is not read.
    pub async fn with_config(config: Config) -> Result<Self> {
        let adapter = list_adapters_matching(&config)
            .await
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::NoAdapter(match &config.adapter {
                    Some(f) => format!("no adapter's name contains {f:?} (GDN_ADAPTER)"),
                    None => {
                        "wgpu found no adapter (is a Vulkan/Metal/DX12 driver installed?)".into()
                    }
                })
            })?;
        let limits = adapter.limits();
        Self::from_adapter_with_config(adapter, limits, config).await
    }

    /// [`Context::new`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<Self> {
        pollster::block_on(Self::new())
    }

    /// [`Context::with_config`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_config_blocking(config: Config) -> Result<Self> {
        pollster::block_on(Self::with_config(config))
    }

    /// A context on a given adapter, requesting the adapter's limits (configured from the
    /// environment).
    pub async fn from_adapter(adapter: wgpu::Adapter) -> Result<Self> {
        // The defaults (16 KiB workgroup memory, 128 MiB bindings) are far below what
        // desktop GPUs offer; the tile choice adapts to whatever is granted.
        let limits = adapter.limits();
        Self::from_adapter_with_limits(adapter, limits).await
    }

    /// A context on a given adapter with the limits the caller asks for, e.g.
    /// `wgpu::Limits::default()` (WebGPU's defaults, which every implementation grants): the
    /// kernels pick their tiles from what the device ends up with. Configured from the
    /// environment.
    pub async fn from_adapter_with_limits(
        adapter: wgpu::Adapter,
        limits: wgpu::Limits,
    ) -> Result<Self> {
        Self::from_adapter_with_config(adapter, limits, Config::from_env()?).await
    }

    /// [`Context::from_adapter_with_limits`] with the caller's configuration (its adapter
    /// filter does not apply: the adapter is given).
    pub async fn from_adapter_with_config(
        adapter: wgpu::Adapter,
        limits: wgpu::Limits,
        config: Config,
    ) -> Result<Self> {
        let info = adapter.get_info();
        let features = wanted_features(adapter.features());
        let desc = wgpu::DeviceDescriptor {
            label: Some("gdn-wgpu"),
            required_features: features,
            required_limits: limits,
            // SAFETY: the only experimental feature requested is cooperative matrices, used
            // solely by the coop compute path, whose kernels are checked against the f64 oracle
            // on the adapters that report it (tests/forward.rs, GDN_REQUIRE_COOP=1).
            experimental_features: if features
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        };
        let (device, queue) = adapter
            .request_device(&desc)
            .await
            .map_err(|e| Error::RequestDevice(e.to_string()))?;
        log::debug!("gdn-wgpu: using adapter {} ({:?})", info.name, info.backend);
        let coop = adapter.cooperative_matrix_properties();
        let mut ctx = Self::build(device, queue, Some(info), config)?;
        ctx.path_support = PathSupport::detect(
            ctx.features(),
            &coop,
            ctx.adapter_info.as_ref(),
            ctx.limits().max_compute_workgroup_storage_size,
        );
        // Errors on a device we own go to the context, never to wgpu's default panic handler.
        let errors = ctx.errors.clone();
        ctx.device
            .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                log::debug!("gdn-wgpu: device error: {e}");
                errors.lock().unwrap().push(DeviceError::from_wgpu(&e));
            }));
        let lost = ctx.lost.clone();
        ctx.device.set_device_lost_callback(move |reason, msg| {
            log::debug!("gdn-wgpu: device lost ({reason:?}): {msg}");
            lost.lock()
                .unwrap()
                .get_or_insert(format!("{reason:?}: {msg}"));
        });
        Ok(ctx)
    }

    /// A context on the caller's own device and queue. The library uses whatever features and
    /// limits the device was created with. Errors of the library's own calls are still typed
    /// (they are caught in error scopes); other device errors keep going to the caller's
    /// handler, and so does device loss: wgpu has one device-lost callback, which stays the
    /// caller's, so call [`Context::notify_device_lost`] from it for the context to report the
    /// loss. The coop compute path needs the adapter's cooperative-matrix list, which a device
    /// does not carry: such a context runs the scalar path. Configured from the environment.
    pub fn from_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter_info: Option<wgpu::AdapterInfo>,
    ) -> Result<Self> {
        Self::build(device, queue, adapter_info, Config::from_env()?)
    }

    /// [`Context::from_device`] with the caller's configuration.
    pub fn from_device_with_config(
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter_info: Option<wgpu::AdapterInfo>,
        config: Config,
    ) -> Result<Self> {
        Self::build(device, queue, adapter_info, config)
    }

    fn build(
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter_info: Option<wgpu::AdapterInfo>,
        config: Config,
    ) -> Result<Self> {
        let mut tuning = Tuning::for_device(&device.limits())?;
        if let Some(bv) = config.v_block {
            // A forced width the forward scan cannot fit would be ignored: refuse it instead.
            if !tuning.v_blocks.contains(&bv) {
                return Err(Error::value(
                    "GDN_V_BLOCK",
                    format!(
                        "a V-block width that fits this device's {} bytes of workgroup memory \
                         (one of {:?})",
                        tuning.workgroup_bytes, tuning.v_blocks
                    ),
                    bv,
                ));
            }
            tuning.forced_v_block = Some(bv);
        }
        if let Some(grads) = config.coop_grads {
            tuning.coop_grads = grads;
        }
        let pipelines = PipelineCache::new(device.clone(), config.shader_checks);
        let forced_path = config.compute_path;
        let binding_limit = config.max_binding_bytes;
        let buffer_limit = config.max_buffer_bytes;
        let forced_algorithm = config.forward_algorithm;
        let path_support = PathSupport::detect(
            device.features(),
            &[],
            adapter_info.as_ref(),
            device.limits().max_compute_workgroup_storage_size,
        );
        Ok(Context {
            device,
            queue,
            adapter_info,
            tuning,
            pipelines,
            config,
            path_support,
            forced_path,
            binding_limit,
            buffer_limit,
            forced_algorithm,
            errors: Arc::default(),
            lost: Arc::default(),
        })
    }

    /// The features the device was created with.
    pub fn features(&self) -> wgpu::Features {
        self.device.features()
    }

    /// The limits the device was created with; launches check grids and buffers against them.
    pub fn limits(&self) -> wgpu::Limits {
        self.device.limits()
    }

    /// The largest storage binding the library makes on this context: the device's
    /// `max_storage_buffer_binding_size`, or `GDN_MAX_BINDING_BYTES` when that is lower, and
    /// never more than [`Context::max_buffer_bytes`]. Tensors and scratch larger than this are
    /// processed in windows (docs/windows.md).
    pub fn max_binding_bytes(&self) -> u64 {
        let device = self.limits().max_storage_buffer_binding_size;
        self.binding_limit
            .map_or(device, |b| b.min(device))
            .min(self.max_buffer_bytes())
    }

    /// The largest buffer the library creates for one tensor: the device's `max_buffer_size`,
    /// or `GDN_MAX_BUFFER_BYTES` when that is lower. Larger tensors are stored in several
    /// buffers of whole rows (docs/windows.md).
    pub fn max_buffer_bytes(&self) -> u64 {
        let device = self.limits().max_buffer_size;
        self.buffer_limit.map_or(device, |b| b.min(device))
    }

    /// Lower the largest buffer the library creates for one tensor (`None`: the device's), as
    /// `GDN_MAX_BUFFER_BYTES` does; it also caps [`Context::max_binding_bytes`]. Tensors made
    /// afterwards larger than this are split into several buffers. A value below
    /// [`config::MIN_BINDING_BYTES`] or not a multiple of 4 is an `Error::Value`.
    pub fn set_max_buffer_bytes(&mut self, bytes: Option<u64>) -> Result<()> {
        if let Some(b) = bytes
            && (b < config::MIN_BINDING_BYTES || b % 4 != 0)
        {
            return Err(Error::value(
                "max_buffer_bytes",
                format!("a multiple of 4, at least {}", config::MIN_BINDING_BYTES),
                b,
            ));
        }
        self.buffer_limit = bytes;
        Ok(())
    }

    /// Lower the largest storage binding the library makes (`None`: the device's), as
    /// `GDN_MAX_BINDING_BYTES` does: forwards and decode plans made afterwards run in smaller
    /// windows, with less scratch. A value below [`config::MIN_BINDING_BYTES`] or not a
    /// multiple of 4 is an `Error::Value`.
    pub fn set_max_binding_bytes(&mut self, bytes: Option<u64>) -> Result<()> {
        if let Some(b) = bytes
            && (b < config::MIN_BINDING_BYTES || b % 4 != 0)
        {
            return Err(Error::value(
                "max_binding_bytes",
                format!("a multiple of 4, at least {}", config::MIN_BINDING_BYTES),
                b,
            ));
        }
        self.binding_limit = bytes;
        Ok(())
    }

    /// Set the memory budget backward plans made afterwards use when none is given in the
    /// call (`None`: [`MemoryBudget::DEFAULT`]), as `GDN_BACKWARD_BUDGET` does.
    ///
    /// [`MemoryBudget::DEFAULT`]: crate::wgpu_backend::backward::MemoryBudget::DEFAULT
    pub fn set_backward_budget(
        &mut self,
        budget: Option<crate::wgpu_backend::backward::MemoryBudget>,
    ) {
        self.config.backward_budget = budget;
    }

    /// Force the backward's compute path (`None`: the forward's, see
    /// [`backward_path`](crate::wgpu_backend::backward::backward_path)), as `GDN_BACKWARD_PATH`
    /// does. The backward has scalar and coop passes only; f16 math, or coop where the adapter
    /// has no cooperative matrices, is `Error::Unsupported`.
    pub fn set_backward_path(&mut self, path: Option<ComputePath>) -> Result<()> {
        match path {
            Some(ComputePath::F16Math) => {
                return Err(Error::unsupported(
                    "backward compute path",
                    "forcing f16 (the backward has scalar and coop passes only)",
                ));
            }
            Some(ComputePath::CoopMatrix) if !self.path_support.coop_f16 => {
                return Err(Error::unsupported(
                    "backward compute path",
                    format!("forcing coop when {}", self.path_support.coop_missing),
                ));
            }
            _ => {}
        }
        self.config.backward_path = path;
        Ok(())
    }

    /// Set the gate-driven window of sequence parallelism that forwards and workspaces made
    /// afterwards take (`None`: exact only, the default), as `GDN_SEGMENT_WINDOW` and
    /// `GDN_SEGMENT_WARMUP` do (docs/sequence-parallelism.md).
    pub fn set_segment_window(&mut self, window: Option<crate::wgpu_backend::SegmentWindow>) {
        self.config.segment_window = window;
    }

    /// The configuration the context was made with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The tile sizes and variants this context's launchers use.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// Storage dtypes the forward takes on this device: f32 and bf16 everywhere, f16 where the
    /// device has SHADER_F16.
    pub fn forward_storage_dtypes(&self) -> Vec<crate::DType> {
        let f16 = self.features().contains(wgpu::Features::SHADER_F16);
        crate::wgpu_backend::shaders::FORWARD_STORAGE_DTYPES
            .into_iter()
            .filter(|&d| d != crate::DType::F16 || f16)
            .collect()
    }

    /// What the device offers for each compute path.
    pub fn path_support(&self) -> PathSupport {
        self.path_support
    }

    /// The forced compute path, if any (from `GDN_COMPUTE_PATH` or [`Self::set_compute_path`]).
    pub fn forced_compute_path(&self) -> Option<ComputePath> {
        self.forced_path
    }

    /// Force a compute path for the forward (`None`: automatic). A forced path the device or
    /// a problem cannot run makes that forward fail with `Error::Unsupported`.
    pub fn set_compute_path(&mut self, path: Option<ComputePath>) -> Result<()> {
        if path == Some(ComputePath::CoopMatrix) && !self.path_support.coop_f16 {
            return Err(Error::unsupported(
                "compute path",
                format!("forcing coop when {}", self.path_support.coop_missing),
            ));
        }
        if path == Some(ComputePath::F16Math) && !self.path_support.f16_math {
            return Err(Error::unsupported(
                "compute path",
                format!("forcing f16 when {}", self.path_support.f16_missing),
            ));
        }
        self.forced_path = path;
        Ok(())
    }

    /// The forced forward algorithm, if any (from `GDN_FORWARD_ALGORITHM` or
    /// [`Self::set_forward_algorithm`]).
    pub fn forced_forward_algorithm(&self) -> Option<ForwardAlgorithm> {
        self.forced_algorithm
    }

    /// Force the forward's algorithm (`None`: automatic, see
    /// [`forward_algorithm`](crate::wgpu_backend::forward_algorithm)). Forcing the recurrent
    /// kernel on a problem it cannot run makes that forward fail with `Error::Unsupported`.
    pub fn set_forward_algorithm(&mut self, algorithm: Option<ForwardAlgorithm>) {
        self.forced_algorithm = algorithm;
    }

    /// The compute path the chunked forward takes for `problem` with storage `dtype`, and why
    /// (the recurrent algorithm has one arithmetic, f32; see
    /// [`forward_algorithm`](crate::wgpu_backend::forward_algorithm)).
    pub fn forward_path(&self, problem: &Problem, dtype: DType) -> Result<PathChoice> {
        self.path_support.choose(problem, dtype, self.forced_path)
    }

    /// Pipelines compiled so far (cached by source, entry point and constants).
    pub fn compiled_pipelines(&self) -> usize {
        self.pipelines.len()
    }

    /// Change tile choices (e.g. force a V-block width to test or benchmark each variant).
    pub fn tuning_mut(&mut self) -> &mut Tuning {
        &mut self.tuning
    }

    /// Reports device loss (as [`Error::DeviceLost`]), then (and clears) device errors that
    /// reached the context's handler since the last check: errors outside the library's own
    /// calls, such as a caller's invalid command buffer. Polls the device without blocking
    /// first, so that a pending loss is noticed.
    pub fn check(&self) -> Result<()> {
        self.check_lost()?;
        let mut errors = self.errors.lock().unwrap();
        if errors.is_empty() {
            return Ok(());
        }
        let oom = errors
            .iter()
            .any(|e| matches!(e, DeviceError::OutOfMemory(_)));
        let all: Vec<&str> = errors
            .iter()
            .map(|e| match e {
                DeviceError::OutOfMemory(m) | DeviceError::Other(m) => m.as_str(),
            })
            .collect();
        let all = all.join("; ");
        errors.clear();
        Err(if oom {
            Error::OutOfMemory {
                name: "device".into(),
                bytes: None,
                msg: all,
            }
        } else {
            Error::Gpu(all)
        })
    }

    /// True once the device is lost: destroyed ([`wgpu::Device::destroy`]), reset by the
    /// driver, or given up by wgpu after an unrecoverable error. A lost context stays lost
    /// and every entry point then returns [`Error::DeviceLost`]; make a new `Context` (its
    /// buffers, the state pool among them, went with the old device). Polls the device
    /// without blocking first, so that a pending loss is noticed.
    pub fn is_lost(&self) -> bool {
        self.check_lost().is_err()
    }

    /// `Err(Error::DeviceLost)` once the device is lost (see [`Context::is_lost`]); leaves
    /// other device errors for [`Context::check`].
    pub fn check_lost(&self) -> Result<()> {
        // wgpu reports a destroyed device's loss from its next poll; a poll error is itself
        // a loss or reported by `poll` below.
        #[cfg(not(target_arch = "wasm32"))]
        self.poll(wgpu::PollType::Poll)?;
        self.check_lost_noticed()
    }

    /// `Err(Error::DeviceLost)` if a loss has been noticed, without polling (a poll measured
    /// 14 µs on lavapipe): for the steps inside a call, whose entry point polled already.
    pub(crate) fn check_lost_noticed(&self) -> Result<()> {
        match self.lost.lock().unwrap().clone() {
            Some(msg) => Err(Error::DeviceLost(msg)),
            None => Ok(()),
        }
    }

    /// Record that the device is lost, for a context on the caller's device
    /// ([`Context::from_device`]): call it from your device-lost callback. From then on the
    /// context reports [`Error::DeviceLost`]. The first message is kept.
    pub fn notify_device_lost(&self, message: impl Into<String>) {
        self.lost.lock().unwrap().get_or_insert(message.into());
    }

    /// `device.poll`, with every failure typed. On a device the driver lost, wgpu's poll
    /// panics (it fires the device-lost callback first, and its state is consistent: the
    /// panic is raised after the poll returned, outside wgpu's locks), so the panic is caught
    /// and becomes [`Error::DeviceLost`].
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn poll(&self, poll_type: wgpu::PollType) -> Result<()> {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        match catch_unwind(AssertUnwindSafe(|| self.device.poll(poll_type))) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.lost_or(Error::Gpu(e.to_string()))),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "wgpu panicked while polling the device".into());
                self.notify_device_lost(msg);
                Err(self.lost_or(Error::Gpu("device poll failed".into())))
            }
        }
    }

    /// [`Error::DeviceLost`] if the device is lost, else `other`: a failed map or poll on a
    /// lost device is the loss, not a separate error.
    pub(crate) fn lost_or(&self, other: Error) -> Error {
        match self.lost.lock().unwrap().clone() {
            Some(msg) => Error::DeviceLost(msg),
            None => other,
        }
    }

    /// Run `make` (buffer, pipeline or bind-group creation, recording) with this thread's
    /// device errors caught in error scopes, and return what it made or the first error,
    /// typed: [`Error::OutOfMemory`] naming `name` (and `bytes`, for one allocation),
    /// [`Error::Gpu`] for validation and internal errors, [`Error::DeviceLost`] when a loss
    /// has been noticed (wgpu drops errors of a lost device, so loss is checked after; without
    /// a poll, which entry points do once at their start). The
    /// scopes are thread-local: other threads' errors are not caught here. On the web the
    /// scopes resolve asynchronously, so there errors go to the handler and [`Context::check`].
    pub(crate) fn scoped<T>(
        &self,
        name: &str,
        bytes: Option<u64>,
        make: impl FnOnce() -> T,
    ) -> Result<T> {
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (name, bytes);
            Ok(make())
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            use futures::FutureExt;
            let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
            let made = make();
            // Popped innermost first; native wgpu resolves a popped scope at once.
            let popped = [internal.pop(), validation.pop(), oom.pop()];
            let mut first = None;
            for scope in popped {
                if let Some(Some(e)) = scope.now_or_never() {
                    let e = typed(name, bytes, e);
                    // Out of memory first: a failed allocation also invalidates what uses it.
                    if first.is_none() || matches!(e, Error::OutOfMemory { .. }) {
                        first = Some(e);
                    }
                }
            }
            self.check_lost_noticed()?;
            match first {
                Some(e) => Err(e),
                None => Ok(made),
            }
        }
    }

    /// Submit `encoder` and block until the GPU has finished it (native), then report device
    /// errors. For examples and host helpers; launchers never call it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn submit_and_wait(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        let index = self.scoped("submit", None, || self.queue.submit(Some(encoder.finish())))?;
        self.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })?;
        self.check()
    }

    /// A new command encoder on the device; `label` shows in validation errors and captures.
    pub fn create_encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }
}
