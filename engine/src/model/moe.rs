//! Routed experts (Qwen3-MoE, Mixtral), computed as llama.cpp's
//! `build_moe_ffn` does with softmax gating: the router's softmax over all
//! experts, the `n_used` highest chosen (ties to the lower index), their
//! probabilities renormalized to sum to one, and the token's output the
//! weighted sum of those experts' SwiGLU feed-forwards.
//!
//! The step's tokens are grouped by expert: each chosen expert's weights
//! are read once for all the tokens (of every sequence in the batch) that
//! route to it, and an expert no token chose is not read at all, which
//! is what makes a 30B-A3B model cost about a 3B one per token.

use std::io::{Read, Seek};

use kernels::backend::Backend;
use kernels::cpu::backend::CpuBackend;

use super::config::MoeConfig;
use super::proj::{Proj, exec, host_matrix, load};
use super::weights::Linear;
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;

/// One expert's SwiGLU feed-forward.
struct Expert<B: Backend> {
    gate_up: Proj<B>,
    down: B::Matrix,
}

/// A layer's router and experts.
pub(super) struct Moe<B: Backend> {
    router: B::Matrix,
    experts: Vec<Expert<B>>,
    n_used: usize,
}

/// The tokens routed to one expert and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    pub rows: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Routes every row of `logits` (`[tokens, n_expert]`, the router's
/// output) to its `n_used` experts: per expert, the rows that chose it
/// and their renormalized weights, rows in order.
pub fn route(logits: &[f32], n_expert: usize, n_used: usize) -> Vec<Route> {
    let mut routes = vec![Route::default(); n_expert];
    let mut order: Vec<usize> = Vec::with_capacity(n_expert);
    for (t, row) in logits.chunks_exact(n_expert.max(1)).enumerate() {
        let probs = softmax(row);
        order.clear();
        order.extend(0..n_expert);
        // Stable: equal probabilities keep the lower expert first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let chosen = &order[..n_used.min(n_expert)];
        let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
        // ggml clamps the sum to the smallest normal f16.
        let sum = sum.max(6.103_515_6e-5);
        for &e in chosen {
            routes[e].rows.push(t);
            routes[e].weights.push(probs[e] / sum);
        }
    }
    routes
}

/// Softmax of one row, shifted by its maximum as ggml's is.
fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
    let sum: f64 = exps.iter().map(|&e| f64::from(e)).sum();
    let inv = (1.0 / sum) as f32;
    exps.into_iter().map(|e| e * inv).collect()
}

impl<B: Backend> Moe<B> {
    /// Loads layer `p`'s (`blk.N`) router and experts: `ffn_gate_inp`
    /// (`[n_expert, hidden]`) and `ffn_{gate,up,down}_exps`
    /// (`[n_expert, rows, cols]`), each expert's slice its own matrix.
    pub(super) fn load<R: Read + Seek>(
        backend: &B,
        ct: &Gguf,
        reader: &mut R,
        p: &str,
        moe: MoeConfig,
    ) -> Result<Self> {
        let mut slices = |k: &str| expert_slices(ct, reader, &format!("{p}.{k}"), moe.n_expert);
        let (gates, ups, downs) = (
            slices("ffn_gate_exps.weight")?,
            slices("ffn_up_exps.weight")?,
            slices("ffn_down_exps.weight")?,
        );
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((g, u), d)| {
                Ok(Expert {
                    gate_up: Proj::new(backend, vec![g, u])?,
                    down: backend.matrix(d.into_host()?).map_err(load)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let name = format!("{p}.ffn_gate_inp.weight");
        let t = ct.info(&name)?;
        let router = Linear::from_gguf(&name, t.ty, &t.dims, &ct.tensor_bytes(reader, &name)?)?;
        Ok(Self {
            router: backend.matrix(router.into_host()?).map_err(load)?,
            experts,
            n_used: moe.n_used,
        })
    }

    /// The layer's feed-forward of every row of `h` (`[tokens, hidden]`).
    pub(super) fn forward(&self, b: &B, h: &B::Tensor) -> Result<B::Tensor> {
        let logits = b.to_host(&b.matmul(h, &self.router).map_err(exec)?);
        let routes = route(&logits, self.experts.len(), self.n_used);
        let hidden = b.matrix_shape(&self.router).1;
        let tokens = logits.len() / self.experts.len().max(1);
        let mut out = b.tensor(vec![0.0; tokens * hidden], hidden);
        for (expert, r) in self.experts.iter().zip(&routes) {
            if r.rows.is_empty() {
                continue;
            }
            let x = b.rows(h, &r.rows);
            let g = b.swiglu(&expert.gate_up.concat(b, &x)?);
            let y = b.matmul(&g, &expert.down).map_err(exec)?;
            b.add_rows_scaled(&mut out, &y, &r.rows, &r.weights);
        }
        Ok(out)
    }
}

impl Moe<CpuBackend> {
    /// The same experts in `b`'s memory.
    pub(super) fn onto<B: Backend>(&self, b: &B) -> Result<Moe<B>> {
        let matrix = |m| b.matrix(host_matrix(m)).map_err(load);
        Ok(Moe {
            router: matrix(&self.router)?,
            experts: self
                .experts
                .iter()
                .map(|e| {
                    Ok(Expert {
                        gate_up: e.gate_up.onto(b)?,
                        down: matrix(&e.down)?,
                    })
                })
                .collect::<Result<_>>()?,
            n_used: self.n_used,
        })
    }
}

/// Tensor `name` (`[n_expert, rows, cols]`) as one matrix per expert.
fn expert_slices<R: Read + Seek>(
    ct: &Gguf,
    reader: &mut R,
    name: &str,
    n_expert: usize,
) -> Result<Vec<Linear>> {
    let t = ct.info(name)?;
    let [e, rows, cols] = t.dims[..] else {
        return Err(EngineError::Load(format!(
            "tensor `{name}` has shape {:?}; experts are [n_expert, rows, cols]",
            t.dims
        )));
    };
    if e != n_expert {
        return Err(EngineError::Load(format!(
            "tensor `{name}` holds {e} experts; the metadata says {n_expert}"
        )));
    }
    let bytes = ct.tensor_bytes(reader, name)?;
    let per = bytes.len() / n_expert.max(1);
    bytes
        .chunks_exact(per.max(1))
        .map(|chunk| Linear::from_gguf(name, t.ty, &[rows, cols], chunk))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_pick_the_top_experts_and_renormalize() {
        // Two tokens over four experts, two used.
        let logits = [1.0, 3.0, 2.0, 0.0, 0.5, 0.5, 0.5, 4.0];
        let r = route(&logits, 4, 2);
        // Token 0: experts 1 and 2. Token 1: expert 3, then the three-way
        // tie goes to the lowest, 0.
        assert_eq!(r[0].rows, vec![1]);
        assert_eq!(r[1].rows, vec![0]);
        assert_eq!(r[2].rows, vec![0]);
        assert_eq!(r[3].rows, vec![1]);
        let (w1, w2) = (r[1].weights[0], r[2].weights[0]);
        assert!((w1 + w2 - 1.0).abs() < 1e-6);
        // softmax then renormalize over the pair = softmax over the pair.
        let want = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((w1 - want).abs() < 1e-6, "{w1} vs {want}");
    }

    #[test]
    fn every_token_gets_exactly_n_used_experts_summing_to_one() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(43);
        for _ in 0..50 {
            let (n, t) = (rng.random_range(1..20), rng.random_range(1..9));
            let k = rng.random_range(1..=n);
            let logits: Vec<f32> = (0..n * t).map(|_| rng.random_range(-8.0..8.0)).collect();
            let routes = route(&logits, n, k);
            let mut per_token = vec![(0usize, 0.0f32); t];
            for r in &routes {
                assert!(r.rows.windows(2).all(|w| w[0] < w[1]), "rows in order");
                for (&row, &w) in r.rows.iter().zip(&r.weights) {
                    per_token[row].0 += 1;
                    per_token[row].1 += w;
                }
            }
            for (count, sum) in per_token {
                assert_eq!(count, k);
                assert!((sum - 1.0).abs() < 1e-5, "{sum}");
            }
        }
    }
}
