//! Plain-Rust reference ops: slow, simple, the oracle every faster kernel is
//! compared with. Tensors are row-major `f32` slices with explicit shapes.

/// RMSNorm of each `dim`-wide row: `x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len();
    x.chunks(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(weight).map(move |(v, w)| v * inv * w)
        })
        .collect()
}

/// Numerically stable softmax of each `dim`-wide row.
pub fn softmax(x: &[f32], dim: usize) -> Vec<f32> {
    x.chunks(dim)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            exps.into_iter().map(move |e| e / sum)
        })
        .collect()
}

/// Rotation angle of pair `i` of a `head_dim`-wide head at `pos`.
fn angle(pos: usize, i: usize, head_dim: usize, theta: f32) -> f32 {
    pos as f32 / theta.powf((2 * i) as f32 / head_dim as f32)
}

/// Rotary embedding, interleaved layout (pairs `2i, 2i+1`; llama.cpp's
/// "normal" RoPE), applied in place to one head vector at `pos`.
pub fn rope_interleaved(head: &mut [f32], pos: usize, theta: f32) {
    let d = head.len();
    for i in 0..d / 2 {
        let (s, c) = angle(pos, i, d, theta).sin_cos();
        let (a, b) = (head[2 * i], head[2 * i + 1]);
        head[2 * i] = a * c - b * s;
        head[2 * i + 1] = a * s + b * c;
    }
}

/// Rotary embedding, NeoX layout (pairs `i, i + d/2`), in place.
pub fn rope_neox(head: &mut [f32], pos: usize, theta: f32) {
    let d = head.len();
    let h = d / 2;
    for i in 0..h {
        let (s, c) = angle(pos, i, d, theta).sin_cos();
        let (a, b) = (head[i], head[i + h]);
        head[i] = a * c - b * s;
        head[i + h] = a * s + b * c;
    }
}

/// Shapes of a causal attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Query tokens (the new chunk).
    pub n_q: usize,
    /// Key/value positions (cache plus chunk); the chunk starts at `n_kv - n_q`.
    pub n_kv: usize,
    /// A sliding window of positions (0: none).
    pub window: usize,
    /// Attention logit soft-capping (0: none).
    pub softcap: f32,
}

/// Causal grouped-query attention. `q` is `[n_head][n_q][head_dim]`, `k`
/// and `v` are `[n_kv_head][n_kv][head_dim]`; the result is
/// `[n_q][n_head * head_dim]`. Query `i` sees positions `0..=start + i`.
/// Queries are scaled by `1/sqrt(head_dim)`.
pub fn causal_attention(q: &[f32], k: &[f32], v: &[f32], s: AttnShape) -> Vec<f32> {
    let AttnShape {
        n_head,
        n_kv_head,
        head_dim: d,
        n_q,
        n_kv,
        window,
        softcap,
    } = s;
    let start = n_kv - n_q;
    let group = n_head / n_kv_head;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0; n_q * n_head * d];
    for h in 0..n_head {
        let kvh = h / group;
        for i in 0..n_q {
            let qv = &q[(h * n_q + i) * d..][..d];
            let visible = start + i + 1;
            let first = if window == 0 {
                0
            } else {
                visible.saturating_sub(window)
            };
            let scores: Vec<f32> = (first..visible)
                .map(|j| {
                    let kv = &k[(kvh * n_kv + j) * d..][..d];
                    let s = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale;
                    crate::backend::soft_cap(s, softcap)
                })
                .collect();
            let probs = softmax(&scores, visible - first);
            let o = &mut out[(i * n_head + h) * d..][..d];
            for (j, p) in (first..visible).zip(&probs) {
                let vv = &v[(kvh * n_kv + j) * d..][..d];
                for (acc, x) in o.iter_mut().zip(vv) {
                    *acc += p * x;
                }
            }
        }
    }
    out
}

/// LayerNorm of each row: `(x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let dim = w.len();
    x.chunks(dim)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / dim as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / dim as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter()
                .zip(w)
                .zip(b)
                .map(move |((&v, &w), &b)| ((f64::from(v) - mean) * inv) as f32 * w + b)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// erf by its Maclaurin series in f64 (|x| < 6; ±1 beyond, where the
/// difference is below f64 precision).
pub fn erf(x: f64) -> f64 {
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

/// Exact GELU: `x * Φ(x)`.
pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = f64::from(v);
            (0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))) as f32
        })
        .collect()
}

/// `x · Wᵀ` for row-major `x` (`m x k`) and `W` (`n x k`): `m x n`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t]))
                .sum::<f64>() as f32;
        }
    }
    out
}

/// Deterministic test data in [-1, 1): `n` values, varied by `seed`.
pub fn ramp(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 31) % 1009) as f32 / 504.0 - 1.0)
        .collect()
}

/// Largest absolute difference of two equal-length slices.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Bidirectional multi-head attention over `n` rows of `q`, `k`, `v`
/// (`h` wide each, `heads` heads): every row attends to every row.
pub fn self_attention(q: &[f32], k: &[f32], v: &[f32], h: usize, heads: usize) -> Vec<f32> {
    let n = q.len() / h.max(1);
    let d = h / heads.max(1);
    let scale = 1.0 / (d as f32).sqrt();
    let mut ctx = vec![0.0f32; n * h];
    let mut scores = vec![0.0f32; n];
    for head in 0..heads {
        let at = |row: usize| row * h + head * d..row * h + (head + 1) * d;
        for i in 0..n {
            let qi = &q[at(i)];
            for (j, s) in scores.iter_mut().enumerate() {
                *s = qi.iter().zip(&k[at(j)]).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
            let p = softmax(&scores, n);
            let out = &mut ctx[at(i)];
            for (j, w) in p.iter().enumerate() {
                out.iter_mut().zip(&v[at(j)]).for_each(|(o, x)| *o += w * x);
            }
        }
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_a_constant_row_is_the_weight() {
        let out = rms_norm(&[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0);
        for (o, w) in out.iter().zip([1.0, 2.0, 3.0, 4.0]) {
            assert!((o - w).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_survive_large_values() {
        let out = softmax(&[1000.0, 1000.0, 0.0, -1.0, 2.0, 3.0], 3);
        assert!((out[0] - 0.5).abs() < 1e-6 && out[2] < 1e-30);
        assert!((out[3..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_position_zero() {
        let orig = [0.3, -1.2, 0.7, 2.0, -0.5, 0.1];
        for rope in [rope_interleaved, rope_neox] {
            let mut h = orig;
            rope(&mut h, 0, 10_000.0);
            assert_eq!(h, orig);
            rope(&mut h, 17, 10_000.0);
            let n0: f32 = orig.iter().map(|x| x * x).sum();
            let n1: f32 = h.iter().map(|x| x * x).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
    }

    #[test]
    fn a_single_visible_position_returns_its_value() {
        // One query at position 0 can only see key 0: the output is v[0].
        let s = AttnShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 2,
            n_q: 1,
            n_kv: 1,
            window: 0,
            softcap: 0.0,
        };
        let out = causal_attention(&[1.0, 2.0, 3.0, 4.0], &[0.5, 0.5], &[7.0, -7.0], s);
        assert_eq!(out, [7.0, -7.0, 7.0, -7.0]);
        // A window of one: the last of three positions sees only itself.
        let s = AttnShape {
            n_kv: 3,
            window: 1,
            ..s
        };
        let (k, v) = (
            [0.5, 0.5, 9.0, 9.0, 0.1, 0.2],
            [1.0, 1.0, 2.0, 2.0, 7.0, -7.0],
        );
        let out = causal_attention(&[1.0, 2.0, 3.0, 4.0], &k, &v, s);
        assert_eq!(out, [7.0, -7.0, 7.0, -7.0]);
    }
}
