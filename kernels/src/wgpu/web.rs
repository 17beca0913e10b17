//! The wgpu backend in a browser (wasm32): the device is opened once,
//! asynchronously (`WgpuBackend::open_web`), and every later
//! `WgpuBackend::new` shares it; a read waits for the GPU through hooks
//! the page installs (`Hooks`). A browser maps a buffer only from its
//! event loop, so a synchronous forward pass can only wait where the
//! page suspends WebAssembly on a promise (JSPI: the hooks are
//! `WebAssembly.Suspending` imports and the step a `promising` export).
//! Errors the browser reports about the device are kept here and fail
//! the read that follows them, instead of leaving wrong numbers behind.

use std::sync::{Mutex, OnceLock};

use crate::quant::KernelError;

/// How the page waits for its GPU.
#[derive(Debug, Clone, Copy)]
pub struct Hooks {
    /// Suspends this WebAssembly until `wake` is called (or a task
    /// later); called again while the read is not done.
    pub wait: fn(),
    /// Called when a mapping ends.
    pub wake: fn(),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();
static ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Installs the page's hooks (the first call wins).
pub fn set_hooks(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
}

/// Waits until `done`, through the page's hooks; then fails if the
/// browser reported an error since the last read.
pub(super) fn wait(done: impl Fn() -> bool) -> Result<(), KernelError> {
    while !done() {
        let Some(h) = HOOKS.get() else {
            return Err(KernelError::Device(
                "this page cannot wait for its GPU inside a step: no JavaScript \
                 promise integration (WebAssembly.Suspending)"
                    .into(),
            ));
        };
        (h.wait)();
    }
    match take_error() {
        Some(e) => Err(KernelError::Device(format!("the browser's GPU: {e}"))),
        None => Ok(()),
    }
}

/// A mapping ended: resumes a waiting read.
pub(super) fn wake() {
    if let Some(h) = HOOKS.get() {
        (h.wake)();
    }
}

/// Keeps the first error the browser reports until it is taken.
pub(super) fn keep_error(e: String) {
    let mut kept = ERROR.lock().unwrap_or_else(|p| p.into_inner());
    kept.get_or_insert(e);
}

/// The error the browser reported, if any (cleared).
pub fn take_error() -> Option<String> {
    ERROR.lock().unwrap_or_else(|p| p.into_inner()).take()
}
