//! Intel AMX (Advanced Matrix Extensions) tiles for the quantized matmul's
//! batched rows: one `tdpbsud` multiplies 16 activation rows by 16 weight
//! rows over a 32-weight block (8,192 multiply-adds, where a 512-bit
//! `vpdpbusd` does 64), and AVX-512 applies the block scales exactly as
//! `x86::group_vnni` does, so a row's result is the same bits on either
//! path: batched rows (AMX) and a lone decode row (VNNI) agree.
//!
//! The interleaved layout (`crate::layout`) already is AMX's "B" operand
//! format: 64-byte row `c` of a group block holds weights `4c..4c + 4` of
//! each of the 16 weight rows, row `r` in bytes `4r..4r + 4`. Q8_0 blocks
//! are read in place; Q4 nibbles are unpacked once per group into a
//! per-thread scratch of 512 bytes a block. Activation rows are the "A"
//! operand, read straight from the Q8 blocks with the row stride.
//!
//! Availability needs the CPU (CPUID AMX-TILE and AMX-INT8), the OS saving
//! tile state (XCR0) and, on Linux, the process's permission to use it
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), asked once. Tiles are configured
//! per group and released after, so an idle thread carries no tile state.
#![allow(unsafe_code)]

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use crate::layout::{GROUP, group_block_bytes, quants_offset};
use crate::quant::Q8Block;

use super::x86::{Q4_1, Q8_0, int_offset, ty};

/// Activation rows per tile (AMX's most rows per tile register).
pub const ROWS: usize = 16;

/// Fewest activation rows a matmul takes AMX for: below it the VNNI tiles
/// win. Tiles and vector work do not overlap on the hosts measured (a tile
/// multiply and store take about as long as scaling its 256 sums), so a
/// 16 x 16 block costs the sum of both and AMX gains only where the VNNI
/// path reuses each block less: on a Xeon (Emerald Rapids), one thread,
/// Q4_0, at 16 rows 0.9x, 32 rows 1.05x, 64 rows 1.13-1.26x, 256 rows
/// 1.29-1.42x; a 1B decode step of 16 sequences (weights streamed from
/// memory) 1.3x slower (BENCHMARKS.md, session 20).
pub const MIN_ROWS: usize = 64;

/// Bytes of one block's unpacked weights: 8 tile rows of 64 bytes.
const BLOCK_BYTES: usize = 8 * 64;

/// Whether this CPU and OS let the process run AMX-INT8 tiles (checked and
/// requested once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_and_os_support() && request_permission())
}

/// CPUID leaf 7 (EDX bits 24 and 25: AMX-TILE, AMX-INT8) and XCR0 bits
/// 17 and 18 (the OS manages tile configuration and data).
fn cpu_and_os_support() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    let cpu = leaf7.edx & (3 << 24) == 3 << 24;
    let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
    if !(cpu && osxsave) {
        return false;
    }
    // SAFETY: OSXSAVE is set (checked above), so `xgetbv` is available.
    let xcr0 = unsafe { xcr0() };
    xcr0 & (3 << 17) == 3 << 17
}

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE.
    unsafe { _xgetbv(0) }
}

/// Asks Linux for the tile data state (`ARCH_REQ_XCOMP_PERM`,
/// `XFEATURE_XTILEDATA`); without it the first tile load faults.
#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call reads no memory for this request;
    // the kernel clobbers rcx and r11 only.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// Other systems: not used (their permission models are not wired up).
#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    false
}

/// The 64-byte tile configuration (palette 1): tmm0-1 activations (16 rows
/// of 32 bytes), tmm2-3 weights (8 rows of 64 bytes: one block of 16 rows),
/// tmm4-5 the 16 x 16 i32 sums.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn new() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        let shapes = [(16, 32), (16, 32), (8, 64), (8, 64), (16, 64), (16, 64)];
        for (t, (rows, colsb)) in shapes.into_iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + t] = rows;
        }
        Self(c)
    }
}

/// Tiles configured on this thread; released on drop.
pub struct Tiles(());

impl Tiles {
    /// Loads the tile configuration.
    ///
    /// # Safety
    /// `available()` must have returned true.
    pub unsafe fn configure() -> Self {
        let cfg = Config::new();
        // SAFETY: AMX is usable (caller contract); `cfg` is a valid palette.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, preserves_flags))
        };
        Self(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `configure` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}

/// 64 bytes, aligned: one tile row.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    /// Unpacked Q4 weights of the group being multiplied.
    static SCRATCH: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// A group's weights in tile rows: `(pointer to block 0, bytes per block)`;
/// every block's 8 rows lie 64 bytes apart.
pub struct Weights {
    base: *const u8,
    block_stride: usize,
}

/// Runs `f` on group `g`'s weights (`nb` blocks of format `T`) as tile
/// rows: Q8_0 in place, Q4 unpacked into this thread's scratch.
///
/// # Safety
/// AVX-512 F/BW must be present; `g` must point at `nb` group blocks.
pub unsafe fn with_weights<const T: u8, R>(
    g: *const u8,
    nb: usize,
    f: impl FnOnce(&Weights) -> R,
) -> R {
    let ty = ty(T);
    let (gbb, q) = (group_block_bytes(ty), quants_offset(ty));
    if T == Q8_0 {
        // SAFETY: the quants of block 0 lie inside the group (caller).
        let base = unsafe { g.add(q) };
        return f(&Weights {
            base,
            block_stride: gbb,
        });
    }
    SCRATCH.with_borrow_mut(|s| {
        // Grown, never cleared: the unpacking overwrites every line used.
        if s.len() < nb * 8 {
            s.resize(nb * 8, Line([0; 64]));
        }
        // SAFETY: AVX-512 is present and `g` holds `nb` blocks (caller);
        // the scratch holds at least `nb` blocks of 8 lines (above).
        unsafe { unpack_q4(g, nb, gbb, q, s.as_mut_ptr().cast()) };
        f(&Weights {
            base: s.as_ptr().cast(),
            block_stride: BLOCK_BYTES,
        })
    })
}

/// Q4 nibbles of `nb` group blocks as unsigned bytes, block `b`'s chunk
/// `c` (weights `4c..4c + 4` of each row) at `out + 512b + 64c`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_q4(g: *const u8, nb: usize, gbb: usize, q: usize, out: *mut u8) {
    let m4 = _mm512_set1_epi8(0x0F);
    for b in 0..nb {
        // SAFETY: block `b` and its 512 output bytes are in bounds (caller).
        unsafe {
            let src = g.add(b * gbb + q);
            super::x86::prefetch(g.wrapping_add((b + 32) * gbb), gbb);
            let dst = out.add(b * BLOCK_BYTES);
            for l in 0..4 {
                let raw = _mm512_loadu_si512(src.add(64 * l).cast());
                _mm512_store_si512(dst.add(64 * l).cast(), _mm512_and_si512(raw, m4));
                let hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                _mm512_store_si512(dst.add(64 * (l + 4)).cast(), hi);
            }
        }
    }
}

/// 16 x 16 i32 sums of two blocks (a tile's rows, 64-byte aligned): the
/// one being scaled and the one being multiplied.
#[repr(C, align(64))]
struct Sums([[[i32; GROUP]; ROWS]; 2]);

/// Multiplies block `b`'s 16 activation rows (`a`, `a_stride` bytes apart)
/// by its weight tile rows (`bw`) in tile slot `slot` (0 or 1); `store`
/// writes the sums out.
///
/// # Safety
/// Tiles configured on this thread; `a` and `bw` point at whole tiles.
#[inline(always)]
unsafe fn multiply(slot: usize, a: *const u8, a_stride: usize, bw: *const u8) {
    macro_rules! tiles {
        ($a:literal, $b:literal, $c:literal) => {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    concat!("tileloadd ", $a, ", [{a} + {sa} * 1]"),
                    concat!("tileloadd ", $b, ", [{bw} + {s64} * 1]"),
                    concat!("tilezero ", $c),
                    concat!("tdpbsud ", $c, ", ", $a, ", ", $b),
                    a = in(reg) a,
                    sa = in(reg) a_stride,
                    bw = in(reg) bw,
                    s64 = in(reg) 64usize,
                    options(nostack, preserves_flags, readonly),
                )
            }
        };
    }
    if slot == 0 {
        tiles!("tmm0", "tmm2", "tmm4");
    } else {
        tiles!("tmm1", "tmm3", "tmm5");
    }
}

/// Stores slot `slot`'s 16 x 16 sums at `c` (64 bytes a row).
///
/// # Safety
/// Tiles configured on this thread; `c` points at 1 KiB.
#[inline(always)]
unsafe fn store(slot: usize, c: *mut i32) {
    // SAFETY: the caller's contract.
    unsafe {
        if slot == 0 {
            asm!("tilestored [{c} + {s64} * 1], tmm4", c = in(reg) c, s64 = in(reg) 64usize,
                options(nostack, preserves_flags));
        } else {
            asm!("tilestored [{c} + {s64} * 1], tmm5", c = in(reg) c, s64 = in(reg) 64usize,
                options(nostack, preserves_flags));
        }
    }
}

/// Computes `out[i * stride + lane] = dot(w[lane], x[i])` for the 16
/// activation rows `x + i * x_stride` (`i < 16`) against one 16-row
/// weight group, with the arithmetic of `x86::group_vnni` (block by block:
/// the integer sum with the integer offset added (Q4_0, Q8_0) times `d_w *
/// d_x`, then Q4_1's float offset times the activation sum), so each
/// result is bit-identical to it. The tiles of
/// block `b + 1` are issued before block `b`'s sums are scaled, so the
/// multiply's latency overlaps the vector work.
///
/// # Safety
/// Tiles must be configured on this thread (`Tiles`) and AVX-512
/// F/BW/VL and F16C present; `g` must point at `nb` group blocks of format
/// `T` and `w` at their tile rows (`with_weights`); `x + i * x_stride`
/// must start `nb` activation blocks for every `i < 16`, and `out + i *
/// stride` must hold 16 writable floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn group_amx<const T: u8>(
    g: *const u8,
    w: &Weights,
    (x, x_stride): (*const Q8Block, usize),
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let ty = ty(T);
    let gbb = group_block_bytes(ty);
    let a_stride = x_stride * size_of::<Q8Block>();
    let qs = std::mem::offset_of!(Q8Block, qs);
    let mut sums = Sums([[[0; GROUP]; ROWS]; 2]);
    let sp = sums.0.as_mut_ptr();
    // SAFETY: block `b < nb` of the activation rows and of the weight tile
    // rows is in bounds, and the tiles are configured (caller contract).
    let issue = |b: usize| unsafe {
        let a = x.add(b).cast::<u8>().add(qs);
        multiply(b & 1, a, a_stride, w.base.add(b * w.block_stride));
    };
    // SAFETY: slot `b & 1`'s sums go to their kilobyte of `sums`.
    let store = |b: usize| unsafe { store(b & 1, sp.add(b & 1).cast()) };
    let mut acc = [_mm512_setzero_ps(); ROWS];
    if nb > 0 {
        issue(0);
        store(0);
    }
    for b in 0..nb {
        if b + 1 < nb {
            issue(b + 1);
        }
        // SAFETY (the rest of the loop): block `b` of the group and of the
        // 16 activation rows is in bounds (caller contract); slot `b & 1`
        // holds its sums.
        let base = unsafe { g.add(b * gbb) };
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(base.cast()) });
        let mw = match T {
            Q4_1 => _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(base.add(2 * GROUP).cast()) }),
            _ => _mm512_setzero_ps(),
        };
        let rows = unsafe { &*sp.add(b & 1) };
        for (i, acc) in acc.iter_mut().enumerate() {
            let xb = unsafe { x.add(i * x_stride + b) };
            let off = _mm512_set1_epi32(unsafe { int_offset::<T>(xb) });
            let s = unsafe { _mm512_load_si512(rows[i].as_ptr().cast()) };
            let s = _mm512_cvtepi32_ps(_mm512_add_epi32(off, s));
            let (xd, xs) = unsafe { ((*xb).d, (*xb).s) };
            *acc = _mm512_fmadd_ps(s, _mm512_mul_ps(dw, _mm512_set1_ps(xd)), *acc);
            if T == Q4_1 {
                *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs), *acc);
            }
        }
        if b + 1 < nb {
            store(b + 1);
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        // SAFETY: row `i` of the output holds 16 floats (caller contract).
        unsafe { _mm512_storeu_ps(out.add(i * stride), a) };
    }
}
