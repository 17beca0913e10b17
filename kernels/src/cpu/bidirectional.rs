//! Bidirectional (encoder) attention on the CPU over a batch of unpadded
//! sequences stacked row after row: every (sequence, head) pair is one
//! task (parallel unless the batch is small), whose scores `Q·Kᵀ` and
//! context `P·V` are two dense matrix products (`cpu::dense`, on the
//! task's own thread), so a long input costs two GEMMs per head instead of
//! `n²` scalar dot products; a short sequence takes the dot products.

use rayon::prelude::*;

use super::dense::{Packed, matmul_packed_serial};
use super::ops::softmax_in_place;

/// Multiply-adds (`Σ n² · h`) below which the heads run on the calling
/// thread.
const SERIAL_WORK: usize = 1 << 20;

/// Attention of `seqs` (their lengths, summing to the rows) over `q`, `k`,
/// `v` (`h` wide, `heads` heads each): a row attends to every row of its
/// own sequence.
pub fn self_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: usize,
    heads: usize,
    seqs: &[usize],
) -> Vec<f32> {
    let rows: usize = seqs.iter().sum();
    assert!(
        q.len() == rows * h
            && k.len() == q.len()
            && v.len() == q.len()
            && h.is_multiple_of(heads.max(1)),
        "self_attention: {rows} rows of {h} in {heads} heads do not match the tensors"
    );
    // Short inputs (a query of a few tokens) are cheaper on this thread,
    // in place, than gathered and spread over the pool.
    let work: usize = seqs.iter().map(|n| n * n * h).sum();
    if work < SERIAL_WORK && seqs.iter().all(|&n| n <= SHORT) {
        return short_in_place(q, k, v, h, heads, seqs);
    }
    let mut tasks = Vec::with_capacity(seqs.len() * heads);
    let mut first = 0;
    for &n in seqs {
        tasks.extend((0..heads).map(|head| (first, n, head)));
        first += n;
    }
    let d = h / heads.max(1);
    let run = |&(first, n, head): &(usize, usize, usize)| one_head(q, k, v, h, d, first, n, head);
    let parts: Vec<Vec<f32>> = if work < SERIAL_WORK {
        tasks.iter().map(run).collect()
    } else {
        tasks.par_iter().map(run).collect()
    };
    let mut ctx = vec![0.0f32; q.len()];
    for (&(first, _, head), part) in tasks.iter().zip(&parts) {
        for (i, row) in part.chunks_exact(d.max(1)).enumerate() {
            ctx[(first + i) * h + head * d..][..d].copy_from_slice(row);
        }
    }
    ctx
}

/// One head of one sequence (rows `first..first + n`): its `n x d` context.
#[allow(clippy::too_many_arguments)]
fn one_head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: usize,
    d: usize,
    first: usize,
    n: usize,
    head: usize,
) -> Vec<f32> {
    let gather = |x: &[f32]| -> Vec<f32> {
        (first..first + n)
            .flat_map(|r| x[r * h + head * d..][..d].iter().copied())
            .collect()
    };
    let (qh, kh, vh) = (gather(q), gather(k), gather(v));
    let scale = 1.0 / (d as f32).sqrt();
    if n <= SHORT {
        return short_head(&qh, &kh, &vh, n, d, scale);
    }
    // Scores: `n x n`, row i = q_i · K.
    let mut p = matmul_packed_serial(&Packed::new(&kh, n, d), &qh, n);
    for row in p.chunks_exact_mut(n.max(1)) {
        row.iter_mut().for_each(|s| *s *= scale);
        softmax_in_place(row);
    }
    // Context: `n x d` = P · V, with V's columns as the weight's rows.
    let mut vt = vec![0.0f32; n * d];
    for (j, row) in vh.chunks_exact(d.max(1)).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            vt[c * n + j] = x;
        }
    }
    matmul_packed_serial(&Packed::new(&vt, d, n), &p, n)
}

/// Sequences up to this long skip the GEMMs: packing would cost more than
/// the `n²` dot products it saves.
const SHORT: usize = 24;

/// Every head of every (short) sequence by plain dot products over the
/// rows where they lie.
fn short_in_place(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: usize,
    heads: usize,
    seqs: &[usize],
) -> Vec<f32> {
    let d = h / heads.max(1);
    let scale = 1.0 / (d as f32).sqrt();
    let mut ctx = vec![0.0f32; q.len()];
    let mut scores = Vec::new();
    let mut first = 0;
    for &n in seqs {
        scores.resize(n, 0.0);
        for head in 0..heads {
            let at = |row: usize| (first + row) * h + head * d..(first + row) * h + (head + 1) * d;
            for i in 0..n {
                let qi = &q[at(i)];
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = qi.iter().zip(&k[at(j)]).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                softmax_in_place(&mut scores);
                let out = &mut ctx[at(i)];
                for (j, w) in scores.iter().enumerate() {
                    out.iter_mut().zip(&v[at(j)]).for_each(|(o, x)| *o += w * x);
                }
            }
        }
        first += n;
    }
    ctx
}

/// One head of a short sequence by plain dot products: `n x d`.
fn short_head(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize, scale: f32) -> Vec<f32> {
    let mut ctx = vec![0.0f32; n * d];
    let mut scores = vec![0.0f32; n];
    for (qi, out) in q.chunks_exact(d).zip(ctx.chunks_exact_mut(d)) {
        for (s, kj) in scores.iter_mut().zip(k.chunks_exact(d)) {
            *s = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
        softmax_in_place(&mut scores);
        for (w, vj) in scores.iter().zip(v.chunks_exact(d)) {
            out.iter_mut().zip(vj).for_each(|(o, x)| *o += w * x);
        }
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    #[test]
    fn one_token_attends_only_to_itself() {
        let (h, heads) = (4, 2);
        let qkv: Vec<f32> = (0..3 * h).map(|i| i as f32).collect();
        let (q, rest) = qkv.split_at(h);
        let (k, v) = rest.split_at(h);
        assert_eq!(self_attention(q, k, v, h, heads, &[1]), v.to_vec());
    }

    #[test]
    fn sequences_attend_only_within_themselves_and_match_the_reference() {
        let (h, heads) = (24, 3);
        let seqs = [5, 1, 9, 2, 40];
        let rows: usize = seqs.iter().sum();
        let (q, k, v) = (
            reference::ramp(rows * h, 1),
            reference::ramp(rows * h, 2),
            reference::ramp(rows * h, 3),
        );
        let got = self_attention(&q, &k, &v, h, heads, &seqs);
        let mut first = 0;
        for &n in &seqs {
            let span = first * h..(first + n) * h;
            let want = reference::self_attention(
                &q[span.clone()],
                &k[span.clone()],
                &v[span.clone()],
                h,
                heads,
            );
            let err = reference::max_diff(&got[span], &want);
            assert!(err < 1e-5, "sequence at {first}: {err}");
            first += n;
        }
    }
}
