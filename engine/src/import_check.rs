//! Checking KV rows another worker computed before this engine uses
//! them. A prefill worker can send rows that pass every checksum and
//! digest and still be forged; the rows of position `p` are a function of
//! the prompt's tokens and the rows before `p`, so this engine recomputes
//! a few positions, chosen at random where the sender cannot see, over
//! the imported rows before them, through every layer, and compares what
//! it got with what was sent. Recomputing `k` positions costs one forward
//! pass of `k` tokens; a forgery of a share `f` of the positions escapes
//! with probability `(1 - f)^k`, and one of every position never does.
//!
//! The comparison allows for honest differences (another backend, another
//! chunking, f16 storage): each layer's keys and values at a position may
//! differ from the recomputed ones by `TOLERANCE` of their norm.
//! Everything this engine or another honest one computes agrees to about
//! 1e-3; random or shuffled rows differ by about 1.

use rand::seq::index::sample;

use crate::executor::{Executor, Tables};
use crate::kv_cache::storage::KvLayout;
use crate::kv_cache::transfer::KvRows;
use crate::model::{ModelBatch, SeqChunk};
use crate::request::RequestId;

/// Positions recomputed per import (fewer when fewer were imported).
pub const POSITIONS: usize = 4;

/// Largest relative L2 difference of one layer's keys (or values) at one
/// position that still counts as the same computation.
pub const TOLERANCE: f32 = 0.05;

/// Why imported rows were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportCheckError {
    #[error(
        "imported KV differs from its recomputation at position {position}, layer {layer} (relative error {error:.3})"
    )]
    Mismatch {
        position: usize,
        layer: usize,
        error: f32,
    },
    #[error("could not recompute imported KV: {0}")]
    Recompute(String),
}

/// `n` distinct positions of `from..end` in ascending order, at random.
pub fn pick(from: usize, end: usize, n: usize) -> Vec<usize> {
    let span = end.saturating_sub(from);
    let mut picks: Vec<usize> = sample(&mut rand::rng(), span, n.min(span))
        .into_iter()
        .map(|i| from + i)
        .collect();
    picks.sort_unstable();
    picks
}

/// Recomputes `positions` of the sequence over `tables` (whose blocks hold
/// the imported `rows`; `tokens` are its tokens from position 0) and
/// compares each with the imported row; the largest relative error seen.
/// The recomputed rows replace the imported ones at those positions.
pub fn verify(
    exec: &mut dyn Executor,
    tables: Tables<'_>,
    tokens: &[u32],
    rows: &KvRows,
    positions: &[usize],
) -> Result<f32, ImportCheckError> {
    let Some(&last) = positions.last() else {
        return Ok(0.0);
    };
    let chunks = positions
        .iter()
        .enumerate()
        .map(|(i, &p)| SeqChunk {
            // Scratch ids: each chunk is one position of the same table.
            seq: RequestId(u64::MAX - 2 - i as u64),
            tokens: vec![tokens[p]],
            start_pos: p,
            // One logits row (ignored): a forward pass wants at least one.
            want_logits: p == last,
            block_table: tables.full.to_vec(),
            swa_table: tables.swa.to_vec(),
            draft: Vec::new(),
        })
        .collect();
    let batch = ModelBatch { chunks };
    let recompute = |e: &dyn std::fmt::Display| ImportCheckError::Recompute(e.to_string());
    exec.logits(&batch).map_err(|e| recompute(&e))?;
    let layout = exec.kv_layout();
    let mut worst = 0f32;
    for &p in positions {
        let got = exec.read_rows(tables, p, 1).map_err(|e| recompute(&e))?;
        worst = worst.max(compare(&layout, rows, &got, p)?);
    }
    Ok(worst)
}

/// Compares the imported row at `position` with `got` (that one
/// position, recomputed), layer by layer, keys and values apart; the
/// largest relative error.
fn compare(
    l: &KvLayout,
    rows: &KvRows,
    got: &KvRows,
    position: usize,
) -> Result<f32, ImportCheckError> {
    let mut worst = 0f32;
    let half = l.n_kv_head * l.head_dim * 2;
    let i = position - rows.first;
    for (layer, (sent, mine)) in rows.layers.iter().zip(&got.layers).enumerate() {
        let k_sent = &sent[i * half..(i + 1) * half];
        let v_at = rows.count * half + i * half;
        let v_sent = &sent[v_at..v_at + half];
        for (a, b) in [(k_sent, &mine[..half]), (v_sent, &mine[half..])] {
            let error = relative_error(a, b);
            if error.is_nan() || error > TOLERANCE {
                return Err(ImportCheckError::Mismatch {
                    position,
                    layer,
                    error,
                });
            }
            worst = worst.max(error);
        }
    }
    Ok(worst)
}

/// `|a - b| / |b|` over two strings of f16 bits (NaN when `a` holds a
/// non-finite value).
fn relative_error(a: &[u8], b: &[u8]) -> f32 {
    let f = |c: &[u8]| half::f16::from_le_bytes([c[0], c[1]]).to_f32();
    let (mut diff, mut norm) = (0f64, 0f64);
    for (x, y) in a.chunks_exact(2).zip(b.chunks_exact(2)) {
        let (x, y) = (f64::from(f(x)), f64::from(f(y)));
        if !x.is_finite() {
            return f32::NAN;
        }
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    (diff.sqrt() / norm.sqrt().max(1e-6)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn picks_are_distinct_sorted_and_inside_the_span() {
        for _ in 0..100 {
            let p = pick(10, 30, 4);
            assert_eq!(p.len(), 4);
            assert!(p.windows(2).all(|w| w[0] < w[1]), "{p:?}");
            assert!(p.iter().all(|&x| (10..30).contains(&x)), "{p:?}");
        }
        assert_eq!(pick(5, 7, 4), vec![5, 6]);
        assert!(pick(7, 7, 4).is_empty());
    }

    #[test]
    fn relative_error_tells_rounding_from_forgery() {
        let a: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let near: Vec<f32> = a.iter().map(|x| x * 1.001).collect();
        let other: Vec<f32> = (0..64).map(|i| (i as f32 * 1.91).cos()).collect();
        assert!(relative_error(&bits(&near), &bits(&a)) < 0.01);
        assert!(relative_error(&bits(&other), &bits(&a)) > 0.5);
        let mut bad = bits(&a);
        bad[0..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
        assert!(relative_error(&bad, &bits(&a)).is_nan());
    }
}
