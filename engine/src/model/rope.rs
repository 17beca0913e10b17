//! Rotary position embedding as a GGUF file describes it, computed once
//! into the `cos`/`sin` tables every backend applies
//! (`kernels::backend::Rope`), the way ggml's `rope_ext` does:
//!
//! - pair `i` of a `d`-wide head turns by `p * base^(-2i/d)` at position
//!   `p` (`{arch}.rope.freq_base`);
//! - Llama 3.x files carry frequency factors (`rope_freqs.weight`, one per
//!   pair) that divide those angles; Phi-3's LongRoPE carries two sets
//!   (`rope_factors_long`/`_short.weight`): the long ones where the model
//!   serves past its original context, as llama.cpp chooses, and a factor
//!   on `cos`/`sin` (`{arch}.rope.scaling.attn_factor`);
//! - linear scaling (`{arch}.rope.scaling.type = linear`, or the older
//!   `{arch}.rope.scale_linear`) multiplies every angle by `1/factor`;
//! - YaRN (`yarn`) keeps the fast pairs' angles, interpolates the slow
//!   ones by `1/factor`, and ramps between them over the pairs whose
//!   wavelengths fall between `beta_fast` and `beta_slow` turns of the
//!   original context (`{arch}.rope.scaling.original_context_length`);
//!   `cos` and `sin` are then scaled by `attn_factor * (1 + 0.1 ln factor)`.
//!
//! A scaling type this module does not know is refused at load: the model would otherwise run with the wrong
//! frequencies and answer worse, silently.

use kernels::backend::Rope;

use crate::error::{EngineError, Result};
use crate::tokenizer::gguf::Meta;

/// How positions are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Scaling {
    #[default]
    None,
    /// Every angle times `freq_scale`.
    Linear,
    /// YaRN over the original context.
    Yarn {
        original_context: usize,
        ext_factor: f32,
        beta_fast: f32,
        beta_slow: f32,
    },
}

/// Everything the tables depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// `{arch}.rope.freq_base`.
    pub base: f32,
    /// NeoX pairs (`i, i + d/2`) rather than interleaved ones.
    pub neox: bool,
    pub scaling: Scaling,
    /// `1 / factor` (1: no scaling).
    pub freq_scale: f32,
    /// YaRN's magnitude factor before its own correction.
    pub attn_factor: f32,
    /// Llama 3's per-pair divisors of the angles (`rope_freqs.weight`).
    pub freq_factors: Option<Vec<f32>>,
    /// The rotated dimensions of each head where fewer than all
    /// (`{arch}.rope.dimension_count`: Phi-4-mini's 96 of 128).
    pub rot_dim: Option<usize>,
}

impl RopeSpec {
    /// Unscaled RoPE at `base`.
    pub fn plain(base: f32, neox: bool) -> Self {
        Self {
            base,
            neox,
            scaling: Scaling::None,
            freq_scale: 1.0,
            attn_factor: 1.0,
            freq_factors: None,
            rot_dim: None,
        }
    }

    /// The rotated width of a `head_dim`-wide head.
    pub fn rot_dim(&self, head_dim: usize) -> usize {
        self.rot_dim.unwrap_or(head_dim)
    }

    /// Reads the `{arch}.rope.*` keys (the frequency factors, a tensor,
    /// are the loader's to set). A file may rotate fewer dimensions than
    /// `head_dim` (an even number of them), never more.
    pub(crate) fn from_meta(
        meta: &Meta<'_>,
        arch: &str,
        neox: bool,
        head_dim: usize,
    ) -> Result<Self> {
        let key = |k: &str| format!("{arch}.rope.{k}");
        let refuse = |what: String| Err(EngineError::Load(what));
        let rot_dim = match meta.u32(&key("dimension_count")) {
            Ok(n) if n as usize == head_dim => None,
            Ok(n) if n > 0 && n % 2 == 0 && (n as usize) < head_dim => Some(n as usize),
            Ok(n) => {
                return refuse(format!(
                    "{arch}.rope.dimension_count is {n}: a head of {head_dim} dimensions turns an even number of them, at most all"
                ));
            }
            Err(_) => None,
        };
        let mut spec = Self::plain(meta.f32(&key("freq_base")).unwrap_or(10_000.0), neox);
        spec.rot_dim = rot_dim;
        let factor = meta
            .f32(&key("scaling.factor"))
            .or_else(|_| meta.f32(&key("scale_linear")))
            .unwrap_or(0.0);
        let kind = meta
            .string(&key("scaling.type"))
            .unwrap_or(if factor > 0.0 { "linear" } else { "none" });
        if !(factor.is_finite() && factor >= 0.0) {
            return refuse(format!("{arch}.rope.scaling.factor is {factor}"));
        }
        spec.freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        spec.scaling = match kind {
            "none" => {
                spec.freq_scale = 1.0;
                Scaling::None
            }
            // LongRoPE's factors are tensors (the loader's); its angles
            // are otherwise scaled as linear ones, as llama.cpp's are.
            "linear" | "longrope" => Scaling::Linear,
            "yarn" => Scaling::Yarn {
                original_context: meta.u32(&key("scaling.original_context_length")).map_err(
                    |_| {
                        EngineError::Load(format!(
                            "YaRN needs {arch}.rope.scaling.original_context_length"
                        ))
                    },
                )? as usize,
                ext_factor: meta.f32(&key("scaling.yarn_ext_factor")).unwrap_or(1.0),
                beta_fast: meta.f32(&key("scaling.yarn_beta_fast")).unwrap_or(32.0),
                beta_slow: meta.f32(&key("scaling.yarn_beta_slow")).unwrap_or(1.0),
            },
            other => {
                return refuse(format!(
                    "rope scaling `{other}` is not supported (none, linear, longrope, yarn)"
                ));
            }
        };
        // llama.cpp multiplies `cos` and `sin` by YaRN's factor times the
        // file's own (Phi-3's LongRoPE writes `sqrt(1 + ln s / ln n)`).
        spec.attn_factor = meta.f32(&key("scaling.yarn_attn_factor")).unwrap_or(1.0)
            * meta.f32(&key("scaling.attn_factor")).unwrap_or(1.0);
        if !(spec.attn_factor.is_finite() && spec.attn_factor > 0.0) {
            return refuse(format!("{arch}.rope attention factor {}", spec.attn_factor));
        }
        Ok(spec)
    }

    /// Sets the per-pair divisors of the angles (Llama 3's, or one of
    /// Phi-3's LongRoPE sets), one per rotary pair.
    pub fn with_freq_factors(mut self, factors: Vec<f32>, head_dim: usize) -> Result<Self> {
        let pairs = self.rot_dim(head_dim) / 2;
        if factors.len() != pairs || factors.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(EngineError::Load(format!(
                "rope frequency factors: {} for {pairs} rotary pairs, each finite and positive",
                factors.len(),
            )));
        }
        self.freq_factors = Some(factors);
        Ok(self)
    }

    /// `cos`/`sin` of every rotated pair of a `head_dim`-wide head at
    /// positions `0..positions` (the frequencies are of the rotated
    /// width, as ggml's `n_dims`).
    pub fn tables(&self, head_dim: usize, positions: usize) -> Rope {
        let rot = self.rot_dim(head_dim);
        let half = rot / 2;
        let (dims, mscale) = self.yarn(rot);
        let inv: Vec<f32> = (0..half)
            .map(|i| {
                let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
                1.0 / pow(self.base, (2 * i) as f32 / rot as f32) / ff
            })
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for (i, f) in inv.iter().enumerate() {
                let extrap = p as f32 * f;
                let interp = self.freq_scale * extrap;
                let theta = match dims {
                    Some((low, high, ext)) => {
                        let mix = ramp(low, high, i) * ext;
                        interp * (1.0 - mix) + extrap * mix
                    }
                    None => interp,
                };
                let (s, c) = sin_cos(theta);
                cos.push(c * mscale);
                sin.push(s * mscale);
            }
        }
        Rope {
            cos,
            sin,
            head_dim,
            rot_dim: rot,
            neox: self.neox,
        }
    }

    /// YaRN's ramp bounds and extrapolation factor (`None` without YaRN),
    /// and the factor on `cos`/`sin`; `head_dim` is the rotated width.
    fn yarn(&self, head_dim: usize) -> (Option<(f32, f32, f32)>, f32) {
        let Scaling::Yarn {
            original_context,
            ext_factor,
            beta_fast,
            beta_slow,
        } = self.scaling
        else {
            return (None, self.attn_factor);
        };
        let n = head_dim as f32;
        // The pair whose wavelength spans `turns` turns of the context.
        let dim = |turns: f32| {
            n * ln(original_context as f32 / (turns * 2.0 * std::f32::consts::PI))
                / (2.0 * ln(self.base))
        };
        let low = dim(beta_fast).floor().max(0.0);
        let high = dim(beta_slow).ceil().min(n - 1.0);
        let mut mscale = self.attn_factor;
        if ext_factor != 0.0 {
            mscale *= 1.0 + 0.1 * ln(1.0 / self.freq_scale);
        }
        (Some((low, high, ext_factor)), mscale)
    }
}

/// 1 for the pairs below `low` (kept), 0 past `high` (interpolated),
/// linear between.
fn ramp(low: f32, high: f32, pair: usize) -> f32 {
    let y = (pair as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// `base^x` for the tables: computed in f64 and rounded once to f32, so
/// every platform's libm gives the same float (f32 `powf`, `sin` and `cos`
/// differ between glibc and the Rust libm of a browser tab by an ulp now
/// and then, and a model's greedy text with them).
fn pow(base: f32, x: f32) -> f32 {
    f64::from(base).powf(f64::from(x)) as f32
}

/// `ln x` for the tables, as `pow`.
fn ln(x: f32) -> f32 {
    f64::from(x).ln() as f32
}

/// `(sin θ, cos θ)` for the tables, as `pow`.
fn sin_cos(theta: f32) -> (f32, f32) {
    let (s, c) = f64::from(theta).sin_cos();
    (s as f32, c as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: usize = 64;

    fn at(r: &Rope, p: usize, i: usize) -> (f64, f64) {
        let h = r.head_dim / 2;
        (f64::from(r.cos[p * h + i]), f64::from(r.sin[p * h + i]))
    }

    /// Checks `r` against per-pair inverse frequencies and a magnitude,
    /// computed in f64 the way Hugging Face's `rope_utils` does.
    fn assert_matches(r: &Rope, inv: &[f64], mag: f64, positions: usize) {
        for p in [0, 1, 7, 100, positions - 1] {
            for (i, f) in inv.iter().enumerate() {
                let (c, s) = at(r, p, i);
                let t = p as f64 * f;
                let tol = 2e-3 * (1.0 + t.abs() * 1e-3);
                assert!(
                    (c - t.cos() * mag).abs() < tol,
                    "cos p={p} i={i}: {c} vs {}",
                    t.cos() * mag
                );
                assert!((s - t.sin() * mag).abs() < tol, "sin p={p} i={i}");
            }
        }
    }

    fn base_inv(base: f64) -> Vec<f64> {
        (0..D / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f64 / D as f64))
            .collect()
    }

    #[test]
    fn plain_rope_turns_each_pair_at_its_frequency() {
        let r = RopeSpec::plain(10_000.0, false).tables(D, 512);
        assert_matches(&r, &base_inv(10_000.0), 1.0, 512);
    }

    #[test]
    fn linear_scaling_divides_every_angle_by_the_factor() {
        let spec = RopeSpec {
            scaling: Scaling::Linear,
            freq_scale: 0.25,
            ..RopeSpec::plain(10_000.0, true)
        };
        let inv: Vec<f64> = base_inv(10_000.0).iter().map(|f| f / 4.0).collect();
        assert_matches(&spec.tables(D, 512), &inv, 1.0, 512);
    }

    #[test]
    fn yarn_matches_the_reference_formulation() {
        let (base, factor, orig) = (1_000_000.0f64, 4.0f64, 32_768usize);
        let spec = RopeSpec {
            scaling: Scaling::Yarn {
                original_context: orig,
                ext_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
            freq_scale: 1.0 / factor as f32,
            ..RopeSpec::plain(base as f32, true)
        };
        // Hugging Face's `_compute_yarn_parameters`: the correction range,
        // a linear ramp over it, extrapolated and interpolated frequencies
        // mixed by it, and the attention factor 0.1 ln(factor) + 1.
        let corr = |rot: f64| {
            D as f64 * (orig as f64 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (low, high) = (
            corr(32.0).floor().max(0.0),
            corr(1.0).ceil().min(D as f64 - 1.0),
        );
        let inv: Vec<f64> = base_inv(base)
            .iter()
            .enumerate()
            .map(|(i, extrap)| {
                let linear = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let keep = 1.0 - linear;
                extrap / factor * (1.0 - keep) + extrap * keep
            })
            .collect();
        assert!(
            low > 0.0 && high < (D / 2) as f64,
            "the ramp lies inside: {low} {high}"
        );
        assert_matches(&spec.tables(D, 4096), &inv, 0.1 * factor.ln() + 1.0, 4096);
    }

    #[test]
    fn llama3_frequency_factors_give_llama3s_frequencies() {
        // Llama 3.1's scaling (factor 8, low 1, high 4, original 8192) as
        // Hugging Face computes its inverse frequencies, and the factors
        // llama.cpp's converter stores for it: old over new.
        let (base, factor, low_f, high_f, orig) = (500_000.0, 8.0, 1.0, 4.0, 8192.0);
        let old = base_inv(base);
        let (low_wave, high_wave) = (orig / low_f, orig / high_f);
        let new: Vec<f64> = old
            .iter()
            .map(|&f| {
                let wave = 2.0 * std::f64::consts::PI / f;
                if wave < high_wave {
                    f
                } else if wave > low_wave {
                    f / factor
                } else {
                    let smooth = (orig / wave - low_f) / (high_f - low_f);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect();
        let factors = old.iter().zip(&new).map(|(o, n)| (o / n) as f32).collect();
        let spec = RopeSpec::plain(base as f32, false)
            .with_freq_factors(factors, D)
            .expect("factors");
        assert_matches(&spec.tables(D, 8192), &new, 1.0, 8192);
        assert!(
            RopeSpec::plain(1.0, false)
                .with_freq_factors(vec![1.0; 3], D)
                .is_err()
        );
        assert!(
            RopeSpec::plain(1.0, false)
                .with_freq_factors(vec![0.0; D / 2], D)
                .is_err()
        );
    }

    #[test]
    fn the_metadata_says_which_scaling_and_unknown_ones_are_refused() {
        use candle_core::quantized::gguf_file::Value;
        let read = |pairs: &[(&str, Value)]| {
            let m: std::collections::HashMap<String, Value> = pairs
                .iter()
                .map(|(k, v)| (format!("llama.rope.{k}"), v.clone()))
                .collect();
            RopeSpec::from_meta(&Meta(&m), "llama", false, D)
        };
        let plain = read(&[("freq_base", Value::F32(500_000.0))]).expect("plain");
        assert_eq!(plain, RopeSpec::plain(500_000.0, false));
        let old = read(&[("scale_linear", Value::F32(2.0))]).expect("old linear key");
        assert_eq!((old.scaling, old.freq_scale), (Scaling::Linear, 0.5));
        let yarn = read(&[
            ("scaling.type", Value::String("yarn".into())),
            ("scaling.factor", Value::F32(4.0)),
            ("scaling.original_context_length", Value::U32(32_768)),
        ])
        .expect("yarn");
        assert_eq!(yarn.freq_scale, 0.25);
        assert!(matches!(
            yarn.scaling,
            Scaling::Yarn {
                original_context: 32_768,
                ..
            }
        ));
        let why = |r: Result<RopeSpec>| r.expect_err("refused").to_string();
        assert!(
            why(read(&[("scaling.type", Value::String("dynamic".into()))]))
                .contains("`dynamic` is not supported")
        );
        assert!(
            why(read(&[("scaling.type", Value::String("yarn".into()))]))
                .contains("original_context_length")
        );
        // Fewer rotated dimensions than the head's are read; an odd
        // number, or more than the head has, refused.
        let partial = read(&[("dimension_count", Value::U32(32))]).expect("partial rotary");
        assert_eq!(partial.rot_dim(D), 32);
        let t = partial.tables(D, 8);
        assert_eq!((t.rot_dim, t.head_dim, t.cos.len()), (32, D, 8 * 16));
        assert!(why(read(&[("dimension_count", Value::U32(33))])).contains("even number"));
        assert!(
            why(read(&[("dimension_count", Value::U32(2 * D as u32))])).contains("at most all")
        );
        assert!(why(read(&[("scaling.factor", Value::F32(-1.0))])).contains("factor"));
    }

    #[test]
    fn the_ramp_keeps_fast_pairs_and_interpolates_slow_ones() {
        assert_eq!(ramp(2.0, 10.0, 0), 1.0);
        assert_eq!(ramp(2.0, 10.0, 12), 0.0);
        assert!((ramp(2.0, 10.0, 6) - 0.5).abs() < 1e-6);
    }
}
