//! The machine's memory read bandwidth, measured: the bound of a decode
//! step, which reads every weight once per token (weight bytes / bandwidth
//! is the fastest a step can be). The benchmarks report against it, taken
//! beside their own timings, since a shared host's bandwidth moves from
//! minute to minute.

use std::time::Instant;

use rayon::prelude::*;

/// A buffer past any last-level cache, summed to measure read bandwidth.
pub struct BandwidthProbe {
    words: Vec<u64>,
}

impl BandwidthProbe {
    /// A probe over `bytes` of memory (touched once here, so the pages
    /// exist before any pass is timed).
    pub fn new(bytes: usize) -> Self {
        Self {
            words: (0..(bytes / 8).max(64) as u64).collect(),
        }
    }

    /// The best of `passes` reads of the whole buffer split over `threads`
    /// threads, in GB/s (512-bit loads where the CPU has them, like the
    /// kernels).
    pub fn read_gbps(&self, threads: usize, passes: usize) -> f64 {
        let threads = threads.max(1);
        // Where no thread can be spawned (WebAssembly), the global pool
        // (the calling thread alone there) reads it.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
        let chunk = self.words.len().div_ceil(threads);
        let read = || {
            self.words
                .par_chunks(chunk)
                .map(sum_words)
                .reduce(|| 0, u64::wrapping_add)
        };
        let mut best = f64::MAX;
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            let sum: u64 = match &pool {
                Ok(pool) => pool.install(read),
                Err(_) => read(),
            };
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(sum);
        }
        (self.words.len() * 8) as f64 / best / 1e9
    }
}

fn sum_words(c: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        #[allow(unsafe_code)]
        return unsafe { sum_avx512(c) };
    }
    c.iter().fold(0u64, |s, x| s.wrapping_add(*x))
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut blocks = c.chunks_exact(32);
    for b in &mut blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `b` holds 32 words, so words 8k..8k + 8 are in bounds.
            let v = unsafe { _mm512_loadu_si512(b.as_ptr().add(8 * k).cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let total = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |s, x| s.wrapping_add(*x));
    (_mm512_reduce_add_epi64(total) as u64).wrapping_add(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_summed_whatever_the_split() {
        // 1,000 words: 31 full 32-word blocks and a tail, in uneven chunks.
        for threads in [1, 2, 3] {
            let p = BandwidthProbe::new(8000);
            let chunk = p.words.len().div_ceil(threads);
            let sum: u64 = p.words.chunks(chunk).map(sum_words).sum();
            assert_eq!(sum, 999 * 1000 / 2, "{threads} threads");
            assert!(p.read_gbps(threads, 2) > 0.0);
        }
    }
}
