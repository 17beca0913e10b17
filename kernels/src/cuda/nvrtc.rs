//! One NVRTC compilation: the CUDA C source to PTX (for a virtual
//! architecture, `compute_XY`) or to a CUBIN (for a real one, `sm_XY`).
//! A CUBIN runs on any driver of the same major CUDA version (minor
//! version compatibility), where PTX of a newer toolkit than the driver's
//! cannot be JIT-compiled: the backend loads CUBINs.

use std::ffi::{CStr, CString, c_char};

use cudarc::nvrtc::{result, sys};

use crate::quant::KernelError;

fn nvrtc_err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Device(format!("NVRTC {what}: {e:?}"))
}

/// A created NVRTC program, destroyed on drop.
struct Program {
    prog: sys::nvrtcProgram,
    /// NVRTC keeps pointers into the source until the program is destroyed.
    _src: CString,
}

impl Drop for Program {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `prog` came from `create_program` and is destroyed once.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

/// What a compilation produced.
#[derive(Debug, Clone)]
pub enum Image {
    /// PTX text (a `compute_XY` target).
    Ptx(String),
    /// A CUBIN (an `sm_XY` target).
    Cubin(Vec<u8>),
}

/// Compiles `src` for `arch` (`compute_XY` gives PTX, `sm_XY` a CUBIN),
/// with NVRTC's log as the error when it does not compile.
#[allow(unsafe_code)]
pub fn compile(src: &str, arch: &str) -> Result<Image, KernelError> {
    let src = CString::new(src).map_err(|e| nvrtc_err("source", e))?;
    let prog = Program {
        prog: result::create_program(&src, Some(c"synor_kernels.cu"))
            .map_err(|e| nvrtc_err("create", e))?,
        _src: src,
    };
    // No contraction: a * b + c rounds twice, as in the CPU backend's Rust.
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--fmad=false".into(),
    ];
    // SAFETY: `prog` is live until dropped below.
    if let Err(e) = unsafe { result::compile_program(prog.prog, &opts) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog.prog) }.unwrap_or_default();
        return Err(KernelError::Device(format!(
            "NVRTC could not compile the kernels for {arch} ({e:?}):\n{}",
            text(&log)
        )));
    }
    if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: `prog` compiled; the buffer is `size` bytes as asked.
        unsafe { sys::nvrtcGetCUBINSize(prog.prog, &mut size).result() }
            .map_err(|e| nvrtc_err("CUBIN size", e))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC said it needs.
        unsafe { sys::nvrtcGetCUBIN(prog.prog, cubin.as_mut_ptr().cast()).result() }
            .map_err(|e| nvrtc_err("CUBIN", e))?;
        return Ok(Image::Cubin(cubin));
    }
    // SAFETY: `prog` compiled.
    let ptx = unsafe { result::get_ptx(prog.prog) }.map_err(|e| nvrtc_err("PTX", e))?;
    Ok(Image::Ptx(text(&ptx)))
}

/// A NUL-terminated C string from NVRTC, as text.
fn text(raw: &[c_char]) -> String {
    if raw.is_empty() {
        return String::new();
    }
    // NVRTC's buffers end with NUL; without one, take them whole.
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}
