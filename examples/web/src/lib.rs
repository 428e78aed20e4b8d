//! gdn-wgpu in the browser: the page's wasm module. `demo` holds the logic (plain Rust over
//! `gdn_wgpu`); this file exports it to JavaScript with wasm-bindgen. Build with `build.sh`.

pub mod demo;

#[cfg(target_arch = "wasm32")]
mod web {
    use wasm_bindgen::prelude::*;

    use crate::demo::{self, Config};

    fn now_ms() -> f64 {
        web_sys::window()
            .and_then(|w| w.performance())
            .map_or(0.0, |p| p.now())
    }

    /// Panics go to the console with their message (the page shows the failed promise).
    #[wasm_bindgen(start)]
    pub fn start() {
        std::panic::set_hook(Box::new(|info| {
            web_sys::console::error_1(&info.to_string().into())
        }));
    }

    /// Run the forward on `tokens` tokens (`runs` times: the first compiles the pipelines; on
    /// `algorithm` = auto, chunked or recurrent; `tiles` = `VxN` runs the recurrent kernel at
    /// V-block V with N vec4s per invocation, `colV` the column kernel, empty: the library's
    /// choice) and
    /// `decode_steps` decode steps on the browser's WebGPU adapter and check them against the
    /// f64 oracle. Resolves to the report as JSON; rejects with a one-line message (bad sizes,
    /// no adapter, device errors).
    #[wasm_bindgen]
    #[allow(clippy::too_many_arguments)]
    pub async fn run_demo(
        tokens: u32,
        heads_qk: u32,
        heads_v: u32,
        key_dim: u32,
        value_dim: u32,
        decode_steps: u32,
        seed: u32,
        default_limits: bool,
        l2norm_qk: bool,
        runs: u32,
        algorithm: String,
        tiles: String,
    ) -> Result<String, JsError> {
        let algorithm =
            gdn_wgpu::wgpu_backend::ForwardAlgorithm::parse_override("algorithm", &algorithm)?;
        let config = Config {
            tokens: tokens as usize,
            heads_qk: heads_qk as usize,
            heads_v: heads_v as usize,
            key_dim: key_dim as usize,
            value_dim: value_dim as usize,
            decode_steps: decode_steps as usize,
            seed: seed as u64,
            default_limits,
            l2norm_qk,
            runs: runs as usize,
            algorithm,
            tiles: demo::parse_tiles(&tiles)?,
        };
        let t0 = now_ms();
        let ctx = demo::context(default_limits, algorithm).await?;
        let context_ms = now_ms() - t0;
        let mut report = demo::run(&ctx, &config, now_ms).await?;
        report.context_ms = context_ms;
        Ok(report.to_json())
    }
}
