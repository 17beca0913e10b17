// Row-wise operations between the matmuls: RMSNorm, LayerNorm, softmax
// (one workgroup per row, reductions in workgroup memory), and the
// element-wise ones: residual add, bias, SwiGLU, GELU, RoPE.
//
// Bindings: 0 params, 1 x (read-write: the in-place ops write it), 2 the
// second operand (weights, y, bias, or RoPE's cos/sin rows), 3 the third
// (LayerNorm's bias), 4 out. Params a = (rows, cols, n, flags), b.x = eps
// (f32 bits), b.y = head_dim (RoPE).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;

// RMSNorm in the CPU's order (`cpu::ops::rms_norm`), so every backend
// rounds alike: eight partial sums of squares over the row's whole chunks
// of eight (lane l takes elements l, l + 8, ...), added in lane order,
// then the tail's squares.
@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = group_index(wid, groups);
    let cols = p.a.y;
    let live = row < p.a.x;
    let o = row * cols;
    let whole = cols - cols % 8u;
    if (live && lid.x < 8u) {
        var a = 0.0;
        for (var i = lid.x; i < whole; i += 8u) {
            a += mul_rn(x[o + i], x[o + i]);
        }
        red[lid.x] = a;
    }
    workgroupBarrier();
    if (live && lid.x == 0u) {
        var s = 0.0;
        for (var l = 0u; l < 8u; l++) {
            s += red[l];
        }
        var tail = 0.0;
        for (var i = whole; i < cols; i++) {
            tail += mul_rn(x[o + i], x[o + i]);
        }
        red[8] = div_rn(1.0, sqrt_rn(div_rn(s + tail, f32(cols)) + bitcast<f32>(p.b.x)));
    }
    workgroupBarrier();
    let inv = red[8];
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            out[o + i] = x[o + i] * inv * w[i];
        }
    }
}

@compute @workgroup_size(64)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = group_index(wid, groups);
    let cols = p.a.y;
    let live = row < p.a.x;
    let o = row * cols;
    var s = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            s += x[o + i];
        }
    }
    let mean = wg_sum(lid.x, s) / f32(cols);
    var q = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            q += (x[o + i] - mean) * (x[o + i] - mean);
        }
    }
    let inv = 1.0 / sqrt(wg_sum(lid.x, q) / f32(cols) + bitcast<f32>(p.b.x));
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            out[o + i] = (x[o + i] - mean) * inv * w[i] + bias[i];
        }
    }
}

// Softmax of every row of x, in place.
@compute @workgroup_size(64)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = group_index(wid, groups);
    let cols = p.a.y;
    let live = row < p.a.x;
    let o = row * cols;
    var m = -3.4e38;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            m = max(m, x[o + i]);
        }
    }
    let mx = wg_max(lid.x, m);
    var s = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let e = exp_precise(x[o + i] - mx);
            x[o + i] = e;
            s += e;
        }
    }
    let total = wg_sum(lid.x, s);
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            x[o + i] = div_rn(x[o + i], total);
        }
    }
}

// x += w (same shape).
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x * p.a.y) {
        x[i] = x[i] + w[i];
    }
}

// x[r][c] += w[c].
@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x * p.a.y) {
        x[i] = x[i] + w[i % p.a.y];
    }
}

// out[r][c] = silu(x[r][c]) * x[r][n + c], rows of x `[gate | up]`, n = a.z.
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let n = p.a.z;
    if (i < p.a.x * n) {
        let r = i / n;
        let c = i % n;
        let g = x[r * 2u * n + c];
        out[i] = div_rn(g, 1.0 + exp_precise(-g)) * x[r * 2u * n + n + c];
    }
}

// GELU's tanh form as ggml's CPU backend takes it, as `cpu::ops::
// gelu_tanh_f16` computes it: the input and the result rounded to f16.
fn gelu_tanh_f16(g: f32) -> f32 {
    if (g <= -10.0) {
        return 0.0;
    }
    if (g >= 10.0) {
        return g;
    }
    let x = f16_to_f32(f32_to_f16(g));
    let inner = mul_rn(mul_rn(0.7978846, x), 1.0 + mul_rn(mul_rn(0.044715, x), x));
    let t = 1.0 - div_rn(2.0, exp_precise(2.0 * abs(inner)) + 1.0);
    let th = select(t, -t, inner < 0.0);
    return f16_to_f32(f32_to_f16(mul_rn(mul_rn(0.5, x), 1.0 + th)));
}

// out[r][c] = gelu(x[r][c]) * x[r][n + c], rows of x `[gate | up]`, n = a.z.
@compute @workgroup_size(64)
fn geglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let n = p.a.z;
    if (i < p.a.x * n) {
        let r = i / n;
        let c = i % n;
        out[i] = gelu_tanh_f16(x[r * 2u * n + c]) * x[r * 2u * n + n + c];
    }
}

// x[i] *= b.x (f32 bits).
@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x * p.a.y) {
        x[i] = x[i] * bitcast<f32>(p.b.x);
    }
}

// erf by Abramowitz and Stegun 7.1.26, as the CPU backend computes it.
fn erf(v: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(v));
    let poly = t * (0.2548296 + t * (-0.28449674 + t * (1.4214137 + t * (-1.4531521 + t * 1.0614054))));
    let r = 1.0 - poly * exp_precise(-v * v);
    return select(r, -r, v < 0.0);
}

@compute @workgroup_size(64)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x * p.a.y) {
        let v = x[i];
        x[i] = 0.5 * v * (1.0 + erf(v * 0.70710677));
    }
}

// Rotates the first b.z dimensions of every head (b.y wide) of row r in
// place; w holds the rows' cos values (rows x half), then their sin values.
// a.w = 1: NeoX pairs (i, i + half), else (2i, 2i + 1). One invocation per
// (row, head, pair).
@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let cols = p.a.y;
    let hd = p.b.y;
    let half = p.b.z / 2u;
    let per_row = cols / hd * half;
    if (i >= p.a.x * per_row) {
        return;
    }
    let r = i / per_row;
    let head = (i % per_row) / half;
    let j = i % half;
    let base = r * cols + head * hd;
    var a = base + 2u * j;
    var b = a + 1u;
    if (p.a.w == 1u) {
        a = base + j;
        b = base + j + half;
    }
    let c = w[r * half + j];
    let s = w[p.a.x * half + r * half + j];
    let x0 = x[a];
    let x1 = x[b];
    x[a] = mul_rn(x0, c) - mul_rn(x1, s);
    x[b] = mul_rn(x0, s) + mul_rn(x1, c);
}

// fma_exact on the triples of x, one per invocation (its test).
@compute @workgroup_size(64)
fn fma_check(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x) {
        out[i] = fma_exact(x[3u * i], x[3u * i + 1u], x[3u * i + 2u]);
    }
}

// div_rn and sqrt_rn on the triples (a, b, k) of x, one per invocation
// (their test): out[2i] = a / b, out[2i + 1] = sqrt(a), each corrected
// from the driver's result moved k ulp away (k an integer, as f32).
@compute @workgroup_size(64)
fn rounding_check(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i < p.a.x) {
        let a = x[3u * i];
        let b = x[3u * i + 1u];
        let k = i32(x[3u * i + 2u]);
        let q = opaque(a / b);
        let s = opaque(sqrt(a));
        out[2u * i] = div_from(a, b, bitcast<f32>(bitcast<i32>(q) + k));
        out[2u * i + 1u] = sqrt_from(a, bitcast<f32>(bitcast<i32>(s) + k));
    }
}
