//! The CUDA backend's kernels (feature `cuda`): CUDA C sources
//! (`kernels.cu`, the same operations and arithmetic as the WGSL shaders)
//! compiled at run time by NVRTC through cudarc, which loads the CUDA
//! libraries dynamically: the crate builds and its tests run with no CUDA
//! toolkit and no driver. Without a driver, selecting CUDA fails with one
//! clear error (`probe`). NVRTC is found by the normal library search, or
//! at `SYNOR_NVRTC` (an absolute path, as `fetch-models.sh nvrtc` leaves
//! it), loaded before cudarc asks for it by name.
//!
//! Still to come: the `Backend` implementation that launches these
//! kernels (issue 17).

use std::sync::OnceLock;

use crate::quant::KernelError;

/// Every kernel's CUDA C source.
pub const SOURCE: &str = include_str!("kernels.cu");

/// The kernels `SOURCE` defines (each one launchable entry).
pub const KERNELS: [&str; 17] = [
    "quantize",
    "matmul_quant",
    "matmul_dense",
    "embed_quant",
    "rms_norm",
    "layer_norm",
    "softmax_rows",
    "add",
    "add_bias",
    "swiglu",
    "gelu",
    "rope",
    "gather",
    "scatter",
    "write_kv",
    "paged_attention",
    "bidirectional_attention",
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

/// Compiles `SOURCE` to PTX for `arch` (e.g. `compute_80`): the text of
/// the module, or NVRTC's log when a kernel does not compile.
#[allow(unsafe_code)]
pub fn compile(arch: &'static str) -> Result<String, KernelError> {
    preload_nvrtc()?;
    // SAFETY: only tries to open the library by its known names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(KernelError::Device(
            "NVRTC (libnvrtc.so.12) is not installed: set SYNOR_NVRTC, or run \
             `scripts/fetch-models.sh nvrtc`"
                .into(),
        ));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| KernelError::Device(format!("NVRTC: {e}")))?;
    Ok(ptx.to_src())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_compiles_to_ptx_with_nvrtc() {
        let ptx = compile("compute_80").unwrap_or_else(|e| panic!("{e}"));
        for k in KERNELS {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{k} is not in the PTX"
            );
        }
    }

    #[test]
    fn without_a_driver_cuda_fails_with_one_clear_error() {
        if driver_present() {
            return; // a GPU machine: the parity tests run there instead
        }
        let e = probe(0).expect_err("no driver here");
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
    }
}
