//! x86-64 SIMD tiles for quantized matmul over the interleaved 16-row
//! layout (`crate::layout`): AVX-512 VNNI (`vpdpbusd` on 512-bit vectors,
//! one lane per weight row) and AVX2 (`maddubs` + `madd`, two 256-bit
//! halves of 8 rows). A tile computes one group of 16 weight rows against
//! `MR` activation rows, so each unpacked weight block is reused `MR` times
//! from registers. Four activation bytes are broadcast to every lane; the
//! per-row sums need no horizontal reduction. On AVX2, Q4 batches of 16 rows
//! and more with long rows take `groups_avx2`: 16 groups at a time against each
//! activation block broadcast once (`Spread`), the same floats.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::layout::{GROUP, group_block_bytes, high_offset, quants_offset};
use crate::quant::{Q8Block, QuantType};

/// `QuantType` as a const-generic tag (branches fold away per format).
pub const Q4_0: u8 = 0;
pub const Q4_1: u8 = 1;
pub const Q8_0: u8 = 2;
/// The super-block formats run `x86_k`'s AVX2 tiles, or `x86_k512`'s on
/// AVX-512 VNNI hosts.
pub const Q4K: u8 = 3;
pub const Q5K: u8 = 4;
pub const Q6K: u8 = 5;
pub const Q5_0: u8 = 6;
pub const Q5_1: u8 = 7;
pub const IQ4NL: u8 = 8;
pub const IQ4XS: u8 = 9;

/// Whether format `t` is held in super-blocks of 256 (`x86_k`'s tiles).
pub const fn super_tag(t: u8) -> bool {
    matches!(t, Q4K | Q5K | Q6K | IQ4XS)
}

/// Whether format `t` has a `group_vnni` tile (the super-block formats
/// have `x86_k512`'s).
pub const fn vnni_tag(t: u8) -> bool {
    matches!(t, Q4_0 | Q4_1 | Q8_0 | IQ4NL | Q5_0 | Q5_1)
}

/// Whether format `t` has AMX tiles (`crate::cpu::amx`).
pub const fn amx_tag(t: u8) -> bool {
    matches!(t, Q4_0 | Q4_1 | Q8_0)
}

pub(crate) const fn ty(t: u8) -> QuantType {
    match t {
        IQ4NL => QuantType::Iq4Nl,
        IQ4XS => QuantType::Iq4Xs,
        Q4_0 => QuantType::Q4_0,
        Q4_1 => QuantType::Q4_1,
        Q4K => QuantType::Q4K,
        Q5K => QuantType::Q5K,
        Q6K => QuantType::Q6K,
        Q5_0 => QuantType::Q5_0,
        Q5_1 => QuantType::Q5_1,
        _ => QuantType::Q8_0,
    }
}

/// Group blocks read ahead of the one being multiplied, into L1, when a
/// tile carries several activation rows: the hardware prefetcher alone
/// left the cores waiting on each block's first line. 8 blocks (about
/// 2.3 KiB of Q4_0) measured best on the first hosts; on a Zen 5, whose
/// tiles run about twice as fast, 8 blocks is under a memory latency
/// ahead, and 24 to 64 blocks gave 15-30% on weights streamed from memory
/// at m = 8 and 16 (BENCHMARKS.md, session 16), the same at m = 128.
const PREFETCH_BLOCKS: usize = 32;

/// Group blocks read ahead into L2 when a tile carries one or two rows (a
/// single stream's decode step, bound by memory alone): farther ahead, and
/// into L2 so the requests do not hold L1's few fill buffers. Measured
/// interleaved step by step on the 1B shape: one row 7% faster than
/// `PREFETCH_BLOCKS` into L1 (16, 32 and 64 blocks alike), two rows 3%;
/// four and eight rows were slower, so they keep the near prefetch.
const FAR_PREFETCH_BLOCKS: usize = 16;

/// Requests the weights `ahead` of the block at `base` for a tile of `mr`
/// rows (see `PREFETCH_BLOCKS` and `FAR_PREFETCH_BLOCKS`).
#[inline(always)]
pub(crate) fn prefetch_ahead(base: *const u8, gbb: usize, mr: usize) {
    if mr <= 2 {
        let p = base.wrapping_add(FAR_PREFETCH_BLOCKS * gbb);
        let mut o = 0;
        while o < gbb {
            // SAFETY: a prefetch reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(o).cast()) };
            o += 64;
        }
    } else {
        prefetch(base.wrapping_add(PREFETCH_BLOCKS * gbb), gbb);
    }
}

/// Asks for the `bytes` at `p` in L1 (a hint: never faults, whatever the
/// address, so reading ahead past the last block is harmless).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        // SAFETY: a prefetch reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast()) };
        o += 64;
    }
}

/// Four activation bytes (weights `4c..4c + 4` of a block) as one i32.
///
/// # Safety
/// `xb` must point at a valid block and `c < 8`.
#[inline(always)]
pub(crate) unsafe fn act_chunk(xb: *const Q8Block, c: usize) -> i32 {
    unsafe { (*xb).qs.as_ptr().cast::<i32>().add(c).read_unaligned() }
}

/// The integer offset of format `T`'s weights against activation block `xb`
/// (`Q8Block::off4`, `off5`, `off8`: IQ4_NL's table values are stored
/// `+ 128` as Q8_0's bytes); 0 for Q4_1 and Q5_1, whose offset is a float.
///
/// # Safety
/// `xb` must point at a valid block.
#[inline(always)]
pub(crate) unsafe fn int_offset<const T: u8>(xb: *const Q8Block) -> i32 {
    // SAFETY: `xb` is valid (caller contract).
    unsafe {
        match T {
            Q4_0 => (*xb).off4(),
            Q5_0 => (*xb).off5(),
            Q8_0 | IQ4NL => (*xb).off8,
            _ => 0,
        }
    }
}

/// Computes `out[i * stride + lane] = dot(w[lane], x[i])` for one 16-row
/// group: straight into the output rows where the group is whole (a copy
/// through an array cost a call to `memcpy` per row, 2% of a decode step).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI and F16C; `g` must point at
/// `nb` group blocks of format `T`, every `x[i]` at `nb` Q8 blocks, and
/// `out + i * stride` at 16 writable floats for every `i < MR`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn group_vnni<const T: u8, const MR: usize>(
    g: *const u8,
    x: [*const Q8Block; MR],
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let gbb = group_block_bytes(ty(T));
    let q = quants_offset(ty(T));
    // IQ4_NL: each index to its table value + 128 (an unsigned byte, as
    // Q8_0's), in every 128-bit lane.
    let table = _mm512_broadcast_i32x4(iq4_table(0x80));
    let mut acc = [_mm512_setzero_ps(); MR];
    for b in 0..nb {
        // SAFETY (whole loop body): block `b` of the group and of every
        // activation row is in bounds (caller contract).
        let base = unsafe { g.add(b * gbb) };
        prefetch_ahead(base, gbb, MR);
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(base.cast()) });
        let mw = if float_min(T) {
            _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(base.add(2 * GROUP).cast()) })
        } else {
            _mm512_setzero_ps()
        };
        let mut wv = [_mm512_setzero_si512(); 8];
        if T == Q8_0 {
            for (c, v) in wv.iter_mut().enumerate() {
                *v = unsafe { _mm512_loadu_si512(base.add(q + 64 * c).cast()) };
            }
        } else {
            wv = unsafe { nibbles512(base.add(q)) };
            if T == IQ4NL {
                wv = wv.map(|w| _mm512_shuffle_epi8(table, w));
            }
            if T == Q5_0 || T == Q5_1 {
                unsafe { add_high_bits512(&mut wv, base.add(high_offset(ty(T)))) };
            }
        }
        for (i, a) in acc.iter_mut().enumerate() {
            let xb = unsafe { x[i].add(b) };
            // Two chains of four, so the dependent `vpdpbusd`s overlap; an
            // integer offset (Q4_0, Q8_0) starts one, so the block's sum is
            // exact and needs no float term for it (see `Q8Block`).
            let mut s0 = _mm512_set1_epi32(unsafe { int_offset::<T>(xb) });
            let mut s1 = _mm512_setzero_si512();
            for c in (0..8).step_by(2) {
                let x0 = _mm512_set1_epi32(unsafe { act_chunk(xb, c) });
                let x1 = _mm512_set1_epi32(unsafe { act_chunk(xb, c + 1) });
                s0 = _mm512_dpbusd_epi32(s0, wv[c], x0);
                s1 = _mm512_dpbusd_epi32(s1, wv[c + 1], x1);
            }
            let sums = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let (xd, xs) = unsafe { ((*xb).d, (*xb).s) };
            *a = _mm512_fmadd_ps(sums, _mm512_mul_ps(dw, _mm512_set1_ps(xd)), *a);
            if float_min(T) {
                *a = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs), *a);
            }
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        // SAFETY: row `i` of the output holds 16 floats (caller contract).
        unsafe { _mm512_storeu_ps(out.add(i * stride), a) };
    }
}

/// `iquant::KVALUES`, each value `^ flip` (0x80: `+ 128`), as one 128-bit
/// `pshufb` table.
#[inline(always)]
pub(crate) fn iq4_table(flip: u8) -> __m128i {
    let b = crate::iquant::KVALUES.map(|v| v as u8 ^ flip);
    // SAFETY: SSE2 is part of every x86-64 CPU; `b` holds 16 bytes.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Maps eight chunks of 4-bit indices to IQ4's signed table values.
///
/// # Safety
/// AVX2 must be enabled.
#[inline(always)]
pub(crate) unsafe fn iq4_values(wv: &mut [__m256i; 8]) {
    unsafe {
        let t = _mm256_broadcastsi128_si256(iq4_table(0));
        for w in wv.iter_mut() {
            *w = _mm256_shuffle_epi8(t, *w);
        }
    }
}

/// The eight 4-weight chunks of one half (8 rows) of a group block, as
/// bytes `maddubs` can take: unsigned nibbles (Q4) or signed bytes (Q8_0,
/// whose `+128` is removed here, and IQ4_NL's table values; the sign is
/// moved onto the activation).
///
/// # Safety
/// AVX2 must be enabled; `base` must point at a whole group block.
#[inline(always)]
unsafe fn half_weights<const T: u8>(base: *const u8, half: usize) -> [__m256i; 8] {
    let q = quants_offset(ty(T));
    unsafe {
        if T == Q5_0 || T == Q5_1 {
            let mut wv = nibbles(base.add(q), half);
            add_high_bits(&mut wv, base.add(high_offset(ty(T))), half);
            return wv;
        }
        if T == IQ4NL {
            let mut wv = nibbles(base.add(q), half);
            iq4_values(&mut wv);
            return wv;
        }
        if T != Q8_0 {
            return nibbles(base.add(q), half);
        }
        let flip = _mm256_set1_epi8(-128);
        std::array::from_fn(|c| {
            let raw = _mm256_loadu_si256(base.add(q + 64 * c + 32 * half).cast());
            _mm256_xor_si256(raw, flip)
        })
    }
}

/// The eight 4-weight chunks of a group block's 16 rows from the four
/// nibble loads at `q` (chunk `l` the low nibbles of load `l`, `l + 4` the
/// high ones).
///
/// # Safety
/// AVX-512 F/BW must be enabled; 256 bytes at `q` must be readable.
#[inline(always)]
pub(crate) unsafe fn nibbles512(q: *const u8) -> [__m512i; 8] {
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut wv = [_mm512_setzero_si512(); 8];
        for l in 0..4 {
            let raw = _mm512_loadu_si512(q.add(64 * l).cast());
            wv[l] = _mm512_and_si512(raw, m4);
            wv[l + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
        }
        wv
    }
}

/// Adds the fifth bits of the load at `high` (bit `c` of a row's byte `k`:
/// weight `4c + k`) at bit 4 of each chunk's bytes (Q5_0, Q5_1, Q5_K).
///
/// # Safety
/// AVX-512 F/BW must be enabled; 64 bytes at `high` must be readable.
#[inline(always)]
pub(crate) unsafe fn add_high_bits512(wv: &mut [__m512i; 8], high: *const u8) {
    unsafe {
        let hb = _mm512_loadu_si512(high.cast());
        let parts = [
            _mm512_slli_epi16::<4>(hb),
            _mm512_slli_epi16::<3>(hb),
            _mm512_slli_epi16::<2>(hb),
            _mm512_slli_epi16::<1>(hb),
            hb,
            _mm512_srli_epi16::<1>(hb),
            _mm512_srli_epi16::<2>(hb),
            _mm512_srli_epi16::<3>(hb),
        ];
        let m = _mm512_set1_epi8(0x10);
        for (w, part) in wv.iter_mut().zip(parts) {
            *w = _mm512_or_si512(*w, _mm512_and_si512(part, m));
        }
    }
}

/// The eight 4-weight chunks of one half (8 rows) of four nibble loads
/// at `q` (see `crate::layout`): chunk `l` in the low nibbles of load `l`,
/// chunk `l + 4` in its high ones.
///
/// # Safety
/// AVX2 must be enabled; `q` must point at four 64-byte loads.
#[inline(always)]
pub(crate) unsafe fn nibbles(q: *const u8, half: usize) -> [__m256i; 8] {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut wv = [_mm256_setzero_si256(); 8];
        for l in 0..4 {
            let raw = _mm256_loadu_si256(q.add(64 * l + 32 * half).cast());
            wv[l] = _mm256_and_si256(raw, m4);
            wv[l + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        }
        wv
    }
}

/// Puts the fifth bits of one half's eight chunks, from the 64-byte load
/// of high bits at `high` (bit `c` of a row's byte `k`: weight `4c + k`;
/// `crate::layout`), at bit 4 of the chunks' bytes (Q5_0, Q5_1, Q5_K).
///
/// # Safety
/// AVX2 must be enabled; 64 bytes at `high` must be readable.
#[inline(always)]
pub(crate) unsafe fn add_high_bits(wv: &mut [__m256i; 8], high: *const u8, half: usize) {
    unsafe {
        let hb = _mm256_loadu_si256(high.add(32 * half).cast());
        let parts = [
            _mm256_slli_epi16::<4>(hb),
            _mm256_slli_epi16::<3>(hb),
            _mm256_slli_epi16::<2>(hb),
            _mm256_slli_epi16::<1>(hb),
            hb,
            _mm256_srli_epi16::<1>(hb),
            _mm256_srli_epi16::<2>(hb),
            _mm256_srli_epi16::<3>(hb),
        ];
        let m = _mm256_set1_epi8(0x10);
        for (w, part) in wv.iter_mut().zip(parts) {
            *w = _mm256_or_si256(*w, _mm256_and_si256(part, m));
        }
    }
}

/// The integer dot products of one half block's eight rows with one
/// activation block, whose eight 4-byte chunks `xc(c)` gives broadcast to
/// every lane and whose integer offset (`int_offset`) `off` holds in every
/// lane. Q4 pairs (`maddubs` of a nibble and an 8-bit activation: at most
/// 2 * 15 * 127 = 3810) are summed as 16-bit lanes over the whole block, 8
/// pairs a lane (at most 30480, under `i16::MAX`, so exact), and widened
/// once: 8 `maddubs` and one `madd` instead of 8 of each. Q8_0's pairs
/// reach 32512 (IQ4's, whose signed table values are multiplied as
/// Q8_0's, 32258), so they are widened chunk by chunk. The sums are those of
/// the signed weights, `sum (u - k) x`, as on the VNNI path: Q8_0's weights
/// are signed here already (it returns before the offset), Q4_0's offset is
/// added as an integer (Q4_1's is 0 here, a float added later). Five-bit
/// weights (Q5_0, Q5_1, Q5_K) are summed four chunks at a time (eight
/// products of at most 31 * 127: 31496) and widened twice. `ones` is the
/// `madd` multiplier of each row: 1, or a K-quant's sub-block scale (at
/// most 2 * 31496 * 63 a lane).
///
/// # Safety
/// AVX2 must be enabled.
#[inline(always)]
pub(crate) unsafe fn half_sums<const T: u8>(
    wv: &[__m256i; 8],
    xc: impl Fn(usize) -> __m256i,
    off: __m256i,
    ones: __m256i,
) -> __m256i {
    // SAFETY (whole body): AVX2 is enabled (caller contract).
    unsafe {
        if T == Q8_0 || T == IQ4NL {
            let mut s = _mm256_setzero_si256();
            for (c, &w) in wv.iter().enumerate() {
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xc(c), w));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
            }
            return s;
        }
        if T == Q5_0 || T == Q5_1 || T == Q5K {
            let four = |c: usize| {
                let p0 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(wv[c], xc(c)),
                    _mm256_maddubs_epi16(wv[c + 1], xc(c + 1)),
                );
                let p1 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(wv[c + 2], xc(c + 2)),
                    _mm256_maddubs_epi16(wv[c + 3], xc(c + 3)),
                );
                _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones)
            };
            return _mm256_add_epi32(_mm256_add_epi32(four(0), four(4)), off);
        }
        // Two chains of four, so the dependent adds overlap.
        let mut p0 = _mm256_maddubs_epi16(wv[0], xc(0));
        let mut p1 = _mm256_maddubs_epi16(wv[1], xc(1));
        for c in (2..8).step_by(2) {
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(wv[c], xc(c)));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(wv[c + 1], xc(c + 1)));
        }
        let s = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones);
        _mm256_add_epi32(s, off)
    }
}

/// Whether format `T`'s offset is an f16 min added in float (Q4_1, Q5_1).
const fn float_min(t: u8) -> bool {
    t == Q4_1 || t == Q5_1
}

/// The AVX2 version of `group_vnni`, and the tile Q5_0 and Q5_1 take on
/// every SIMD path.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `g` must point at `nb` group
/// blocks of format `T`, every `x[i]` at `nb` Q8 blocks, and
/// `out + i * stride` at 16 writable floats for every `i < MR`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn group_avx2<const T: u8, const MR: usize>(
    g: *const u8,
    x: [*const Q8Block; MR],
    nb: usize,
    (out, stride): (*mut f32, usize),
) {
    let gbb = group_block_bytes(ty(T));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for b in 0..nb {
        // SAFETY (whole loop body): block `b` of the group and of every
        // activation row is in bounds (caller contract).
        let base = unsafe { g.add(b * gbb) };
        prefetch_ahead(base, gbb, MR);
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base.add(16 * h).cast()) });
            let mw = if float_min(T) {
                _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base.add(2 * GROUP + 16 * h).cast()) })
            } else {
                _mm256_setzero_ps()
            };
            let wv = unsafe { half_weights::<T>(base, h) };
            for (i, a) in acc.iter_mut().enumerate() {
                let xb = unsafe { x[i].add(b) };
                // SAFETY: `xb` is a valid block and `c < 8`.
                let xc = |c| _mm256_set1_epi32(unsafe { act_chunk(xb, c) });
                let off = _mm256_set1_epi32(unsafe { int_offset::<T>(xb) });
                let s = unsafe { half_sums::<T>(&wv, xc, off, ones) };
                let (xd, xs) = unsafe { ((*xb).d, (*xb).s) };
                let sums = _mm256_cvtepi32_ps(s);
                a[h] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dw, _mm256_set1_ps(xd)), a[h]);
                if float_min(T) {
                    a[h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs), a[h]);
                }
            }
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        // SAFETY: row `i` of the output holds 16 floats (caller contract).
        unsafe {
            _mm256_storeu_ps(out.add(i * stride), a[0]);
            _mm256_storeu_ps(out.add(i * stride + 8), a[1]);
        }
    }
}

/// One activation block laid out for `groups_avx2`: each 4-byte chunk
/// broadcast to the eight lanes, the integer offset and the two scales
/// likewise, so the tile reads them as memory operands of its `maddubs`,
/// adds and multiplies instead of broadcasting them again for every half
/// block of every group (LLVM's Zen 3 model puts a broadcast from memory
/// on a shuffle pipe: 10 of the 30 vector operations per row and half
/// block; alone on Zen 4 the loop ran 6.6 cycles so against 7.7).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Spread {
    chunks: [__m256i; 8],
    off: __m256i,
    d: __m256,
    s: __m256,
}

/// `xb` spread (see `Spread`).
///
/// # Safety
/// AVX2 must be enabled; `xb` must point at a valid block.
#[inline(always)]
unsafe fn spread<const T: u8>(xb: *const Q8Block) -> Spread {
    // SAFETY: AVX2 is enabled and `xb` is valid (caller contract); `c < 8`.
    unsafe {
        Spread {
            chunks: std::array::from_fn(|c| _mm256_set1_epi32(act_chunk(xb, c))),
            off: _mm256_set1_epi32(int_offset::<T>(xb)),
            d: _mm256_set1_ps((*xb).d),
            s: _mm256_set1_ps((*xb).s),
        }
    }
}

/// `group_avx2` for `groups` consecutive weight groups at once, over the
/// blocks `blocks` of their rows: each activation block is spread once
/// (`Spread`) and serves every group's two half blocks. Adds
/// `dot(w[g * 16 + lane], x[i])` over those blocks to
/// `acc[(g * MR + i) * 16 + lane]`, block by block in order, with the same
/// float operations as `group_avx2`, so the bits are the same.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must point at `groups`
/// consecutive groups of `nb` blocks of format `T`, every `x[i]` at `nb`
/// Q8 blocks, `blocks` must lie in `0..nb`, and `acc` must point at
/// `groups * MR * 16` writable floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn groups_avx2<const T: u8, const MR: usize>(
    (w, groups, nb): (*const u8, usize, usize),
    blocks: std::ops::Range<usize>,
    x: [*const Q8Block; MR],
    acc: *mut f32,
) {
    let gbb = group_block_bytes(ty(T));
    let ones = _mm256_set1_epi16(1);
    // SAFETY: all-zero bits are a valid `Spread` (vectors of zeros).
    let mut sp: [Spread; MR] = unsafe { std::mem::zeroed() };
    for b in blocks {
        for (s, xi) in sp.iter_mut().zip(x) {
            // SAFETY: block `b` of every activation row is valid.
            *s = unsafe { spread::<T>(xi.add(b)) };
        }
        for g in 0..groups {
            // SAFETY (whole loop body): block `b` of group `g` is in bounds
            // and `acc` holds `groups * MR * 16` floats (caller contract).
            // No software prefetch: the hardware follows the 16 streams, and
            // `prefetch_ahead` here measured the same or slower.
            let base = unsafe { w.add((g * nb + b) * gbb) };
            for h in 0..2 {
                let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(base.add(16 * h).cast()) });
                let mw = match T {
                    Q4_1 => _mm256_cvtph_ps(unsafe {
                        _mm_loadu_si128(base.add(2 * GROUP + 16 * h).cast())
                    }),
                    _ => _mm256_setzero_ps(),
                };
                let wv = unsafe { half_weights::<T>(base, h) };
                for (i, s) in sp.iter().enumerate() {
                    let sums = unsafe { half_sums::<T>(&wv, |c| s.chunks[c], s.off, ones) };
                    let a = unsafe { acc.add((g * MR + i) * GROUP + 8 * h) };
                    let prev = unsafe { _mm256_loadu_ps(a) };
                    let mut v =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, s.d), prev);
                    if T == Q4_1 {
                        v = _mm256_fmadd_ps(mw, s.s, v);
                    }
                    unsafe { _mm256_storeu_ps(a, v) };
                }
            }
        }
    }
}

/// `quant::quantize_block_q8_at` with AVX2: the same arithmetic (max of
/// magnitudes and `floor`, `d = amax / 127`, round half away from zero),
/// so the result is bit-identical to the portable version.
///
/// # Safety
/// The CPU must support AVX2; `b` must hold 32 floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_block_avx2(b: &[f32], floor: f32) -> Q8Block {
    assert!(b.len() >= 32, "a block is 32 values");
    // SAFETY: 32 floats are readable (checked above).
    let v: [__m256; 4] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(b.as_ptr().add(8 * k)) });
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for &x in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1))).max(floor);
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let half = _mm256_set1_ps(0.5);
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        let t = _mm256_mul_ps(v[k], id);
        let r = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign)));
        _mm256_cvttps_epi32(r)
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s4 = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
    // i32 -> i16 -> i8 with saturation (values are within ±127), then undo
    // the lane interleaving of the 256-bit packs.
    let p16a = _mm256_packs_epi32(q[0], q[1]);
    let p16b = _mm256_packs_epi32(q[2], q[3]);
    let p8 = _mm256_packs_epi16(p16a, p16b);
    let ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut qs = [0i8; 32];
    // SAFETY: `qs` holds 32 bytes.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), ordered) };
    Q8Block::new(d, total, qs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_block_q8_at;

    #[test]
    fn simd_quantization_is_bit_identical_to_the_portable_one() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut blocks: Vec<Vec<f32>> = vec![vec![0.0; 32], vec![-3.5; 32]];
        // Ties at .5 after scaling, mixed signs, and pseudo-random values.
        blocks.push(
            (0..32)
                .map(|i| (i as f32 - 16.0) * 127.0 / 16.0 / 2.0)
                .collect(),
        );
        for seed in 0..200u32 {
            blocks.push(
                (0..32)
                    .map(|i| ((seed * 7919 + i * 104_729) % 2003) as f32 / 1001.0 - 1.0)
                    .collect(),
            );
        }
        for b in &blocks {
            // SAFETY: AVX2 is present (checked above); `b` has 32 values.
            for floor in [0.0, 2.5] {
                let got = unsafe { quantize_block_avx2(b, floor) };
                assert_eq!(got, quantize_block_q8_at(b, floor), "{b:?}");
            }
        }
    }
}
