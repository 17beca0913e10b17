//! Quantized matrix multiplication on the CPU: `y = x · Wᵀ` for activation
//! rows `x` (f32, quantized to Q8 on the fly) and a GGML-quantized weight
//! matrix `W`. The weight rows are split across threads (rayon); within a
//! thread, SIMD tiles reuse each unpacked weight block for several
//! activation rows, so a batched step reads each weight once.
//!
//! The instruction set is picked once at run time: AVX-512 VNNI, then
//! AVX2+FMA+F16C, then portable scalar code. `SYNOR_KERNELS=scalar|avx2`
//! forces a lower path (for tests and comparisons).

pub mod attention;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::quant::{KernelError, Q8Block, QMatrix, quantize_activations};

/// The SIMD path in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best path this CPU supports, capped by `SYNOR_KERNELS`.
    pub fn detect() -> Self {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Self::best_supported();
            match std::env::var("SYNOR_KERNELS").as_deref() {
                Ok("scalar") => Self::Scalar,
                Ok("avx2") if best != Self::Scalar => Self::Avx2,
                _ => best,
            }
        })
    }

    /// Every path this CPU can run (for tests).
    pub fn all_supported() -> Vec<Self> {
        let best = Self::best_supported();
        [Self::Scalar, Self::Avx2, Self::Avx512Vnni]
            .into_iter()
            .filter(|&i| i <= best)
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    fn best_supported() -> Self {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        if avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512vnni") {
            Self::Avx512Vnni
        } else if avx2 {
            Self::Avx2
        } else {
            Self::Scalar
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn best_supported() -> Self {
        Self::Scalar
    }
}

impl PartialOrd for Isa {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some((*self as u8).cmp(&(*other as u8)))
    }
}

/// Output rows per parallel task: enough work to amortize scheduling.
const ROWS_PER_TASK: usize = 64;

/// `out[i * w.rows + r] = Σ_k x[i * w.cols + k] * W[r][k]` for `m` rows of `x`.
pub fn matmul(w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) -> Result<(), KernelError> {
    matmul_with(Isa::detect(), w, x, m, out)
}

/// `matmul` on a chosen instruction set (falls back to scalar if unsupported).
pub fn matmul_with(
    isa: Isa,
    w: &QMatrix,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if x.len() != m * w.cols {
        return Err(KernelError::Shape {
            what: "activations",
            expected: m * w.cols,
            got: x.len(),
        });
    }
    if out.len() != m * w.rows {
        return Err(KernelError::Shape {
            what: "output",
            expected: m * w.rows,
            got: out.len(),
        });
    }
    let isa = if Isa::all_supported().contains(&isa) {
        isa
    } else {
        Isa::Scalar
    };
    let acts = quantize_activations(x, w.cols);
    let act_d: Vec<f32> = acts.iter().map(|b| b.d).collect();
    let act_s: Vec<f32> = acts.iter().map(|b| b.s).collect();
    let job = Job {
        isa,
        w,
        acts: &acts,
        act_d: &act_d,
        act_s: &act_s,
        nb: w.blocks_per_row(),
        m,
        out: OutPtr(out.as_mut_ptr()),
    };
    let tasks = w.rows.div_ceil(ROWS_PER_TASK);
    (0..tasks).into_par_iter().for_each(|t| {
        let r0 = t * ROWS_PER_TASK;
        job.rows(r0, ROWS_PER_TASK.min(w.rows - r0));
    });
    Ok(())
}

/// The output buffer, shared by the tasks of one matmul. Each task writes
/// only the columns (weight rows) it owns, so no element is written twice.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `Job::store`), and the buffer
// outlives the parallel loop (it is borrowed mutably by `matmul_with`).
#[allow(unsafe_code)]
unsafe impl Send for OutPtr {}
#[allow(unsafe_code)]
unsafe impl Sync for OutPtr {}

/// One matmul call: the weights, the quantized activations and the path.
struct Job<'a> {
    isa: Isa,
    w: &'a QMatrix,
    acts: &'a [Q8Block],
    /// Each block's `d` and `s`, contiguous (vector loads in the SIMD tiles).
    act_d: &'a [f32],
    act_s: &'a [f32],
    /// Blocks per row.
    nb: usize,
    /// Activation rows.
    m: usize,
    /// `m x w.rows` output, row-major.
    out: OutPtr,
}

impl Job<'_> {
    /// Computes weight rows `r0..r0 + n` against every activation row.
    fn rows(&self, r0: usize, n: usize) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512Vnni => simd::rows(self, r0, n),
            _ => {
                let nb = self.nb;
                for r in r0..r0 + n {
                    let wr = self.w.row(r);
                    for i in 0..self.m {
                        self.store(
                            i,
                            r,
                            scalar::dot_row(self.w.ty, wr, &self.acts[i * nb..(i + 1) * nb]),
                        );
                    }
                }
            }
        }
    }

    /// Writes output `(act row i, weight row r)`.
    #[allow(unsafe_code)]
    fn store(&self, i: usize, r: usize, v: f32) {
        assert!(i < self.m && r < self.w.rows, "output index out of range");
        // SAFETY: in bounds (checked above) of the `m x rows` buffer, and
        // weight row `r` belongs to exactly one task, so no two threads
        // write the same element.
        unsafe { *self.out.0.add(i * self.w.rows + r) = v };
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Walks a block of rows in SIMD tiles.
    #![allow(unsafe_code)]

    use super::x86::{self, Q4_0, Q4_1, Q8_0};
    use super::{Isa, Job, Q8Block};
    use crate::quant::QuantType;

    /// Weight rows `r0..r0 + rows` against every activation row. Only
    /// called with `Isa::Avx2` or `Isa::Avx512Vnni` (checked by the caller).
    pub fn rows(job: &Job<'_>, r0: usize, rows: usize) {
        let ctx = Ctx {
            job,
            r0,
            vnni: job.isa == Isa::Avx512Vnni,
        };
        match job.w.ty {
            QuantType::Q4_0 => ctx.run::<Q4_0>(rows),
            QuantType::Q4_1 => ctx.run::<Q4_1>(rows),
            QuantType::Q8_0 => ctx.run::<Q8_0>(rows),
        }
    }

    struct Ctx<'a, 'b> {
        job: &'a Job<'b>,
        r0: usize,
        /// AVX-512 VNNI tiles, else AVX2 tiles.
        vnni: bool,
    }

    impl Ctx<'_, '_> {
        fn run<const T: u8>(&self, rows: usize) {
            let mut r = 0;
            if self.job.m >= 4 {
                while r < rows {
                    self.tiles::<T, 1, 4>(r);
                    r += 1;
                }
            } else {
                while r + 2 <= rows {
                    self.tiles::<T, 2, 1>(r);
                    r += 2;
                }
            }
            while r < rows {
                self.tiles::<T, 1, 1>(r);
                r += 1;
            }
        }

        /// Rows `r..r + NR` against every activation row, `MR` at a time.
        fn tiles<const T: u8, const NR: usize, const MR: usize>(&self, r: usize) {
            let Job {
                w,
                acts,
                act_d,
                act_s,
                nb,
                m,
                ..
            } = *self.job;
            let scales = |i: usize| x86::ActScales {
                d: act_d[i * nb..].as_ptr(),
                s: act_s[i * nb..].as_ptr(),
            };
            let wp: [*const u8; NR] = std::array::from_fn(|k| w.row(self.r0 + r + k).as_ptr());
            let mut i = 0;
            while i + MR <= m {
                let x: [*const Q8Block; MR] =
                    std::array::from_fn(|k| acts[(i + k) * nb..].as_ptr());
                let xs: [x86::ActScales; MR] = std::array::from_fn(|k| scales(i + k));
                let out = self.tile::<T, NR, MR>(wp, x, xs);
                for (k, row) in out.iter().enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        self.job.store(i + j, self.r0 + r + k, v);
                    }
                }
                i += MR;
            }
            while i < m {
                let x = [acts[i * nb..].as_ptr()];
                let out = self.tile::<T, NR, 1>(wp, x, [scales(i)]);
                for (k, row) in out.iter().enumerate() {
                    self.job.store(i, self.r0 + r + k, row[0]);
                }
                i += 1;
            }
        }

        fn tile<const T: u8, const NR: usize, const MR: usize>(
            &self,
            w: [*const u8; NR],
            x: [*const Q8Block; MR],
            xs: [x86::ActScales; MR],
        ) -> [[f32; MR]; NR] {
            // SAFETY: `isa` was checked against the CPU's features; the row
            // pointers come from `QMatrix::row` (each `nb` blocks long) and the
            // activation pointers start rows of `nb` blocks inside `acts`.
            unsafe {
                if self.vnni {
                    x86::tile_vnni::<T, NR, MR>(w, x, xs, self.job.nb)
                } else {
                    x86::tile_avx2::<T, NR, MR>(w, x, xs, self.job.nb)
                }
            }
        }
    }
}
