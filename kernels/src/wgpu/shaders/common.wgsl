// Shared by every shader (prepended by the host): the parameter block,
// f16 conversions written out by hand (so no shader needs the f16
// extension, which lavapipe and older drivers lack in some builds), an
// `exp` accurate to an ulp, and workgroup reductions.

struct Params {
    a: vec4<u32>,
    b: vec4<u32>,
}

// f16 bits (low 16 bits of `h`) to f32.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        let v = f32(m) * 5.9604645e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to f16 bits, rounding to nearest even (as the `half` crate does).
fn f32_to_f16(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = (x >> 23u) & 0xffu;
    let m = x & 0x7fffffu;
    if (e == 0xffu) {
        return sign | 0x7c00u | select(0u, 0x200u, m != 0u) | (m >> 13u);
    }
    let he = i32(e) - 112;
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        if (he < -10) {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - he);
        let round = 1u << (shift - 1u);
        var hm = mm >> shift;
        if ((mm & round) != 0u && (mm & (3u * round - 1u)) != 0u) {
            hm += 1u;
        }
        return sign | hm;
    }
    var h = sign | (u32(he) << 10u) | (m >> 13u);
    if ((m & 0x1000u) != 0u && (m & 0x2fffu) != 0u) {
        h += 1u;
    }
    return h;
}

// The linear index of a workgroup in a grid folded into x and y.
fn group_index(wid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return wid.x + wid.y * groups.x;
}

// The linear index of an invocation of a 64-wide workgroup in such a grid.
fn element(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * 64u;
}

// a * b rounded on its own, as the CPU rounds it: never fused with the
// add or subtract that takes it. SPIR-V lets a driver contract `a * b + c`
// into one rounding unless the product is decorated NoContraction, which
// naga does not emit; the product's bits through `opaque` cannot be fused.
fn mul_rn(a: f32, b: f32) -> f32 {
    return opaque(a * b);
}

// Below and above these the remainders `div_rn` and `sqrt_rn` correct
// with may not be exact (2^-80, 2^80): there they keep the driver's result.
const EXACT_LO: f32 = 8.271806e-25;
const EXACT_HI: f32 = 1.2089258e24;

// a / b rounded to nearest even, as the CPU divides. Vulkan lets a
// driver's division be 2.5 ulp off (and compilers turn `a / c` into a
// multiply by 1 / c); the quotient is moved ulp by ulp toward the exact
// one, judged by the exact remainder a - q * b (one fused multiply-add),
// until q is the nearest float. Zeros, infinities, NaN and operands or
// quotients outside [EXACT_LO, EXACT_HI] keep the driver's quotient.
fn div_rn(a: f32, b: f32) -> f32 {
    return div_from(a, b, opaque(a / b));
}

// div_rn from a first guess q0 of a / b, as far off as a driver may be.
fn div_from(a: f32, b: f32, q0: f32) -> f32 {
    let x = abs(a);
    let y = abs(b);
    var q = abs(q0);
    if (!(min(min(x, y), q) >= EXACT_LO && max(max(x, y), q) <= EXACT_HI)) {
        return q0;
    }
    // One Newton step first: a guess many ulp off lands within about one.
    q = fma_exact(fma_exact(-q, y, x), opaque(1.0 / y), q);
    for (var i = 0u; i < 4u; i++) {
        let bits = bitcast<u32>(q);
        let up = bitcast<f32>(bits + 1u);
        let dn = bitcast<f32>(bits - 1u);
        let odd = (bits & 1u) == 1u;
        // x - q y against half the gap to each neighbour, times y (the
        // gaps are powers of two: exact).
        let r = fma_exact(-q, y, x);
        let half_up = mul_rn(y, up - q) * 0.5;
        let half_dn = mul_rn(y, q - dn) * 0.5;
        if (r > half_up || (r == half_up && odd)) {
            q = up;
        } else if (r < -half_dn || (r == -half_dn && odd)) {
            q = dn;
        } else {
            break;
        }
    }
    return select(q, -q, (a < 0.0) != (b < 0.0));
}

// The square root rounded to nearest, as the CPU's: the driver's root
// (Vulkan allows a few ulp) moved ulp by ulp until it is the nearest
// float, judged by the exact residual x - s * s. With s = S u (S an
// integer, u the gap above s) the residual is a whole multiple of u^2,
// so the root is past the midpoint s + u/2 exactly when x - s^2 > s u,
// and below the midpoint under s exactly when x - s^2 <= -s u' (u' the
// gap below s); no root of a float is a midpoint. Outside [EXACT_LO,
// EXACT_HI], zeros, infinities and NaN keep the driver's root.
fn sqrt_rn(x: f32) -> f32 {
    return sqrt_from(x, opaque(sqrt(x)));
}

// sqrt_rn from a first guess s0 of the root, as far off as a driver may be.
fn sqrt_from(x: f32, s0: f32) -> f32 {
    if (!(x >= EXACT_LO && x <= EXACT_HI)) {
        return s0;
    }
    var s = fma_exact(fma_exact(-s0, s0, x), opaque(0.5 / s0), s0);
    for (var i = 0u; i < 4u; i++) {
        let bits = bitcast<u32>(s);
        let up = bitcast<f32>(bits + 1u);
        let dn = bitcast<f32>(bits - 1u);
        let r = fma_exact(-s, s, x);
        if (r > mul_rn(s, up - s)) {
            s = up;
        } else if (r <= -mul_rn(s, s - dn)) {
            s = dn;
        } else {
            break;
        }
    }
    return s;
}

// e^x to within about one ulp (the driver's `exp` may be a few ulps off,
// which the next layer's 8-bit activations can turn into a different
// code): x = k ln2 + r by Cody and Waite, a degree-7 polynomial for e^r on
// |r| <= ln2 / 2, then 2^k in two factors (subnormal results stay exact).
fn exp_precise(x: f32) -> f32 {
    if (x > 88.72283) {
        // Infinity, through the opaque zero: WebGPU's compiler (Tint)
        // refuses a constant expression that evaluates to infinity.
        return bitcast<f32>(0x7f800000u ^ p.b.w);
    }
    if (x < -103.97208) {
        return 0.0;
    }
    let k = round(x * 1.4426950);
    let r = (x - mul_rn(k, 0.693145752)) - mul_rn(k, 1.42860677e-6);
    let p = 1.0 + mul_rn(r, 1.0 + mul_rn(r, 0.5 + mul_rn(r, 0.16666667 + mul_rn(r, 0.041666668
        + mul_rn(r, 0.008333334 + mul_rn(r, 0.0013888889 + mul_rn(r, 0.0001984127)))))));
    let ki = i32(k);
    let k1 = ki / 2;
    let k2 = ki - k1;
    return opaque(p * bitcast<f32>(u32(k1 + 127) << 23u) * bitcast<f32>(u32(k2 + 127) << 23u));
}

// Whether this driver's fma() rounds once (GPUs) or rounds the product
// first (lavapipe): set per device at pipeline creation (`device.rs`
// probes it).
override FUSED: bool = true;

// a * b + c rounded once, as the CPU's FMA: the driver's fma where it
// fuses; elsewhere from error-free transforms (Dekker's exact product,
// Knuth's exact sum, then Boldo and Melquiond's rounding to odd), exact
// for products that neither overflow nor fall below 2^-100.
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
    if (FUSED) {
        return fma(a, b, c);
    }
    let pr = opaque(a * b);
    let sa = split(a);
    let sb = split(b);
    let e = ((sa.x * sb.x - pr) + sa.x * sb.y + sa.y * sb.x) + sa.y * sb.y;
    let th = opaque(c + pr);
    let z = opaque(th - c);
    let tl = (c - opaque(th - z)) + (pr - z);
    return th + sum_round_odd(tl, e);
}

// x, hidden from the shader compiler's algebra: the error-free transforms
// above are exact only as written, and a compiler that treats float
// arithmetic as real arithmetic (Mesa's NIR folds `t - (t - a)` to `a`)
// would erase them. `p.b.w` is zero at run time (`device.rs` keeps the
// last parameter word zero), which the compiler cannot know.
fn opaque(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ p.b.w);
}

// Veltkamp's split of a into a high and a low half of 12 bits each.
fn split(a: f32) -> vec2<f32> {
    let t = opaque(4097.0 * a);
    let hi = opaque(t - opaque(t - a));
    return vec2<f32>(hi, a - hi);
}

// x + y rounded to odd: the nearest float, moved one ulp toward the exact
// sum when that is inexact and its last bit is even.
fn sum_round_odd(x: f32, y: f32) -> f32 {
    let s = opaque(x + y);
    let z = opaque(s - x);
    let err = (x - opaque(s - z)) + (y - z);
    let bits = bitcast<u32>(s);
    if (err == 0.0 || (bits & 1u) == 1u) {
        return s;
    }
    if ((err > 0.0) == (s > 0.0)) {
        return bitcast<f32>(bits + 1u);
    }
    return bitcast<f32>(bits - 1u);
}

// Workgroup reductions over 64 threads (every thread gets the result).
var<workgroup> red: array<f32, 64>;

// The sum of every thread's `v` in the workgroup (all threads get it).
fn wg_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn wg_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

