// Attention, one workgroup per (query row, head), over chunks of 64
// positions: each thread scores one position of a chunk, then every thread
// adds the chunk into the output dimensions it owns (up to four:
// head_dim <= 256).
//
// `paged`: causal attention over the paged f16 KV of one layer, in the CPU
// backend's arithmetic and order (`cpu::attention`, `cpu::paged`), so it
// rounds alike: scores as its eight-lane fused multiply-adds and their
// horizontal sum, a softmax of max, exp, a sum in position order and a
// division, then the values added position by position with fused
// multiply-adds. The scores are computed three times (the max, the sum,
// the weights) rather than stored. K and V hold, per block,
// `[kv_head][slot][head_dim]` f16 values, two to a word. `info` holds per
// query row (position, table offset); `tables` the sequences' block
// tables. a = (rows, n_head, n_kv_head, head_dim), b = (block_size,
// window, softcap bits, 0): a query at pos sees pos + 1 - window ..= pos
// (window 0: every earlier position); softcap > 0 caps every score s as
// softcap * tanh(s / softcap) (Gemma 2).
//
// `bidirectional`: an encoder's attention over f32 q, k, v rows stacked
// sequence after sequence, with an online softmax; `info` holds per row
// (sequence start, length). a = (rows, n_head, n_head, head_dim).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<u32>;
@group(0) @binding(3) var<storage, read> v: array<u32>;
@group(0) @binding(4) var<storage, read> info: array<u32>;
@group(0) @binding(5) var<storage, read> tables: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> qs: array<f32, 256>;
var<workgroup> wts: array<f32, 64>;
// Positions the workgroup attends over (loaded once, uniformly), and the
// first of them (a sliding window's start).
var<workgroup> span: u32;
var<workgroup> first: u32;

// Folds one chunk's scores (`s`, valid for `j < n`) into the running max
// `m` and sum `l`, leaves the chunk's weights in `wts`, and returns the
// factor the output accumulated so far is scaled by.
fn fold(lid: u32, s: f32, valid: bool, cn: u32, m: ptr<function, f32>, l: ptr<function, f32>) -> f32 {
    let nm = max(*m, wg_max(lid, s));
    let corr = exp_precise(*m - nm);
    wts[lid] = select(0.0, exp_precise(s - nm), valid);
    workgroupBarrier();
    var sum = 0.0;
    for (var i = 0u; i < cn; i++) {
        sum += wts[i];
    }
    *l = *l * corr + sum;
    *m = nm;
    return corr;
}

// Value `d` of head `h` at the KV word array position of (block, slot).
fn kv_at(arr_is_k: bool, block: u32, slot: u32, h: u32, d: u32) -> f32 {
    let hd = p.a.w;
    let bs = p.b.x;
    let idx = ((block * p.a.z + h) * bs + slot) * hd + d;
    var word: u32;
    if (arr_is_k) {
        word = k[idx / 2u];
    } else {
        word = v[idx / 2u];
    }
    return f16_to_f32((word >> (16u * (idx % 2u))) & 0xffffu);
}

// Position j's score for the query in `qs`, as the CPU's AVX2 loop
// computes it: eight lanes (lane l takes dimensions l, l + 8, ...) of
// fused multiply-adds, added as its horizontal sum, times the scale.
fn paged_score(j: u32, toff: u32, kvh: u32, scale: f32) -> f32 {
    let hd = p.a.w;
    let bs = p.b.x;
    let block = tables[toff + j / bs];
    var a = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var d = 0u; d < hd; d += 8u) {
        for (var l = 0u; l < 8u && d + l < hd; l++) {
            a[l] = fma_exact(qs[d + l], kv_at(true, block, j % bs, kvh, d + l), a[l]);
        }
    }
    // Rounded on its own: the caller subtracts the maximum from it.
    let s = mul_rn(scale, ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])));
    let cap = bitcast<f32>(p.b.z);
    return select(s, tanh(s * (1.0 / cap)) * cap, cap > 0.0);
}

@compute @workgroup_size(64)
fn paged(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let task = group_index(wid, groups);
    let n_head = p.a.y;
    let hd = p.a.w;
    let live = task < p.a.x * n_head;
    let t = task / n_head;
    let h = task % n_head;
    let kvh = h / (n_head / p.a.z);
    let bs = p.b.x;
    var pos = 0u;
    var toff = 0u;
    if (live) {
        pos = info[2u * t];
        toff = info[2u * t + 1u];
        for (var d = lid; d < hd; d += WG) {
            qs[d] = q[(t * n_head + h) * hd + d];
        }
    }
    if (lid == 0u) {
        span = select(0u, pos + 1u, live);
        let w = p.b.y;
        first = select(0u, pos + 1u - w, live && w > 0u && pos + 1u > w);
    }
    let n = workgroupUniformLoad(&span);
    let lo = workgroupUniformLoad(&first);
    let scale = div_rn(1.0, sqrt_rn(f32(hd)));
    // The largest score.
    var m = -3.4e38;
    for (var c = lo; c < n; c += WG) {
        var s = -3.4e38;
        if (c + lid < n) {
            s = paged_score(c + lid, toff, kvh, scale);
        }
        m = max(m, wg_max(lid, s));
    }
    // The exponentials' sum, in position order (every thread adds alike).
    var total = 0.0;
    for (var c = lo; c < n; c += WG) {
        if (c + lid < n) {
            wts[lid] = exp_precise(paged_score(c + lid, toff, kvh, scale) - m);
        }
        workgroupBarrier();
        for (var i = 0u; i < min(WG, n - c); i++) {
            total += wts[i];
        }
        workgroupBarrier();
    }
    // The weights, and the values added position by position.
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = lo; c < n; c += WG) {
        if (c + lid < n) {
            wts[lid] = div_rn(exp_precise(paged_score(c + lid, toff, kvh, scale) - m), total);
        }
        workgroupBarrier();
        for (var e = 0u; e < 4u; e++) {
            let d = lid + e * WG;
            if (d < hd) {
                for (var i = 0u; i < min(WG, n - c); i++) {
                    let jj = c + i;
                    let value = kv_at(false, tables[toff + jj / bs], jj % bs, kvh, d);
                    acc[e] = fma_exact(wts[i], value, acc[e]);
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var e = 0u; e < 4u; e++) {
            let d = lid + e * WG;
            if (d < hd) {
                out[(t * n_head + h) * hd + d] = acc[e];
            }
        }
    }
}

@compute @workgroup_size(64)
fn bidirectional(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let task = group_index(wid, groups);
    let n_head = p.a.y;
    let hd = p.a.w;
    let cols = n_head * hd;
    let live = task < p.a.x * n_head;
    let t = task / n_head;
    let h = task % n_head;
    var start = 0u;
    var len = 0u;
    if (live) {
        start = info[2u * t];
        len = info[2u * t + 1u];
        for (var d = lid; d < hd; d += WG) {
            qs[d] = q[t * cols + h * hd + d];
        }
    }
    if (lid == 0u) {
        span = len;
    }
    let n = workgroupUniformLoad(&span);
    let scale = 1.0 / sqrt(f32(hd));
    var m = -3.4e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < n; c += WG) {
        let j = c + lid;
        var s = -3.4e38;
        if (j < n) {
            s = 0.0;
            let ko = (start + j) * cols + h * hd;
            for (var d = 0u; d < hd; d++) {
                s += qs[d] * bitcast<f32>(k[ko + d]);
            }
            s *= scale;
        }
        let cn = min(WG, n - c);
        let corr = fold(lid, s, j < n, cn, &m, &l);
        for (var e = 0u; e < 4u; e++) {
            let d = lid + e * WG;
            if (d < hd) {
                var a = acc[e] * corr;
                for (var i = 0u; i < cn; i++) {
                    a += wts[i] * bitcast<f32>(v[(start + c + i) * cols + h * hd + d]);
                }
                acc[e] = a;
            }
        }
        workgroupBarrier();
    }
    if (live) {
        for (var e = 0u; e < 4u; e++) {
            let d = lid + e * WG;
            if (d < hd) {
                out[t * cols + h * hd + d] = acc[e] / l;
            }
        }
    }
}
