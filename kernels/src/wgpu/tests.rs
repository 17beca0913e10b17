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
fn head_norm_and_expert_scatter_match_the_cpu() {
    t::head_norm_and_expert_scatter_match_the_cpu(&gpu());
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
fn paged_attention_past_4096_positions_matches_the_cpu() {
    t::paged_attention_past_4096_positions_matches_the_cpu(&gpu());
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
fn sliding_layers_keep_a_pool_of_their_own() {
    t::sliding_layers_keep_a_pool_of_their_own(&gpu(), |kv, l| kv.k[l].size() as usize);
}

#[test]
fn kv_blocks_move_between_backends_bit_for_bit() {
    t::kv_blocks_move_between_backends_bit_for_bit(&gpu());
}

/// The shaders' division and square root round to nearest as the CPU's
/// do, from a driver's result up to 3 ulp off (Vulkan allows 2.5 for a
/// division; lavapipe's are already exact, so each is also started that
/// far off on purpose). Quotients near a midpoint between two floats are
/// the hard cases: half of the divisions are built to land there.
#[test]
fn the_shaders_division_and_square_root_round_like_the_cpus() {
    use rand::{Rng, SeedableRng};
    let g = gpu();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut triples: Vec<[f32; 3]> = Vec::new();
    let scaled = |rng: &mut rand::rngs::StdRng, lo: i32, hi: i32| -> f32 {
        rng.random_range(1.0f32..2.0) * f32::powi(2.0, rng.random_range(lo..hi))
    };
    for i in 0..20_000 {
        let b = scaled(&mut rng, -30, 30) * if rng.random_bool(0.5) { -1.0 } else { 1.0 };
        let a = if i % 2 == 0 {
            scaled(&mut rng, -40, 40)
        } else {
            // a = (q + u/2) * b rounded: a / b lies within an ulp or so of
            // the midpoint above q.
            let q = scaled(&mut rng, -30, 30);
            let half = f64::from(q.next_up() - q) / 2.0;
            ((f64::from(q) + half) * f64::from(b)).abs() as f32
        };
        let k = rng.random_range(-3i32..=3) as f32;
        triples.push([a, b, k]);
    }
    // The neighbours of ones and powers of two (the gap changes there),
    // and integers (attention's 1 / sqrt(head_dim)).
    for a in [
        1.0f32, 2.0, 4.0, 0.5, 64.0, 128.0, 3.0, 7.0, 96.0, 1e-20, 1e20,
    ] {
        for (v, k) in [(a, 0.0), (a.next_up(), 2.0), (a.next_down(), -2.0)] {
            triples.push([v, 1.0, k]);
            triples.push([1.0, v, k]);
        }
    }
    let got = rounding_check(&g, &triples);
    for (t, got) in triples.iter().zip(got.chunks_exact(2)) {
        let (want_q, want_s) = (t[0] / t[1], t[0].sqrt());
        assert_eq!(
            got[0].to_bits(),
            want_q.to_bits(),
            "{t:?}: {:e} / {:e}",
            t[0],
            t[1]
        );
        assert_eq!(got[1].to_bits(), want_s.to_bits(), "{t:?}: sqrt {:e}", t[0]);
    }
}

/// Outside the range where the remainder is exact, and for zeros,
/// infinities and NaN, the driver's result stands: never a wrong class
/// (a NaN, an infinity or a zero where the CPU has none) and within the
/// few ulp Vulkan allows. (Subnormal operands are left out: NVIDIA's
/// Vulkan driver flushes them to zero, which Vulkan allows.)
#[test]
fn the_shaders_division_and_square_root_keep_special_values() {
    let g = gpu();
    let inf = f32::INFINITY;
    let triples: Vec<[f32; 3]> = [
        [0.0, 3.0],
        [-0.0, 3.0],
        [5.0, inf],
        [inf, 2.0],
        [f32::NAN, 2.0],
        [2.0, f32::NAN],
        [1e-30, 3.0],
        [3e30, 7.0],
        [2e-38, 1e-3],
        [-4.0, 2.0],
    ]
    .iter()
    .map(|&[a, b]| [a, b, 0.0])
    .collect();
    let got = rounding_check(&g, &triples);
    let near = |got: f32, want: f32| {
        if want.is_nan() {
            return got.is_nan();
        }
        if want.is_infinite() || want == 0.0 {
            return got == want;
        }
        (got.to_bits() as i64 - want.to_bits() as i64).abs() <= 3
    };
    for (t, got) in triples.iter().zip(got.chunks_exact(2)) {
        let (want_q, want_s) = (t[0] / t[1], t[0].sqrt());
        assert!(
            near(got[0], want_q),
            "{t:?}: {} / {} gave {:e}",
            t[0],
            t[1],
            got[0]
        );
        assert!(
            near(got[1], want_s),
            "{t:?}: sqrt {} gave {:e}",
            t[0],
            got[1]
        );
    }
}

/// The shaders' `rounding_check` on `(a, b, k)` triples: per triple, a / b
/// and sqrt(a), each corrected from the driver's result moved k ulp.
fn rounding_check(g: &WgpuBackend, triples: &[[f32; 3]]) -> Vec<f32> {
    let x: Vec<f32> = triples.iter().flatten().copied().collect();
    let out = g.new_tensor(triples.len(), 2);
    let p = [triples.len() as u32, 0, 0, 0, 0, 0, 0, 0];
    let b = [(1, &*g.tensor(x, 3).buf), (4, &*out.buf)];
    let groups = WgpuBackend::groups(triples.len());
    g.gpu
        .dispatch(Shader::Rows, "rounding_check", p, &b, groups, 1);
    g.to_host(&out)
}

#[test]
fn attention_at_a_software_adapters_position_cap_matches_the_cpu() {
    let g = gpu();
    let a = g.adapter().clone();
    let Some(_) = a.max_attention_positions(64) else {
        eprintln!("skipped: {} ({}) has no position cap", a.name, a.kind);
        return;
    };
    for hd in [64, 128, 192, 256] {
        let cap = a.max_attention_positions(hd).expect("a software adapter");
        eprintln!("heads of {hd}: {cap} positions");
        t::paged_attention_over(&g, hd, cap);
    }
}
