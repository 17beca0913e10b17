//! Weight matrices as the forward pass uses them: GGML-quantized matrices
//! run through `kernels::cpu::matmul` (weights stay quantized), anything
//! else (F16, F32, K-quants for now) dequantized once and multiplied with
//! candle's f32 GEMM.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use kernels::{QMatrix, QuantType};

use crate::error::{EngineError, Result};

/// A `rows x cols` weight matrix (`y = x · Wᵀ`).
#[derive(Debug, Clone)]
pub enum Linear {
    Quant(Arc<QMatrix>),
    Dense { w: Tensor, rows: usize, cols: usize },
}

fn quant_type(dtype: GgmlDType) -> Option<QuantType> {
    match dtype {
        GgmlDType::Q4_0 => Some(QuantType::Q4_0),
        GgmlDType::Q4_1 => Some(QuantType::Q4_1),
        GgmlDType::Q8_0 => Some(QuantType::Q8_0),
        GgmlDType::F32
        | GgmlDType::F16
        | GgmlDType::BF16
        | GgmlDType::Q5_0
        | GgmlDType::Q5_1
        | GgmlDType::Q8_1
        | GgmlDType::Q2K
        | GgmlDType::Q3K
        | GgmlDType::Q4K
        | GgmlDType::Q5K
        | GgmlDType::Q6K
        | GgmlDType::Q8K => None,
    }
}

impl Linear {
    /// Wraps a 2-D GGUF tensor (`(rows, cols)` in candle's order).
    pub fn from_qtensor(name: &str, qt: &QTensor) -> Result<Self> {
        let (rows, cols) = qt
            .shape()
            .dims2()
            .map_err(|e| EngineError::Load(format!("`{name}` is not a matrix: {e}")))?;
        if let Some(ty) = quant_type(qt.dtype())
            && cols.is_multiple_of(kernels::quant::QK)
        {
            let bytes = qt
                .data()
                .map_err(|e| EngineError::Load(format!("`{name}`: {e}")))?;
            let m = QMatrix::new(ty, rows, cols, &bytes)
                .map_err(|e| EngineError::Load(format!("`{name}`: {e}")))?;
            return Ok(Self::Quant(Arc::new(m)));
        }
        let w = qt.dequantize(&Device::Cpu)?;
        Ok(Self::Dense { w, rows, cols })
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Quant(m) => m.rows,
            Self::Dense { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Quant(m) => m.cols,
            Self::Dense { cols, .. } => *cols,
        }
    }

    /// `m` rows of `x` (`m x cols`) times `Wᵀ`: `m x rows`.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        match self {
            Self::Quant(w) => {
                let mut out = vec![0.0; m * w.rows];
                kernels::cpu::matmul(w, x, m, &mut out)
                    .map_err(|e| EngineError::Execution(e.to_string()))?;
                Ok(out)
            }
            Self::Dense { w, cols, .. } => {
                let xt = Tensor::from_slice(x, (m, *cols), &Device::Cpu)?;
                Ok(xt.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?)
            }
        }
    }

    /// Row `r` of the matrix as f32 (embedding lookup).
    pub fn row(&self, r: usize) -> Result<Vec<f32>> {
        if r >= self.rows() {
            return Err(EngineError::Execution(format!(
                "row {r} out of range ({} rows)",
                self.rows()
            )));
        }
        match self {
            Self::Quant(m) => Ok(m.dequantize_row(r)),
            Self::Dense { w, .. } => Ok(w.get(r)?.to_vec1::<f32>()?),
        }
    }
}

/// A 1-D f32 tensor from GGUF (norm weights, biases).
pub fn vector(name: &str, qt: &QTensor) -> Result<Vec<f32>> {
    qt.dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()
        .map_err(|e| EngineError::Load(format!("`{name}`: {e}")))
}

/// Several projections of the same input (Q/K/V, or gate/up). When they
/// share a quantized format they are stacked into one matrix, so one matmul
/// (one pass over the input, one parallel region) computes all of them.
#[derive(Debug, Clone)]
pub enum MultiLinear {
    /// One stacked matrix and the row count of each part, in order.
    Fused {
        w: Linear,
        rows: Vec<usize>,
    },
    Separate(Vec<Linear>),
}

impl MultiLinear {
    pub fn new(parts: Vec<Linear>) -> Result<Self> {
        let quant: Option<Vec<&QMatrix>> = parts
            .iter()
            .map(|p| match p {
                Linear::Quant(m) => Some(m.as_ref()),
                Linear::Dense { .. } => None,
            })
            .collect();
        if let Some(ms) = quant
            && let Ok(stacked) = QMatrix::concat(&ms)
        {
            let rows = ms.iter().map(|m| m.rows).collect();
            return Ok(Self::Fused {
                w: Linear::Quant(Arc::new(stacked)),
                rows,
            });
        }
        Ok(Self::Separate(parts))
    }

    /// `m` rows of `x` through every part, the parts' outputs side by side
    /// in each row (`m x Σ rows_i`).
    pub fn forward_concat(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        match self {
            Self::Fused { w, .. } => w.forward(x, m),
            Self::Separate(parts) => {
                let outs = parts
                    .iter()
                    .map(|p| p.forward(x, m))
                    .collect::<Result<Vec<_>>>()?;
                let mut all = Vec::with_capacity(outs.iter().map(Vec::len).sum());
                for i in 0..m {
                    for (out, p) in outs.iter().zip(parts) {
                        all.extend_from_slice(&out[i * p.rows()..(i + 1) * p.rows()]);
                    }
                }
                Ok(all)
            }
        }
    }

    /// `m` rows of `x` through every part: one `m x rows_i` output per part.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<Vec<f32>>> {
        let (w, rows) = match self {
            Self::Separate(parts) => return parts.iter().map(|p| p.forward(x, m)).collect(),
            Self::Fused { w, rows } => (w, rows),
        };
        let all = w.forward(x, m)?;
        let mut outs: Vec<Vec<f32>> = rows.iter().map(|r| Vec::with_capacity(m * r)).collect();
        for row in all.chunks_exact(w.rows()) {
            let mut at = 0;
            for (out, &n) in outs.iter_mut().zip(rows) {
                out.extend_from_slice(&row[at..at + n]);
                at += n;
            }
        }
        Ok(outs)
    }
}
