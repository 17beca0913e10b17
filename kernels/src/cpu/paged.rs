//! Causal grouped-query attention over the paged KV cache (the CPU
//! backend's `attention`).
//!
//! Each (query token, KV head) pair is one parallel task: block by block it
//! scores every query head of its group against the f16 keys (contiguous
//! per head, see `KvStorage`) with the SIMD loops in `kernels`, takes a
//! numerically stable softmax over the visible positions `0..=pos`, then
//! accumulates the values the same way.

use super::attention::{self, HeadGroup, KvRows};
use rayon::prelude::*;

use super::kv::KvStorage;
use super::ops::softmax_in_place;
use super::prefetch_slice;
pub use crate::backend::AttnShape;

/// KV blocks (of one head) requested ahead of the one being read.
const KV_AHEAD: usize = 4;

/// `q` is `[token][n_head * head_dim]` (RoPE applied); `queries[t]` gives
/// token `t`'s position and its sequence's block table. Returns
/// `[token][n_head * head_dim]`.
pub fn paged_attention(
    q: &[f32],
    queries: &[(usize, &[u32])],
    kv: &KvStorage,
    layer: usize,
    s: AttnShape,
) -> Vec<f32> {
    let group = s.n_head / s.n_kv_head;
    let mut out = vec![0.0f32; queries.len() * s.n_head * s.head_dim];
    out.par_chunks_mut(group * s.head_dim)
        .enumerate()
        .for_each(|(task, o)| {
            let (t, kvh) = (task / s.n_kv_head, task % s.n_kv_head);
            let qs = &q[(t * s.n_head + kvh * group) * s.head_dim..][..group * s.head_dim];
            attend_one(
                LayerCtx {
                    kv,
                    layer,
                    shape: s,
                },
                qs,
                queries[t],
                kvh,
                o,
            );
        });
    out
}

/// What every attention task of one layer shares.
#[derive(Clone, Copy)]
struct LayerCtx<'a> {
    kv: &'a KvStorage,
    layer: usize,
    shape: AttnShape,
}

/// Attention of one token's `group` query heads `qs`, which share KV head
/// `kvh`, over the positions it sees (`0..=pos`, or the sliding window's
/// last ones) of the sequence with block table `table`. Scores run from
/// the first visible position's block; the positions before it there
/// weigh exactly zero.
fn attend_one(
    c: LayerCtx<'_>,
    qs: &[f32],
    (pos, table): (usize, &[u32]),
    kvh: usize,
    o: &mut [f32],
) {
    let (hd, bs) = (c.shape.head_dim, c.shape.block_size);
    let first = c.shape.first_visible(pos);
    let base = first / bs * bs;
    let n = pos + 1 - base;
    let masked = first - base;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scores = vec![0.0f32; qs.len() / hd * n];
    let used = &table[base / bs..(pos + 1).div_ceil(bs).min(table.len())];
    let blocks = used.iter().enumerate();
    // A decode step's keys and values were pushed out of cache by the
    // layer weights streamed since they were last read: fetching them
    // blocks ahead keeps these loops on bandwidth, not on each block's
    // memory latency.
    let fetch = |b: Option<&u32>, keys: bool| {
        if let Some(&b) = b {
            match if keys {
                c.kv.k(c.layer, b, kvh, bs)
            } else {
                c.kv.v(c.layer, b, kvh, bs)
            } {
                KvRows::F16(x) => prefetch_slice(x),
                KvRows::Q8 { q, d, .. } => {
                    prefetch_slice(q);
                    prefetch_slice(d);
                }
            }
        }
    };
    (0..KV_AHEAD).for_each(|bi| fetch(used.get(bi), true));
    for (bi, &block) in blocks.clone() {
        fetch(used.get(bi + KV_AHEAD), true);
        let len = bs.min(n - bi * bs);
        let keys = c.kv.k(c.layer, block, kvh, len);
        let heads = HeadGroup {
            q: qs,
            hd,
            stride: n,
        };
        attention::scores(heads, keys, len, scale, &mut scores[bi * bs..]);
    }
    (0..KV_AHEAD).for_each(|bi| fetch(used.get(bi), false));
    for row in scores.chunks_exact_mut(n) {
        let (hidden, seen) = row.split_at_mut(masked);
        hidden.fill(0.0);
        if c.shape.softcap > 0.0 {
            seen.iter_mut().for_each(|s| *s = c.shape.cap(*s));
        }
        softmax_in_place(seen);
    }
    o.fill(0.0);
    for (bi, &block) in blocks {
        fetch(used.get(bi + KV_AHEAD), false);
        let len = bs.min(n - bi * bs);
        let values = c.kv.v(c.layer, block, kvh, len);
        attention::weighted_sum(&scores[bi * bs..], n, values, len, o, hd);
    }
}

#[cfg(test)]
mod tests {
    use crate::reference;
    use half::f16;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::cpu::kv::{KvDtype, KvLayout};

    fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn round_f16(x: &[f32]) -> Vec<f32> {
        x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
    }

    /// What the cache holds for position `p` of head `h` (keys or
    /// values), as f32.
    fn stored(kv: &KvStorage, keys: bool, block: u32, slot: usize, h: usize) -> Vec<f32> {
        let hd = kv.layout.head_dim;
        let bs = kv.layout.block_size;
        let rows = if keys {
            kv.k(0, block, h, bs)
        } else {
            kv.v(0, block, h, bs)
        };
        let at = slot * hd;
        match rows {
            KvRows::F16(x) => x[at..at + hd].iter().map(|v| v.to_f32()).collect(),
            KvRows::Q8 { q, d, group } => (at..at + hd)
                .map(|i| f32::from(q[i]) * d[i / group])
                .collect(),
        }
    }

    #[test]
    fn paged_attention_matches_the_reference_through_scattered_blocks() {
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            for hd in [8usize, 64] {
                // No window, one inside a block (4), one across blocks;
                // scores soft-capped (Gemma 2) at a cap they reach.
                for (window, softcap) in [(0, 0.0), (3, 0.0), (6, 0.0), (0, 0.5), (6, 0.5)] {
                    paged_case(dtype, hd, window, softcap);
                }
            }
        }
    }

    fn paged_case(dtype: KvDtype, hd: usize, window: usize, softcap: f32) {
        let mut rng = StdRng::seed_from_u64(9);
        let (nh, nkv, bs) = (6, 2, 4);
        let layout = KvLayout {
            n_layer: 1,
            n_kv_head: nkv,
            head_dim: hd,
            block_size: bs,
            num_blocks: 16,
            dtype,
            sliding: None,
        };
        for l in [1usize, 5, 13] {
            let mut kv = KvStorage::new(layout);
            // A deliberately scrambled block table.
            let table: Vec<u32> = (0..l.div_ceil(bs) as u32).map(|i| 15 - 2 * i).collect();
            let k = random(&mut rng, l * nkv * hd);
            let v = random(&mut rng, l * nkv * hd);
            for p in 0..l {
                kv.write(
                    0,
                    table[p / bs],
                    p % bs,
                    &k[p * nkv * hd..][..nkv * hd],
                    &v[p * nkv * hd..][..nkv * hd],
                );
            }
            // Queries for the last 1..3 positions, as a chunk would have.
            let n_q = l.min(3);
            let q = random(&mut rng, n_q * nh * hd);
            let queries: Vec<(usize, &[u32])> =
                (l - n_q..l).map(|p| (p, table.as_slice())).collect();
            let shape = AttnShape {
                n_head: nh,
                n_kv_head: nkv,
                head_dim: hd,
                block_size: bs,
                window,
                softcap,
            };
            let got = paged_attention(&q, &queries, &kv, 0, shape);
            // Reference layouts: q [head][token][d], k/v [kv_head][pos][d].
            let to_heads = |x: &[f32], heads: usize, n: usize| -> Vec<f32> {
                (0..heads)
                    .flat_map(|h| {
                        (0..n).flat_map(move |t| x[(t * heads + h) * hd..][..hd].to_vec())
                    })
                    .collect()
            };
            // The reference reads what the cache holds: f16-rounded or
            // Q8-dequantized values; f16 is checked against the rounding
            // done here too.
            let held = |keys: bool| -> Vec<f32> {
                let mut out = Vec::new();
                for p in 0..l {
                    for h in 0..nkv {
                        out.extend(stored(&kv, keys, table[p / bs], p % bs, h));
                    }
                }
                out
            };
            let (hk, hv) = (held(true), held(false));
            if dtype == KvDtype::F16 {
                assert_eq!((hk.clone(), hv.clone()), (round_f16(&k), round_f16(&v)));
            } else {
                let err = hk
                    .iter()
                    .zip(&k)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(err <= 1.0 / 254.0 * 1.001, "q8 keys off by {err}");
            }
            let (kr, vr) = (to_heads(&hk, nkv, l), to_heads(&hv, nkv, l));
            let ref_shape = reference::AttnShape {
                n_head: nh,
                n_kv_head: nkv,
                head_dim: hd,
                n_q,
                n_kv: l,
                window,
                softcap,
            };
            let want = reference::causal_attention(&to_heads(&q, nh, n_q), &kr, &vr, ref_shape);
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                err < 1e-5,
                "{dtype:?} hd={hd} l={l} window={window} softcap={softcap}: {err}"
            );
        }
    }
}
