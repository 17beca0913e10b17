// The CUDA backend's kernels: the same operations and the same arithmetic
// as the WGSL shaders (`kernels/src/wgpu/shaders`), compiled at run time
// by NVRTC with --fmad=false, so a * b + c rounds twice as in Rust and
// only the explicit __fmaf_rn fuses. Weights stay quantized on the device in the repacked layout
// (per 32-weight block: the scale, and Q4_1's min, as f32 words, then the
// block's GGML bytes); activations are quantized to 8 bits as the CPU does
// and each block's dot product is the CPU's integer sum. The KV cache
// holds f16 values, two to a 32-bit word.

typedef unsigned int u32;
typedef unsigned short u16;

#define WG 64
#define TM 4
#define XQ_WORDS 10

extern "C" {

// ---- f16 by hand, as the shaders (bit-identical to the `half` crate) ----

__device__ float f16_to_f32(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 e = (h >> 10) & 0x1fu;
    u32 m = h & 0x3ffu;
    if (e == 0u) {
        float v = (float)m * 5.9604645e-8f;
        return sign ? -v : v;
    }
    if (e == 31u) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ u32 f32_to_f16(float v) {
    u32 x = __float_as_uint(v);
    u32 sign = (x >> 16) & 0x8000u;
    u32 e = (x >> 23) & 0xffu;
    u32 m = x & 0x7fffffu;
    if (e == 0xffu) return sign | 0x7c00u | (m ? 0x200u : 0u) | (m >> 13);
    int he = (int)e - 112;
    if (he >= 31) return sign | 0x7c00u;
    if (he <= 0) {
        if (he < -10) return sign;
        u32 mm = m | 0x800000u;
        u32 shift = (u32)(14 - he);
        u32 round = 1u << (shift - 1u);
        u32 hm = mm >> shift;
        if ((mm & round) && (mm & (3u * round - 1u))) hm += 1u;
        return sign | hm;
    }
    u32 h = sign | ((u32)he << 10) | (m >> 13);
    if ((m & 0x1000u) && (m & 0x2fffu)) h += 1u;
    return h;
}

// e^x to about an ulp, operation for operation as the CPU's cpu::ops::exp
// and the shaders' exp_precise, so every backend rounds alike.
__device__ float exp_precise(float x) {
    if (x > 88.72283f) return __uint_as_float(0x7f800000u);
    if (x < -103.97208f) return 0.0f;
    float k = rintf(x * 1.4426950f);
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, 0.693145752f)), __fmul_rn(k, 1.42860677e-6f));
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f
        + r * (0.008333334f + r * (0.0013888889f + r * 0.0001984127f))))));
    int ki = (int)k;
    int k1 = ki / 2;
    int k2 = ki - k1;
    return p * __uint_as_float((u32)(k1 + 127) << 23) * __uint_as_float((u32)(k2 + 127) << 23);
}

__device__ int sbyte(u32 w, u32 t) { return (int)(signed char)((w >> (8u * t)) & 0xffu); }

// ---- reductions over a 64-thread block ----

__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (u32 s = WG / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float t = red[0];
    __syncthreads();
    return t;
}

__device__ float block_max(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (u32 s = WG / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    float t = red[0];
    __syncthreads();
    return t;
}

// ---- matmul ----

// Quantizes rows x (rows, k) into xq, one thread a 32-value block.
__global__ void quantize(const float* x, u32* xq, u32 rows, u32 k) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * (k / 32u)) return;
    const float* b = x + i * 32u;
    float amax = 0.0f;
    for (u32 j = 0; j < 32u; j++) amax = fmaxf(amax, fabsf(b[j]));
    float d = __fdiv_rn(amax, 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int sum = 0;
    u32* o = xq + i * XQ_WORDS;
    for (u32 j = 0; j < 8u; j++) {
        u32 word = 0;
        for (u32 t = 0; t < 4u; t++) {
            float v = __fmul_rn(b[4u * j + t], id);
            int q = (int)(v + (v < 0.0f ? -0.5f : 0.5f));
            q = max(-128, min(127, q));
            sum += q;
            word |= ((u32)q & 0xffu) << (8u * t);
        }
        o[2u + j] = word;
    }
    o[0] = __float_as_uint(d);
    o[1] = __float_as_uint(__fmul_rn(d, (float)sum));
}

// One block's terms against quantized activation block xb, as the CPU's
// integer path computes them: (isum, d_w * d_x, offset, s), the block
// adding isum * (d_w * d_x) + offset * s to the dot product. Q4_0's and
// Q8_0's weights are signed integers times d (isum exact, offset 0, and
// adding 0 * 0 leaves the sum as it is); Q4_1's (and kind 4's, Q8_0's
// bytes with an f32 min) are d * u + offset. Kind 5 (Q8_0's bytes with a
// scale per 16 weights) gives its halves' sums and scales in the two
// places: isum_lo * dd_lo + isum_hi * dd_hi.
__device__ float4 block_terms(const u32* w, u32 blk, u32 kind, u32 wpb, const u32* xb) {
    const u32* base = w + blk * wpb;
    float d = __uint_as_float(base[0]);
    float dd = __fmul_rn(d, __uint_as_float(xb[0]));
    int isum = 0;
    if (kind == 2u || kind >= 4u) {
        int hi = 0;
        const u32* qs = base + (kind >= 4u ? 2u : 1u);
        for (u32 j = 0; j < 8u; j++) {
            u32 q = qs[j], a = xb[2u + j];
            int part = 0;
            for (u32 t = 0; t < 4u; t++) part += sbyte(q, t) * sbyte(a, t);
            if (kind == 5u && j >= 4u) hi += part; else isum += part;
        }
        if (kind == 4u) return make_float4((float)isum, dd, __uint_as_float(base[1]), __uint_as_float(xb[1]));
        if (kind == 5u)
            return make_float4((float)isum, dd, (float)hi, __fmul_rn(__uint_as_float(base[1]), __uint_as_float(xb[0])));
        return make_float4((float)isum, dd, 0.0f, 0.0f);
    }
    bool has_min = kind == 1u;
    int k = has_min ? 0 : 8;
    const u32* qs = base + (has_min ? 2u : 1u);
    for (u32 j = 0; j < 4u; j++) {
        u32 q = qs[j], lo = xb[2u + j], hi = xb[6u + j];
        for (u32 t = 0; t < 4u; t++) {
            u32 byte = (q >> (8u * t)) & 0xffu;
            isum += ((int)(byte & 0xfu) - k) * sbyte(lo, t) + ((int)(byte >> 4) - k) * sbyte(hi, t);
        }
    }
    if (!has_min) return make_float4((float)isum, dd, 0.0f, 0.0f);
    return make_float4((float)isum, dd, __uint_as_float(base[1]), __uint_as_float(xb[1]));
}

__device__ void reduce_store(float* acc, float* y, u32 n, u32 m0, u32 m, u32 nn) {
    __shared__ float partial[TM * WG];
    for (u32 r = 0; r < TM; r++) partial[r * WG + threadIdx.x] = acc[r];
    __syncthreads();
    for (u32 s = WG / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            for (u32 r = 0; r < TM; r++) partial[r * WG + threadIdx.x] += partial[r * WG + threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x < TM && n < nn && m0 + threadIdx.x < m)
        y[(m0 + threadIdx.x) * nn + n] = partial[threadIdx.x * WG];
}

// y (m, n) = x · Wᵀ, W quantized (block b of row n at b * n_out + n). A
// block of MQ_N * MQ_S threads takes MQ_N outputs (consecutive n, so
// their weight blocks are adjacent) of MQ_R activation rows: in each round
// thread (x, s) computes the terms of block b0 + s for output x and every
// row into shared memory, then one thread per (output, row) adds the
// round's blocks in order, each with two fused multiply-adds: the CPU's
// sums (on every CPU path), bit for bit. The terms (the memory reads and
// integer sums) spread over MQ_S times the threads the chains need.
#define MQ_N 32u
#define MQ_S 8u
#define MQ_R 4u
__global__ void matmul_quant(const u32* xq, const u32* w, float* y, u32 m, u32 n_out, u32 k,
                             u32 kind, u32 wpb) {
    __shared__ float4 terms[MQ_R][MQ_S][MQ_N];
    u32 x = threadIdx.x % MQ_N, s = threadIdx.x / MQ_N;
    u32 n = blockIdx.x * MQ_N + x, r0 = blockIdx.y * MQ_R, nb = k / 32u;
    u32 rows = min(MQ_R, m - r0);
    float acc = 0.0f;
    for (u32 b0 = 0; b0 < nb; b0 += MQ_S) {
        u32 b = b0 + s;
        if (n < n_out && b < nb)
            for (u32 r = 0; r < rows; r++)
                terms[r][s][x] = block_terms(w, b * n_out + n, kind, wpb, xq + ((r0 + r) * nb + b) * XQ_WORDS);
        __syncthreads();
        if (s < rows && n < n_out) {
            u32 cnt = min(MQ_S, nb - b0);
            for (u32 j = 0; j < cnt; j++) {
                float4 t = terms[s][j][x];
                acc = __fmaf_rn(t.x, t.y, acc);
                acc = __fmaf_rn(t.z, t.w, acc);
            }
        }
        __syncthreads();
    }
    if (s < rows && n < n_out) y[(r0 + s) * n_out + n] = acc;
}

__global__ void matmul_dense(const float* x, const float* w, float* y, u32 m, u32 n_out, u32 k) {
    u32 n = blockIdx.x + blockIdx.y * gridDim.x;
    u32 m0 = blockIdx.z * TM;
    float acc[TM] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (n < n_out)
        for (u32 i = threadIdx.x; i < k; i += WG) {
            float wv = w[n * k + i];
            for (u32 r = 0; r < TM; r++)
                if (m0 + r < m) acc[r] += wv * x[(m0 + r) * k + i];
        }
    reduce_store(acc, y, n, m0, m, n_out);
}

// Embedding rows of a quantized table (n rows, block b of row r at
// b * n + r): one thread a (row, block).
__global__ void embed_quant(const u32* ids, const u32* w, float* y, u32 rows, u32 n, u32 k, u32 kind,
                            u32 wpb) {
    u32 nb = k / 32u;
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nb) return;
    u32 t = i / nb, b = i % nb, id = ids[t];
    if (id >= n) return;
    const u32* base = w + (b * n + id) * wpb;
    float d = __uint_as_float(base[0]);
    float* out = y + t * k + b * 32u;
    if (kind == 2u || kind >= 4u) {
        // Kind 4: a min after the scale; kind 5: the second 16's scale.
        float second = __uint_as_float(base[1]);
        const u32* qs = base + (kind >= 4u ? 2u : 1u);
        for (u32 j = 0; j < 32u; j++) {
            float v = (float)sbyte(qs[j / 4u], j % 4u);
            out[j] = kind == 4u ? __fadd_rn(__fmul_rn(v, d), second) : v * (kind == 5u && j >= 16u ? second : d);
        }
        return;
    }
    bool has_min = kind == 1u;
    float mn = has_min ? __uint_as_float(base[1]) : 0.0f;
    float off = has_min ? 0.0f : 8.0f;
    const u32* qs = base + (has_min ? 2u : 1u);
    for (u32 j = 0; j < 16u; j++) {
        u32 byte = (qs[j / 4u] >> (8u * (j % 4u))) & 0xffu;
        out[j] = ((float)(byte & 0xfu) - off) * d + mn;
        out[j + 16u] = ((float)(byte >> 4) - off) * d + mn;
    }
}

// ---- row operations ----

// RMSNorm in the CPU's order (cpu::ops::rms_norm): eight partial sums of
// squares over the whole chunks of eight, added in lane order, then the
// tail's squares.
__global__ void rms_norm(const float* x, const float* w, float* out, u32 rows, u32 cols, float eps) {
    __shared__ float red[WG];
    u32 row = blockIdx.x + blockIdx.y * gridDim.x;
    bool live = row < rows;
    const float* xr = x + row * cols;
    u32 whole = cols - cols % 8u;
    if (live && threadIdx.x < 8u) {
        float a = 0.0f;
        for (u32 i = threadIdx.x; i < whole; i += 8u) a += xr[i] * xr[i];
        red[threadIdx.x] = a;
    }
    __syncthreads();
    if (live && threadIdx.x == 0u) {
        float s = 0.0f;
        for (u32 l = 0; l < 8u; l++) s += red[l];
        float tail = 0.0f;
        for (u32 i = whole; i < cols; i++) tail += xr[i] * xr[i];
        red[8] = 1.0f / sqrtf((s + tail) / (float)cols + eps);
    }
    __syncthreads();
    float inv = red[8];
    if (live) for (u32 i = threadIdx.x; i < cols; i += WG) out[row * cols + i] = xr[i] * inv * w[i];
}

__global__ void layer_norm(const float* x, const float* w, const float* bias, float* out, u32 rows,
                           u32 cols, float eps) {
    __shared__ float red[WG];
    u32 row = blockIdx.x + blockIdx.y * gridDim.x;
    bool live = row < rows;
    const float* xr = x + row * cols;
    float s = 0.0f;
    if (live) for (u32 i = threadIdx.x; i < cols; i += WG) s += xr[i];
    float mean = block_sum(s, red) / (float)cols;
    float q = 0.0f;
    if (live) for (u32 i = threadIdx.x; i < cols; i += WG) q += (xr[i] - mean) * (xr[i] - mean);
    float inv = 1.0f / sqrtf(block_sum(q, red) / (float)cols + eps);
    if (live)
        for (u32 i = threadIdx.x; i < cols; i += WG) out[row * cols + i] = (xr[i] - mean) * inv * w[i] + bias[i];
}

__global__ void softmax_rows(float* x, u32 rows, u32 cols) {
    __shared__ float red[WG];
    u32 row = blockIdx.x + blockIdx.y * gridDim.x;
    bool live = row < rows;
    float* xr = x + row * cols;
    float m = -3.4e38f;
    if (live) for (u32 i = threadIdx.x; i < cols; i += WG) m = fmaxf(m, xr[i]);
    float mx = block_max(m, red);
    float s = 0.0f;
    if (live)
        for (u32 i = threadIdx.x; i < cols; i += WG) {
            float e = exp_precise(xr[i] - mx);
            xr[i] = e;
            s += e;
        }
    float total = block_sum(s, red);
    if (live) for (u32 i = threadIdx.x; i < cols; i += WG) xr[i] = xr[i] / total;
}

__global__ void add(float* x, const float* y, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void add_bias(float* x, const float* b, u32 n, u32 cols) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % cols];
}

__global__ void swiglu(const float* gu, float* out, u32 rows, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    u32 r = i / n, c = i % n;
    float g = gu[r * 2u * n + c];
    out[i] = g / (1.0f + exp_precise(-g)) * gu[r * 2u * n + n + c];
}

// GELU's tanh form as ggml's CPU backend takes it (cpu::ops::
// gelu_tanh_f16): the input and the result rounded to f16.
__device__ float gelu_tanh_f16(float g) {
    if (g <= -10.0f) return 0.0f;
    if (g >= 10.0f) return g;
    float x = f16_to_f32(f32_to_f16(g));
    float inner = 0.7978846f * x * (1.0f + 0.044715f * x * x);
    float t = 1.0f - 2.0f / (exp_precise(2.0f * fabsf(inner)) + 1.0f);
    float th = inner < 0.0f ? -t : t;
    return f16_to_f32(f32_to_f16(0.5f * x * (1.0f + th)));
}

__global__ void geglu(const float* gu, float* out, u32 rows, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    u32 r = i / n, c = i % n;
    out[i] = gelu_tanh_f16(gu[r * 2u * n + c]) * gu[r * 2u * n + n + c];
}

__global__ void scale(float* x, u32 n, float s) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__device__ float erf_as(float v) {
    float t = 1.0f / (1.0f + 0.3275911f * fabsf(v));
    float poly = t * (0.2548296f + t * (-0.28449674f + t * (1.4214137f + t * (-1.4531521f + t * 1.0614054f))));
    float r = 1.0f - poly * exp_precise(-v * v);
    return v < 0.0f ? -r : r;
}

__global__ void gelu(float* x, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.5f * x[i] * (1.0f + erf_as(x[i] * 0.70710677f));
}

// cs: the rows' cos values (rows x half), then their sin values.
// The first rot dimensions of every hd-wide head turned; the rest kept.
__global__ void rope(float* x, const float* cs, u32 rows, u32 cols, u32 hd, u32 rot, u32 neox) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 half = rot / 2u, per_row = cols / hd * half;
    if (i >= rows * per_row) return;
    u32 r = i / per_row, head = (i % per_row) / half, j = i % half;
    u32 base = r * cols + head * hd;
    u32 a = neox ? base + j : base + 2u * j;
    u32 b = neox ? base + j + half : a + 1u;
    float c = cs[r * half + j], s = cs[rows * half + r * half + j];
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}

// ---- moving rows and the KV cache ----

__global__ void gather(const float* src, const u32* idx, float* dst, u32 rows, u32 src_cols, u32 w, u32 off) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * w) dst[i] = src[idx[i / w] * src_cols + off + i % w];
}

// dst[idx[r]][c] += scale[r] * src[r][c], the scales' bits after the row
// indices in idx. The rows hold no repeats.
__global__ void scatter_add(const float* src, const u32* idx, float* dst, u32 rows, u32 w) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * w) {
        u32 r = i / w;
        dst[idx[r] * w + i % w] += __fmul_rn(__uint_as_float(idx[rows + r]), src[i]);
    }
}

__global__ void scatter(const float* src, float* dst, u32 rows, u32 w, u32 dst_cols, u32 off) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * w) dst[(i / w) * dst_cols + off + i % w] = src[i];
}

// slots: (block, slot) per row; one thread a pair of values (one word).
__global__ void write_kv(const float* src, const u32* slots, u32* kv, u32 rows, u32 kv_heads, u32 hd, u32 bs) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 pairs = kv_heads * hd / 2u;
    if (i >= rows * pairs) return;
    u32 r = i / pairs, e = 2u * (i % pairs), h = e / hd, d = e % hd;
    u32 at = (((slots[2u * r] * kv_heads + h) * bs + slots[2u * r + 1u]) * hd + d) / 2u;
    const float* row = src + r * kv_heads * hd;
    kv[at] = f32_to_f16(row[e]) | (f32_to_f16(row[e + 1u]) << 16);
}

// ---- attention: one block per (query row, head), online softmax over
// chunks of 64 positions (head_dim <= 256) ----

__device__ float kv_value(const u32* a, u32 block, u32 slot, u32 h, u32 d, u32 kv_heads, u32 hd, u32 bs) {
    u32 idx = ((block * kv_heads + h) * bs + slot) * hd + d;
    return f16_to_f32((a[idx / 2u] >> (16u * (idx % 2u))) & 0xffffu);
}

// Folds a chunk's score into the running max and sum; weights in wts.
__device__ float fold(float s, bool valid, u32 cn, float* m, float* l, float* wts, float* red) {
    float nm = fmaxf(*m, block_max(s, red));
    float corr = exp_precise(*m - nm);
    wts[threadIdx.x] = valid ? exp_precise(s - nm) : 0.0f;
    __syncthreads();
    float sum = 0.0f;
    for (u32 i = 0; i < cn; i++) sum += wts[i];
    *l = *l * corr + sum;
    *m = nm;
    return corr;
}

// Position j's score, as the CPU's AVX2 loop computes it: eight lanes
// (lane l takes dimensions l, l + 8, ...) of fused multiply-adds, added as
// its horizontal sum, times the scale.
__device__ float paged_score(const float* qs, const u32* k, const u32* tables, u32 toff, u32 j,
                             u32 kvh, u32 kv_heads, u32 hd, u32 bs, float scale) {
    u32 block = tables[toff + j / bs];
    float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 d = 0; d < hd; d += 8u)
        for (u32 l = 0; l < 8u && d + l < hd; l++)
            a[l] = __fmaf_rn(qs[d + l], kv_value(k, block, j % bs, kvh, d + l, kv_heads, hd, bs), a[l]);
    return scale * (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])));
}

// A score soft-capped (Gemma 2): softcap * tanh(s / softcap); 0: none.
__device__ float soft_cap(float s, float softcap) {
    return softcap > 0.0f ? tanhf(s * (1.0f / softcap)) * softcap : s;
}

// Causal attention over the paged KV in the CPU backend's arithmetic and
// order (cpu::attention, cpu::paged): the scores, a softmax of max, exp, a
// sum in position order and a division, then the values added position
// by position with fused multiply-adds. Up to ATT_CACHE positions the
// scores, then their exponentials, are kept in shared memory; past it they
// are computed again for the sum and the weights (the same floats).
// info: (position, table offset) per query row; softcap > 0 caps every
// score (Gemma 2).
#define ATT_CACHE 4096u
__global__ void paged_attention(const float* q, const u32* k, const u32* v, const u32* info,
                                const u32* tables, float* out, u32 rows, u32 n_head, u32 kv_heads,
                                u32 hd, u32 bs, u32 window, float softcap) {
    __shared__ float qs[256];
    __shared__ float wts[WG];
    __shared__ float red[WG];
    __shared__ float sc[ATT_CACHE];
    u32 task = blockIdx.x + blockIdx.y * gridDim.x;
    if (task >= rows * n_head) return;  // whole block: no barrier divergence
    u32 t = task / n_head, h = task % n_head, kvh = h / (n_head / kv_heads);
    u32 n = info[2u * t] + 1u, toff = info[2u * t + 1u];
    // A sliding window: positions lo..n (scores cached relative to lo).
    u32 lo = window > 0u && n > window ? n - window : 0u;
    for (u32 d = threadIdx.x; d < hd; d += WG) qs[d] = q[(t * n_head + h) * hd + d];
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    bool cached = n - lo <= ATT_CACHE;
    float m = -3.4e38f;
    for (u32 c = lo; c < n; c += WG) {
        u32 j = c + threadIdx.x;
        float s = j < n ? soft_cap(paged_score(qs, k, tables, toff, j, kvh, kv_heads, hd, bs, scale), softcap) : -3.4e38f;
        if (cached && j < n) sc[j - lo] = s;
        m = fmaxf(m, block_max(s, red));
    }
    float total = 0.0f;
    if (cached) {
        // Each thread its own positions (those it scored), then the sum of
        // all in position order.
        for (u32 j = threadIdx.x; j < n - lo; j += WG) sc[j] = exp_precise(sc[j] - m);
        __syncthreads();
        for (u32 j = 0; j < n - lo; j++) total += sc[j];
    } else {
        for (u32 c = lo; c < n; c += WG) {
            u32 j = c + threadIdx.x;
            if (j < n) wts[threadIdx.x] = exp_precise(soft_cap(paged_score(qs, k, tables, toff, j, kvh, kv_heads, hd, bs, scale), softcap) - m);
            __syncthreads();
            for (u32 i = 0; i < min((u32)WG, n - c); i++) total += wts[i];
            __syncthreads();
        }
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 c = lo; c < n; c += WG) {
        u32 j = c + threadIdx.x;
        if (j < n) {
            float e = cached ? sc[j - lo] : exp_precise(soft_cap(paged_score(qs, k, tables, toff, j, kvh, kv_heads, hd, bs, scale), softcap) - m);
            wts[threadIdx.x] = e / total;
        }
        __syncthreads();
        u32 cn = min((u32)WG, n - c);
        for (u32 e = 0; e < 4u; e++) {
            u32 d = threadIdx.x + e * WG;
            if (d < hd)
                for (u32 i = 0; i < cn; i++) {
                    u32 jj = c + i;
                    float value = kv_value(v, tables[toff + jj / bs], jj % bs, kvh, d, kv_heads, hd, bs);
                    acc[e] = __fmaf_rn(wts[i], value, acc[e]);
                }
        }
        __syncthreads();
    }
    for (u32 e = 0; e < 4u; e++) {
        u32 d = threadIdx.x + e * WG;
        if (d < hd) out[(t * n_head + h) * hd + d] = acc[e];
    }
}

// info: (sequence start, length) per row.
__global__ void bidirectional_attention(const float* q, const float* k, const float* v, const u32* info,
                                        float* out, u32 rows, u32 n_head, u32 hd) {
    __shared__ float qs[256];
    __shared__ float wts[WG];
    __shared__ float red[WG];
    u32 task = blockIdx.x + blockIdx.y * gridDim.x;
    if (task >= rows * n_head) return;
    u32 t = task / n_head, h = task % n_head, cols = n_head * hd;
    u32 start = info[2u * t], n = info[2u * t + 1u];
    for (u32 d = threadIdx.x; d < hd; d += WG) qs[d] = q[t * cols + h * hd + d];
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    float m = -3.4e38f, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 c = 0; c < n; c += WG) {
        u32 j = c + threadIdx.x;
        float s = -3.4e38f;
        if (j < n) {
            s = 0.0f;
            for (u32 d = 0; d < hd; d++) s += qs[d] * k[(start + j) * cols + h * hd + d];
            s *= scale;
        }
        u32 cn = min((u32)WG, n - c);
        float corr = fold(s, j < n, cn, &m, &l, wts, red);
        for (u32 e = 0; e < 4u; e++) {
            u32 d = threadIdx.x + e * WG;
            if (d < hd) {
                float a = acc[e] * corr;
                for (u32 i = 0; i < cn; i++) a += wts[i] * v[(start + c + i) * cols + h * hd + d];
                acc[e] = a;
            }
        }
        __syncthreads();
    }
    for (u32 e = 0; e < 4u; e++) {
        u32 d = threadIdx.x + e * WG;
        if (d < hd) out[t * cols + h * hd + d] = acc[e] / l;
    }
}

}  // extern "C"
