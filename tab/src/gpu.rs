//! The page's GPU (wasm32 only): opens the browser's WebGPU adapter for
//! the wgpu backend and installs how a read waits for it. The waits are
//! imports from `provide-jspi.js`, which the page serves beside `tab.js`:
//! `synor_gpu_wait` is a `WebAssembly.Suspending` function (it suspends
//! this module until `synor_gpu_wake`, called when a mapping ends, or
//! 100 ms later), so a step on the GPU must run through a `promising`
//! export (`synor_tab_turn`).

use kernels::wgpu::WgpuBackend;
use kernels::wgpu::web::{Hooks, set_hooks};
use wasm_bindgen::prelude::*;

// Plain WebAssembly imports (not wasm-bindgen's, whose JavaScript shims
// could not suspend): wasm-bindgen's glue imports the module as it is.
#[allow(unsafe_code)]
#[link(wasm_import_module = "./provide-jspi.js")]
unsafe extern "C" {
    fn synor_gpu_wait();
    fn synor_gpu_wake();
}

#[allow(unsafe_code)]
fn wait() {
    // SAFETY: a JavaScript function of no arguments and no result.
    unsafe { synor_gpu_wait() }
}

#[allow(unsafe_code)]
fn wake() {
    // SAFETY: as `wait`.
    unsafe { synor_gpu_wake() }
}

/// Opens the browser's WebGPU adapter for the engines this page loads
/// after it; the adapter's kind (`cpu` for a software one) on success.
#[wasm_bindgen]
pub async fn open_gpu() -> Result<String, JsError> {
    set_hooks(Hooks { wait, wake });
    let backend = WgpuBackend::open_web()
        .await
        .map_err(|e| JsError::new(&e.to_string()))?;
    Ok(backend.adapter().kind.clone())
}
