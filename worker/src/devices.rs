//! What a worker can see of its machine: the CPU (model, cores, SIMD
//! features, memory), the GPU its engine runs on (`--device wgpu`: the
//! adapter; `--device cuda:N`: the CUDA device), both usable, and the GPUs
//! it does not run on but reports (Vulkan drivers that wgpu would find,
//! NVIDIA devices that CUDA would), read from the operating system without
//! loading any GPU library. Self-reported: the server shows it and
//! measures the rest (calibration, canaries).

use std::path::Path;

use protocol::Device;

/// Every device found, the CPU first.
pub fn detect(running: engine::Device) -> Vec<Device> {
    let mut out = vec![cpu()];
    // The device the engine runs on, instead of the driver's listing.
    match running.cuda_index().and_then(cuda) {
        Some(d) => out.push(d),
        None => out.extend(nvidia(Path::new("/proc/driver/nvidia/gpus"))),
    }
    match (running, adapter()) {
        (engine::Device::Wgpu, Some(a)) => out.push(a),
        _ => out.extend(vulkan(Path::new("/usr/share/vulkan/icd.d"))),
    }
    out
}

/// CUDA device `index`, which `--device cuda:N` runs models on.
#[cfg(feature = "cuda")]
fn cuda(index: u32) -> Option<Device> {
    let d = engine::gpu_executor::cuda_device(index).ok()?;
    Some(Device {
        kind: "cuda".into(),
        name: d.name,
        cores: 0,
        memory_bytes: d.memory_bytes,
        features: vec![
            format!("cuda:{}", d.index),
            format!("sm_{}{}", d.capability.0, d.capability.1),
        ],
        usable: true,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_index: u32) -> Option<Device> {
    None
}

/// The adapter `--device wgpu` runs models on.
#[cfg(feature = "wgpu")]
fn adapter() -> Option<Device> {
    let a = engine::gpu_executor::adapter().ok()?;
    Some(Device {
        kind: "wgpu".into(),
        name: a.name,
        cores: 0,
        memory_bytes: 0,
        features: vec![a.kind, a.driver],
        usable: true,
    })
}

#[cfg(not(feature = "wgpu"))]
fn adapter() -> Option<Device> {
    None
}

fn cpu() -> Device {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(
            || std::env::consts::ARCH.to_string(),
            |(_, v)| v.trim().to_string(),
        );
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total(&m))
        .unwrap_or(0);
    Device {
        kind: "cpu".into(),
        name,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        memory_bytes,
        features: simd(),
        usable: true,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn simd() -> Vec<String> {
    #[allow(unused_mut)]
    let mut f: Vec<String> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($name:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($name) {
                    f.push($name.to_string());
                })*
            };
        }
        check!(
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vnni",
            "avx512bf16"
        );
    }
    #[cfg(target_arch = "aarch64")]
    f.push("neon".into());
    f
}

/// NVIDIA GPUs the driver lists (`information` files), reported for CUDA.
fn nvidia(dir: &Path) -> Vec<Device> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Device> = entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("information")).ok())
        .map(|info| Device {
            kind: "cuda".into(),
            name: info
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))
                .map_or_else(|| "NVIDIA GPU".into(), |m| m.trim().to_string()),
            cores: 0,
            memory_bytes: 0,
            features: vec!["cuda".into()],
            usable: false,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Vulkan drivers installed (ICD manifests): what wgpu would enumerate.
fn vulkan(dir: &Path) -> Vec<Device> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".json").map(|n| n.to_string())
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|icd| Device {
            kind: "wgpu".into(),
            name: format!("Vulkan driver {icd}"),
            cores: 0,
            memory_bytes: 0,
            features: vec!["vulkan".into()],
            usable: false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_found_and_usable() {
        let d = detect(engine::Device::Cpu);
        assert_eq!(d[0].kind, "cpu");
        assert!(d[0].usable && d[0].cores >= 1 && !d[0].name.is_empty());
        assert!(
            d[1..].iter().all(|g| !g.usable),
            "a worker on the CPU runs nothing on its GPUs"
        );
    }

    #[test]
    fn memory_and_gpu_listings_are_parsed() {
        assert_eq!(
            mem_total("MemTotal:       2048 kB\nMemFree: 1 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(mem_total("nothing"), None);
        let unique = format!("synor-dev-{}-{}", std::process::id(), rand::random::<u64>());
        let dir = std::env::temp_dir().join(unique);
        let gpu = dir.join("nvidia/0000:01:00.0");
        std::fs::create_dir_all(&gpu).expect("dir");
        std::fs::write(gpu.join("information"), "Model: \t NVIDIA H100\nIRQ: 1\n").expect("info");
        let icd = dir.join("icd");
        std::fs::create_dir_all(&icd).expect("dir");
        std::fs::write(icd.join("lvp_icd.x86_64.json"), "{}").expect("icd");
        let g = nvidia(&dir.join("nvidia"));
        assert_eq!(
            (g.len(), g[0].name.as_str(), g[0].kind.as_str()),
            (1, "NVIDIA H100", "cuda")
        );
        let v = vulkan(&icd);
        assert_eq!(v[0].name, "Vulkan driver lvp_icd.x86_64");
        assert!(nvidia(&dir.join("missing")).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
