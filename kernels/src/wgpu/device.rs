//! `Gpu`: one wgpu device and queue, its compiled pipelines, and the
//! command encoder every operation records into. Nothing is submitted
//! until a result is read back (`read`), so a whole forward pass (every
//! layer of a decode step) is one submission with no host round trip in
//! between. Buffers are reference-counted by wgpu: one dropped while its
//! commands are pending lives until they ran.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::quant::KernelError;

/// The WGSL sources: each is compiled with `common.wgsl` in front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shader {
    Matmul,
    Rows,
    Attention,
    Copy,
}

impl Shader {
    fn source(self) -> String {
        let body = match self {
            Self::Matmul => include_str!("shaders/matmul.wgsl"),
            Self::Rows => include_str!("shaders/rows.wgsl"),
            Self::Attention => include_str!("shaders/attention.wgsl"),
            Self::Copy => include_str!("shaders/copy.wgsl"),
        };
        format!("{}\n{body}", include_str!("shaders/common.wgsl"))
    }
}

/// Workgroups per grid row: larger launches fold into a second dimension.
pub const GRID_X: u32 = 32_768;

/// What the adapter is.
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    pub name: String,
    /// `cpu` (a software rasterizer such as lavapipe), `discrete`, ...
    pub kind: String,
    pub driver: String,
    pub max_binding: u64,
    /// The PCI vendor id (0x10de NVIDIA; 0x10005 Mesa's software drivers).
    pub vendor: u32,
}

impl AdapterInfo {
    /// Whether the shaders' arithmetic was measured on this driver to be
    /// the CPU backend's bit for bit (given the CPU paths they mirror):
    /// lavapipe, and NVIDIA's Vulkan driver (an H100, `scripts/gpu-check.sh`),
    /// which contracts `a * b + c` and divides within a few ulp unless the
    /// shaders keep it from doing so (`mul_rn`, `div_rn`, `sqrt_rn`). Other
    /// drivers are held to the parity tests' tolerance.
    pub fn bit_exact(&self) -> bool {
        self.kind == "cpu" || self.vendor == 0x10de
    }

    /// The most positions the attention shader attends over correctly on
    /// this adapter, where it has such a limit: a software adapter. Mesa's
    /// (lavapipe's gallivm) ends every loop of a shader invocation once
    /// they have run `SOFTWARE_LOOP_LIMIT` iterations together, and the
    /// paged attention shader's loops run about `4.375 * hd + 140` times
    /// per 64 positions (three scoring passes of `hd + hd / 8`, the value
    /// sums, the sum, the weights' division), so past the limit its
    /// results are silently wrong (measured on lavapipe: heads of 64 fail
    /// between 8,300 and 13,000 positions, of 192 between 4,100 and 4,400,
    /// of 256 between 3,000 and 3,500). The cap counts `4.5 * hd + 256` a
    /// chunk, on the safe side; a test runs the shader at it. `None`
    /// elsewhere.
    pub fn max_attention_positions(&self, head_dim: usize) -> Option<usize> {
        (self.kind == "cpu").then(|| {
            let per_chunk = 4 * head_dim + head_dim / 2 + 256;
            (SOFTWARE_LOOP_LIMIT / per_chunk) * 64
        })
    }
}

/// Loop iterations a shader invocation runs on Mesa's software drivers
/// before every loop is ended (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`,
/// shared between every loop of a shader).
const SOFTWARE_LOOP_LIMIT: usize = 65_535;

/// The device, its queue, pipelines and pending commands.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pub info: AdapterInfo,
    pipelines: Mutex<HashMap<(Shader, &'static str), Arc<wgpu::ComputePipeline>>>,
    /// Whether the driver's `fma` rounds once (the shaders' `FUSED`).
    fused: bool,
    pending: Mutex<Option<wgpu::CommandEncoder>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// Runs a future that is ready at once (wgpu's on native) to its end.
#[cfg(not(target_arch = "wasm32"))]
fn ready<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

fn gpu_error(what: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Device(format!("{what}: {e}"))
}

/// What `fma_probe` leaves in its buffer's third word: 2^-24 where the
/// driver's `fma` rounds once, 0 where it rounds the product first.
fn fused_from(bytes: &[u8]) -> bool {
    bytes
        .get(8..12)
        .is_some_and(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) != 0.0)
}

impl Gpu {
    /// Opens the first Vulkan adapter (a GPU first, a software one when
    /// there is none).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open() -> Result<Self, KernelError> {
        let backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        let mut gpu = ready(Self::connect(backends))?;
        let probe = gpu.fma_probe();
        gpu.fused = fused_from(&gpu.read(&probe, 16)?);
        Ok(gpu)
    }

    /// Opens the browser's WebGPU adapter (`navigator.gpu`), waiting on
    /// the page's event loop. Errors the browser reports about the device
    /// are kept, and fail the next read (`web::wait`).
    #[cfg(target_arch = "wasm32")]
    pub async fn open_web() -> Result<Self, KernelError> {
        let mut gpu = Self::connect(wgpu::Backends::BROWSER_WEBGPU).await?;
        gpu.device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            super::web::keep_error(e.to_string())
        }));
        let probe = gpu.fma_probe();
        let pending = gpu.begin_read(&[(&probe, 0, 16)]);
        pending.mapped().await?;
        gpu.fused = fused_from(&pending.finish()?);
        if let Some(e) = super::web::take_error() {
            return Err(gpu_error("the browser's GPU", e));
        }
        Ok(gpu)
    }

    /// The adapter and device of `backends`, before the `fma` probe.
    async fn connect(backends: wgpu::Backends) -> Result<Self, KernelError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| gpu_error("no GPU adapter (is a Vulkan driver installed?)", e))?;
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("synor"),
                required_features: wgpu::Features::empty(),
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| gpu_error("opening the GPU device", e))?;
        let a = adapter.get_info();
        let info = AdapterInfo {
            name: a.name,
            kind: format!("{:?}", a.device_type).to_lowercase(),
            driver: format!("{} {}", a.driver, a.driver_info),
            max_binding: limits.max_storage_buffer_binding_size,
            vendor: a.vendor,
        };
        Ok(Self {
            device,
            queue,
            info,
            pipelines: Mutex::default(),
            fused: true,
            pending: Mutex::default(),
        })
    }

    /// Records the probe of whether the driver's `fma` rounds once:
    /// (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 fused and 0 when the product
    /// is rounded first (`fused_from` reads the answer).
    fn fma_probe(&self) -> Arc<wgpu::Buffer> {
        const PROBE: &str = "@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n\
            @compute @workgroup_size(1) fn probe() { o[2] = fma(o[0], o[0], o[1]); }";
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("fma probe"),
                source: wgpu::ShaderSource::Wgsl(PROBE.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("fma probe"),
                layout: None,
                module: &module,
                entry_point: Some("probe"),
                compilation_options: Default::default(),
                cache: None,
            });
        let a = 1.0 + f32::powi(2.0, -12);
        let c = -(1.0 + f32::powi(2.0, -11));
        let bytes: Vec<u8> = [a, c, 7.0, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let buf = self.upload(
            &bytes,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        );
        self.record(&pipeline, &[(0, &buf)], (1, 1, 1));
        buf
    }

    fn pipeline(&self, shader: Shader, entry: &'static str) -> Arc<wgpu::ComputePipeline> {
        let mut map = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((shader, entry))
            .or_insert_with(|| {
                let module = self
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(entry),
                        source: wgpu::ShaderSource::Wgsl(shader.source().into()),
                    });
                Arc::new(
                    self.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(entry),
                            layout: None,
                            module: &module,
                            entry_point: Some(entry),
                            compilation_options: wgpu::PipelineCompilationOptions {
                                constants: &[("FUSED", f64::from(u8::from(self.fused)))],
                                ..Default::default()
                            },
                            cache: None,
                        }),
                )
            })
            .clone()
    }

    /// A storage buffer of `bytes` (at least 16), uninitialized.
    pub fn alloc(&self, bytes: u64) -> Arc<wgpu::Buffer> {
        Arc::new(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes.max(16).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// A buffer holding `data` (written at creation: no queue ordering).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn upload(&self, data: &[u8], usage: wgpu::BufferUsages) -> Arc<wgpu::Buffer> {
        let size = (data.len() as u64).max(16).next_multiple_of(4);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: true,
        });
        // A buffer just created mapped always maps.
        if let Ok(mut view) = buf.get_mapped_range_mut(..) {
            view.slice(..data.len()).copy_from_slice(data);
        }
        buf.unmap();
        Arc::new(buf)
    }

    /// A buffer holding `data`, in a browser: written through the queue,
    /// before the next submission's commands (a buffer created mapped
    /// costs the browser a shared-memory region each: with one a
    /// dispatch, for its parameters, a decode step of the tiny model
    /// took 1.3 s on SwiftShader).
    #[cfg(target_arch = "wasm32")]
    pub fn upload(&self, data: &[u8], usage: wgpu::BufferUsages) -> Arc<wgpu::Buffer> {
        let size = (data.len() as u64).max(16).next_multiple_of(4);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: usage | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut padded = data.to_vec();
        padded.resize(size as usize, 0);
        self.queue.write_buffer(&buf, 0, &padded);
        Arc::new(buf)
    }

    /// A storage buffer holding 32-bit words.
    pub fn words(&self, words: &[u32]) -> Arc<wgpu::Buffer> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.upload(
            &bytes,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// Records one dispatch of `entry`: `params` as its uniform block,
    /// `bindings` (binding number, buffer) after it, `groups` workgroups
    /// (folded into a grid of `GRID_X` columns) by `z`.
    pub fn dispatch(
        &self,
        shader: Shader,
        entry: &'static str,
        params: [u32; 8],
        bindings: &[(u32, &wgpu::Buffer)],
        groups: u32,
        z: u32,
    ) {
        if groups == 0 || z == 0 {
            return;
        }
        // The last word is the shaders' opaque zero (`common.wgsl`).
        assert_eq!(
            params[7], 0,
            "{entry}: the last parameter word is kept zero"
        );
        let pipeline = self.pipeline(shader, entry);
        let bytes: Vec<u8> = params.iter().flat_map(|w| w.to_le_bytes()).collect();
        let uniform = self.upload(&bytes, wgpu::BufferUsages::UNIFORM);
        let mut all: Vec<(u32, &wgpu::Buffer)> = vec![(0, &uniform)];
        all.extend_from_slice(bindings);
        let (x, y) = (groups.min(GRID_X), groups.div_ceil(GRID_X));
        self.record(&pipeline, &all, (x, y, z));
    }

    /// Records one dispatch of `pipeline` over `grid` workgroups with
    /// these buffers bound, into the pending command encoder.
    fn record(
        &self,
        pipeline: &wgpu::ComputePipeline,
        bindings: &[(u32, &wgpu::Buffer)],
        grid: (u32, u32, u32),
    ) {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
            .iter()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: *i,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let enc = pending.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(grid.0, grid.1, grid.2);
    }

    /// Submits everything recorded, then reads `bytes` of `src` back.
    pub fn read(&self, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, KernelError> {
        self.read_ranges(&[(src, 0, bytes)])
    }

    /// Submits the pending commands, then reads the byte ranges `(buffer,
    /// offset, length)` back, one after another, in one copy and one wait
    /// (in a browser, a wait on its event loop: `web::wait`).
    pub fn read_ranges(
        &self,
        ranges: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<Vec<u8>, KernelError> {
        let pending = self.begin_read(ranges);
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_error("waiting for the GPU", e))?;
        #[cfg(target_arch = "wasm32")]
        super::web::wait(|| pending.is_mapped())?;
        pending.finish()
    }

    /// Submits the pending commands and a copy of `ranges` into a staging
    /// buffer, and asks for it to be mapped.
    fn begin_read(&self, ranges: &[(&wgpu::Buffer, u64, u64)]) -> PendingRead {
        let padded: Vec<u64> = ranges.iter().map(|r| r.2.next_multiple_of(4)).collect();
        let total: u64 = padded.iter().sum();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: total.max(16),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_else(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
            });
        let mut at = 0;
        for (&(src, offset, _), &len) in ranges.iter().zip(&padded) {
            if len > 0 {
                enc.copy_buffer_to_buffer(src, offset, &staging, at, len);
            }
            at += len;
        }
        self.queue.submit([enc.finish()]);
        let state = Arc::new(Mutex::new(MapState::default()));
        let done = state.clone();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let mut s = done.lock().unwrap_or_else(|e| e.into_inner());
            s.result = Some(r.map_err(|e| e.to_string()));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
            #[cfg(target_arch = "wasm32")]
            super::web::wake();
        });
        PendingRead {
            staging,
            lens: ranges.iter().map(|r| r.2).zip(padded).collect(),
            state,
        }
    }

    /// Writes `bytes` into `dst` at `offset`, after every command recorded
    /// so far (they are submitted first).
    pub fn write(&self, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        if let Some(enc) = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            self.queue.submit([enc.finish()]);
        }
        self.queue.write_buffer(dst, offset, bytes);
    }
}

/// How a staging buffer's mapping ended, and who waits for it.
#[derive(Default)]
struct MapState {
    result: Option<Result<(), String>>,
    waker: Option<std::task::Waker>,
}

/// A read submitted and not yet mapped (`Gpu::begin_read`).
struct PendingRead {
    staging: wgpu::Buffer,
    /// Each range's length and its padded length in `staging`.
    lens: Vec<(u64, u64)>,
    state: Arc<Mutex<MapState>>,
}

impl PendingRead {
    fn state(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the mapping has ended (well or not).
    #[cfg(target_arch = "wasm32")]
    fn is_mapped(&self) -> bool {
        self.state().result.is_some()
    }

    /// Waits for the mapping without blocking (a browser's event loop
    /// runs the callback).
    #[cfg(target_arch = "wasm32")]
    fn mapped(&self) -> impl std::future::Future<Output = Result<(), KernelError>> + '_ {
        std::future::poll_fn(move |cx| {
            let mut s = self.state();
            match &s.result {
                Some(Ok(())) => std::task::Poll::Ready(Ok(())),
                Some(Err(e)) => std::task::Poll::Ready(Err(gpu_error("mapping the result", e))),
                None => {
                    s.waker = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            }
        })
    }

    /// The ranges' bytes, once mapped.
    fn finish(self) -> Result<Vec<u8>, KernelError> {
        let ended = self.state().result.take();
        match ended {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(gpu_error("mapping the result", e)),
            None => return Err(gpu_error("reading back", "the GPU never answered")),
        }
        let mut out = Vec::with_capacity(self.lens.iter().map(|l| l.0 as usize).sum());
        {
            let view = self
                .staging
                .get_mapped_range(..)
                .map_err(|e| gpu_error("reading the result", e))?;
            let mut at = 0;
            for &(len, padded) in &self.lens {
                out.extend_from_slice(&view[at as usize..(at + len) as usize]);
                at += padded;
            }
        }
        self.staging.unmap();
        Ok(out)
    }
}
