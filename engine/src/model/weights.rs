//! Weight matrices as loaded from GGUF, before a compute backend takes
//! them (`Linear::into_host`). Quantized tensors stay quantized: Q4_0,
//! Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as they are (in the kernels'
//! interleaved layouts, bit for bit the file's values), the other
//! K-quants requantized to Q8_0 (a finer step than theirs). F16, BF16
//! and F32 tensors (and any whose rows are not whole blocks) are kept in
//! f32. `Linear::forward` is the host-side product the tests compare with.

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

/// How a GGUF tensor type is brought into the kernels' formats.
enum Plan {
    /// Used as it is.
    Native(QuantType),
    /// Dequantized and requantized into Q8_0.
    Requantize,
    /// Kept as f32.
    Dense,
}

fn plan(dtype: GgmlDType, cols: usize) -> Plan {
    use kernels::quant::QK;
    if !cols.is_multiple_of(QK) {
        return Plan::Dense;
    }
    match dtype {
        GgmlDType::Q4_0 => Plan::Native(QuantType::Q4_0),
        GgmlDType::Q4_1 => Plan::Native(QuantType::Q4_1),
        GgmlDType::Q8_0 => Plan::Native(QuantType::Q8_0),
        GgmlDType::Q5_0 => Plan::Native(QuantType::Q5_0),
        GgmlDType::Q5_1 => Plan::Native(QuantType::Q5_1),
        GgmlDType::Q4K if cols.is_multiple_of(kernels::kquant::QK_K) => {
            Plan::Native(QuantType::Q4K)
        }
        GgmlDType::Q5K if cols.is_multiple_of(kernels::kquant::QK_K) => {
            Plan::Native(QuantType::Q5K)
        }
        GgmlDType::Q6K if cols.is_multiple_of(kernels::kquant::QK_K) => {
            Plan::Native(QuantType::Q6K)
        }
        GgmlDType::Q4K
        | GgmlDType::Q8_1
        | GgmlDType::Q2K
        | GgmlDType::Q3K
        | GgmlDType::Q5K
        | GgmlDType::Q6K
        | GgmlDType::Q8K => Plan::Requantize,
        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => Plan::Dense,
    }
}

impl Linear {
    /// Wraps a 2-D GGUF tensor (`(rows, cols)` in candle's order).
    pub fn from_qtensor(name: &str, qt: &QTensor) -> Result<Self> {
        let (rows, cols) = qt
            .shape()
            .dims2()
            .map_err(|e| EngineError::Load(format!("`{name}` is not a matrix: {e}")))?;
        let load = |e: &dyn std::fmt::Display| EngineError::Load(format!("`{name}`: {e}"));
        let m = match plan(qt.dtype(), cols) {
            Plan::Dense => None,
            Plan::Native(ty) => {
                let bytes = qt.data().map_err(|e| load(&e))?;
                Some(QMatrix::new(ty, rows, cols, &bytes).map_err(|e| load(&e))?)
            }
            Plan::Requantize => {
                let w = qt
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Some(QMatrix::quantize(QuantType::Q8_0, rows, cols, &w).map_err(|e| load(&e))?)
            }
        };
        if let Some(m) = m {
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

    /// The matrix as a backend takes it.
    pub fn into_host(self) -> Result<kernels::backend::HostMatrix> {
        use kernels::backend::HostMatrix;
        Ok(match self {
            Self::Quant(m) => {
                HostMatrix::Quant(Arc::try_unwrap(m).unwrap_or_else(|m| m.as_ref().clone()))
            }
            Self::Dense { w, rows, cols } => HostMatrix::Dense {
                data: w.flatten_all()?.to_vec1::<f32>()?,
                rows,
                cols,
            },
        })
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

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn k_quants_stay_quantized_and_match_their_dequantized_product() {
        let (rows, cols, m) = (48, 512, 3);
        let w = Tensor::from_vec(
            kernels::reference::ramp(rows * cols, 1),
            (rows, cols),
            &Device::Cpu,
        )
        .expect("w");
        let x = kernels::reference::ramp(m * cols, 2);
        for dtype in [
            GgmlDType::Q4K,
            GgmlDType::Q6K,
            GgmlDType::Q5K,
            GgmlDType::Q5_0,
        ] {
            let qt = QTensor::quantize(&w, dtype).expect("quantize");
            let lin = Linear::from_qtensor("w", &qt).expect("load");
            assert!(matches!(lin, Linear::Quant(_)), "{dtype:?} stays quantized");
            let got = lin.forward(&x, m).expect("forward");
            // The exact product with candle's dequantized weights.
            let deq = qt.dequantize(&Device::Cpu).expect("deq");
            let xt = Tensor::from_slice(&x, (m, cols), &Device::Cpu).expect("x");
            let want = xt.matmul(&deq.t().expect("t")).expect("mm");
            let want = want
                .flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("vec");
            let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            // Activations are quantized to 8 bits.
            assert!(
                err <= 0.02 * scale,
                "{dtype:?}: max error {err} (scale {scale})"
            );
        }
    }

    #[test]
    fn native_rows_read_back_as_candle_dequantizes_them() {
        let (rows, cols) = (20, 512);
        let w = Tensor::from_vec(
            kernels::reference::ramp(rows * cols, 3),
            (rows, cols),
            &Device::Cpu,
        )
        .expect("w");
        for dtype in [
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
        ] {
            let qt = QTensor::quantize(&w, dtype).expect("quantize");
            let lin = Linear::from_qtensor("w", &qt).expect("load");
            let Linear::Quant(m) = &lin else {
                panic!("{dtype:?} is read natively")
            };
            assert_ne!(m.ty, QuantType::Q8_0, "{dtype:?} kept in its own format");
            let deq = qt.dequantize(&Device::Cpu).expect("deq");
            for r in [0, 7, 19] {
                let want = deq.get(r).expect("row").to_vec1::<f32>().expect("vec");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&lin.row(r).expect("row")),
                    bits(&want),
                    "{dtype:?} row {r}"
                );
            }
        }
    }
}
