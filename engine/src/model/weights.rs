//! Weight matrices as loaded from GGUF, before a compute backend takes
//! them (`Linear::into_host`). Quantized tensors stay quantized: Q4_0,
//! Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS as they are
//! (in the kernels' interleaved layouts, bit for bit the file's values),
//! Q2_K and Q3_K requantized to Q8_0 (a finer step than theirs). F16 and
//! BF16 matrices are kept at 16 bits (`Linear::Half`; the CPU multiplies
//! them widened exactly to f32); F32 tensors (and quantized ones whose rows
//! are not whole blocks) are kept in f32. `Linear::forward` is the
//! host-side product the tests compare with.

use std::sync::Arc;

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::{Device, Tensor};
use kernels::{QMatrix, QuantType};

use crate::error::{EngineError, Result};
use crate::gguf::TensorType;

/// A `rows x cols` weight matrix (`y = x · Wᵀ`).
#[derive(Debug, Clone)]
pub enum Linear {
    Quant(Arc<QMatrix>),
    Dense {
        w: Tensor,
        rows: usize,
        cols: usize,
    },
    /// F16 or (`bf16`) BF16 bits, row-major.
    Half {
        bits: Vec<u16>,
        bf16: bool,
        rows: usize,
        cols: usize,
    },
}

/// How a GGUF tensor type is brought into the kernels' formats.
enum Plan {
    /// Used as it is.
    Native(QuantType),
    /// Dequantized and requantized into Q8_0.
    Requantize,
    /// Kept as f32.
    Dense,
    /// Kept at 16 bits (F16, BF16).
    Half,
}

/// The kernels' format of a GGUF tensor type, where they read it as it is.
fn native(ty: TensorType) -> Option<QuantType> {
    Some(match ty {
        TensorType::Q4_0 => QuantType::Q4_0,
        TensorType::Q4_1 => QuantType::Q4_1,
        TensorType::Q8_0 => QuantType::Q8_0,
        TensorType::Q5_0 => QuantType::Q5_0,
        TensorType::Q5_1 => QuantType::Q5_1,
        TensorType::Q4K => QuantType::Q4K,
        TensorType::Q5K => QuantType::Q5K,
        TensorType::Q6K => QuantType::Q6K,
        TensorType::Iq4Nl => QuantType::Iq4Nl,
        TensorType::Iq4Xs => QuantType::Iq4Xs,
        TensorType::F32
        | TensorType::F16
        | TensorType::BF16
        | TensorType::Q2K
        | TensorType::Q3K => return None,
    })
}

fn plan(ty: TensorType, cols: usize) -> Plan {
    if matches!(ty, TensorType::F16 | TensorType::BF16) {
        return Plan::Half;
    }
    if !cols.is_multiple_of(kernels::quant::QK) {
        return Plan::Dense;
    }
    match native(ty) {
        Some(q) if cols.is_multiple_of(q.block_weights()) => Plan::Native(q),
        _ if matches!(ty, TensorType::F16 | TensorType::BF16) => Plan::Half,
        _ if ty == TensorType::F32 => Plan::Dense,
        _ => Plan::Requantize,
    }
}

/// A GGUF tensor's values in f32 (`n` of them: the reader checked that
/// the bytes are whole blocks of `ty`).
pub fn dequantize(name: &str, ty: TensorType, dims: &[usize], bytes: &[u8]) -> Result<Vec<f32>> {
    let load = |e: &dyn std::fmt::Display| EngineError::Load(format!("`{name}`: {e}"));
    let n: usize = dims.iter().product();
    match (ty.candle(), native(ty)) {
        (Some(dt), _) => qtensor_from_ggml(dt, bytes, dims.to_vec(), &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| load(&e)),
        (None, Some(q)) => Ok(QMatrix::new(q, 1, n, bytes)
            .map_err(|e| load(&e))?
            .dequantize_row(0)),
        (None, None) => Err(load(&format!("{} cannot be read", ty.name()))),
    }
}

impl Linear {
    /// Wraps a 2-D GGUF tensor of type `ty` (`dims` = `[rows, cols]`)
    /// from its bytes.
    pub fn from_gguf(name: &str, ty: TensorType, dims: &[usize], bytes: &[u8]) -> Result<Self> {
        let &[rows, cols] = dims else {
            return Err(EngineError::Load(format!(
                "`{name}` is not a matrix: shape {dims:?}"
            )));
        };
        let load = |e: &dyn std::fmt::Display| EngineError::Load(format!("`{name}`: {e}"));
        let m = match plan(ty, cols) {
            Plan::Dense => {
                let w = dequantize(name, ty, dims, bytes)?;
                let w = Tensor::from_vec(w, (rows, cols), &Device::Cpu)?;
                return Ok(Self::Dense { w, rows, cols });
            }
            Plan::Half => {
                let bits = bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                let bf16 = ty == TensorType::BF16;
                return Ok(Self::Half {
                    bits,
                    bf16,
                    rows,
                    cols,
                });
            }
            Plan::Native(q) => QMatrix::new(q, rows, cols, bytes),
            Plan::Requantize => {
                let w = dequantize(name, ty, dims, bytes)?;
                QMatrix::quantize(QuantType::Q8_0, rows, cols, &w)
            }
        };
        Ok(Self::Quant(Arc::new(m.map_err(|e| load(&e))?)))
    }

    /// Whether `from_gguf` makes a `Quant` matrix of a tensor of type `ty`
    /// with rows of `cols` (its own format, or requantized to Q8_0).
    pub fn is_quantized(ty: TensorType, cols: usize) -> bool {
        matches!(plan(ty, cols), Plan::Native(_) | Plan::Requantize)
    }

    pub fn rows(&self) -> usize {
        match self {
            Self::Quant(m) => m.rows,
            Self::Dense { rows, .. } | Self::Half { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Self::Quant(m) => m.cols,
            Self::Dense { cols, .. } | Self::Half { cols, .. } => *cols,
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
            Self::Half {
                bits,
                bf16,
                rows,
                cols,
            } => {
                let p = kernels::cpu::dense::Packed::new_half(bits, *bf16, *rows, *cols);
                Ok(kernels::cpu::dense::matmul_packed(&p, x, m))
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
            Self::Half {
                bits,
                bf16,
                rows,
                cols,
            } => HostMatrix::Half {
                bits,
                bf16,
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
            Self::Half {
                bits, bf16, cols, ..
            } => Ok(kernels::backend::widen(&bits[r * cols..][..*cols], *bf16)),
        }
    }
}

/// A 1-D f32 tensor from GGUF (norm weights, biases).
pub fn vector(name: &str, ty: TensorType, dims: &[usize], bytes: &[u8]) -> Result<Vec<f32>> {
    dequantize(name, ty, dims, bytes)
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    /// A candle-quantized tensor, loaded as the engine loads a file's.
    fn load(qt: &QTensor, rows: usize, cols: usize) -> Linear {
        let ty = [
            TensorType::Q4K,
            TensorType::Q5K,
            TensorType::Q6K,
            TensorType::Q5_0,
            TensorType::Q5_1,
        ]
        .into_iter()
        .find(|t| t.candle() == Some(qt.dtype()))
        .expect("a type used here");
        let bytes = qt.data().expect("bytes");
        Linear::from_gguf("w", ty, &[rows, cols], &bytes).expect("load")
    }

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
            let lin = load(&qt, rows, cols);
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
    fn f16_and_bf16_matrices_stay_at_16_bits_with_their_exact_values() {
        let (rows, cols, m) = (40, 96, 3);
        let w = kernels::reference::ramp(rows * cols, 4);
        let x = kernels::reference::ramp(m * cols, 5);
        for (ty, bf16) in [(TensorType::F16, false), (TensorType::BF16, true)] {
            let bits = kernels::backend::narrow(&w, bf16);
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            let lin = Linear::from_gguf("w", ty, &[rows, cols], &bytes).expect("load");
            assert!(matches!(lin, Linear::Half { .. }), "{ty:?} kept at 16 bits");
            let wide = kernels::backend::widen(&bits, bf16);
            assert_eq!(lin.row(7).expect("row"), wide[7 * cols..8 * cols]);
            let want = kernels::cpu::dense::matmul_f32(&wide, rows, cols, &x, m);
            assert_eq!(lin.forward(&x, m).expect("forward"), want, "{ty:?}");
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
            let lin = load(&qt, rows, cols);
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
