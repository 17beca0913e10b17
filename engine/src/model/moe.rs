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
use std::sync::Arc;

use kernels::backend::Backend;
use kernels::cpu::backend::CpuBackend;

use super::config::MoeConfig;
use super::proj::{Proj, exec, host_matrix, load};
use super::weights::Linear;
use crate::error::{EngineError, Result};
use crate::gguf::{Gguf, TensorType};

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

/// Softmax of one row, shifted by its maximum as ggml's is (through the
/// kernels' `exp`, so a tab's libm picks the same experts).
fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row
        .iter()
        .map(|&x| kernels::cpu::ops::exp(x - max))
        .collect();
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
        let gate_up = match stacked_gate_up(ct, reader, p, moe.n_expert)? {
            Some((parts, ff)) => parts
                .into_iter()
                .map(|w| Proj::stacked(backend, w, vec![ff, ff]))
                .collect::<Result<Vec<_>>>()?,
            None => {
                let mut slices =
                    |k: &str| expert_slices(ct, reader, &format!("{p}.{k}"), moe.n_expert);
                let (gates, ups) = (
                    slices("ffn_gate_exps.weight")?,
                    slices("ffn_up_exps.weight")?,
                );
                gates
                    .into_iter()
                    .zip(ups)
                    .map(|(g, u)| Proj::new(backend, vec![g, u]))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let downs = expert_slices(
            ct,
            reader,
            &format!("{p}.ffn_down_exps.weight"),
            moe.n_expert,
        )?;
        let experts = gate_up
            .into_iter()
            .zip(downs)
            .map(|(gate_up, d)| {
                Ok(Expert {
                    gate_up,
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

    /// The layer's feed-forward of every row of `h` (`[tokens, hidden]`):
    /// the chosen experts' gate-up projections in one `matmul_many`, their
    /// down projections in another.
    pub(super) fn forward(&self, b: &B, h: &B::Tensor) -> Result<B::Tensor> {
        let logits = b.to_host(&b.matmul(h, &self.router).map_err(exec)?);
        let routes = route(&logits, self.experts.len(), self.n_used);
        let hidden = b.matrix_shape(&self.router).1;
        let tokens = logits.len() / self.experts.len().max(1);
        let active: Vec<(&Expert<B>, &Route)> = self
            .experts
            .iter()
            .zip(&routes)
            .filter(|(_, r)| !r.rows.is_empty())
            .collect();
        let xs: Vec<B::Tensor> = active.iter().map(|(_, r)| b.rows(h, &r.rows)).collect();
        let gate_up: Vec<(&Proj<B>, &B::Tensor)> = active
            .iter()
            .zip(&xs)
            .map(|((e, _), x)| (&e.gate_up, x))
            .collect();
        let gs: Vec<B::Tensor> = Proj::concat_many(b, &gate_up)?
            .iter()
            .map(|g| b.swiglu(g))
            .collect();
        let down: Vec<(&B::Tensor, &B::Matrix)> = gs
            .iter()
            .zip(&active)
            .map(|(g, (e, _))| (g, &e.down))
            .collect();
        let ys = b.matmul_many(&down).map_err(exec)?;
        let mut out = b.tensor(vec![0.0; tokens * hidden], hidden);
        for (y, (_, r)) in ys.iter().zip(&active) {
            b.add_rows_scaled(&mut out, y, &r.rows, &r.weights);
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

/// Tensor `name` (`[n_expert, rows, cols]`) as one matrix per expert:
/// split from one stack where the format allows (`split_stack`), else
/// each expert's slice read on its own.
fn expert_slices<R: Read + Seek>(
    ct: &Gguf,
    reader: &mut R,
    name: &str,
    n_expert: usize,
) -> Result<Vec<Linear>> {
    let t = ct.info(name)?;
    let [rows, cols] = expert_dims(name, &t.dims, n_expert)?;
    let bytes = ct.tensor_bytes(reader, name)?;
    if let Some(parts) = split_stack(name, t.ty, n_expert, [rows, cols], &bytes)? {
        return Ok(parts);
    }
    let per = bytes.len() / n_expert.max(1);
    bytes
        .chunks_exact(per.max(1))
        .map(|chunk| Linear::from_gguf(name, t.ty, &[rows, cols], chunk))
        .collect()
}

/// The experts' gate and up projections as one stack of `[gate_e; up_e]`
/// per expert, split into them (`split_stack`), and the feed-forward
/// width; `None` where the two tensors differ in format or shape, or the
/// stack cannot be split.
fn stacked_gate_up<R: Read + Seek>(
    ct: &Gguf,
    reader: &mut R,
    p: &str,
    n_expert: usize,
) -> Result<Option<(Vec<Linear>, usize)>> {
    let (gn, un) = (
        format!("{p}.ffn_gate_exps.weight"),
        format!("{p}.ffn_up_exps.weight"),
    );
    let (g, u) = (ct.info(&gn)?, ct.info(&un)?);
    let [ff, cols] = expert_dims(&gn, &g.dims, n_expert)?;
    if g.ty != u.ty || g.dims != u.dims || !Linear::is_quantized(g.ty, cols) {
        return Ok(None);
    }
    let (gates, ups) = (ct.tensor_bytes(reader, &gn)?, ct.tensor_bytes(reader, &un)?);
    let per = gates.len() / n_expert.max(1);
    let mut both = Vec::with_capacity(gates.len() + ups.len());
    for (gate, up) in gates
        .chunks_exact(per.max(1))
        .zip(ups.chunks_exact(per.max(1)))
    {
        both.extend_from_slice(gate);
        both.extend_from_slice(up);
    }
    drop((gates, ups));
    Ok(split_stack(&gn, g.ty, n_expert, [2 * ff, cols], &both)?.map(|parts| (parts, ff)))
}

/// `bytes`, `n` matrices of `rows x cols` one after another, packed as one
/// stack and split into its matrices, which share its buffer: a layer's
/// experts lie together in memory, on huge pages (`kernels::cpu::pages`;
/// one expert, 1-2 MiB, is too small to get one of its own), as in
/// llama.cpp's one tensor for all of them. `None` where the format is not
/// a quantized one or `rows` is not whole groups of 16.
fn split_stack(
    name: &str,
    ty: TensorType,
    n: usize,
    [rows, cols]: [usize; 2],
    bytes: &[u8],
) -> Result<Option<Vec<Linear>>> {
    if !rows.is_multiple_of(kernels::layout::GROUP) || !Linear::is_quantized(ty, cols) {
        return Ok(None);
    }
    let Linear::Quant(stack) = Linear::from_gguf(name, ty, &[n * rows, cols], bytes)? else {
        return Ok(None);
    };
    let parts = Arc::unwrap_or_clone(stack)
        .split_groups(rows)
        .map_err(load)?;
    Ok(Some(
        parts
            .into_iter()
            .map(|m| Linear::Quant(Arc::new(m)))
            .collect(),
    ))
}

/// An expert tensor's `[rows, cols]`, checked: `[n_expert, rows, cols]`.
fn expert_dims(name: &str, dims: &[usize], n_expert: usize) -> Result<[usize; 2]> {
    let [e, rows, cols] = dims[..] else {
        return Err(EngineError::Load(format!(
            "tensor `{name}` has shape {dims:?}; experts are [n_expert, rows, cols]"
        )));
    };
    if e != n_expert {
        return Err(EngineError::Load(format!(
            "tensor `{name}` holds {e} experts; the metadata says {n_expert}"
        )));
    }
    Ok([rows, cols])
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
