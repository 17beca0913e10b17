//! `CpuBackend`: the compute backend on host memory. Quantized weights run
//! through the SIMD matmul (`cpu::matmul`), f32 weights through
//! `cpu::dense`, the row-wise ops through `cpu::ops`, the
//! paged attention through `cpu::paged` over `cpu::kv::KvStorage`, an
//! encoder's attention through `cpu::bidirectional`. Work
//! runs on the caller's rayon pool (the executor's).

use std::sync::Arc;

use super::kv::{KvLayout, KvStorage};
use super::{ops, paged};
use crate::backend::{AttnShape, Backend, HostMatrix, Rope};
use crate::quant::{KernelError, QMatrix};

/// Activations on the host: `data` holds `data.len() / cols` rows.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub cols: usize,
}

impl CpuTensor {
    pub fn rows(&self) -> usize {
        self.data.len() / self.cols.max(1)
    }
}

/// A weight matrix on the host.
#[derive(Debug, Clone)]
pub enum CpuMatrix {
    Quant(Arc<QMatrix>),
    /// f32, packed for the dense matmul (`Packed::n` rows of `k`).
    Dense(Arc<super::dense::Packed>),
}

/// The CPU backend (stateless: the thread pool is the caller's).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type Kv = KvStorage;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn matrix(&self, m: HostMatrix) -> Result<CpuMatrix, KernelError> {
        Ok(match m {
            HostMatrix::Quant(q) => CpuMatrix::Quant(Arc::new(q)),
            HostMatrix::Dense { data, rows, cols } => {
                crate::backend::check_dense(&data, rows, cols)?;
                CpuMatrix::Dense(Arc::new(super::dense::Packed::new(&data, rows, cols)))
            }
            HostMatrix::Half {
                bits,
                bf16,
                rows,
                cols,
            } => {
                crate::backend::check_half(&bits, rows, cols)?;
                let p = super::dense::Packed::new_half(&bits, bf16, rows, cols);
                CpuMatrix::Dense(Arc::new(p))
            }
        })
    }

    fn matrix_shape(&self, m: &CpuMatrix) -> (usize, usize) {
        match m {
            CpuMatrix::Quant(q) => (q.rows, q.cols),
            CpuMatrix::Dense(p) => (p.n, p.k),
        }
    }

    fn vector(&self, v: Vec<f32>) -> Vec<f32> {
        v
    }

    fn kv(&self, layout: KvLayout) -> KvStorage {
        KvStorage::new(layout)
    }

    fn kv_layout(&self, kv: &KvStorage) -> KvLayout {
        kv.layout
    }

    fn kv_blocks(&self, kv: &KvStorage, blocks: &[u32]) -> Vec<u16> {
        let l = kv.layout;
        let mut out = Vec::with_capacity(blocks.len() * l.n_layer * 2 * l.block_len());
        for &b in blocks {
            for layer in 0..l.n_layer {
                let (k, v) = kv.block_bits(layer, b);
                out.extend_from_slice(&k);
                out.extend_from_slice(&v);
            }
        }
        out
    }

    fn set_kv_blocks(&self, kv: &mut KvStorage, blocks: &[u32], bits: &[u16]) {
        let l = kv.layout;
        let mut parts = bits.chunks_exact(l.block_len());
        for &b in blocks {
            for layer in 0..l.n_layer {
                let (k, v) = (parts.next(), parts.next());
                if let (Some(k), Some(v)) = (k, v) {
                    kv.set_block_bits(layer, b, k.into(), v.into());
                }
            }
        }
    }

    fn tensor(&self, data: Vec<f32>, cols: usize) -> CpuTensor {
        CpuTensor { data, cols }
    }

    fn to_host(&self, x: &CpuTensor) -> Vec<f32> {
        x.data.clone()
    }

    fn take_host(&self, x: CpuTensor) -> Vec<f32> {
        x.data
    }

    fn embed(&self, table: &CpuMatrix, ids: &[u32]) -> Result<CpuTensor, KernelError> {
        let (rows, cols) = self.matrix_shape(table);
        crate::backend::check_ids(ids, rows)?;
        let mut data = Vec::with_capacity(ids.len() * cols);
        for &id in ids {
            let r = id as usize;
            match table {
                CpuMatrix::Quant(q) => data.extend(q.dequantize_row(r)),
                CpuMatrix::Dense(p) => data.extend(p.row(r)),
            }
        }
        Ok(CpuTensor { data, cols })
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuMatrix) -> Result<CpuTensor, KernelError> {
        let mut outs = self.matmul_many(&[(x, w)])?;
        Ok(outs.pop().expect("one product for one pair"))
    }

    fn matmul_many(
        &self,
        pairs: &[(&CpuTensor, &CpuMatrix)],
    ) -> Result<Vec<CpuTensor>, KernelError> {
        let mut outs = Vec::with_capacity(pairs.len());
        for &(x, w) in pairs {
            let (rows, cols) = self.matrix_shape(w);
            if x.cols != cols {
                return Err(KernelError::Shape {
                    what: "matmul input width",
                    expected: cols,
                    got: x.cols,
                });
            }
            outs.push(match w {
                CpuMatrix::Quant(_) => CpuTensor {
                    data: vec![0.0; x.rows() * rows],
                    cols: rows,
                },
                CpuMatrix::Dense(p) => CpuTensor {
                    data: super::dense::matmul_packed(p, &x.data, x.rows()),
                    cols: rows,
                },
            });
        }
        let mut products: Vec<super::Product<'_>> = pairs
            .iter()
            .zip(outs.iter_mut())
            .filter_map(|(&(x, w), out)| match w {
                CpuMatrix::Quant(q) => Some(super::Product {
                    w: q,
                    x: &x.data,
                    m: x.rows(),
                    out: &mut out.data,
                }),
                CpuMatrix::Dense(_) => None,
            })
            .collect();
        super::matmul_many(&mut products)?;
        Ok(outs)
    }

    fn split_cols(&self, x: &CpuTensor, widths: &[usize]) -> Vec<CpuTensor> {
        let mut outs: Vec<CpuTensor> = widths
            .iter()
            .map(|&w| CpuTensor {
                data: Vec::with_capacity(x.rows() * w),
                cols: w,
            })
            .collect();
        for row in x.data.chunks_exact(x.cols.max(1)) {
            let mut at = 0;
            for (out, &w) in outs.iter_mut().zip(widths) {
                out.data.extend_from_slice(&row[at..at + w]);
                at += w;
            }
        }
        outs
    }

    fn concat_cols(&self, parts: &[CpuTensor]) -> CpuTensor {
        let cols = parts.iter().map(|p| p.cols).sum();
        let rows = parts.first().map_or(0, CpuTensor::rows);
        let mut data = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            for p in parts {
                data.extend_from_slice(&p.data[i * p.cols..(i + 1) * p.cols]);
            }
        }
        CpuTensor { data, cols }
    }

    fn rows(&self, x: &CpuTensor, rows: &[usize]) -> CpuTensor {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            data.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        CpuTensor { data, cols: x.cols }
    }

    fn reshape(&self, x: CpuTensor, cols: usize) -> CpuTensor {
        debug_assert!(x.data.len().is_multiple_of(cols.max(1)));
        CpuTensor { data: x.data, cols }
    }

    fn add_rows_scaled(&self, x: &mut CpuTensor, y: &CpuTensor, rows: &[usize], scale: &[f32]) {
        let n = x.cols;
        for ((src, &r), &s) in y.data.chunks_exact(n.max(1)).zip(rows).zip(scale) {
            for (d, &v) in x.data[r * n..(r + 1) * n].iter_mut().zip(src) {
                *d += s * v;
            }
        }
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) {
        ops::add_in_place(&mut x.data, &y.data);
    }

    fn add_bias(&self, x: &mut CpuTensor, b: &Vec<f32>) {
        for row in x.data.chunks_exact_mut(b.len().max(1)) {
            ops::add_in_place(row, b);
        }
    }

    fn rms_norm(&self, x: &CpuTensor, w: &Vec<f32>, eps: f32) -> CpuTensor {
        CpuTensor {
            data: ops::rms_norm(&x.data, w, eps),
            cols: x.cols,
        }
    }

    fn layer_norm(&self, x: &CpuTensor, w: &Vec<f32>, b: &Vec<f32>, eps: f32) -> CpuTensor {
        CpuTensor {
            data: ops::layer_norm(&x.data, w, b, eps),
            cols: x.cols,
        }
    }

    fn swiglu(&self, gate_up: &CpuTensor) -> CpuTensor {
        let n = gate_up.cols / 2;
        CpuTensor {
            data: ops::swiglu(&gate_up.data, n),
            cols: n,
        }
    }

    fn geglu(&self, gate_up: &CpuTensor) -> CpuTensor {
        let n = gate_up.cols / 2;
        CpuTensor {
            data: ops::geglu(&gate_up.data, n),
            cols: n,
        }
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) {
        for v in &mut x.data {
            *v *= s;
        }
    }

    fn gelu(&self, x: &mut CpuTensor) {
        ops::gelu_in_place(&mut x.data);
    }

    fn softmax_rows(&self, x: &mut CpuTensor) {
        for row in x.data.chunks_exact_mut(x.cols.max(1)) {
            ops::softmax_in_place(row);
        }
    }

    fn self_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        heads: usize,
        seqs: &[usize],
    ) -> CpuTensor {
        CpuTensor {
            data: super::bidirectional::self_attention(
                &q.data, &k.data, &v.data, q.cols, heads, seqs,
            ),
            cols: q.cols,
        }
    }

    fn rope(&self, x: &mut CpuTensor, positions: &[usize], rope: &Rope) {
        let cols = x.cols;
        for (row, &pos) in x.data.chunks_exact_mut(cols.max(1)).zip(positions) {
            ops::rope_row(row, pos, rope);
        }
    }

    fn write_kv(
        &self,
        kv: &mut KvStorage,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        slots: &[(u32, usize)],
    ) {
        let rows = k
            .data
            .chunks_exact(k.cols.max(1))
            .zip(v.data.chunks_exact(v.cols.max(1)));
        for ((kr, vr), &(block, slot)) in rows.zip(slots) {
            kv.write(layer, block, slot, kr, vr);
        }
    }

    fn attention(
        &self,
        q: &CpuTensor,
        kv: &KvStorage,
        layer: usize,
        queries: &[(usize, &[u32])],
        shape: AttnShape,
    ) -> CpuTensor {
        CpuTensor {
            data: paged::paged_attention(&q.data, queries, kv, layer, shape),
            cols: q.cols,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantType;
    use crate::reference;

    #[test]
    fn experts_add_back_into_their_rows_scaled_and_heads_reshape() {
        let b = CpuBackend;
        let mut x = b.tensor(reference::ramp(5 * 6, 1), 6);
        let before = x.data.clone();
        let y = b.tensor(reference::ramp(2 * 6, 2), 6);
        b.add_rows_scaled(&mut x, &y, &[3, 0], &[0.25, -2.0]);
        for (r, row) in x.data.chunks(6).enumerate() {
            let (src, s) = match r {
                3 => (Some(&y.data[..6]), 0.25),
                0 => (Some(&y.data[6..]), -2.0),
                _ => (None, 0.0),
            };
            for (c, &v) in row.iter().enumerate() {
                let want = before[r * 6 + c] + src.map_or(0.0, |y| s * y[c]);
                assert_eq!(v, want, "row {r} col {c}");
            }
        }
        let heads = b.reshape(x.clone(), 3);
        assert_eq!((heads.rows(), heads.cols), (10, 3));
        assert_eq!(b.reshape(heads, 6), x);
    }

    #[test]
    fn dense_and_quantized_matmuls_match_the_reference() {
        let b = CpuBackend;
        let (rows, cols, m) = (40, 64, 5);
        let w = reference::ramp(rows * cols, 1);
        let x = b.tensor(reference::ramp(m * cols, 2), cols);
        let want = reference::matmul(&x.data, &w, m, cols, rows);
        let dense = b
            .matrix(HostMatrix::Dense {
                data: w.clone(),
                rows,
                cols,
            })
            .expect("dense");
        let got = b.matmul(&x, &dense).expect("matmul");
        assert!(reference::max_diff(&got.data, &want) < 1e-4);
        let q = QMatrix::quantize(QuantType::Q8_0, rows, cols, &w).expect("quantize");
        let quant = b.matrix(HostMatrix::Quant(q)).expect("quant");
        let got = b.matmul(&x, &quant).expect("matmul");
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        assert!(reference::max_diff(&got.data, &want) < 0.02 * scale);
        assert!(b.matmul(&b.tensor(vec![0.0; 3], 3), &dense).is_err());
    }

    #[test]
    fn row_ops_match_the_reference() {
        let b = CpuBackend;
        let cols = 24;
        let x = b.tensor(reference::ramp(3 * cols, 3), cols);
        let w = reference::ramp(cols, 4);
        let bias = reference::ramp(cols, 5);
        let got = b.rms_norm(&x, &w, 1e-5);
        assert!(reference::max_diff(&got.data, &reference::rms_norm(&x.data, &w, 1e-5)) < 1e-5);
        let got = b.layer_norm(&x, &w, &bias, 1e-5);
        let want = reference::layer_norm(&x.data, &w, &bias, 1e-5);
        assert!(reference::max_diff(&got.data, &want) < 1e-5);
        let mut s = x.clone();
        b.softmax_rows(&mut s);
        assert!(reference::max_diff(&s.data, &reference::softmax(&x.data, cols)) < 1e-6);
        let mut g = x.clone();
        b.gelu(&mut g);
        assert!(reference::max_diff(&g.data, &reference::gelu(&x.data)) < 1e-6);
        // One row attends only to itself: its context is its value row.
        let (q, k) = (
            b.tensor(reference::ramp(8, 6), 8),
            b.tensor(reference::ramp(8, 7), 8),
        );
        let v = b.tensor(reference::ramp(8, 8), 8);
        assert_eq!(b.self_attention(&q, &k, &v, 2, &[1]).data, v.data);
        let two = b.tensor(reference::ramp(16, 9), 8);
        // Two sequences of one row: each row attends only to itself.
        assert_eq!(b.self_attention(&two, &two, &two, 2, &[1, 1]), two);
        let ctx = b.self_attention(&two, &two, &two, 1, &[2]);
        for i in 0..2 {
            let s: Vec<f32> = (0..2)
                .map(|j| {
                    (0..8)
                        .map(|t| two.data[i * 8 + t] * two.data[j * 8 + t])
                        .sum::<f32>()
                })
                .map(|s| s / 8f32.sqrt())
                .collect();
            let p = reference::softmax(&s, 2);
            for t in 0..8 {
                let want = p[0] * two.data[t] + p[1] * two.data[8 + t];
                assert!((ctx.data[i * 8 + t] - want).abs() < 1e-5);
            }
        }
        let parts = b.split_cols(&x, &[10, 14]);
        assert_eq!(b.concat_cols(&parts), x);
        assert_eq!(b.rows(&x, &[2, 0]).data[..cols], x.data[2 * cols..]);
    }
}
