//! The shared GPU kernel tests (`gpu_tests`) on the wgpu backend, on
//! whatever adapter wgpu finds: in CI lavapipe, Mesa's software Vulkan
//! (`.ci/run` installs it).

use super::*;
use crate::gpu_tests as t;

fn gpu() -> WgpuBackend {
    WgpuBackend::new().unwrap_or_else(|e| {
        panic!("{e}: the wgpu tests need a Vulkan driver (apt-get install mesa-vulkan-drivers)")
    })
}

#[test]
fn quantized_and_dense_matmuls_and_embeddings_match_the_reference() {
    t::quantized_and_dense_matmuls_and_embeddings_match_the_reference(&gpu());
}

#[test]
fn row_ops_match_the_reference() {
    t::row_ops_match_the_reference(&gpu());
}

#[test]
fn rope_matches_the_cpu_both_pairings() {
    t::rope_matches_the_cpu_both_pairings(&gpu());
}

#[test]
fn paged_attention_over_f16_kv_matches_the_cpu() {
    t::paged_attention_over_f16_kv_matches_the_cpu(&gpu());
}

#[test]
fn paged_attention_at_the_default_models_shapes_matches_the_cpu() {
    t::paged_attention_at_the_default_models_shapes_matches_the_cpu(&gpu());
}

#[test]
fn f16_conversion_in_the_shader_rounds_like_the_half_crate() {
    let g = gpu();
    t::f16_conversion_rounds_like_the_half_crate(&g, |kv: &GpuKv| {
        let raw = g.gpu.read(&kv.k[0], kv.k[0].size()).expect("read");
        raw.chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    });
}

#[test]
fn bidirectional_attention_matches_the_reference_per_sequence() {
    t::bidirectional_attention_matches_the_reference_per_sequence(&gpu());
}

#[test]
fn a_matmul_wider_than_one_grid_row_covers_every_output() {
    t::a_matmul_wider_than_one_grid_row_covers_every_output(&gpu(), device::GRID_X as usize + 1000);
}

#[test]
fn the_adapter_says_what_it_is() {
    let g = gpu();
    let a = g.adapter();
    assert!(!a.name.is_empty() && !a.kind.is_empty());
    assert!(a.max_binding >= 128 << 20);
}

#[test]
fn the_shaders_multiply_add_rounds_once_like_the_cpus_fma() {
    use rand::{Rng, SeedableRng};
    let g = gpu();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut triples: Vec<[f32; 3]> = Vec::new();
    // A halfway case: (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 fused, 0 not.
    let a = 1.0 + f32::powi(2.0, -12);
    triples.push([a, a, -(1.0 + f32::powi(2.0, -11))]);
    for _ in 0..20_000 {
        let a: f32 = rng.random_range(-1.0..1.0) * f32::powi(2.0, rng.random_range(-20..20));
        let b: f32 = rng.random_range(-1.0..1.0) * f32::powi(2.0, rng.random_range(-20..20));
        // Sums that cancel (c near -a*b), and sums of every other size.
        let c = match rng.random_range(0..3) {
            0 => -(a * b) * (1.0 + rng.random_range(-1e-6..1e-6)),
            1 => -(a * b),
            _ => rng.random_range(-1.0..1.0) * f32::powi(2.0, rng.random_range(-30..30)),
        };
        triples.push([a, b, c]);
    }
    let x: Vec<f32> = triples.iter().flatten().copied().collect();
    let xt = g.tensor(x, 3);
    let out = g.new_tensor(triples.len(), 1);
    let p = [triples.len() as u32, 0, 0, 0, 0, 0, 0, 0];
    let b = [(1, &*xt.buf), (4, &*out.buf)];
    g.gpu.dispatch(
        Shader::Rows,
        "fma_check",
        p,
        &b,
        WgpuBackend::groups(triples.len()),
        1,
    );
    let got = g.to_host(&out);
    for (t, got) in triples.iter().zip(got) {
        let want = t[0].mul_add(t[1], t[2]);
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "fma{t:?}: {got:e}, want {want:e}"
        );
    }
}

#[test]
fn kv_blocks_move_between_backends_bit_for_bit() {
    t::kv_blocks_move_between_backends_bit_for_bit(&gpu());
}
