//! Where the CUDA backend's time goes, when `SYNOR_CUDA_PROFILE` is set
//! (any value but `0`): every kernel launch is bracketed by two timing
//! events on the stream, and the host's device allocations and uploads are
//! counted; `CudaBackend::take_profile` sums the GPU time by kernel. The
//! GPU time of a forward pass against its wall time says how much of a
//! step is the kernels and how much the host's launching and waiting.
//! Off by default: the events cost a few microseconds a launch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

/// One kernel's launches since the last report.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    pub name: &'static str,
    pub launches: usize,
    /// Summed GPU time between each launch's two events.
    pub gpu_ms: f64,
}

/// The launches, allocations and uploads since the last report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// By GPU time, largest first.
    pub kernels: Vec<KernelTime>,
    pub allocations: usize,
    pub uploads: usize,
}

impl Profile {
    /// The GPU time of every launch.
    pub fn gpu_ms(&self) -> f64 {
        self.kernels.iter().map(|k| k.gpu_ms).sum()
    }

    /// Every kernel launch.
    pub fn launches(&self) -> usize {
        self.kernels.iter().map(|k| k.launches).sum()
    }
}

/// The events and counts a profiled backend collects.
#[derive(Debug, Default)]
pub(super) struct Profiler {
    launches: Mutex<Vec<(&'static str, CudaEvent, CudaEvent)>>,
    allocations: AtomicUsize,
    uploads: AtomicUsize,
}

fn timing_event(stream: &Arc<CudaStream>) -> CudaEvent {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap_or_else(|e| panic!("CUDA profile event: {e}"))
}

impl Profiler {
    /// A profiler when `SYNOR_CUDA_PROFILE` asks for one.
    pub(super) fn from_env() -> Option<Arc<Self>> {
        let on = std::env::var("SYNOR_CUDA_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
        on.then(|| Arc::new(Self::default()))
    }

    /// Records the start of a launch on `stream`.
    pub(super) fn start(&self, stream: &Arc<CudaStream>) -> CudaEvent {
        timing_event(stream)
    }

    /// Records the end of launch `name`, begun at `start`.
    pub(super) fn finish(&self, name: &'static str, start: CudaEvent, stream: &Arc<CudaStream>) {
        let end = timing_event(stream);
        self.launches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name, start, end));
    }

    pub(super) fn allocated(&self) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn uploaded(&self) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits for the recorded launches and sums them by kernel; the counts
    /// start again from zero.
    pub(super) fn take(&self) -> Profile {
        let launches =
            std::mem::take(&mut *self.launches.lock().unwrap_or_else(PoisonError::into_inner));
        let mut kernels: Vec<KernelTime> = Vec::new();
        for (name, start, end) in launches {
            end.synchronize()
                .unwrap_or_else(|e| panic!("CUDA profile: {e}"));
            let ms = f64::from(
                start
                    .elapsed_ms(&end)
                    .unwrap_or_else(|e| panic!("CUDA profile: {e}")),
            );
            match kernels.iter_mut().find(|k| k.name == name) {
                Some(k) => {
                    k.launches += 1;
                    k.gpu_ms += ms;
                }
                None => kernels.push(KernelTime {
                    name,
                    launches: 1,
                    gpu_ms: ms,
                }),
            }
        }
        kernels.sort_by(|a, b| b.gpu_ms.total_cmp(&a.gpu_ms));
        Profile {
            kernels,
            allocations: self.allocations.swap(0, Ordering::Relaxed),
            uploads: self.uploads.swap(0, Ordering::Relaxed),
        }
    }
}
