//! `CudaBackend`: the compute backend on one NVIDIA GPU, launching the
//! kernels of `kernels.cu` (compiled by NVRTC to a CUBIN for the device's
//! own architecture) on one stream.
//!
//! Weights are uploaded once and stay quantized in the layout the WGSL
//! shaders read (`gpu_pack::repack`); activations and the paged KV (f16,
//! two values to a word) stay on the device. Every operation is queued on
//! the stream and only `to_host` waits, so a forward pass makes no host
//! round trip between layers. Every launch is checked against the kernel's
//! parameter list (`super::KERNELS`) before it runs. The kernels compute
//! what the CPU backend computes, in its order and with its fused
//! multiply-adds (`__fmaf_rn`; nothing else is contracted), so a model's
//! logits are meant to be the CPU's bit for bit (the parity tests check
//! it where a GPU is).
//!
//! The `Backend` trait's operations cannot fail except where they return a
//! `Result`; a driver error (a device lost, memory exhausted mid-pass)
//! panics with the driver's message, and the engine's executor turns that
//! panic into a failed step, as with the wgpu backend.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use super::profile::{Profile, Profiler};
use super::reuse::Reused;
use super::{Image, KERNELS};
use crate::backend::{AttnShape, Backend, HostMatrix, KvLayout, Rope};
use crate::gpu_pack::{self, MAX_HEAD_DIM, TILE_M, WG, XQ_WORDS};
use crate::quant::KernelError;

/// Threads of a block in the element-wise kernels.
const ELEMENTWISE: u32 = 256;

/// `matmul_quant`'s tile (`MQ_N`, `MQ_R` in `kernels.cu`): outputs and
/// activation rows a block takes, and its threads (`MQ_N * MQ_S`).
pub(super) const MQ_OUTPUTS: usize = 32;
pub(super) const MQ_ROWS: usize = 4;
pub(super) const MQ_THREADS: u32 = 256;
// `matmul`'s check of the rows (at most 65,535 tiles of `TILE_M`) holds
// for both matmul kernels' grids.
const _: () = assert!(MQ_ROWS == TILE_M);

/// Activations on the device: `rows x cols` f32 (at least one element is
/// allocated, so an empty tensor is a valid pointer).
#[derive(Debug)]
pub struct CudaTensor {
    buf: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// A weight matrix on the device.
#[derive(Debug)]
pub struct CudaMatrix {
    data: MatrixData,
    rows: usize,
    cols: usize,
}

#[derive(Debug)]
enum MatrixData {
    /// Repacked quantized blocks: the kernels' `kind` and words per block.
    Quant {
        words: CudaSlice<u32>,
        kind: u32,
        wpb: u32,
    },
    Dense(CudaSlice<f32>),
}

/// A 1-D weight on the device.
#[derive(Debug)]
pub struct CudaVector {
    buf: CudaSlice<f32>,
}

/// The paged KV of one model: per layer, K and V as f16 pairs.
#[derive(Debug)]
pub struct CudaKv {
    layout: KvLayout,
    k: Vec<CudaSlice<u32>>,
    v: Vec<CudaSlice<u32>>,
}

/// What the device is.
#[derive(Debug, Clone)]
pub struct CudaDeviceInfo {
    pub index: u32,
    pub name: String,
    /// `(major, minor)`.
    pub capability: (i32, i32),
    pub memory_bytes: u64,
}

/// One kernel argument.
enum Arg<'a> {
    /// `float*`.
    F(&'a CudaSlice<f32>),
    /// `u32*`.
    W(&'a CudaSlice<u32>),
    /// `u32`.
    U(u32),
    /// `float`.
    X(f32),
}

impl Arg<'_> {
    fn letter(&self) -> char {
        match self {
            Arg::F(_) => 'f',
            Arg::W(_) => 'w',
            Arg::U(_) => 'u',
            Arg::X(_) => 'x',
        }
    }
}

fn u(n: usize) -> Arg<'static> {
    Arg::U(n as u32)
}

/// The CUDA backend: one device, one stream.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    stream: Arc<CudaStream>,
    functions: Arc<HashMap<&'static str, CudaFunction>>,
    info: CudaDeviceInfo,
    /// Set by `SYNOR_CUDA_PROFILE` (see `super::profile`).
    profiler: Option<Arc<Profiler>>,
    tables: Arc<StepTables>,
}

/// The per-layer tables of a forward pass, uploaded once a pass (see
/// `super::reuse`).
#[derive(Debug, Default)]
struct StepTables {
    rope: Reused<f32>,
    slots: Reused<u32>,
    queries: Reused<u32>,
    blocks: Reused<u32>,
}

fn driver(what: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Device(format!("CUDA {what}: {e}"))
}

impl CudaBackend {
    /// A gated unit (`swiglu`, `geglu`) over `[gate | up]` rows: half as wide.
    fn glu(&self, kernel: &'static str, gate_up: &CudaTensor) -> CudaTensor {
        let n = gate_up.cols / 2;
        let out = self.new_tensor(gate_up.rows, n);
        let args = [
            Arg::F(&gate_up.buf),
            Arg::F(&out.buf),
            u(gate_up.rows),
            u(n),
        ];
        self.elementwise(kernel, gate_up.rows * n, &args);
        out
    }

    /// Opens device `index`: one clear error without a driver, a device of
    /// that index, or NVRTC.
    pub fn new(index: u32) -> Result<Self, KernelError> {
        super::probe(index)?;
        let count = CudaContext::device_count().map_err(|e| driver("device count", e))?;
        if index as i32 >= count {
            return Err(KernelError::Device(format!(
                "cuda:{index}: this machine has {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(index as usize).map_err(|e| driver("context", e))?;
        // SAFETY: every allocation, copy and launch of this backend goes to
        // its one stream, in order, so no buffer is used on another stream
        // (what cudarc's per-buffer events order); without them, no buffer
        // costs two events created and destroyed.
        #[allow(unsafe_code)]
        unsafe {
            ctx.disable_event_tracking();
        }
        let capability = ctx
            .compute_capability()
            .map_err(|e| driver("compute capability", e))?;
        let info = CudaDeviceInfo {
            index,
            name: ctx.name().map_err(|e| driver("device name", e))?,
            capability,
            memory_bytes: ctx.total_mem().map_err(|e| driver("memory", e))? as u64,
        };
        let arch = format!("sm_{}{}", capability.0, capability.1);
        let module = match super::compile(&arch)? {
            Image::Cubin(bin) => ctx.load_module(cudarc::nvrtc::Ptx::from_binary(bin)),
            Image::Ptx(src) => ctx.load_module(cudarc::nvrtc::Ptx::from_src(src)),
        }
        .map_err(|e| driver("loading the kernels", e))?;
        let mut functions = HashMap::new();
        for (name, _) in KERNELS {
            let f = module
                .load_function(name)
                .map_err(|e| driver(&format!("kernel {name}"), e))?;
            functions.insert(name, f);
        }
        Ok(Self {
            stream: ctx.default_stream(),
            functions: Arc::new(functions),
            info,
            profiler: Profiler::from_env(),
            tables: Arc::default(),
        })
    }

    /// This backend with the profiler on, whatever `SYNOR_CUDA_PROFILE`
    /// says (for tests).
    #[cfg(test)]
    pub(super) fn profiled(mut self) -> Self {
        self.profiler = Some(Arc::new(Profiler::default()));
        self
    }

    /// The kernels' GPU time, launches, allocations and uploads since the
    /// last call, when `SYNOR_CUDA_PROFILE` is set (waits for the launches
    /// to finish); `None` otherwise.
    pub fn take_profile(&self) -> Option<Profile> {
        self.profiler.as_ref().map(|p| p.take())
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &CudaDeviceInfo {
        &self.info
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(u64, u64), KernelError> {
        let (free, total) = self
            .stream
            .context()
            .mem_get_info()
            .map_err(|e| driver("memory info", e))?;
        Ok((free as u64, total as u64))
    }

    /// A weight upload: a clear error when the device is out of memory or
    /// the matrix is past what the kernels index (32-bit).
    fn try_upload<T: cudarc::driver::DeviceRepr>(
        &self,
        v: &[T],
    ) -> Result<CudaSlice<T>, KernelError> {
        if v.len() > u32::MAX as usize {
            return Err(KernelError::Device(format!(
                "a weight matrix of {} values is past the kernels' 32-bit indexing",
                v.len()
            )));
        }
        self.stream
            .clone_htod(v)
            .map_err(|e| driver("weight upload", e))
    }

    /// Layer `layer`'s keys as the device holds them, f16 by f16.
    #[cfg(test)]
    pub(crate) fn raw_keys(&self, kv: &CudaKv, layer: usize) -> Vec<u16> {
        let words = self.stream.clone_dtoh(&kv.k[layer]).expect("read the keys");
        words
            .iter()
            .flat_map(|w| [*w as u16, (w >> 16) as u16])
            .collect()
    }

    /// `n` f32 on the device (at least one).
    fn alloc(&self, n: usize) -> CudaSlice<f32> {
        if let Some(p) = &self.profiler {
            p.allocated();
        }
        self.stream
            .alloc_zeros(n.max(1))
            .unwrap_or_else(|e| panic!("CUDA allocation of {n} floats: {e}"))
    }

    fn upload<T: cudarc::driver::DeviceRepr + Default + Copy>(&self, v: &[T]) -> CudaSlice<T> {
        if let Some(p) = &self.profiler {
            p.uploaded();
        }
        let one = [T::default()];
        let v = if v.is_empty() { &one[..] } else { v };
        self.stream
            .clone_htod(v)
            .unwrap_or_else(|e| panic!("CUDA upload of {} values: {e}", v.len()))
    }

    fn new_tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            buf: self.alloc(rows * cols),
            rows,
            cols,
        }
    }

    /// Launches `name` on a `grid` of blocks of `block` threads, after
    /// checking the arguments against its parameter list.
    #[allow(unsafe_code)]
    fn launch(&self, name: &'static str, grid: (u32, u32, u32), block: u32, args: &[Arg<'_>]) {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return; // nothing to compute
        }
        let sig = KERNELS
            .iter()
            .find(|(k, _)| *k == name)
            .map_or("", |(_, s)| s);
        let given: String = args.iter().map(Arg::letter).collect();
        assert_eq!(
            given, sig,
            "CUDA kernel {name}: arguments do not match its parameters"
        );
        let f = &self.functions[name];
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::F(s) => b.arg(*s),
                Arg::W(s) => b.arg(*s),
                Arg::U(v) => b.arg(v),
                Arg::X(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters in order and
        // type (checked above against `KERNELS`, itself checked against the
        // source); every buffer holds what the kernel indexes, as the
        // shapes passed beside it say (the callers size them).
        let start = self.profiler.as_ref().map(|p| p.start(&self.stream));
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("CUDA kernel {name}: {e}"));
        if let (Some(p), Some(start)) = (&self.profiler, start) {
            p.finish(name, start, &self.stream);
        }
    }

    /// One thread per element of `n`.
    fn elementwise(&self, name: &'static str, n: usize, args: &[Arg<'_>]) {
        let blocks = n.div_ceil(ELEMENTWISE as usize) as u32;
        self.launch(name, (blocks, 1, 1), ELEMENTWISE, args);
    }

    /// One 64-thread block per task (a row, a (row, head)).
    fn per_task(&self, name: &'static str, tasks: usize, args: &[Arg<'_>]) {
        self.launch(name, (tasks as u32, 1, 1), WG as u32, args);
    }

    /// Columns `off..off + width` of rows `idx` of `src` (f32 rows of
    /// `src_cols`).
    fn gather(
        &self,
        src: &CudaSlice<f32>,
        src_cols: usize,
        idx: &[u32],
        off: usize,
        width: usize,
    ) -> CudaTensor {
        let out = self.new_tensor(idx.len(), width);
        let ib = self.upload(idx);
        let args = [
            Arg::F(src),
            Arg::W(&ib),
            Arg::F(&out.buf),
            u(idx.len()),
            u(src_cols),
            u(width),
            u(off),
        ];
        self.elementwise("gather", idx.len() * width, &args);
        out
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type Kv = CudaKv;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn matrix(&self, m: HostMatrix) -> Result<CudaMatrix, KernelError> {
        let (data, rows, cols) = match m {
            HostMatrix::Quant(q) => {
                let (words, kind, wpb) = gpu_pack::repack(&q)?;
                let words = self.try_upload(&words)?;
                (MatrixData::Quant { words, kind, wpb }, q.rows, q.cols)
            }
            HostMatrix::Dense { data, rows, cols } => {
                crate::backend::check_dense(&data, rows, cols)?;
                (MatrixData::Dense(self.try_upload(&data)?), rows, cols)
            }
            HostMatrix::Half {
                bits,
                bf16,
                rows,
                cols,
            } => {
                let data = crate::backend::widen(&bits, bf16);
                crate::backend::check_dense(&data, rows, cols)?;
                (MatrixData::Dense(self.try_upload(&data)?), rows, cols)
            }
        };
        Ok(CudaMatrix { data, rows, cols })
    }

    fn matrix_shape(&self, m: &CudaMatrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn vector(&self, v: Vec<f32>) -> CudaVector {
        CudaVector {
            buf: self.upload(&v),
        }
    }

    fn kv(&self, layout: KvLayout) -> CudaKv {
        let words = layout.block_len() / 2;
        let layer = |l| {
            self.stream
                .alloc_zeros::<u32>((words * layout.layer_ids(l).len()).max(1))
                .unwrap_or_else(|e| panic!("CUDA allocation of the KV cache: {e}"))
        };
        CudaKv {
            layout,
            k: (0..layout.n_layer).map(layer).collect(),
            v: (0..layout.n_layer).map(layer).collect(),
        }
    }

    fn kv_layout(&self, kv: &CudaKv) -> KvLayout {
        kv.layout
    }

    fn kv_blocks(&self, kv: &CudaKv, blocks: &[u32]) -> Vec<u16> {
        let words = kv.layout.block_len() / 2;
        let mut out = Vec::with_capacity(blocks.len() * kv.layout.n_layer * 4 * words);
        for (l, at) in gpu_pack::kv_places(&kv.layout, blocks) {
            for buf in [&kv.k[l], &kv.v[l]] {
                let Some(at) = at.map(|i| i * words) else {
                    out.resize(out.len() + 2 * words, 0);
                    continue;
                };
                let part = self
                    .stream
                    .clone_dtoh(&buf.slice(at..at + words))
                    .unwrap_or_else(|e| panic!("CUDA: reading KV blocks back: {e}"));
                out.extend(part.iter().flat_map(|w| [*w as u16, (w >> 16) as u16]));
            }
        }
        out
    }

    fn set_kv_blocks(&self, kv: &mut CudaKv, blocks: &[u32], bits: &[u16]) {
        let words = kv.layout.block_len() / 2;
        let mut parts = bits.chunks_exact(2 * words);
        for (l, at) in gpu_pack::kv_places(&kv.layout, blocks) {
            for buf in [&mut kv.k[l], &mut kv.v[l]] {
                let Some(part) = parts.next() else { return };
                let Some(at) = at.map(|i| i * words) else {
                    continue;
                };
                let w: Vec<u32> = part
                    .chunks_exact(2)
                    .map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16))
                    .collect();
                self.stream
                    .memcpy_htod(&w, &mut buf.slice_mut(at..at + words))
                    .unwrap_or_else(|e| panic!("CUDA: writing KV blocks: {e}"));
            }
        }
    }

    fn tensor(&self, data: Vec<f32>, cols: usize) -> CudaTensor {
        CudaTensor {
            buf: self.upload(&data),
            rows: data.len() / cols.max(1),
            cols,
        }
    }

    fn to_host(&self, x: &CudaTensor) -> Vec<f32> {
        // A copy into pageable memory returns once it is done, after every
        // kernel queued before it.
        let mut v = self
            .stream
            .clone_dtoh(&x.buf)
            .unwrap_or_else(|e| panic!("CUDA: reading a result back: {e}"));
        v.truncate(x.rows * x.cols);
        v
    }

    fn embed(&self, table: &CudaMatrix, ids: &[u32]) -> Result<CudaTensor, KernelError> {
        crate::backend::check_ids(ids, table.rows)?;
        let k = table.cols;
        match &table.data {
            MatrixData::Dense(buf) => Ok(self.gather(buf, k, ids, 0, k)),
            MatrixData::Quant { words, kind, wpb } => {
                let out = self.new_tensor(ids.len(), k);
                let idb = self.upload(ids);
                let args = [
                    Arg::W(&idb),
                    Arg::W(words),
                    Arg::F(&out.buf),
                    u(ids.len()),
                    u(table.rows),
                    u(k),
                    Arg::U(*kind),
                    Arg::U(*wpb),
                ];
                self.elementwise("embed_quant", ids.len() * k / 32, &args);
                Ok(out)
            }
        }
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaMatrix) -> Result<CudaTensor, KernelError> {
        if x.cols != w.cols {
            return Err(KernelError::Shape {
                what: "matmul input width",
                expected: w.cols,
                got: x.cols,
            });
        }
        let tiles = x.rows.div_ceil(TILE_M);
        if tiles > 65_535 {
            return Err(KernelError::Shape {
                what: "matmul rows",
                expected: 65_535 * TILE_M,
                got: x.rows,
            });
        }
        let out = self.new_tensor(x.rows, w.rows);
        let grid = (w.rows as u32, 1, tiles as u32);
        let (m, n, k) = (u(x.rows), u(w.rows), u(w.cols));
        match &w.data {
            MatrixData::Dense(wb) => {
                let args = [Arg::F(&x.buf), Arg::F(wb), Arg::F(&out.buf), m, n, k];
                self.launch("matmul_dense", grid, WG as u32, &args);
            }
            MatrixData::Quant { words, kind, wpb } => {
                // The activations, quantized block by block as the CPU does.
                let blocks = x.rows * x.cols / 32;
                if let Some(p) = &self.profiler {
                    p.allocated();
                }
                let xq = self
                    .stream
                    .alloc_zeros::<u32>((blocks * XQ_WORDS).max(1))
                    .map_err(|e| driver("allocation", e))?;
                let args = [Arg::F(&x.buf), Arg::W(&xq), u(x.rows), u(x.cols)];
                self.elementwise("quantize", blocks, &args);
                let args = [
                    Arg::W(&xq),
                    Arg::W(words),
                    Arg::F(&out.buf),
                    m,
                    n,
                    k,
                    Arg::U(*kind),
                    Arg::U(*wpb),
                ];
                let grid = (
                    w.rows.div_ceil(MQ_OUTPUTS) as u32,
                    x.rows.div_ceil(MQ_ROWS) as u32,
                    1,
                );
                self.launch("matmul_quant", grid, MQ_THREADS, &args);
            }
        }
        Ok(out)
    }

    fn split_cols(&self, x: &CudaTensor, widths: &[usize]) -> Vec<CudaTensor> {
        let idx: Vec<u32> = (0..x.rows as u32).collect();
        let mut off = 0;
        widths
            .iter()
            .map(|&w| {
                let t = self.gather(&x.buf, x.cols, &idx, off, w);
                off += w;
                t
            })
            .collect()
    }

    fn concat_cols(&self, parts: &[CudaTensor]) -> CudaTensor {
        let cols = parts.iter().map(|p| p.cols).sum();
        let rows = parts.first().map_or(0, |p| p.rows);
        let out = self.new_tensor(rows, cols);
        let mut off = 0;
        for p in parts {
            let args = [
                Arg::F(&p.buf),
                Arg::F(&out.buf),
                u(rows),
                u(p.cols),
                u(cols),
                u(off),
            ];
            self.elementwise("scatter", rows * p.cols, &args);
            off += p.cols;
        }
        out
    }

    fn rows(&self, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.gather(&x.buf, x.cols, &idx, 0, x.cols)
    }

    fn reshape(&self, x: CudaTensor, cols: usize) -> CudaTensor {
        let n = x.rows * x.cols;
        debug_assert!(n.is_multiple_of(cols.max(1)));
        CudaTensor {
            buf: x.buf,
            rows: n / cols.max(1),
            cols,
        }
    }

    fn add_rows_scaled(&self, x: &mut CudaTensor, y: &CudaTensor, rows: &[usize], scale: &[f32]) {
        // The row indices, then the scales' bits, in one word buffer.
        let words: Vec<u32> = rows
            .iter()
            .map(|&r| r as u32)
            .chain(scale.iter().map(|s| s.to_bits()))
            .collect();
        let ib = self.upload(&words);
        let n = y.rows * y.cols;
        let args = [
            Arg::F(&y.buf),
            Arg::W(&ib),
            Arg::F(&x.buf),
            u(y.rows),
            u(y.cols),
        ];
        self.elementwise("scatter_add", n, &args);
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) {
        let n = x.rows * x.cols;
        self.elementwise("add", n, &[Arg::F(&x.buf), Arg::F(&y.buf), u(n)]);
    }

    fn add_bias(&self, x: &mut CudaTensor, b: &CudaVector) {
        let n = x.rows * x.cols;
        let args = [Arg::F(&x.buf), Arg::F(&b.buf), u(n), u(x.cols)];
        self.elementwise("add_bias", n, &args);
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaVector, eps: f32) -> CudaTensor {
        let out = self.new_tensor(x.rows, x.cols);
        let args = [
            Arg::F(&x.buf),
            Arg::F(&w.buf),
            Arg::F(&out.buf),
            u(x.rows),
            u(x.cols),
            Arg::X(eps),
        ];
        self.per_task("rms_norm", x.rows, &args);
        out
    }

    fn layer_norm(&self, x: &CudaTensor, w: &CudaVector, b: &CudaVector, eps: f32) -> CudaTensor {
        let out = self.new_tensor(x.rows, x.cols);
        let args = [
            Arg::F(&x.buf),
            Arg::F(&w.buf),
            Arg::F(&b.buf),
            Arg::F(&out.buf),
            u(x.rows),
            u(x.cols),
            Arg::X(eps),
        ];
        self.per_task("layer_norm", x.rows, &args);
        out
    }

    fn swiglu(&self, gate_up: &CudaTensor) -> CudaTensor {
        self.glu("swiglu", gate_up)
    }

    fn geglu(&self, gate_up: &CudaTensor) -> CudaTensor {
        self.glu("geglu", gate_up)
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        let n = x.rows * x.cols;
        self.elementwise("scale", n, &[Arg::F(&x.buf), u(n), Arg::X(s)]);
    }

    fn gelu(&self, x: &mut CudaTensor) {
        let n = x.rows * x.cols;
        self.elementwise("gelu", n, &[Arg::F(&x.buf), u(n)]);
    }

    fn softmax_rows(&self, x: &mut CudaTensor) {
        let args = [Arg::F(&x.buf), u(x.rows), u(x.cols)];
        self.per_task("softmax_rows", x.rows, &args);
    }

    fn rope(&self, x: &mut CudaTensor, positions: &[usize], rope: &Rope) {
        let cs = gpu_pack::rope_rows(positions, &rope.cos, &rope.sin, rope.rot_dim);
        let csb = self.tables.rope.get(cs, |v| self.upload(v));
        let args = [
            Arg::F(&x.buf),
            Arg::F(&csb),
            u(positions.len()),
            u(x.cols),
            u(rope.head_dim),
            u(rope.rot_dim),
            Arg::U(u32::from(rope.neox)),
        ];
        let pairs = positions.len() * x.cols / rope.head_dim * rope.rot_dim / 2;
        self.elementwise("rope", pairs, &args);
    }

    fn write_kv(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        slots: &[(u32, usize)],
    ) {
        let l = kv.layout;
        let base = l.layer_ids(layer).start;
        let ib = (self.tables.slots).get(gpu_pack::slot_words(slots, base), |v| self.upload(v));
        let n = slots.len() * l.n_kv_head * l.head_dim / 2;
        for (src, dst) in [(k, &kv.k[layer]), (v, &kv.v[layer])] {
            let args = [
                Arg::F(&src.buf),
                Arg::W(&ib),
                Arg::W(dst),
                u(slots.len()),
                u(l.n_kv_head),
                u(l.head_dim),
                u(l.block_size),
            ];
            self.elementwise("write_kv", n, &args);
        }
    }

    fn self_attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        heads: usize,
        seqs: &[usize],
    ) -> CudaTensor {
        let hd = q.cols / heads.max(1);
        assert!(
            hd <= MAX_HEAD_DIM,
            "CUDA attention: head width {hd} over {MAX_HEAD_DIM}"
        );
        let ib = self.upload(&gpu_pack::sequence_rows(seqs));
        let out = self.new_tensor(q.rows, q.cols);
        let args = [
            Arg::F(&q.buf),
            Arg::F(&k.buf),
            Arg::F(&v.buf),
            Arg::W(&ib),
            Arg::F(&out.buf),
            u(q.rows),
            u(heads),
            u(hd),
        ];
        self.per_task("bidirectional_attention", q.rows * heads, &args);
        out
    }

    fn attention(
        &self,
        q: &CudaTensor,
        kv: &CudaKv,
        layer: usize,
        queries: &[(usize, &[u32])],
        shape: AttnShape,
    ) -> CudaTensor {
        assert!(
            shape.head_dim <= MAX_HEAD_DIM,
            "CUDA attention: head width {} over {MAX_HEAD_DIM}",
            shape.head_dim
        );
        let base = kv.layout.layer_ids(layer).start;
        let (info, tables) = gpu_pack::paged_queries(queries, base);
        let ib = self.tables.queries.get(info, |v| self.upload(v));
        let tb = self.tables.blocks.get(tables, |v| self.upload(v));
        let out = self.new_tensor(q.rows, q.cols);
        let args = [
            Arg::F(&q.buf),
            Arg::W(&kv.k[layer]),
            Arg::W(&kv.v[layer]),
            Arg::W(&ib),
            Arg::W(&tb),
            Arg::F(&out.buf),
            u(queries.len()),
            u(shape.n_head),
            u(shape.n_kv_head),
            u(shape.head_dim),
            u(shape.block_size),
            u(shape.window),
            Arg::X(shape.softcap),
        ];
        self.per_task("paged_attention", queries.len() * shape.n_head, &args);
        out
    }
}
