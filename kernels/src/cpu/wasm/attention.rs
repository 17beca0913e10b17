//! Attention's score dot products and weighted sums in WebAssembly
//! SIMD128, with the floats of the portable loops in `cpu::attention`
//! (which are the x86 loops' floats): fused multiply-adds made exact by
//! `super::fma`, four values of a key or value row at a time.

use core::arch::wasm32::*;

use super::{f16_bits_to_f32, fma, lanes};
use crate::cpu::attention::KvRows;

/// `q · keys[j]` in the eight-lane order of `attention::dot` (`hd` a
/// multiple of 8); `None` where a Q8_0 scale group is not a multiple of 4
/// values (the portable loop takes those).
pub fn dot(q: &[f32], keys: KvRows<'_>, j: usize, hd: usize) -> Option<f32> {
    if !four_at_a_time(keys) || q.len() < hd || !hd.is_multiple_of(8) {
        return None;
    }
    let (mut lo, mut hi) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for c in (0..hd).step_by(8) {
        lo = fma(load(q, c), row4(keys, j * hd + c), lo);
        hi = fma(load(q, c + 4), row4(keys, j * hd + c + 4), hi);
    }
    let s = lanes(f32x4_add(lo, hi));
    Some((s[0] + s[2]) + (s[1] + s[3]))
}

/// `o[i] = p.mul_add(values[j][i], o[i])` for the row's `hd` values;
/// false, doing nothing, where the rows cannot be read four at a time.
pub fn add_row(o: &mut [f32], p: f32, values: KvRows<'_>, j: usize, hd: usize) -> bool {
    if !four_at_a_time(values) || o.len() < hd || !hd.is_multiple_of(4) {
        return false;
    }
    let pv = f32x4_splat(p);
    for i in (0..hd).step_by(4) {
        let sum = fma(pv, row4(values, j * hd + i), load(o, i));
        o[i..i + 4].copy_from_slice(&lanes(sum));
    }
    true
}

/// Whether four consecutive values (from a multiple of 4) share a scale.
fn four_at_a_time(rows: KvRows<'_>) -> bool {
    match rows {
        KvRows::F16(_) => true,
        KvRows::Q8 { group, .. } => group.is_multiple_of(4),
    }
}

/// Values `at..at + 4` of the rows as f32, as `KvRows::at` gives each.
#[inline(always)]
fn row4(rows: KvRows<'_>, at: usize) -> v128 {
    match rows {
        KvRows::F16(x) => {
            let s = &x[at..at + 4];
            // SAFETY: `s` holds four f16 (8 bytes); any alignment.
            f16_bits_to_f32(unsafe { u32x4_load_extend_u16x4(s.as_ptr().cast()) })
        }
        KvRows::Q8 { q, d, group } => {
            let s = &q[at..at + 4];
            let word = i32::from_le_bytes([s[0] as u8, s[1] as u8, s[2] as u8, s[3] as u8]);
            let wide = i32x4_extend_low_i16x8(i16x8_extend_low_i8x16(i32x4_splat(word)));
            f32x4_mul(f32x4_convert_i32x4(wide), f32x4_splat(d[at / group]))
        }
    }
}

/// Four f32 of `v` from `at`.
#[inline(always)]
fn load(v: &[f32], at: usize) -> v128 {
    let s = &v[at..at + 4];
    // SAFETY: `s` holds four f32; `v128_load` takes any alignment.
    unsafe { v128_load(s.as_ptr().cast()) }
}
