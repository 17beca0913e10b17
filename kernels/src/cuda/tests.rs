//! The CUDA kernels: every one compiles with NVRTC (to PTX and to a
//! CUBIN) and matches its parameter list (no device needed), one clear
//! error without a driver, and, where a CUDA device exists, the shared GPU
//! kernel tests (`gpu_tests`) on it.

use super::*;
use crate::gpu_tests as t;

/// Device 0, or `None` (the test is skipped, and says so) where this
/// machine has no CUDA driver.
fn gpu() -> Option<CudaBackend> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this machine");
        return None;
    }
    Some(CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn quantized_and_dense_matmuls_and_embeddings_match_the_reference() {
    let Some(g) = gpu() else { return };
    t::quantized_and_dense_matmuls_and_embeddings_match_the_reference(&g);
}

#[test]
fn head_norm_and_expert_scatter_match_the_cpu() {
    let Some(g) = gpu() else { return };
    t::head_norm_and_expert_scatter_match_the_cpu(&g);
}

#[test]
fn row_ops_match_the_reference() {
    let Some(g) = gpu() else { return };
    t::row_ops_match_the_reference(&g);
}

#[test]
fn rope_matches_the_cpu_both_pairings() {
    let Some(g) = gpu() else { return };
    t::rope_matches_the_cpu_both_pairings(&g);
}

#[test]
fn paged_attention_over_f16_kv_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    t::paged_attention_over_f16_kv_matches_the_cpu(&g);
}

#[test]
fn paged_attention_at_the_default_models_shapes_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    t::paged_attention_at_the_default_models_shapes_matches_the_cpu(&g);
}

#[test]
fn paged_attention_past_4096_positions_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    t::paged_attention_past_4096_positions_matches_the_cpu(&g);
}

#[test]
fn f16_conversion_rounds_like_the_half_crate() {
    let Some(g) = gpu() else { return };
    t::f16_conversion_rounds_like_the_half_crate(&g, |kv: &CudaKv| g.raw_keys(kv, 0));
}

#[test]
fn bidirectional_attention_matches_the_reference_per_sequence() {
    let Some(g) = gpu() else { return };
    t::bidirectional_attention_matches_the_reference_per_sequence(&g);
}

#[test]
fn a_matmul_of_many_outputs_covers_every_output() {
    let Some(g) = gpu() else { return };
    t::a_matmul_wider_than_one_grid_row_covers_every_output(&g, 70_000);
}

/// Each `__global__` kernel of the source and its parameters as letters
/// (`f` float*, `w` u32*, `u` u32, `x` float).
fn source_signatures() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for part in SOURCE.split("__global__ void ").skip(1) {
        let (name, rest) = part.split_once('(').expect("a parameter list");
        let params = rest.split_once(')').expect("closed").0;
        let letters = params
            .split(',')
            .map(|p| match (p.contains('*'), p.contains("float")) {
                (true, true) => 'f',
                (true, false) => 'w',
                (false, true) => 'x',
                (false, false) => 'u',
            })
            .collect();
        out.push((name.trim().to_string(), letters));
    }
    out
}

#[test]
fn every_kernel_is_launched_with_its_own_parameter_list() {
    let src = source_signatures();
    let table: Vec<(String, String)> = KERNELS
        .iter()
        .map(|(k, s)| (k.to_string(), s.to_string()))
        .collect();
    assert_eq!(
        src, table,
        "KERNELS must list the source's kernels and parameters"
    );
}

#[test]
fn every_kernel_compiles_to_ptx_and_to_a_cubin_with_nvrtc() {
    let Image::Ptx(ptx) = compile("compute_80").unwrap_or_else(|e| panic!("{e}")) else {
        panic!("compute_80 gives PTX");
    };
    for (k, _) in KERNELS {
        assert!(
            ptx.contains(&format!(".entry {k}(")),
            "{k} is not in the PTX"
        );
    }
    // The backend loads a CUBIN for the device's own architecture: Ampere
    // and Hopper here (an ELF image with every kernel's name in it).
    for arch in ["sm_80", "sm_90"] {
        let Image::Cubin(bin) = compile(arch).unwrap_or_else(|e| panic!("{e}")) else {
            panic!("{arch} gives a CUBIN");
        };
        assert_eq!(&bin[..4], b"\x7fELF", "{arch}: an ELF image");
        for (k, _) in KERNELS {
            assert!(
                bin.windows(k.len() + 1)
                    .any(|w| &w[..k.len()] == k.as_bytes() && w[k.len()] == 0),
                "{arch}: {k} is not in the CUBIN"
            );
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_gives_nvrtcs_log() {
    let e = compile_source(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "sm_80",
    )
    .expect_err("does not compile");
    assert!(e.to_string().contains("undefined_thing"), "{e}");
}

#[test]
fn without_a_driver_cuda_fails_with_one_clear_error() {
    if driver_present() {
        return; // a GPU machine: the tests above run on it instead
    }
    let e = probe(0).expect_err("no driver here");
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
    let e = CudaBackend::new(0).expect_err("no driver here");
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
}

#[test]
fn sliding_layers_keep_a_pool_of_their_own() {
    let Some(g) = gpu() else { return };
    t::sliding_layers_keep_a_pool_of_their_own(&g, |kv, l| g.raw_keys(kv, l).len() * 2);
}

#[test]
fn kv_blocks_move_between_backends_bit_for_bit() {
    let Some(g) = gpu() else { return };
    t::kv_blocks_move_between_backends_bit_for_bit(&g);
}

#[test]
fn the_profile_counts_every_launch_allocation_and_upload_once() {
    use crate::backend::Backend;
    let Some(g) = gpu() else { return };
    let g = g.profiled();
    let (rows, cols, m) = (48, 64, 3);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| (i % 13) as f32 / 7.0 - 0.9)
        .collect();
    let q = crate::QMatrix::quantize(crate::QuantType::Q4_0, rows, cols, &w).expect("quantize");
    let wm = g
        .matrix(crate::backend::HostMatrix::Quant(q))
        .expect("upload");
    assert!(g.take_profile().is_some(), "profiling is on");
    let x = g.tensor(vec![0.5; m * cols], cols);
    let y = g.matmul(&x, &wm).expect("matmul");
    assert_eq!(g.to_host(&y).len(), m * rows);
    let p = g.take_profile().expect("profiling is on");
    let names: Vec<_> = p.kernels.iter().map(|k| (k.name, k.launches)).collect();
    assert_eq!(p.launches(), 2, "{names:?}");
    assert!(names.contains(&("quantize", 1)) && names.contains(&("matmul_quant", 1)));
    assert!(p.kernels.iter().all(|k| k.gpu_ms > 0.0), "{:?}", p.kernels);
    // The activations uploaded; the quantized copy and the output allocated.
    assert_eq!((p.uploads, p.allocations), (1, 2));
    let again = g.take_profile().expect("profiling is on");
    assert_eq!(
        again,
        super::Profile::default(),
        "a report starts from zero"
    );
}

#[test]
fn the_matmul_tile_is_the_same_in_the_source_and_the_launch() {
    let define = |name: &str| -> u32 {
        let line = SOURCE
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("{name} is defined"));
        line.split_whitespace()
            .nth(2)
            .expect("a value")
            .trim_end_matches('u')
            .parse()
            .expect("a number")
    };
    let (n, s, r) = (define("MQ_N"), define("MQ_S"), define("MQ_R"));
    assert_eq!(n as usize, backend::MQ_OUTPUTS);
    assert_eq!(r as usize, backend::MQ_ROWS);
    assert_eq!(n * s, backend::MQ_THREADS);
}
