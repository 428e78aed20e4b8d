//! The CUDA device: driver context, the stream every launcher enqueues on, the NVRTC target
//! of its architecture, and the kernels loaded so far.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, sys};

use super::backward::BackwardPath;
use super::kernels::{SOURCES, Source};
use super::nvrtc::{self, Target};
use crate::error::{Error, Result};
use crate::wgpu_backend::SegmentWindow;

/// One CUDA device and the stream this crate's launchers enqueue on: a stream of its own
/// ([`Context::new`]) or a caller's ([`Context::from_raw_stream`], for PyTorch/JAX interop and
/// CUDA-graph capture).
pub struct Context {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    target: Target,
    cache_dir: Option<PathBuf>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Dynamic shared memory each kernel was opted into so far (set once, not per launch).
    smem_opt_in: Mutex<HashMap<String, usize>>,
    borrowed_stream: bool,
    /// The backward's path when forced (`GDN_CUDA_BACKWARD`, [`Context::with_backward_path`]).
    backward_path: Option<BackwardPath>,
    /// Sequence parallelism's gate-driven window for plans made afterwards
    /// (`GDN_SEGMENT_WINDOW`, `GDN_SEGMENT_WARMUP`, [`Context::set_segment_window`]).
    segment_window: Option<SegmentWindow>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("capability", &self.capability)
            .field("target", &self.target)
            .field("borrowed_stream", &self.borrowed_stream)
            .finish_non_exhaustive()
    }
}

/// The stream handles that name no stream object: the legacy default stream (null), and the
/// legacy and per-thread default stream aliases (1, 2).
fn is_default_stream_alias(stream: sys::CUstream) -> bool {
    (stream as usize) <= 2
}

/// A caller's stream must belong to the context the kernels are loaded into.
fn check_stream_context(ctx: &CudaContext, stream: sys::CUstream) -> Result<()> {
    if is_default_stream_alias(stream) {
        return Ok(());
    }
    ctx.bind_to_thread()
        .map_err(|e| driver_error("context binding", e))?;
    let mut owner: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a query on the stream the caller vouches for; `owner` is a valid out-pointer.
    unsafe { sys::cuStreamGetCtx(stream, &mut owner) }
        .result()
        .map_err(|e| driver_error("stream context query", e))?;
    if owner != ctx.cu_ctx() {
        return Err(Error::value(
            "stream",
            "a stream of the device's primary context (the CUDA runtime's)",
            "a stream of another context",
        ));
    }
    Ok(())
}

/// A driver error as the crate's error, naming what was being done: out of memory as
/// [`Error::OutOfMemory`]; the "sticky" errors after which the CUDA context cannot run
/// anything more (a faulting or timed-out kernel, an uncorrectable ECC error, a destroyed
/// context) as [`Error::DeviceLost`]; everything else as [`Error::Gpu`].
pub(crate) fn driver_error(what: &str, e: DriverError) -> Error {
    use sys::CUresult::*;
    // The result code's name, not `DriverError`'s Debug, which asks the driver for a string
    // (and panics where the driver library cannot be loaded).
    let code = e.0;
    match code {
        CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
            name: format!("CUDA {what}"),
            bytes: None,
            msg: format!("{code:?}"),
        },
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_LAUNCH_TIMEOUT
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ECC_UNCORRECTABLE
        | CUDA_ERROR_NVLINK_UNCORRECTABLE
        | CUDA_ERROR_CONTEXT_IS_DESTROYED
        | CUDA_ERROR_DEINITIALIZED => Error::DeviceLost(format!(
            "CUDA {what}: {code:?} (the CUDA context can run nothing more)"
        )),
        _ => Error::Gpu(format!("CUDA {what}: {code:?}")),
    }
}

fn missing_driver() -> Error {
    Error::NoAdapter(
        "the CUDA driver library (libcuda.so) could not be loaded: no NVIDIA driver installed, \
         or its folder is not on LD_LIBRARY_PATH"
            .into(),
    )
}

impl Context {
    /// The first CUDA device.
    pub fn new() -> Result<Self> {
        Self::with_ordinal(0)
    }

    /// The device `ordinal`. Without a driver, without that device or on a device older than
    /// compute capability 8.0 this is an error ([`Error::NoAdapter`], [`Error::Unsupported`]),
    /// never a panic.
    pub fn with_ordinal(ordinal: usize) -> Result<Self> {
        Self::open(ordinal, None)
    }

    /// A context on device `ordinal` whose launchers enqueue on the caller's stream `stream`
    /// (PyTorch: `torch.cuda.current_stream().cuda_stream`; a null handle is the legacy default
    /// stream). Nothing is copied or synchronised behind the caller's back: cudarc's per-buffer
    /// event tracking is off for this context (its events would be recorded into a CUDA-graph
    /// capture), so plans, workspaces and tensors made on it are ordered by this one stream
    /// alone. Errors as [`Context::with_ordinal`], and [`Error::Value`] for a stream of another
    /// context.
    ///
    /// # Safety
    /// `stream` must be a valid `CUstream` (`cudaStream_t`) of device `ordinal`'s primary
    /// context (the one the CUDA runtime, and so PyTorch and JAX, use), alive as long as this
    /// context and everything made from it (tensors, plans, workspaces: their memory is freed
    /// in order on that stream). Work the caller submits to other streams on memory these
    /// calls use must be ordered by the caller (events, as between any two streams).
    pub unsafe fn from_raw_stream(ordinal: usize, stream: sys::CUstream) -> Result<Self> {
        Self::open(ordinal, Some(stream))
    }

    /// Whether the launchers enqueue on a caller's stream ([`Context::from_raw_stream`]).
    pub fn borrows_stream(&self) -> bool {
        self.borrowed_stream
    }

    fn open(ordinal: usize, borrowed: Option<sys::CUstream>) -> Result<Self> {
        // cudarc's dynamic loading panics when libcuda cannot be opened (on the first driver
        // call); probe for the library first, and catch any panic of the calls below too.
        let present =
            std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err(missing_driver());
        }
        // The raw handle crosses the unwind boundary as an integer.
        let borrowed_bits = borrowed.map(|s| s as usize);
        let made = std::panic::catch_unwind(|| -> Result<_> {
            let ctx = CudaContext::new(ordinal).map_err(|e| match e.0 {
                sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                    Error::NoAdapter("the CUDA driver reports no CUDA device".into())
                }
                sys::CUresult::CUDA_ERROR_INVALID_DEVICE => {
                    let count = CudaContext::device_count().unwrap_or(0);
                    Error::NoAdapter(format!(
                        "CUDA device {ordinal} does not exist ({count} device(s))"
                    ))
                }
                _ => Error::RequestDevice(format!("CUDA context on device {ordinal}: {e:?}")),
            })?;
            let name = ctx.name().map_err(|e| driver_error("device name", e))?;
            let capability = ctx
                .compute_capability()
                .map_err(|e| driver_error("compute capability", e))?;
            let stream = match borrowed_bits {
                None => ctx
                    .new_stream()
                    .map_err(|e| driver_error("stream creation", e))?,
                Some(bits) => {
                    let raw = bits as sys::CUstream;
                    check_stream_context(&ctx, raw)?;
                    // SAFETY: this CudaContext is new and private to the Context: no buffer
                    // has events yet, and every use of its buffers is on the one stream.
                    unsafe { ctx.disable_event_tracking() };
                    // SAFETY: the caller of from_raw_stream promises a live stream of this
                    // device's primary context; the wrapper never destroys it.
                    unsafe { ctx.wrap_borrowed_stream(raw) }
                }
            };
            Ok((ctx, stream, name, capability))
        })
        .map_err(|_| missing_driver())?;
        let (ctx, stream, name, capability) = made?;
        let target = Target::for_capability(capability.0, capability.1)?;
        super::nvrtc::env_defines()?;
        let backward_path = match std::env::var("GDN_CUDA_BACKWARD") {
            Ok(s) if !s.is_empty() => BackwardPath::parse_override("GDN_CUDA_BACKWARD", &s)?,
            _ => None,
        };
        let env = |name: &str| std::env::var(name).ok();
        let segment_window = SegmentWindow::parse(
            ("GDN_SEGMENT_WINDOW", env("GDN_SEGMENT_WINDOW").as_deref()),
            ("GDN_SEGMENT_WARMUP", env("GDN_SEGMENT_WARMUP").as_deref()),
        )?;
        Ok(Context {
            ctx,
            stream,
            ordinal,
            name,
            capability,
            target,
            cache_dir: nvrtc::default_cache_dir(),
            modules: Mutex::new(HashMap::new()),
            smem_opt_in: Mutex::new(HashMap::new()),
            borrowed_stream: borrowed.is_some(),
            backward_path,
            segment_window,
        })
    }

    /// The gate-driven window (docs/sequence-parallelism.md) for the chunk plans made from now
    /// on (`None`: exact only, the default); overrides `GDN_SEGMENT_WINDOW` /
    /// `GDN_SEGMENT_WARMUP`. [`ChunkPlan::set_segment_window`] sets one plan's.
    ///
    /// [`ChunkPlan::set_segment_window`]: crate::cuda_backend::ChunkPlan::set_segment_window
    pub fn set_segment_window(&mut self, window: Option<SegmentWindow>) {
        self.segment_window = window;
    }

    /// The gate-driven window new chunk plans take.
    pub fn segment_window(&self) -> Option<SegmentWindow> {
        self.segment_window
    }

    /// The same context with the backward's path forced (`None`: chosen per call by
    /// [`crate::cuda_backend::backward::backward_path`]); overrides `GDN_CUDA_BACKWARD`.
    pub fn with_backward_path(mut self, path: Option<BackwardPath>) -> Self {
        self.backward_path = path;
        self
    }

    /// The forced backward path, if any.
    pub fn backward_path_override(&self) -> Option<BackwardPath> {
        self.backward_path
    }

    /// The same context with the kernel cache in `dir` (`None`: compile every time).
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// The stream every launcher enqueues on (the caller's with
    /// [`Context::from_raw_stream`]); [`Context::synchronize`] waits for it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The driver context.
    pub fn cuda_context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The CUDA device ordinal this context runs on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name as the driver reports it (e.g. "NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// What NVRTC compiles for on this device.
    pub fn target(&self) -> Target {
        self.target
    }

    /// An event that records time (cudarc's default event has timing disabled, and
    /// `elapsed_ms` between such events fails with an invalid-handle error).
    pub fn timing_event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("event creation", e))
    }

    /// Wait until everything enqueued on [`Context::stream`] has run.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("stream synchronize", e))
    }

    /// The kernel `function` of `source`, compiling (through the cache) and loading the module
    /// on first use.
    pub(crate) fn function(&self, source: &Source, function: &str) -> Result<CudaFunction> {
        let module = self.module(source)?;
        module
            .load_function(function)
            .map_err(|e| driver_error(&format!("kernel {function} of {}", source.file), e))
    }

    /// [`Context::function`], opted into at least `smem` bytes of dynamic shared memory: the
    /// attribute is set on first use only, so warm launches make no such driver call.
    pub(crate) fn function_with_smem(
        &self,
        source: &Source,
        function: &str,
        smem: usize,
    ) -> Result<CudaFunction> {
        let func = self.function(source, function)?;
        let mut set = self
            .smem_opt_in
            .lock()
            .map_err(|_| Error::Gpu("CUDA shared-memory table poisoned by a panic".into()))?;
        if set.get(function).is_none_or(|&have| have < smem) {
            let bytes = i32::try_from(smem)
                .map_err(|_| Error::value("shared memory", "at most i32::MAX bytes", smem))?;
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .map_err(|e| driver_error(&format!("shared memory opt-in of {function}"), e))?;
            set.insert(function.to_string(), smem);
        }
        Ok(func)
    }

    /// Compile every CUDA source for this device (through the cache) on parallel threads and
    /// load the modules, so later calls make no NVRTC call. Without it each source compiles on
    /// its first use, one after another: over a minute on an empty cache on an H200 host.
    /// Returns each source's file name and its compile (or cache read) time in seconds.
    pub fn precompile(&self) -> Result<Vec<(&'static str, f64)>> {
        let pending: Vec<&'static Source> = {
            let modules = self.lock_modules()?;
            SOURCES
                .iter()
                .filter(|s| !modules.contains_key(s.file))
                .collect()
        };
        let (target, dir) = (self.target, self.cache_dir.as_deref());
        let compiled: Vec<Result<(&'static Source, String, nvrtc::Image, f64)>> =
            std::thread::scope(|scope| {
                let workers: Vec<_> = pending
                    .iter()
                    .map(|&source| {
                        scope.spawn(move || {
                            let start = std::time::Instant::now();
                            let text = source.full_text();
                            let image = nvrtc::compile_cached(source.file, &text, target, dir)?;
                            Ok((source, text, image, start.elapsed().as_secs_f64()))
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| {
                        w.join().unwrap_or_else(|_| {
                            Err(Error::Gpu("an NVRTC compile thread panicked".into()))
                        })
                    })
                    .collect()
            });
        let mut times = Vec::with_capacity(compiled.len());
        for result in compiled {
            let (source, text, image, secs) = result?;
            let module = self.load_or_recompile(source, &text, image)?;
            self.lock_modules()?.entry(source.file).or_insert(module);
            times.push((source.file, secs));
        }
        Ok(times)
    }

    fn lock_modules(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<&'static str, Arc<CudaModule>>>> {
        self.modules
            .lock()
            .map_err(|_| Error::Gpu("CUDA module table poisoned by a panic".into()))
    }

    fn module(&self, source: &Source) -> Result<Arc<CudaModule>> {
        let mut modules = self.lock_modules()?;
        if let Some(m) = modules.get(source.file) {
            return Ok(m.clone());
        }
        let text = source.full_text();
        let image =
            nvrtc::compile_cached(source.file, &text, self.target, self.cache_dir.as_deref())?;
        let module = self.load_or_recompile(source, &text, image)?;
        modules.insert(source.file, module.clone());
        Ok(module)
    }

    /// Load `image`; a cached image the driver refuses (say, from a newer NVRTC than the
    /// driver) is dropped from the cache and compiled afresh.
    fn load_or_recompile(
        &self,
        source: &Source,
        text: &str,
        image: nvrtc::Image,
    ) -> Result<Arc<CudaModule>> {
        match (self.load(image), self.cache_dir.as_deref()) {
            (Ok(m), _) => Ok(m),
            (Err(_), Some(dir)) => {
                nvrtc::evict(source.file, text, self.target, dir);
                self.load(nvrtc::compile(source.file, text, self.target)?)
                    .map_err(|e| driver_error(&format!("loading {}", source.file), e))
            }
            (Err(e), None) => Err(driver_error(&format!("loading {}", source.file), e)),
        }
    }

    fn load(&self, image: nvrtc::Image) -> std::result::Result<Arc<CudaModule>, DriverError> {
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Driver errors come back typed: out of memory, a context that can run nothing more
    /// (device lost), and the rest.
    #[test]
    fn driver_errors_are_typed() {
        use sys::CUresult::*;
        let typed = |r| driver_error("allocation of v", DriverError(r));
        match typed(CUDA_ERROR_OUT_OF_MEMORY) {
            Error::OutOfMemory { name, .. } => assert_eq!(name, "CUDA allocation of v"),
            e => panic!("{e}"),
        }
        for sticky in [
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_ECC_UNCORRECTABLE,
        ] {
            assert!(matches!(typed(sticky), Error::DeviceLost(_)), "{sticky:?}");
        }
        assert!(matches!(typed(CUDA_ERROR_INVALID_VALUE), Error::Gpu(_)));
        assert!(!typed(CUDA_ERROR_OUT_OF_MEMORY).is_input_error());
    }
}
