//! The CUDA backend (feature `cuda`): CUDA C sources (`kernels.cu`, the
//! same operations and arithmetic as the WGSL shaders) compiled at run
//! time by NVRTC (`nvrtc`) through cudarc, which loads the CUDA libraries
//! dynamically: the crate builds and its tests run with no CUDA toolkit
//! and no driver. Without a driver, selecting CUDA fails with one clear
//! error (`probe`). NVRTC is found by the normal library search, or at
//! `SYNOR_NVRTC` (an absolute path, as `fetch-models.sh nvrtc` leaves
//! it), loaded before cudarc asks for it by name. `CudaBackend`
//! (`backend`) launches the kernels; `profile` times them when
//! `SYNOR_CUDA_PROFILE` is set; `reuse` uploads a pass's per-layer tables
//! once.

mod backend;
mod nvrtc;
mod profile;
mod reuse;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

pub use backend::{CudaBackend, CudaDeviceInfo, CudaKv, CudaMatrix, CudaTensor, CudaVector};
pub use nvrtc::Image;
pub use profile::{KernelTime, Profile};

use crate::quant::KernelError;

/// Every kernel's CUDA C source.
pub const SOURCE: &str = include_str!("kernels.cu");

/// Every kernel `SOURCE` defines and its parameters, one letter each:
/// `f` a `float*`, `w` a `u32*`, `u` a `u32`, `x` a `float`. Every launch
/// is checked against this (a wrong argument list is refused, never run),
/// and a test checks it against the source.
pub const KERNELS: [(&str, &str); 20] = [
    ("quantize", "fwuu"),
    ("matmul_quant", "wwfuuuuu"),
    ("matmul_dense", "fffuuu"),
    ("embed_quant", "wwfuuuuu"),
    ("rms_norm", "fffuux"),
    ("layer_norm", "ffffuux"),
    ("softmax_rows", "fuu"),
    ("add", "ffu"),
    ("add_bias", "ffuu"),
    ("swiglu", "ffuu"),
    ("geglu", "ffuu"),
    ("scale", "fux"),
    ("gelu", "fu"),
    ("rope", "ffuuuuu"),
    ("gather", "fwfuuuu"),
    ("scatter_add", "fwfuu"),
    ("scatter", "ffuuuu"),
    ("write_kv", "fwwuuuu"),
    ("paged_attention", "fwwwwfuuuuuux"),
    ("bidirectional_attention", "fffwfuuu"),
];

/// The NVRTC library named by `SYNOR_NVRTC`, kept loaded for the process.
#[allow(unsafe_code)]
fn preload_nvrtc() -> Result<(), KernelError> {
    static LOADED: OnceLock<Result<Option<libloading::Library>, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| match std::env::var_os("SYNOR_NVRTC") {
        None => Ok(None),
        // SAFETY: NVRTC's initializers only set up its own state.
        Some(path) => unsafe { libloading::Library::new(&path) }
            .map(Some)
            .map_err(|e| format!("loading NVRTC from {}: {e}", path.to_string_lossy())),
    });
    loaded
        .as_ref()
        .map(|_| ())
        .map_err(|e| KernelError::Device(e.clone()))
}

/// Whether the CUDA driver library (libcuda) can be loaded here.
#[allow(unsafe_code)]
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its known names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Compiles `SOURCE` for `arch`: `compute_XY` gives PTX, `sm_XY` a CUBIN;
/// NVRTC's log is the error when a kernel does not compile.
pub fn compile(arch: &str) -> Result<Image, KernelError> {
    compile_source(SOURCE, arch)
}

/// Compiles CUDA C `src` for `arch`, as `compile`.
#[allow(unsafe_code)]
fn compile_source(src: &str, arch: &str) -> Result<Image, KernelError> {
    preload_nvrtc()?;
    // SAFETY: only tries to open the library by its known names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(KernelError::Device(
            "NVRTC (libnvrtc.so.12) is not installed: set SYNOR_NVRTC, or run \
             `scripts/fetch-models.sh nvrtc`"
                .into(),
        ));
    }
    nvrtc::compile(src, arch)
}

/// Checks that CUDA device `index` can be used: one clear error when the
/// driver is missing.
pub fn probe(index: u32) -> Result<(), KernelError> {
    if !driver_present() {
        return Err(KernelError::Device(format!(
            "cuda:{index}: no CUDA driver on this machine (libcuda.so.1 was not found)"
        )));
    }
    Ok(())
}
