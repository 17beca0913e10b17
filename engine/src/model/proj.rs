//! Several projections of the same input (Q/K/V, or gate/up) held as one
//! stacked matrix where their formats allow: one matmul, one pass over
//! the input.

use kernels::QMatrix;
use kernels::backend::{Backend, HostMatrix};
use kernels::cpu::backend::{CpuBackend, CpuMatrix};

use super::weights::Linear;
use crate::error::{EngineError, Result};

/// Several projections of the same input (Q/K/V, or gate/up): stacked
/// into one matrix when their formats allow (one matmul, one pass over the
/// input), else kept apart.
pub(super) enum Proj<B: Backend> {
    Fused { w: B::Matrix, widths: Vec<usize> },
    Separate(Vec<B::Matrix>),
}

impl<B: Backend> Proj<B> {
    pub(super) fn new(backend: &B, parts: Vec<Linear>) -> Result<Self> {
        let quant: Option<Vec<&QMatrix>> = parts
            .iter()
            .map(|p| match p {
                Linear::Quant(m) => Some(m.as_ref()),
                Linear::Dense { .. } | Linear::Half { .. } => None,
            })
            .collect();
        if let Some(ms) = quant
            && let Ok(stacked) = QMatrix::concat(&ms)
        {
            let widths = ms.iter().map(|m| m.rows).collect();
            let w = backend.matrix(HostMatrix::Quant(stacked)).map_err(load)?;
            return Ok(Self::Fused { w, widths });
        }
        let ws = parts
            .into_iter()
            .map(|p| backend.matrix(p.into_host()?).map_err(load))
            .collect::<Result<_>>()?;
        Ok(Self::Separate(ws))
    }

    /// Projections a file already stacks in one matrix `w` (Phi-3's
    /// `attn_qkv`, its gate-up `ffn_up`), `widths` the parts' rows in order.
    pub(super) fn stacked(backend: &B, w: Linear, widths: Vec<usize>) -> Result<Self> {
        if w.rows() != widths.iter().sum::<usize>() {
            return Err(EngineError::Load(format!(
                "a stacked projection of {} rows split as {widths:?}",
                w.rows()
            )));
        }
        let w = backend.matrix(w.into_host()?).map_err(load)?;
        Ok(Self::Fused { w, widths })
    }

    /// Every part's output, side by side in each row.
    pub(super) fn concat(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Self::Fused { w, .. } => b.matmul(x, w).map_err(exec),
            Self::Separate(ws) => {
                let outs = ws
                    .iter()
                    .map(|w| b.matmul(x, w).map_err(exec))
                    .collect::<Result<Vec<_>>>()?;
                Ok(b.concat_cols(&outs))
            }
        }
    }

    /// `concat` of each projection with its input, the products of all of
    /// them in one `matmul_many` (the experts of a mixture-of-experts
    /// layer).
    pub(super) fn concat_many(b: &B, items: &[(&Self, &B::Tensor)]) -> Result<Vec<B::Tensor>> {
        let pairs: Vec<(&B::Tensor, &B::Matrix)> = items
            .iter()
            .flat_map(|&(proj, x)| proj.matrices().iter().map(move |w| (x, w)))
            .collect();
        let mut outs = b.matmul_many(&pairs).map_err(exec)?.into_iter();
        items
            .iter()
            .map(|(proj, _)| match proj {
                Self::Fused { .. } => outs.next().ok_or_else(short_of_outputs),
                Self::Separate(ws) => {
                    let parts: Vec<B::Tensor> = outs.by_ref().take(ws.len()).collect();
                    if parts.len() < ws.len() {
                        return Err(short_of_outputs());
                    }
                    Ok(b.concat_cols(&parts))
                }
            })
            .collect()
    }

    /// The stacked matrix, or the parts' matrices in order.
    fn matrices(&self) -> &[B::Matrix] {
        match self {
            Self::Fused { w, .. } => std::slice::from_ref(w),
            Self::Separate(ws) => ws,
        }
    }

    /// Every part's output, apart.
    pub(super) fn each(&self, b: &B, x: &B::Tensor) -> Result<Vec<B::Tensor>> {
        match self {
            Self::Fused { w, widths } => Ok(b.split_cols(&b.matmul(x, w).map_err(exec)?, widths)),
            Self::Separate(ws) => ws.iter().map(|w| b.matmul(x, w).map_err(exec)).collect(),
        }
    }
}

/// A backend's `matmul_many` gave fewer results than it was asked for.
fn short_of_outputs() -> EngineError {
    EngineError::Execution("matmul_many returned fewer products than asked".into())
}

pub(super) fn load(e: kernels::KernelError) -> EngineError {
    EngineError::Load(e.to_string())
}

pub(super) fn exec(e: kernels::KernelError) -> EngineError {
    EngineError::Execution(e.to_string())
}

/// A CPU weight matrix as the host form another backend takes.
pub(super) fn host_matrix(m: &kernels::cpu::backend::CpuMatrix) -> HostMatrix {
    match m {
        CpuMatrix::Quant(q) => HostMatrix::Quant(q.as_ref().clone()),
        CpuMatrix::Dense(p) => HostMatrix::Dense {
            data: (0..p.n).flat_map(|r| p.row(r)).collect(),
            rows: p.n,
            cols: p.k,
        },
    }
}

impl Proj<CpuBackend> {
    /// The same projections in `b`'s memory.
    pub(super) fn onto<B: Backend>(&self, b: &B) -> Result<Proj<B>> {
        let matrix = |m: &CpuMatrix| b.matrix(host_matrix(m)).map_err(load);
        Ok(match self {
            Self::Fused { w, widths } => Proj::Fused {
                w: matrix(w)?,
                widths: widths.clone(),
            },
            Self::Separate(ws) => Proj::Separate(ws.iter().map(matrix).collect::<Result<_>>()?),
        })
    }
}
