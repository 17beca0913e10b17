//! `WgpuBackend` (feature `wgpu`): the compute backend on a GPU through
//! wgpu and WGSL (`shaders/`), on any Vulkan, Metal or DX12 device, and
//! on lavapipe (Mesa's software Vulkan) where there is none.
//!
//! Weights are uploaded once and stay quantized on the device: each
//! 32-weight block repacked into whole words (the scale, and Q4_1's min,
//! as f32, then the block's GGML bytes), dequantized in the matmul shader.
//! Activations and the paged KV (f16, two values to a word) stay on the
//! device; every operation records into one command encoder and only
//! `to_host` submits and waits (`device::Gpu`).
//!
//! The shaders compute what the CPU backend computes, operation for
//! operation and in its order (its fused multiply-adds, exact in software
//! where the driver's `fma` does not fuse, which `device::Gpu` probes), so
//! on a driver that neither contracts nor reassociates (lavapipe) a model's
//! logits are the CPU's bit for bit.

mod device;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "wasm32")]
pub mod web;

use std::sync::Arc;

pub use device::AdapterInfo;
use device::{Gpu, Shader};

use crate::backend::{AttnShape, Backend, HostMatrix, KvLayout, Rope};
use crate::gpu_pack::{self, KIND_F32, TILE_M, WG, XQ_WORDS};
use crate::quant::KernelError;

/// Activations on the device: `rows x cols` f32. Not `Clone`: the
/// in-place operations write its buffer, which a copy would share.
#[derive(Debug)]
pub struct GpuTensor {
    buf: Arc<wgpu::Buffer>,
    pub rows: usize,
    pub cols: usize,
}

/// A weight matrix on the device.
#[derive(Debug, Clone)]
pub struct GpuMatrix {
    buf: Arc<wgpu::Buffer>,
    rows: usize,
    cols: usize,
    /// 0 = Q4_0, 1 = Q4_1, 2 = Q8_0, 3 = f32 (the shader's `kind`).
    kind: u32,
    /// Words per 32-weight block (quantized kinds).
    words_per_block: u32,
}

/// A 1-D weight on the device.
#[derive(Debug, Clone)]
pub struct GpuVector {
    buf: Arc<wgpu::Buffer>,
}

/// The paged KV of one model: per layer, K and V buffers of f16 pairs.
#[derive(Debug)]
pub struct GpuKv {
    layout: KvLayout,
    k: Vec<Arc<wgpu::Buffer>>,
    v: Vec<Arc<wgpu::Buffer>>,
}

#[cfg(target_arch = "wasm32")]
thread_local! {
    /// The browser's device, once `open_web` opened it.
    static OPENED: std::cell::RefCell<Option<WgpuBackend>> = const { std::cell::RefCell::new(None) };
}

/// The wgpu backend: one device.
#[derive(Debug, Clone)]
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn storage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
}

impl WgpuBackend {
    /// Opens the first adapter wgpu finds (a GPU, else a software one).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self, KernelError> {
        Ok(Self {
            gpu: Arc::new(Gpu::open()?),
        })
    }

    /// The browser's GPU, which `open_web` opened.
    #[cfg(target_arch = "wasm32")]
    pub fn new() -> Result<Self, KernelError> {
        OPENED.with(|o| o.borrow().clone()).ok_or_else(|| {
            KernelError::Device("the browser's GPU is not open (WgpuBackend::open_web)".into())
        })
    }

    /// Opens the browser's WebGPU adapter, once: later calls, and every
    /// `new`, share it.
    #[cfg(target_arch = "wasm32")]
    pub async fn open_web() -> Result<Self, KernelError> {
        if let Ok(open) = Self::new() {
            return Ok(open);
        }
        let backend = Self {
            gpu: Arc::new(Gpu::open_web().await?),
        };
        OPENED.with(|o| *o.borrow_mut() = Some(backend.clone()));
        Ok(backend)
    }

    /// The adapter this backend runs on.
    pub fn adapter(&self) -> &AdapterInfo {
        &self.gpu.info
    }

    fn new_tensor(&self, rows: usize, cols: usize) -> GpuTensor {
        GpuTensor {
            buf: self.gpu.alloc((rows * cols * 4) as u64),
            rows,
            cols,
        }
    }

    /// Workgroups for one invocation per element.
    fn groups(n: usize) -> u32 {
        n.div_ceil(WG) as u32
    }

    /// One dispatch of an element-wise entry of `rows.wgsl` on `x`.
    fn rows_op(&self, entry: &'static str, x: &GpuTensor, other: Option<&wgpu::Buffer>, n: usize) {
        let p = [x.rows as u32, x.cols as u32, 0, 0, 0, 0, 0, 0];
        let mut b: Vec<(u32, &wgpu::Buffer)> = vec![(1, &x.buf)];
        if let Some(o) = other {
            b.push((2, o));
        }
        self.gpu
            .dispatch(Shader::Rows, entry, p, &b, Self::groups(n), 1);
    }

    /// `dst` = columns `off..off + width` of rows `idx` of `src`.
    fn gather(&self, src: &GpuTensor, idx: &[u32], off: usize, width: usize) -> GpuTensor {
        let out = self.new_tensor(idx.len(), width);
        let ib = self.gpu.words(idx);
        let p = [
            idx.len() as u32,
            src.cols as u32,
            width as u32,
            off as u32,
            0,
            0,
            0,
            0,
        ];
        let b = [(1, &*src.buf), (2, &*ib), (3, &*out.buf)];
        self.gpu.dispatch(
            Shader::Copy,
            "gather",
            p,
            &b,
            Self::groups(idx.len() * width),
            1,
        );
        out
    }

    fn check_binding(&self, what: &'static str, bytes: usize) -> Result<(), KernelError> {
        let max = self.gpu.info.max_binding as usize;
        if bytes > max {
            return Err(KernelError::Device(format!(
                "{what} of {bytes} bytes is over this device's {max}-byte binding limit"
            )));
        }
        Ok(())
    }

    /// A gated unit (`swiglu`, `geglu`) over rows `[gate | up]`.
    fn glu(&self, entry: &'static str, gate_up: &GpuTensor) -> GpuTensor {
        let n = gate_up.cols / 2;
        let out = self.new_tensor(gate_up.rows, n);
        let p = [
            gate_up.rows as u32,
            gate_up.cols as u32,
            n as u32,
            0,
            0,
            0,
            0,
            0,
        ];
        let b = [(1, &*gate_up.buf), (4, &*out.buf)];
        self.gpu.dispatch(
            Shader::Rows,
            entry,
            p,
            &b,
            Self::groups(gate_up.rows * n),
            1,
        );
        out
    }
}

impl Backend for WgpuBackend {
    type Tensor = GpuTensor;
    type Matrix = GpuMatrix;
    type Vector = GpuVector;
    type Kv = GpuKv;

    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn matrix(&self, m: HostMatrix) -> Result<GpuMatrix, KernelError> {
        let dense = |data: Vec<f32>, rows: usize, cols: usize| {
            crate::backend::check_dense(&data, rows, cols)?;
            let words = data.iter().map(|v| v.to_bits()).collect();
            Ok::<_, KernelError>((words, rows, cols, KIND_F32, 0))
        };
        let (words, rows, cols, kind, wpb) = match m {
            HostMatrix::Quant(q) => {
                let (w, kind, wpb) = gpu_pack::repack(&q)?;
                (w, q.rows, q.cols, kind, wpb)
            }
            HostMatrix::Dense { data, rows, cols } => dense(data, rows, cols)?,
            HostMatrix::Half {
                bits,
                bf16,
                rows,
                cols,
            } => dense(crate::backend::widen(&bits, bf16), rows, cols)?,
        };
        self.check_binding("a weight matrix", words.len() * 4)?;
        Ok(GpuMatrix {
            buf: self.gpu.words(&words),
            rows,
            cols,
            kind,
            words_per_block: wpb,
        })
    }

    fn matrix_shape(&self, m: &GpuMatrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn vector(&self, v: Vec<f32>) -> GpuVector {
        GpuVector {
            buf: self.gpu.upload(&f32_bytes(&v), storage()),
        }
    }

    fn kv(&self, layout: KvLayout) -> GpuKv {
        let block = (layout.block_len() * 2) as u64;
        let layer = |l| {
            self.gpu
                .alloc(block * layout.layer_ids(l).len().max(1) as u64)
        };
        GpuKv {
            layout,
            k: (0..layout.n_layer).map(layer).collect(),
            v: (0..layout.n_layer).map(layer).collect(),
        }
    }

    fn kv_layout(&self, kv: &GpuKv) -> KvLayout {
        kv.layout
    }

    fn kv_blocks(&self, kv: &GpuKv, blocks: &[u32]) -> Vec<u16> {
        let l = kv.layout;
        let bytes = (l.block_len() * 2) as u64;
        let places = gpu_pack::kv_places(&l, blocks);
        let ranges: Vec<(&wgpu::Buffer, u64, u64)> = places
            .iter()
            .filter_map(|&(layer, at)| {
                let at = at? as u64 * bytes;
                Some([(&*kv.k[layer], at, bytes), (&*kv.v[layer], at, bytes)])
            })
            .flatten()
            .collect();
        // A device lost mid-read is not recoverable here (as `to_host`).
        let raw = self
            .gpu
            .read_ranges(&ranges)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut held = raw.chunks_exact(2 * bytes as usize);
        let mut out = Vec::with_capacity(places.len() * 2 * l.block_len());
        for (_, at) in places {
            match at.and_then(|_| held.next()) {
                Some(kv) => {
                    out.extend(kv.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                }
                None => out.resize(out.len() + 2 * l.block_len(), 0),
            }
        }
        out
    }

    fn set_kv_blocks(&self, kv: &mut GpuKv, blocks: &[u32], bits: &[u16]) {
        let n = kv.layout.block_len();
        let mut parts = bits.chunks_exact(n);
        for (layer, at) in gpu_pack::kv_places(&kv.layout, blocks) {
            for buf in [&kv.k[layer], &kv.v[layer]] {
                let (Some(part), Some(at)) = (parts.next(), at) else {
                    continue;
                };
                let bytes: Vec<u8> = part.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.gpu.write(buf, (at * n * 2) as u64, &bytes);
            }
        }
    }

    fn tensor(&self, data: Vec<f32>, cols: usize) -> GpuTensor {
        GpuTensor {
            buf: self.gpu.upload(&f32_bytes(&data), storage()),
            rows: data.len() / cols.max(1),
            cols,
        }
    }

    fn to_host(&self, x: &GpuTensor) -> Vec<f32> {
        let n = x.rows * x.cols;
        // A device lost mid-pass is not recoverable here: the engine's
        // executor turns the panic into a failed step.
        let bytes = self
            .gpu
            .read(&x.buf, (n * 4) as u64)
            .unwrap_or_else(|e| panic!("{e}"));
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn embed(&self, table: &GpuMatrix, ids: &[u32]) -> Result<GpuTensor, KernelError> {
        crate::backend::check_ids(ids, table.rows)?;
        let out = self.new_tensor(ids.len(), table.cols);
        let idb = self.gpu.words(ids);
        let p = [
            ids.len() as u32,
            table.rows as u32,
            table.cols as u32,
            table.kind,
            table.words_per_block,
            0,
            0,
            0,
        ];
        let (entry, n) = if table.kind == KIND_F32 {
            ("embed_dense", ids.len() * table.cols)
        } else {
            ("embed", ids.len() * table.cols / 32)
        };
        let b = [(1, &*idb), (2, &*table.buf), (3, &*out.buf)];
        self.gpu
            .dispatch(Shader::Matmul, entry, p, &b, Self::groups(n), 1);
        Ok(out)
    }

    fn matmul(&self, x: &GpuTensor, w: &GpuMatrix) -> Result<GpuTensor, KernelError> {
        if x.cols != w.cols {
            return Err(KernelError::Shape {
                what: "matmul input width",
                expected: w.cols,
                got: x.cols,
            });
        }
        let out = self.new_tensor(x.rows, w.rows);
        let p = [
            x.rows as u32,
            w.rows as u32,
            w.cols as u32,
            w.kind,
            w.words_per_block,
            0,
            0,
            0,
        ];
        let z = x.rows.div_ceil(TILE_M) as u32;
        if w.kind == KIND_F32 {
            let b = [(1, &*x.buf), (2, &*w.buf), (3, &*out.buf)];
            self.gpu
                .dispatch(Shader::Matmul, "dense", p, &b, w.rows as u32, z);
            return Ok(out);
        }
        // The activations, quantized block by block as the CPU does.
        let blocks = x.rows * x.cols / 32;
        let xq = self.gpu.alloc((blocks * XQ_WORDS * 4) as u64);
        let b = [(1, &*x.buf), (4, &*xq)];
        self.gpu
            .dispatch(Shader::Matmul, "quantize", p, &b, Self::groups(blocks), 1);
        let b = [(2, &*w.buf), (3, &*out.buf), (4, &*xq)];
        let outputs = Self::groups(x.rows * w.rows);
        self.gpu
            .dispatch(Shader::Matmul, "quant", p, &b, outputs, 1);
        Ok(out)
    }

    fn split_cols(&self, x: &GpuTensor, widths: &[usize]) -> Vec<GpuTensor> {
        let idx: Vec<u32> = (0..x.rows as u32).collect();
        let mut off = 0;
        widths
            .iter()
            .map(|&w| {
                let t = self.gather(x, &idx, off, w);
                off += w;
                t
            })
            .collect()
    }

    fn concat_cols(&self, parts: &[GpuTensor]) -> GpuTensor {
        let cols = parts.iter().map(|p| p.cols).sum();
        let rows = parts.first().map_or(0, |p| p.rows);
        let out = self.new_tensor(rows, cols);
        let mut off = 0;
        for part in parts {
            let p = [
                rows as u32,
                part.cols as u32,
                cols as u32,
                off as u32,
                0,
                0,
                0,
                0,
            ];
            let b = [(1, &*part.buf), (3, &*out.buf)];
            self.gpu.dispatch(
                Shader::Copy,
                "scatter",
                p,
                &b,
                Self::groups(rows * part.cols),
                1,
            );
            off += part.cols;
        }
        out
    }

    fn rows(&self, x: &GpuTensor, rows: &[usize]) -> GpuTensor {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.gather(x, &idx, 0, x.cols)
    }

    fn reshape(&self, x: GpuTensor, cols: usize) -> GpuTensor {
        let n = x.rows * x.cols;
        debug_assert!(n.is_multiple_of(cols.max(1)));
        GpuTensor {
            buf: x.buf,
            rows: n / cols.max(1),
            cols,
        }
    }

    fn add_rows_scaled(&self, x: &mut GpuTensor, y: &GpuTensor, rows: &[usize], scale: &[f32]) {
        // The row indices, then the scales' bits, in one word buffer.
        let words: Vec<u32> = rows
            .iter()
            .map(|&r| r as u32)
            .chain(scale.iter().map(|s| s.to_bits()))
            .collect();
        let ib = self.gpu.words(&words);
        let p = [y.rows as u32, y.cols as u32, 0, 0, 0, 0, 0, 0];
        let b = [(1, &*y.buf), (2, &*ib), (3, &*x.buf)];
        let n = y.rows * y.cols;
        self.gpu
            .dispatch(Shader::Copy, "scatter_add", p, &b, Self::groups(n), 1);
    }

    fn add(&self, x: &mut GpuTensor, y: &GpuTensor) {
        self.rows_op("add", x, Some(&y.buf), x.rows * x.cols);
    }

    fn add_bias(&self, x: &mut GpuTensor, b: &GpuVector) {
        self.rows_op("add_bias", x, Some(&b.buf), x.rows * x.cols);
    }

    fn rms_norm(&self, x: &GpuTensor, w: &GpuVector, eps: f32) -> GpuTensor {
        let out = self.new_tensor(x.rows, x.cols);
        let p = [x.rows as u32, x.cols as u32, 0, 0, eps.to_bits(), 0, 0, 0];
        let b = [(1, &*x.buf), (2, &*w.buf), (4, &*out.buf)];
        self.gpu
            .dispatch(Shader::Rows, "rms_norm", p, &b, x.rows as u32, 1);
        out
    }

    fn layer_norm(&self, x: &GpuTensor, w: &GpuVector, bias: &GpuVector, eps: f32) -> GpuTensor {
        let out = self.new_tensor(x.rows, x.cols);
        let p = [x.rows as u32, x.cols as u32, 0, 0, eps.to_bits(), 0, 0, 0];
        let b = [(1, &*x.buf), (2, &*w.buf), (3, &*bias.buf), (4, &*out.buf)];
        self.gpu
            .dispatch(Shader::Rows, "layer_norm", p, &b, x.rows as u32, 1);
        out
    }

    fn swiglu(&self, gate_up: &GpuTensor) -> GpuTensor {
        self.glu("swiglu", gate_up)
    }

    fn geglu(&self, gate_up: &GpuTensor) -> GpuTensor {
        self.glu("geglu", gate_up)
    }

    fn scale(&self, x: &mut GpuTensor, s: f32) {
        let p = [x.rows as u32, x.cols as u32, 0, 0, s.to_bits(), 0, 0, 0];
        let n = x.rows * x.cols;
        self.gpu.dispatch(
            Shader::Rows,
            "scale",
            p,
            &[(1, &*x.buf)],
            Self::groups(n),
            1,
        );
    }
    fn gelu(&self, x: &mut GpuTensor) {
        self.rows_op("gelu", x, None, x.rows * x.cols);
    }

    fn softmax_rows(&self, x: &mut GpuTensor) {
        let p = [x.rows as u32, x.cols as u32, 0, 0, 0, 0, 0, 0];
        self.gpu.dispatch(
            Shader::Rows,
            "softmax",
            p,
            &[(1, &*x.buf)],
            x.rows as u32,
            1,
        );
    }

    fn rope(&self, x: &mut GpuTensor, positions: &[usize], rope: &Rope) {
        let cs = gpu_pack::rope_rows(positions, &rope.cos, &rope.sin, rope.rot_dim);
        let csb = self.gpu.upload(&f32_bytes(&cs), storage());
        let p = [
            positions.len() as u32,
            x.cols as u32,
            0,
            u32::from(rope.neox),
            0,
            rope.head_dim as u32,
            rope.rot_dim as u32,
            0,
        ];
        let b = [(1, &*x.buf), (2, &*csb)];
        let n = positions.len() * x.cols / rope.head_dim * rope.rot_dim / 2;
        self.gpu
            .dispatch(Shader::Rows, "rope", p, &b, Self::groups(n), 1);
    }

    fn write_kv(
        &self,
        kv: &mut GpuKv,
        layer: usize,
        k: &GpuTensor,
        v: &GpuTensor,
        slots: &[(u32, usize)],
    ) {
        let l = kv.layout;
        let idx = gpu_pack::slot_words(slots, l.layer_ids(layer).start);
        let ib = self.gpu.words(&idx);
        let p = [
            slots.len() as u32,
            l.n_kv_head as u32,
            l.head_dim as u32,
            l.block_size as u32,
            0,
            0,
            0,
            0,
        ];
        let n = slots.len() * l.n_kv_head * l.head_dim / 2;
        for (src, dst) in [(k, &kv.k[layer]), (v, &kv.v[layer])] {
            let b = [(1, &*src.buf), (2, &*ib), (4, &**dst)];
            self.gpu
                .dispatch(Shader::Copy, "write_kv", p, &b, Self::groups(n), 1);
        }
    }

    fn self_attention(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        heads: usize,
        seqs: &[usize],
    ) -> GpuTensor {
        let info = gpu_pack::sequence_rows(seqs);
        let ib = self.gpu.words(&info);
        let out = self.new_tensor(q.rows, q.cols);
        let hd = q.cols / heads.max(1);
        let p = [
            q.rows as u32,
            heads as u32,
            heads as u32,
            hd as u32,
            1,
            0,
            0,
            0,
        ];
        let b = [
            (1, &*q.buf),
            (2, &*k.buf),
            (3, &*v.buf),
            (4, &*ib),
            (6, &*out.buf),
        ];
        self.gpu.dispatch(
            Shader::Attention,
            "bidirectional",
            p,
            &b,
            (q.rows * heads) as u32,
            1,
        );
        out
    }

    fn attention(
        &self,
        q: &GpuTensor,
        kv: &GpuKv,
        layer: usize,
        queries: &[(usize, &[u32])],
        shape: AttnShape,
    ) -> GpuTensor {
        let base = kv.layout.layer_ids(layer).start;
        let (info, tables) = gpu_pack::paged_queries(queries, base);
        let (ib, tb) = (self.gpu.words(&info), self.gpu.words(&tables));
        let out = self.new_tensor(q.rows, q.cols);
        let p = [
            queries.len() as u32,
            shape.n_head as u32,
            shape.n_kv_head as u32,
            shape.head_dim as u32,
            shape.block_size as u32,
            shape.window as u32,
            shape.softcap.to_bits(),
            0,
        ];
        let b = [
            (1, &*q.buf),
            (2, &*kv.k[layer]),
            (3, &*kv.v[layer]),
            (4, &*ib),
            (5, &*tb),
            (6, &*out.buf),
        ];
        self.gpu.dispatch(
            Shader::Attention,
            "paged",
            p,
            &b,
            (queries.len() * shape.n_head) as u32,
            1,
        );
        out
    }
}
