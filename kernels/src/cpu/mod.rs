//! Quantized matrix multiplication on the CPU: `y = x · Wᵀ` for activation
//! rows `x` (f32, quantized to Q8 on the fly) and a quantized weight matrix
//! `W` in the interleaved 16-row layout (`crate::layout`). Groups of 16
//! weight rows are split across threads (rayon); within a thread, SIMD
//! tiles reuse each unpacked weight block for up to 8 activation rows, so a
//! batched step reads each weight once.
//!
//! The instruction set is picked once at run time: AMX-INT8 tiles for
//! batches of `amx::MIN_ROWS` rows and more (AVX-512 VNNI for the rest
//! and smaller batches, with the same bits), then
//! AVX-512 VNNI, then AVX2+FMA+F16C, then portable scalar code. The
//! super-block formats (Q4_K, Q5_K, Q6_K, IQ4_XS) have their own tiles
//! (`x86_k512` on VNNI, `x86_k` on AVX2); AMX tiles exist for Q4_0, Q4_1
//! and Q8_0 only, the other formats running their VNNI tiles there.
//! `SYNOR_KERNELS=scalar|avx2|vnni` forces a lower path (for tests and
//! comparisons).

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod backend;
pub mod bidirectional;
pub mod dense;
pub mod kv;
pub mod membw;
pub mod ops;
pub mod paged;
pub mod pages;
pub mod scalar;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub mod wasm;
#[cfg(target_arch = "x86_64")]
pub mod x86;
#[cfg(target_arch = "x86_64")]
pub mod x86_k;
#[cfg(target_arch = "x86_64")]
pub mod x86_k512;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::layout::GROUP;
use crate::quant::{KernelError, Q8Block, QK, QMatrix, QuantType, amax, quantize_block_q8_at};

/// Asks for the memory of `s` in L1 ahead of its use (a hint: reads
/// nothing, never faults; a no-op off x86-64).
#[inline(always)]
pub fn prefetch_slice<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch(s.as_ptr().cast(), std::mem::size_of_val(s));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

/// The SIMD path in use. On WebAssembly built with `+simd128`, `Scalar`'s
/// 32-weight formats run `wasm`'s vectors (the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
    /// AVX-512 VNNI with AMX-INT8 tiles for batched rows (bit-identical).
    Amx,
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
                Ok("vnni") if best >= Self::Avx512Vnni => Self::Avx512Vnni,
                _ => best,
            }
        })
    }

    /// Every path this CPU can run (for tests).
    pub fn all_supported() -> Vec<Self> {
        let best = Self::best_supported();
        [Self::Scalar, Self::Avx2, Self::Avx512Vnni, Self::Amx]
            .into_iter()
            .filter(|&i| i <= best)
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    fn best_supported() -> Self {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
        if avx2 && vnni && amx::available() {
            Self::Amx
        } else if avx2 && vnni {
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

/// Multiply-accumulates per parallel task: enough work to amortize the
/// scheduling (about a few microseconds).
const MACS_PER_TASK: usize = 1 << 19;

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
    matmul_many_with(isa, &mut [Product { w, x, m, out }])
}

/// One product of `matmul_many`: `out = x · wᵀ` for `m` rows of `x`.
pub struct Product<'a> {
    pub w: &'a QMatrix,
    pub x: &'a [f32],
    pub m: usize,
    pub out: &'a mut [f32],
}

/// Several `matmul`s in one parallel loop: the weight groups of all the
/// products are the loop's tasks, so the threads meet once, not once per
/// product. A mixture-of-experts layer runs every chosen expert's
/// projection this way (llama.cpp's `mul_mat_id`): tens of small matrices
/// a step, each too small to keep two threads busy on its own. Each
/// product's result is bit for bit `matmul`'s.
pub fn matmul_many(products: &mut [Product<'_>]) -> Result<(), KernelError> {
    matmul_many_with(Isa::detect(), products)
}

/// `matmul_many` on a chosen instruction set (falls back to scalar if
/// unsupported).
pub fn matmul_many_with(isa: Isa, products: &mut [Product<'_>]) -> Result<(), KernelError> {
    for p in products.iter() {
        check_product(p)?;
    }
    let isa = if Isa::all_supported().contains(&isa) {
        isa
    } else {
        Isa::Scalar
    };
    let acts: Vec<Vec<Q8Block>> = products
        .iter()
        .map(|p| {
            let nb = p.w.blocks_per_row();
            quantize_rows(isa, p.x, (nb, act_stride(nb), p.w.ty.act_span()))
        })
        .collect();
    let jobs: Vec<Job<'_>> = products
        .iter_mut()
        .zip(&acts)
        .map(|(p, acts)| {
            let nb = p.w.blocks_per_row();
            Job {
                isa,
                w: p.w,
                acts,
                nb,
                stride: act_stride(nb),
                m: p.m,
                out: OutPtr(p.out.as_mut_ptr()),
            }
        })
        .collect();
    tasks(&jobs)
        .into_par_iter()
        .for_each(|(j, g0, g1)| jobs[j].groups(g0, g1));
    Ok(())
}

/// Checks one product's activations and output against its weights.
fn check_product(p: &Product<'_>) -> Result<(), KernelError> {
    if p.x.len() != p.m * p.w.cols {
        return Err(KernelError::Shape {
            what: "activations",
            expected: p.m * p.w.cols,
            got: p.x.len(),
        });
    }
    if p.out.len() != p.m * p.w.rows {
        return Err(KernelError::Shape {
            what: "output",
            expected: p.m * p.w.rows,
            got: p.out.len(),
        });
    }
    Ok(())
}

/// The parallel loop's tasks, `(job, first group, end group)`: each job's
/// groups in runs of about `MACS_PER_TASK` of work, but at least four
/// tasks per thread over all the jobs when there are enough groups (work
/// stealing evens them out). A job with no rows has none.
fn tasks(jobs: &[Job<'_>]) -> Vec<(usize, usize, usize)> {
    let live = || jobs.iter().enumerate().filter(|(_, j)| j.m > 0);
    let all_groups: usize = live().map(|(_, j)| j.w.groups()).sum();
    let balanced = all_groups.div_ceil(4 * rayon::current_num_threads()).max(1);
    let mut tasks = Vec::new();
    for (i, job) in live() {
        let groups = job.w.groups();
        let per_task = if job.spread() {
            SPREAD_GROUPS.min(balanced)
        } else {
            let macs_per_group = (job.m * job.w.cols * GROUP).max(1);
            (MACS_PER_TASK / macs_per_group).clamp(1, balanced)
        };
        tasks.extend(
            (0..groups)
                .step_by(per_task)
                .map(|g0| (i, g0, (g0 + per_task).min(groups))),
        );
    }
    tasks
}

/// One Q8 block, with SIMD where the chosen path has it (`floor`: see
/// `quant::quantize_block_q8_at`).
fn quantize_block(isa: Isa, b: &[f32], floor: f32) -> Q8Block {
    match isa {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: `isa` was checked against the CPU's features; `b` holds
        // one 32-value block.
        Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx => unsafe { x86::quantize_block_avx2(b, floor) },
        _ => quantize_block_q8_at(b, floor),
    }
}

/// Blocks from one quantized activation row to the next: `nb`, or one more
/// where `nb` blocks are a multiple of 4 KiB. Rows 4 KiB apart fall in the
/// same L1 sets, and a tile's 8 rows and the weights then overflow the
/// cache's ways: the down projection of the 1B shape (8,192 columns, rows
/// 12 KiB apart) ran 12-15% slower on a Zen 4 (BENCHMARKS.md, session 21).
fn act_stride(nb: usize) -> usize {
    if (nb * size_of::<Q8Block>()).is_multiple_of(4096) {
        nb + 1
    } else {
        nb
    }
}

/// The activations as Q8 blocks, `nb` per row `stride` apart (the padding
/// blocks are never read), every `span` values sharing a scale
/// (`QuantType::act_span`); large batches are quantized in parallel.
fn quantize_rows(isa: Isa, x: &[f32], (nb, stride, span): (usize, usize, usize)) -> Vec<Q8Block> {
    let cols = nb * QK;
    let rows = x.len() / cols;
    let mut acts = vec![Q8Block::new(0.0, 0, [0; QK]); rows * stride];
    let row = |(a, xr): (&mut [Q8Block], &[f32])| {
        for (a, xs) in a.chunks_mut(span / QK).zip(xr.chunks_exact(span)) {
            let floor = if span > QK { amax(xs) } else { 0.0 };
            for (blk, xb) in a.iter_mut().zip(xs.chunks_exact(QK)) {
                *blk = quantize_block(isa, xb, floor);
            }
        }
    };
    if x.len() < 16 * 1024 {
        acts.chunks_mut(stride).zip(x.chunks(cols)).for_each(row);
    } else {
        acts.par_chunks_mut(stride)
            .zip(x.par_chunks(cols))
            .for_each(row);
    }
    acts
}

/// Activation rows from which the AVX2 path takes several groups at a time
/// (`x86::groups_avx2`). It pays where a span of weights serves two tiles
/// or more, read from L2 the second time: on a Zen 4 held to AVX2, 1B
/// shapes at 16 rows 4-10% faster and at 128 rows 5-12%, but at 8 rows
/// (one tile, the weights streamed from memory in 16 streams at once)
/// 2-8% slower than group by group (BENCHMARKS.md, session 22).
const SPREAD_MIN_ROWS: usize = 16;

/// Blocks per row from which the multi-group AVX2 path is taken: with
/// SmolLM2's short rows (18 and 48 blocks) a 16-sequence decode step ran
/// 8% slower on it (a spread serves fewer groups there, and the tasks are
/// small); the 1B shapes have 64 and 256.
const SPREAD_MIN_BLOCKS: usize = 64;

/// Groups that share one spread of the activations (`x86::Spread`): their
/// accumulators for a tile of 8 rows (8 KiB) stay in L1.
const SPREAD_GROUPS: usize = 16;

/// Bytes of weights the multi-group AVX2 path reads for every tile of
/// activation rows before moving on to the next blocks: kept in L2 (512 KiB
/// on Zen 3), as each tile reads them again.
#[cfg(target_arch = "x86_64")]
const SPREAD_WEIGHT_BYTES: usize = 160 * 1024;

/// The output buffer, shared by the tasks of one matmul. Each task writes
/// only the columns (weight rows) of its own groups, so no element is
/// written twice.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `Job::store`), and the buffer
// outlives the parallel loop (it is borrowed mutably by `matmul_many_with`).
#[allow(unsafe_code)]
unsafe impl Send for OutPtr {}
#[allow(unsafe_code)]
unsafe impl Sync for OutPtr {}

/// One matmul call: the weights, the quantized activations and the path.
struct Job<'a> {
    isa: Isa,
    w: &'a QMatrix,
    acts: &'a [Q8Block],
    /// Blocks per row.
    nb: usize,
    /// Blocks from one activation row to the next (`act_stride`).
    stride: usize,
    /// Activation rows.
    m: usize,
    /// `m x w.rows` output, row-major.
    out: OutPtr,
}

impl Job<'_> {
    /// Whether this job takes the multi-group AVX2 path (`x86::groups_avx2`).
    fn spread(&self) -> bool {
        // Q8_0's sums move each activation's sign by the weight's
        // (`_mm256_sign_epi8`), an operation per chunk either way: 10%
        // slower on SmolLM2's Q8_0 lm_head at 16 rows, so it stays group
        // by group; the K-quants have tiles of their own (`x86_k`).
        cfg!(target_arch = "x86_64")
            && self.isa == Isa::Avx2
            && self.m >= SPREAD_MIN_ROWS
            && self.nb >= SPREAD_MIN_BLOCKS
            && matches!(self.w.ty, QuantType::Q4_0 | QuantType::Q4_1)
    }

    /// Computes groups `g0..g1` against every activation row.
    fn groups(&self, g0: usize, g1: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.spread() {
            return simd::spread_groups(self, g0, g1);
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if wasm::supports(self.w.ty) {
            return self.wasm_groups(g0, g1);
        }
        for g in g0..g1 {
            self.group(g);
        }
    }

    /// Computes the 16 weight rows of group `g` against every activation row.
    fn group(&self, g: usize) {
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx => simd::group(self, g),
            _ => {
                for i in 0..self.m {
                    let acts = &self.acts[i * self.stride..][..self.nb];
                    let sums = scalar::dot_group(self.w.ty, self.w.group(g), acts);
                    self.store(i, g, &sums);
                }
            }
        }
    }

    /// `groups` on WebAssembly SIMD128 (`wasm`): each tile of activation
    /// rows is spread once, then meets every group of the run.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    fn wasm_groups(&self, g0: usize, g1: usize) {
        for i0 in (0..self.m).step_by(wasm::TILE) {
            let rows = i0..self.m.min(i0 + wasm::TILE);
            let x: Vec<&[Q8Block]> = rows
                .clone()
                .map(|i| &self.acts[i * self.stride..][..self.nb])
                .collect();
            let spreads: Vec<Vec<wasm::Spread>> = x
                .iter()
                .map(|r| r.iter().map(wasm::spread).collect())
                .collect();
            let spreads: Vec<&[wasm::Spread]> = spreads.iter().map(Vec::as_slice).collect();
            let mut sums = vec![[0.0; GROUP]; x.len()];
            for g in g0..g1 {
                wasm::dot_group_rows(self.w.ty, self.w.group(g), &x, &spreads, &mut sums);
                for (i, s) in rows.clone().zip(&sums) {
                    self.store(i, g, s);
                }
            }
        }
    }

    /// Writes the results of group `g` for activation row `i` (the padding
    /// lanes of a last, partial group are dropped).
    #[allow(unsafe_code)]
    fn store(&self, i: usize, g: usize, sums: &[f32; GROUP]) {
        let r0 = g * GROUP;
        let n = GROUP.min(self.w.rows - r0);
        assert!(i < self.m, "output row out of range");
        // SAFETY: `i < m` and `r0 + n <= rows`, so the `n` elements starting
        // at `i * rows + r0` lie in the `m x rows` buffer; group `g` belongs
        // to exactly one task, so no two threads write the same element.
        unsafe {
            let dst = self.out.0.add(i * self.w.rows + r0);
            if n == GROUP {
                // A constant length: two vector moves, not a call to `memcpy`.
                std::ptr::copy_nonoverlapping(sums.as_ptr(), dst, GROUP);
            } else {
                std::ptr::copy_nonoverlapping(sums.as_ptr(), dst, n);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Walks the activation rows of one weight group in SIMD tiles.
    #![allow(unsafe_code)]

    use super::x86::{self, IQ4NL, IQ4XS, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
    use super::{GROUP, Isa, Job, Q8Block, SPREAD_WEIGHT_BYTES, amx};
    use crate::layout;
    use crate::quant::QuantType;

    /// Group `g` against every activation row. Only called with
    /// `Isa::Avx2`, `Isa::Avx512Vnni` or `Isa::Amx` (checked by the caller).
    pub fn group(job: &Job<'_>, g: usize) {
        match job.w.ty {
            QuantType::Q4_0 => run::<Q4_0>(job, g),
            QuantType::Q4_1 => run::<Q4_1>(job, g),
            QuantType::Q8_0 => run::<Q8_0>(job, g),
            QuantType::Q4K => run::<Q4K>(job, g),
            QuantType::Q5K => run::<Q5K>(job, g),
            QuantType::Q6K => run::<Q6K>(job, g),
            QuantType::Q5_0 => run::<Q5_0>(job, g),
            QuantType::Q5_1 => run::<Q5_1>(job, g),
            QuantType::Iq4Nl => run::<IQ4NL>(job, g),
            QuantType::Iq4Xs => run::<IQ4XS>(job, g),
        }
    }

    fn run<const T: u8>(job: &Job<'_>, g: usize) {
        let mut i = 0;
        if job.isa == Isa::Amx && job.m >= amx::MIN_ROWS && x86::amx_tag(T) {
            i = amx_rows::<T>(job, g);
        }
        run_from::<T>(job, g, i);
    }

    /// Activation rows `i..m` against group `g`, in tiles of 8, 4, 2 and 1.
    fn run_from<const T: u8>(job: &Job<'_>, g: usize, mut i: usize) {
        while i < job.m {
            i += match job.m - i {
                n if n >= 8 => tile::<T, 8>(job, g, i),
                n if n >= 4 => tile::<T, 4>(job, g, i),
                n if n >= 2 => tile::<T, 2>(job, g, i),
                _ => tile::<T, 1>(job, g, i),
            };
        }
    }

    /// Groups `g0..g1` against every activation row on the multi-group AVX2
    /// path (Q4_0 and Q4_1; see `Job::spread`, which keeps Q8_0 off it):
    /// rows in tiles of 8 and 4 against all the task's groups at a time
    /// (`x86::groups_avx2`), the last `m % 4` rows group by group.
    pub fn spread_groups(job: &Job<'_>, g0: usize, g1: usize) {
        match job.w.ty {
            QuantType::Q4_0 => spread_run::<Q4_0>(job, g0, g1),
            QuantType::Q4_1 => spread_run::<Q4_1>(job, g0, g1),
            QuantType::Q8_0
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::Iq4Nl
            | QuantType::Iq4Xs => (g0..g1).for_each(|g| group(job, g)),
        }
    }

    /// Groups `g0..g1` (at most `SPREAD_GROUPS`) on the multi-group path:
    /// the blocks in spans whose weights stay in L2 (`SPREAD_WEIGHT_BYTES`),
    /// each span against every tile of rows, the accumulators of all rows
    /// kept between spans.
    fn spread_run<const T: u8>(job: &Job<'_>, g0: usize, g1: usize) {
        let (nb, n) = (job.nb, g1 - g0);
        let rows = job.m - job.m % 4;
        let span = SPREAD_WEIGHT_BYTES / (n * layout::group_block_bytes(x86::ty(T)));
        let span = span.clamp(8, nb.max(8));
        let mut acc = vec![0.0f32; rows * n * GROUP];
        for b0 in (0..nb).step_by(span) {
            let blocks = b0..(b0 + span).min(nb);
            let mut i = 0;
            while i < rows {
                i += match rows - i {
                    n if n >= 8 => spread_tile::<T, 8>(job, g0..g1, i, blocks.clone(), &mut acc),
                    _ => spread_tile::<T, 4>(job, g0..g1, i, blocks.clone(), &mut acc),
                };
            }
        }
        store_spread(job, g0..g1, rows, &acc);
        for g in g0..g1 {
            run_from::<T>(job, g, rows);
        }
    }

    /// Writes the accumulators of `spread_run` (tiles of 8 rows, then one
    /// of 4: each `[group][row][16]`) into the output.
    fn store_spread(job: &Job<'_>, gs: std::ops::Range<usize>, rows: usize, acc: &[f32]) {
        let n = gs.len();
        let mut i = 0;
        while i < rows {
            let mr = if rows - i >= 8 { 8 } else { 4 };
            let tile = &acc[i * n * GROUP..][..mr * n * GROUP];
            for (g, sums) in gs.clone().zip(tile.chunks_exact(mr * GROUP)) {
                for (k, row) in sums.chunks_exact(GROUP).enumerate() {
                    job.store(i + k, g, row.try_into().expect("16 floats"));
                }
            }
            i += mr;
        }
    }

    /// Activation rows `i..i + MR` against groups `gs` over `blocks`, added
    /// to the tile's accumulators in `acc`; returns `MR`.
    fn spread_tile<const T: u8, const MR: usize>(
        job: &Job<'_>,
        gs: std::ops::Range<usize>,
        i: usize,
        blocks: std::ops::Range<usize>,
        acc: &mut [f32],
    ) -> usize {
        let n = gs.len();
        let acc = &mut acc[i * n * GROUP..][..MR * n * GROUP];
        let x: [*const Q8Block; MR] =
            std::array::from_fn(|k| job.acts[(i + k) * job.stride..].as_ptr());
        let w = job.w.group(gs.start).as_ptr();
        // SAFETY: `isa` is `Avx2`, checked against the CPU's features; `w`
        // starts `n` consecutive groups of `nb` blocks of format `T` (the
        // groups of one matrix are stored one after another); `blocks` lie
        // in `0..nb`; each `x[k]` starts a row of `nb` activation blocks
        // inside `acts`; `acc` holds `n * MR * 16` floats.
        unsafe { x86::groups_avx2::<T, MR>((w, n, job.nb), blocks, x, acc.as_mut_ptr()) };
        MR
    }

    /// Activation rows `i..i + MR` against group `g`; returns `MR`.
    fn tile<const T: u8, const MR: usize>(job: &Job<'_>, g: usize, i: usize) -> usize {
        let nb = job.nb;
        let w = job.w.group(g);
        let x: [*const Q8Block; MR] =
            std::array::from_fn(|k| job.acts[(i + k) * job.stride..].as_ptr());
        // SAFETY: `isa` was checked against the CPU's features; `w` holds
        // `nb` group blocks of format `T` and each `x[k]` starts a row of
        // `nb` activation blocks inside `acts`; `out` points at 16 floats
        // for each of the rows i + k < m (`run` keeps i + MR <= m), which
        // only this task's group writes (`with_out`).
        with_out::<MR>(job, g, i, |out| unsafe {
            if x86::super_tag(T) && job.isa >= Isa::Avx512Vnni {
                super::x86_k512::group_k_vnni::<T, MR>(w.as_ptr(), x, nb, out)
            } else if x86::super_tag(T) {
                super::x86_k::group_k_avx2::<T, MR>(w.as_ptr(), x, nb, out)
            } else if x86::vnni_tag(T) && job.isa >= Isa::Avx512Vnni {
                x86::group_vnni::<T, MR>(w.as_ptr(), x, nb, out)
            } else {
                x86::group_avx2::<T, MR>(w.as_ptr(), x, nb, out)
            }
        });
        MR
    }

    /// Runs `f` on where the results of group `g` for activation rows
    /// `i..i + R` go, as (first row's 16 floats, floats from row to row):
    /// straight into the output (columns r0..r0 + 16 of rows i..i + R of
    /// the `m x rows` output) where the group is whole, else through a
    /// buffer whose padding lanes `Job::store` drops.
    fn with_out<const R: usize>(
        job: &Job<'_>,
        g: usize,
        i: usize,
        f: impl FnOnce((*mut f32, usize)),
    ) {
        let rows = job.w.rows;
        let r0 = g * GROUP;
        assert!(i + R <= job.m, "output rows out of range");
        if r0 + GROUP <= rows {
            f((job.out.0.wrapping_add(i * rows + r0), rows));
            return;
        }
        let mut part = [[0.0f32; GROUP]; R];
        f((part.as_mut_ptr().cast::<f32>(), GROUP));
        for (k, sums) in part.iter().enumerate() {
            job.store(i + k, g, sums);
        }
    }

    /// The first `16 * (m / 16)` activation rows against group `g` in AMX
    /// tiles (the group's weights unpacked once for all of them); returns
    /// how many rows it did.
    fn amx_rows<const T: u8>(job: &Job<'_>, g: usize) -> usize {
        let nb = job.nb;
        let w = job.w.group(g);
        let tiles = job.m / amx::ROWS;
        // SAFETY: `isa` is `Amx`, checked against the CPU and OS; `w` holds
        // `nb` group blocks of format `T`; each tile's activation rows
        // i..i + 16 <= m start rows of `nb` blocks in `acts`, `stride` apart;
        // `out` points at 16 floats for each of those rows, which only this
        // task's group writes (`with_out`).
        unsafe {
            let _tiles = amx::Tiles::configure();
            amx::with_weights::<T, _>(w.as_ptr(), nb, |wt| {
                for i in (0..tiles * amx::ROWS).step_by(amx::ROWS) {
                    let x = (job.acts[i * job.stride..].as_ptr(), job.stride);
                    with_out::<{ amx::ROWS }>(job, g, i, |out| {
                        amx::group_amx::<T>(w.as_ptr(), wt, x, nb, out)
                    });
                }
            })
        }
        tiles * amx::ROWS
    }
}
