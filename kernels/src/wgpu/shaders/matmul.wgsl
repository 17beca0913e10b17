// y = x · Wᵀ with W quantized (blocks of kinds Q4_0, Q4_1, Q8_0, Q8_0 with
// a min, Q8_0 with a scale per 16: dequantized here, block by block) or
// f32, and the embedding lookup of quantized rows.
//
// Quantized weights are repacked at upload into whole 32-bit words per
// 32-weight block: the scale (and Q4_1's min) as f32, then the block's
// bytes as in GGML (Q4: byte j holds weight j in its low nibble and weight
// j + 16 in its high one; Q8_0: one signed byte per weight). Kind 4 is
// Q8_0's bytes with an f32 min after the scale (`d * q + m`: Q5_1, Q5_K);
// kind 5 Q8_0's bytes with two scales, one per 16 weights (Q6_K). Blocks
// are stored block column by block column: block b of row r is b * rows + r.
//
// Activations are quantized first (`quantize`), block by block, to 8
// bits exactly as the CPU backend does (d = amax / 127, round half away
// from zero, s = d * sum(q)), and each block's dot product is an exact
// integer sum, `isum * (d_w * d_x) + offset * s` (the offset term only for
// Q4_1; Q4_0's and Q8_0's weights are signed integers), added block after
// block as the CPU adds them.
//
// Params a = (m, n, k, kind), b = (words per block, 0, 0, 0); kind 0 =
// Q4_0, 1 = Q4_1, 2 = Q8_0, 3 = f32, 4 = Q8_0 with a min, 5 = Q8_0 with
// two scales. The f32 matmul: one workgroup
// computes one output column `n` for up to TM rows of x.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Quantized activations: per 32-value block, d and s (f32), then 8 words
// of signed bytes.
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
const XQ_WORDS: u32 = 10u;

const WG: u32 = 64u;
const TM: u32 = 4u;
var<workgroup> partial: array<f32, 256>;

// The 32 weights of block `blk` (a block index over the whole matrix).
fn dequant(blk: u32, kind: u32, wpb: u32, out: ptr<function, array<f32, 32>>) {
    let base = blk * wpb;
    let d = bitcast<f32>(w[base]);
    if (kind == 2u || kind >= 4u) {
        // Kind 4: a min after the scale; kind 5: the second 16's scale.
        let second = bitcast<f32>(w[base + 1u]);
        let qs = base + select(1u, 2u, kind >= 4u);
        for (var j = 0u; j < 8u; j++) {
            let q = w[qs + j];
            for (var t = 0u; t < 4u; t++) {
                let v = f32(bitcast<i32>(((q >> (8u * t)) & 0xffu) << 24u) >> 24u);
                var y = v * d;
                if (kind == 4u) {
                    y = mul_rn(v, d) + second;
                } else if (kind == 5u && j >= 4u) {
                    y = v * second;
                }
                (*out)[4u * j + t] = y;
            }
        }
        return;
    }
    let has_min = kind == 1u;
    let mn = select(0.0, bitcast<f32>(w[base + 1u]), has_min);
    let qs = base + select(1u, 2u, has_min);
    let off = select(8.0, 0.0, has_min);
    for (var j = 0u; j < 4u; j++) {
        let q = w[qs + j];
        for (var t = 0u; t < 4u; t++) {
            let byte = (q >> (8u * t)) & 0xffu;
            (*out)[4u * j + t] = mul_rn(f32(byte & 0xfu) - off, d) + mn;
            (*out)[4u * j + t + 16u] = mul_rn(f32(byte >> 4u) - off, d) + mn;
        }
    }
}

// One block's terms against quantized activation block `xb`, as the
// CPU's integer path computes them: (isum, d_w * d_x, offset, s), the
// block adding `isum * (d_w * d_x) + offset * s` to the dot product.
// Q4_0's and Q8_0's weights are signed integers times d (isum exact,
// offset 0, and adding 0 * 0 leaves the sum as it is); Q4_1's (and kind
// 4's) are `d * u + offset`. Kind 5 gives its two halves' sums and
// scales in the two places: `isum_lo * dd_lo + isum_hi * dd_hi`.
fn block_terms(blk: u32, kind: u32, wpb: u32, xb: u32) -> vec4<f32> {
    let base = blk * wpb;
    let d = bitcast<f32>(w[base]);
    let dd = d * bitcast<f32>(xq[xb]);
    var isum = 0i;
    if (kind == 2u || kind >= 4u) {
        var hi = 0i;
        let qs = base + select(1u, 2u, kind >= 4u);
        for (var j = 0u; j < 8u; j++) {
            let q = w[qs + j];
            let a = xq[xb + 2u + j];
            var part = 0i;
            for (var t = 0u; t < 4u; t++) {
                let wq = bitcast<i32>(((q >> (8u * t)) & 0xffu) << 24u) >> 24u;
                part += wq * (bitcast<i32>(((a >> (8u * t)) & 0xffu) << 24u) >> 24u);
            }
            if (kind == 5u && j >= 4u) {
                hi += part;
            } else {
                isum += part;
            }
        }
        if (kind == 4u) {
            return vec4<f32>(f32(isum), dd, bitcast<f32>(w[base + 1u]), bitcast<f32>(xq[xb + 1u]));
        }
        if (kind == 5u) {
            return vec4<f32>(f32(isum), dd, f32(hi), bitcast<f32>(w[base + 1u]) * bitcast<f32>(xq[xb]));
        }
        return vec4<f32>(f32(isum), dd, 0.0, 0.0);
    }
    let has_min = kind == 1u;
    let k = select(8i, 0i, has_min);
    let qs = base + select(1u, 2u, has_min);
    for (var j = 0u; j < 4u; j++) {
        let q = w[qs + j];
        let lo = xq[xb + 2u + j];
        let hi = xq[xb + 6u + j];
        for (var t = 0u; t < 4u; t++) {
            let byte = (q >> (8u * t)) & 0xffu;
            let xl = bitcast<i32>(((lo >> (8u * t)) & 0xffu) << 24u) >> 24u;
            let xh = bitcast<i32>(((hi >> (8u * t)) & 0xffu) << 24u) >> 24u;
            isum += (i32(byte & 0xfu) - k) * xl + (i32(byte >> 4u) - k) * xh;
        }
    }
    if (!has_min) {
        return vec4<f32>(f32(isum), dd, 0.0, 0.0);
    }
    return vec4<f32>(f32(isum), dd, bitcast<f32>(w[base + 1u]), bitcast<f32>(xq[xb + 1u]));
}

// Quantizes x's rows, block by block, into xq (one invocation a block).
@compute @workgroup_size(64)
fn quantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    if (i >= p.a.x * (p.a.z / 32u)) {
        return;
    }
    let o = i * 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(x[o + j]));
    }
    let d = div_rn(amax, 127.0);
    let id = select(0.0, div_rn(1.0, d), d != 0.0);
    var sum = 0i;
    let at = i * XQ_WORDS;
    for (var j = 0u; j < 8u; j++) {
        var word = 0u;
        for (var t = 0u; t < 4u; t++) {
            let v = mul_rn(x[o + 4u * j + t], id);
            let q = clamp(i32(v + select(0.5, -0.5, v < 0.0)), -128, 127);
            sum += q;
            word |= (bitcast<u32>(q) & 0xffu) << (8u * t);
        }
        xq[at + 2u + j] = word;
    }
    xq[at] = bitcast<u32>(d);
    xq[at + 1u] = bitcast<u32>(d * f32(sum));
}

fn reduce_store(lid: u32, n: u32, m0: u32, acc: array<f32, 4>) {
    for (var r = 0u; r < TM; r++) {
        partial[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var r = 0u; r < TM; r++) {
                partial[r * WG + lid] += partial[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < TM && n < p.a.y) {
        let m = m0 + lid;
        if (m < p.a.x) {
            y[m * p.a.y + n] = partial[lid * WG];
        }
    }
}

// One invocation per output (row m of x, column n): the blocks in order,
// each added with two fused multiply-adds as the CPU adds them (the
// second adds 0 * 0 for Q4_0 and Q8_0, which leaves the sum as it is): the
// CPU's sums bit for bit, on every CPU path.
@compute @workgroup_size(64)
fn quant(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let n_out = p.a.y;
    if (i >= p.a.x * n_out) {
        return;
    }
    let m = i / n_out;
    let n = i % n_out;
    let nb = p.a.z / 32u;
    var acc = 0.0;
    for (var b = 0u; b < nb; b++) {
        let t = block_terms(b * n_out + n, p.a.w, p.b.x, (m * nb + b) * XQ_WORDS);
        acc = fma_exact(t.x, t.y, acc);
        acc = fma_exact(t.z, t.w, acc);
    }
    y[m * n_out + n] = acc;
}

@compute @workgroup_size(64)
fn dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = wid.x + wid.y * groups.x;
    let m0 = wid.z * TM;
    let k = p.a.z;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    if (n < p.a.y) {
        for (var i = lid.x; i < k; i += WG) {
            let wv = bitcast<f32>(w[n * k + i]);
            for (var r = 0u; r < TM; r++) {
                let m = m0 + r;
                if (m < p.a.x) {
                    acc[r] += wv * x[m * k + i];
                }
            }
        }
    }
    reduce_store(lid.x, n, m0, acc);
}

// Embedding lookup: row `x[t]` (an id, as f32 bits) of the matrix into row
// `t` of y. One invocation per (row, block) of a quantized matrix, per
// (row, column) of an f32 one; a = (rows, n, k, kind).
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let k = p.a.z;
    let nb = k / 32u;
    if (i >= p.a.x * nb) {
        return;
    }
    let t = i / nb;
    let b = i % nb;
    let id = bitcast<u32>(x[t]);
    if (id >= p.a.y) {
        return;
    }
    var v: array<f32, 32>;
    dequant(b * p.a.y + id, p.a.w, p.b.x, &v);
    for (var j = 0u; j < 32u; j++) {
        y[t * k + b * 32u + j] = v[j];
    }
}

@compute @workgroup_size(64)
fn embed_dense(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let k = p.a.z;
    if (i >= p.a.x * k) {
        return;
    }
    let t = i / k;
    let id = bitcast<u32>(x[t]);
    if (id < p.a.y) {
        y[i] = bitcast<f32>(w[id * k + i % k]);
    }
}
