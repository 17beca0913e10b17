// Moving rows and columns: gather (rows by index, a column range of
// each) and scatter (into a column range of wider rows), and writing
// new keys and values into the paged f16 KV.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// dst[r][c] = src[idx[r]][off + c]: a = (rows, src cols, dst cols, off).
@compute @workgroup_size(64)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let w = p.a.z;
    if (i < p.a.x * w) {
        let r = i / w;
        dst[i] = src[idx[r] * p.a.y + p.a.w + i % w];
    }
}

// dst[idx[r]][c] += scale[r] * src[r][c], the scales' bits after the
// row indices in `idx`: a = (rows, cols). The rows hold no repeats.
@compute @workgroup_size(64)
fn scatter_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let w = p.a.y;
    if (i < p.a.x * w) {
        let r = i / w;
        let d = idx[r] * w + i % w;
        dst[d] = dst[d] + mul_rn(bitcast<f32>(idx[p.a.x + r]), src[i]);
    }
}

// dst[r][off + c] = src[r][c]: a = (rows, src cols, dst cols, off).
@compute @workgroup_size(64)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let w = p.a.y;
    if (i < p.a.x * w) {
        let r = i / w;
        dst[r * p.a.z + p.a.w + i % w] = src[i];
    }
}

// Rows of k (or v) into the paged cache: idx holds (block, slot) per row;
// one invocation per pair of values (one word). a = (rows, kv_heads,
// head_dim, block_size).
@group(0) @binding(4) var<storage, read_write> kv: array<u32>;

@compute @workgroup_size(64)
fn write_kv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = element(gid, groups);
    let hd = p.a.z;
    let pairs = p.a.y * hd / 2u;
    if (i >= p.a.x * pairs) {
        return;
    }
    let r = i / pairs;
    let e = 2u * (i % pairs);
    let h = e / hd;
    let d = e % hd;
    let block = idx[2u * r];
    let slot = idx[2u * r + 1u];
    let at = (((block * p.a.y + h) * p.a.w + slot) * hd + d) / 2u;
    let lo = f32_to_f16(src[r * p.a.y * hd + e]);
    let hi = f32_to_f16(src[r * p.a.y * hd + e + 1u]);
    kv[at] = lo | (hi << 16u);
}
