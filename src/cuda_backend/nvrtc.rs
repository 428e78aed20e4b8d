//! Run-time compilation of the CUDA sources with NVRTC, and the on-disk cache of what it made.
//!
//! Needs only the NVRTC library (no driver, no GPU): the `cuda` test compiles every source for
//! sm_90a and sm_80 on machines without a GPU. The CUDA headers (`cuda_fp16.h`,
//! `cuda_bf16.h`) are searched, once per process, in: `$GDN_CUDA_INCLUDE` (`:`-separated),
//! `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, the include folder
//! next to each `$LD_LIBRARY_PATH` entry (a toolkit's `lib64/../include`, or the PyPI wheels'
//! `nvidia/cuda_nvrtc/lib/../../cuda_runtime/include`), and
//! `~/.cache/gdn-nvrtc/nvidia/cuda_runtime/include` (where `shared/tools/cuda/fetch-nvrtc.sh`
//! installs them).

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::error::{Error, Result};

/// What NVRTC is asked to produce for a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Hopper (compute capability 9.0): a cubin for `sm_90a` (wgmma/TMA available).
    Sm90a,
    /// Ampere and Ada (8.x): a cubin for `sm_80`, which every 8.x device runs.
    Sm80,
    /// Anything newer than Hopper (10.x, 12.x): `compute_80` PTX that the driver compiles for
    /// the device, since an sm_80 cubin only runs on 8.x devices.
    Compute80Ptx,
}

impl Target {
    /// The target for a device of compute capability `major.minor`; below 8.0 is unsupported.
    pub fn for_capability(major: i32, minor: i32) -> Result<Target> {
        match (major, minor) {
            (9, 0) => Ok(Target::Sm90a),
            (8, _) => Ok(Target::Sm80),
            (m, _) if m >= 9 => Ok(Target::Compute80Ptx),
            _ => Err(Error::unsupported(
                "cuda device",
                format!("compute capability {major}.{minor} (the CUDA kernels need 8.0 or newer)"),
            )),
        }
    }

    /// NVRTC's `--gpu-architecture` value.
    pub fn arch(self) -> &'static str {
        match self {
            Target::Sm90a => "sm_90a",
            Target::Sm80 => "sm_80",
            Target::Compute80Ptx => "compute_80",
        }
    }

    fn is_cubin(self) -> bool {
        !matches!(self, Target::Compute80Ptx)
    }
}

/// A compiled module image: a cubin, or NUL-terminated PTX for [`Target::Compute80Ptx`].
#[derive(Debug, Clone)]
pub struct Image {
    /// What the image was compiled for.
    pub target: Target,
    /// The cubin, or NUL-terminated PTX text.
    pub bytes: Vec<u8>,
}

/// The include folders holding `cuda_fp16.h`, searched once (see the module docs).
pub fn include_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(v) = env("GDN_CUDA_INCLUDE") {
            candidates.extend(std::env::split_paths(&v));
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(v) = env(var) {
                candidates.push(PathBuf::from(v).join("include"));
            }
        }
        candidates.push("/usr/local/cuda/include".into());
        if let Some(v) = env("LD_LIBRARY_PATH") {
            for lib in std::env::split_paths(&v) {
                candidates.push(lib.join("../include"));
                candidates.push(lib.join("../../cuda_runtime/include"));
            }
        }
        if let Some(home) = env("HOME") {
            candidates
                .push(PathBuf::from(home).join(".cache/gdn-nvrtc/nvidia/cuda_runtime/include"));
        }
        let mut found: Vec<PathBuf> = Vec::new();
        for c in candidates {
            if c.join("cuda_fp16.h").is_file()
                && let Ok(c) = c.canonicalize()
                && !found.contains(&c)
            {
                found.push(c);
            }
        }
        found
    })
}

/// True when the NVRTC library can be loaded (cudarc loads it on first use).
pub fn nvrtc_available() -> bool {
    // cudarc panics when a library it needs cannot be loaded; this probe only tries to open it.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

fn missing_nvrtc() -> Error {
    Error::NoAdapter(
        "the NVRTC library (libnvrtc.so) could not be loaded: install the CUDA toolkit (or \
         shared/tools/cuda/fetch-nvrtc.sh) and add its lib folder to LD_LIBRARY_PATH"
            .into(),
    )
}

/// `GDN_CUDA_DEFINES`: preprocessor definitions added to every kernel's compile, for
/// experiments that time a kernel's variants with one binary in one process (the constants a
/// kernel leaves open under `#ifndef`, e.g. `GDN_PREP_BLOCKS=3`; docs/configuration.md).
/// Whitespace-separated `NAME` or `NAME=VALUE`, a C identifier and a value of letters, digits
/// and `_ . + -`; each becomes a `--define-macro` option, so a part of the cache key.
/// `Context::new` refuses a malformed list with `Error::Value`.
pub fn env_defines() -> Result<Vec<String>> {
    std::env::var("GDN_CUDA_DEFINES").map_or(Ok(Vec::new()), |list| parse_defines(&list))
}

/// The NVRTC options of a `GDN_CUDA_DEFINES` list ([`env_defines`]).
pub fn parse_defines(list: &str) -> Result<Vec<String>> {
    list.split_whitespace()
        .map(|def| {
            let (name, value) = def.split_once('=').unwrap_or((def, ""));
            let ident = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let plain = value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c));
            if ident && plain && !(def.contains('=') && value.is_empty()) {
                Ok(format!("--define-macro={def}"))
            } else {
                Err(Error::value(
                    "GDN_CUDA_DEFINES",
                    "whitespace-separated NAME or NAME=VALUE (a C identifier; a value of \
                     letters, digits and _ . + -)",
                    def,
                ))
            }
        })
        .collect()
}

/// The NVRTC options used for `target` (also part of the cache key). `GDN_CUDA_LINEINFO=1`
/// adds `--generate-line-info`, so that Nsight Compute maps SASS to source lines (the same code;
/// a separate cache entry); `GDN_CUDA_DEFINES` adds its definitions ([`env_defines`]; a
/// malformed list adds none here, `Context::new` having refused it).
pub fn options(target: Target) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={}", target.arch()),
        "--std=c++17".into(),
    ];
    if std::env::var_os("GDN_CUDA_LINEINFO").is_some_and(|v| v == "1") {
        opts.push("--generate-line-info".into());
    }
    opts.extend(env_defines().unwrap_or_default());
    for dir in include_dirs() {
        opts.push(format!("--include-path={}", dir.display()));
    }
    opts
}

/// Compile `source` (named `name` in diagnostics) for `target`, without the cache.
pub fn compile(name: &str, source: &str, target: Target) -> Result<Image> {
    if !nvrtc_available() {
        return Err(missing_nvrtc());
    }
    let fail = |what: &str, detail: String| {
        Error::Gpu(format!(
            "NVRTC {what} of {name} for {}: {detail}",
            target.arch()
        ))
    };
    let src = CString::new(source).map_err(|_| fail("compile", "source holds a NUL".into()))?;
    let cname = CString::new(name).map_err(|_| fail("compile", "name holds a NUL".into()))?;
    let opts = options(target);
    let prog = result::create_program(&src, Some(&cname))
        .map_err(|e| fail("program creation", e.to_string()))?;
    // Destroy the program on every path out.
    struct Guard(sys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let guard = Guard(prog);
    if let Err(e) = unsafe { result::compile_program(guard.0, &opts) } {
        let log = unsafe { result::get_program_log(guard.0) }
            .map(|l| c_text(&l))
            .unwrap_or_default();
        let headers = if include_dirs().is_empty() {
            " (no folder with cuda_fp16.h found: set GDN_CUDA_INCLUDE or CUDA_HOME)"
        } else {
            ""
        };
        return Err(fail("compile", format!("{e}{headers}\n{log}")));
    }
    let bytes = if target.is_cubin() {
        let mut size = 0usize;
        unsafe { sys::nvrtcGetCUBINSize(guard.0, &mut size) }
            .result()
            .map_err(|e| fail("cubin size", e.to_string()))?;
        let mut bytes = vec![0u8; size];
        unsafe { sys::nvrtcGetCUBIN(guard.0, bytes.as_mut_ptr() as *mut c_char) }
            .result()
            .map_err(|e| fail("cubin", e.to_string()))?;
        bytes
    } else {
        let ptx = unsafe { result::get_ptx(guard.0) }.map_err(|e| fail("PTX", e.to_string()))?;
        let mut bytes: Vec<u8> = ptx.into_iter().map(|c| c as u8).collect();
        if bytes.last() != Some(&0) {
            bytes.push(0);
        }
        bytes
    };
    Ok(Image { target, bytes })
}

fn c_text(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// The default cache folder: `$GDN_CUDA_CACHE`, else `$XDG_CACHE_HOME/gdn-wgpu/cuda`, else
/// `~/.cache/gdn-wgpu/cuda`; `None` when none of them is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = env("GDN_CUDA_CACHE") {
        return Some(dir.into());
    }
    let base = env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("gdn-wgpu").join("cuda"))
}

/// 128-bit FNV-1a: a stable content hash (std's hasher may change between Rust releases).
fn fnv1a128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.iter() {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
        // Separate the parts, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The cache file of `source` compiled for `target`: keyed by the hash of the source, the
/// target and every NVRTC option (which names the include folders).
pub fn cache_path(dir: &Path, name: &str, source: &str, target: Target) -> PathBuf {
    let opts = options(target).join("\n");
    let key = fnv1a128(&[source.as_bytes(), target.arch().as_bytes(), opts.as_bytes()]);
    let ext = if target.is_cubin() { "cubin" } else { "ptx" };
    let stem = name.trim_end_matches(".cu");
    dir.join(format!("{stem}-{}-{key:032x}.{ext}", target.arch()))
}

fn looks_valid(target: Target, bytes: &[u8]) -> bool {
    if target.is_cubin() {
        bytes.starts_with(b"\x7fELF")
    } else {
        bytes.last() == Some(&0) && bytes.len() > 1
    }
}

/// [`compile`] through the cache in `dir` (if any): a hit skips NVRTC. Reading or writing the
/// cache never fails the call: a miss, a corrupt entry or an I/O error means compiling.
pub fn compile_cached(
    name: &str,
    source: &str,
    target: Target,
    dir: Option<&Path>,
) -> Result<Image> {
    let Some(dir) = dir else {
        return compile(name, source, target);
    };
    let path = cache_path(dir, name, source, target);
    if let Ok(bytes) = std::fs::read(&path)
        && looks_valid(target, &bytes)
    {
        return Ok(Image { target, bytes });
    }
    let image = compile(name, source, target)?;
    if let Err(e) = store(&path, &image.bytes) {
        log::warn!("CUDA kernel cache: could not write {}: {e}", path.display());
    }
    Ok(image)
}

/// Forget a cache entry (one the driver refused to load).
pub fn evict(name: &str, source: &str, target: Target, dir: &Path) {
    let _ = std::fs::remove_file(cache_path(dir, name, source, target));
}

fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Write then rename, so a concurrent reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
