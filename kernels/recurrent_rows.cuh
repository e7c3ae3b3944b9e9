/*
 * recurrent_rows.cuh: the row kernel of the decode op (v9, v10, v10b and session 11 of NOTES-ops.md;
 * the default wherever it fits, GDP_DECODE_STATE=rows forces it), included
 * by recurrent.cu inside its anonymous namespace (it uses RecurrentParams, StateStorage and the
 * column load/store helpers there).
 *
 * Why (NOTES-ops.md, v5/v6 ncu card): the shared-memory kernel is issue-bound, not
 * bandwidth-bound: 2,000 warp instructions a warp, 130 M a B=256 launch, against about 15 M
 * FMAs of real work; per step it runs two reduction trees, a block barrier, and its value
 * blocks of 32 columns read 128-byte slices of each 512-byte state row at different times.
 *
 * Design:
 *   - one block of 8 warps per (request, head, slice of BV = 4 LPR value columns; LPR = 32
 *     lanes a row: the whole 128-column row). Lane l holds 4 adjacent columns 4 (l % LPR) of
 *     the R consecutive rows (warp RPW + l / LPR) R + i (i < R; RPW = 32 / LPR rows a warp
 *     load): one warp load is RPW whole rows of the slice and the block reads the item's rows
 *     all together, so the state arrives as one stream, read once and written once, in
 *     registers in between; consecutive rows let a thread read its q and k entries 4 to a
 *     16-byte load;
 *   - one reduction round per token, not per step: every S^T k_t and S^T q_t of the token's
 *     M steps is taken from the state at the token's start (in-thread over the R rows, then
 *     the 8 warps' partials summed in a fixed order through shared memory, once per column
 *     group by a few threads, then read back by all: two barriers); the
 *     raw dot products the steps need (|k_t|^2, |q_t|^2, k_j . k_t, k_j . q_t) alongside, one
 *     warp each; then per column the deltas and outputs in closed form,
 *         a_t S_{t-1}^T k^_t = P(-1,t) f_t S^T k_t + sum_{j<t} P(j,t) f_j f_t (k_j . k_t) d_j
 *         d_t = beta_t (v_t - a_t S_{t-1}^T k^_t)
 *         o_t = P(-1,t) h_t S^T q_t + sum_{j<=t} P(j,t) f_j h_t (k_j . q_t) d_j
 *     (P(j,t) = a_{j+1} ... a_t, a = exp(g), f_t = 1 / |k_t| and h_t = scale / |q_t| with
 *     the L2 norm, else 1 and scale), and one rank-M update of the registers
 *         S <- P(-1,M-1) S + sum_j k_j (P(j,M-1) f_j d_j)^T;
 *   - the norms are never applied to q and k themselves: the sums use the raw vectors and
 *     the factors scale the sums (a zero query, GDP's copies < M-1, skips its sums: o = 0);
 *   - a resident grid (2 blocks per SM) whose blocks walk the items: while an item computes,
 *     the next item's state streams into each thread's own shared-memory cells and its token-0
 *     inputs into the block's raw area by cp.async (each thread reads back and converts only
 *     what it copied, so neither needs a barrier), and the slot of the item after it is loaded
 *     a whole item ahead: a block's loads overlap its previous item's compute; with one token
 *     an item (S = 1) the inputs are converted into the other stage buffer before the item's
 *     last barrier, which publishes them, so the next item skips its first barrier (v10b; the
 *     totals and dots alternate by token parity so that no barrier is needed between tokens);
 *   - S tokens of a request (drafts) run one after another with the state in registers,
 *     their inputs staged into alternate shared buffers, the snapshot of each written after
 *     its update; an fp32 state stays fp32 between tokens, so S tokens in one call equal S
 *     one-token calls bit for bit.
 * The arithmetic differs from the other kernels (a closed form instead of M sequential
 * updates): the same values to fp32 rounding, not the same bits (test_recurrent_gpu holds it
 * to the CPU reference's bar, and to itself across runs).
 * Scope: V a multiple of BV (64 or 128), K <= 8 RPW R with R <= 16, M <= ROWS_MAX_M, fp32,
 * bf16 or fp16 state with 16-byte columns; anything else runs the other kernels.
 */

constexpr int ROWS_WARPS = 8;
constexpr int ROWS_THREADS = ROWS_WARPS * 32;
constexpr int ROWS_MAX_M = 3;  /* steps a token the kernel holds (registers of the deltas) */
constexpr int ROWS_GROUP = 4;  /* reduction vectors summed per pass over the registers */
constexpr int ROWS_STAGE_UNROLL = 2; /* q/k (and v) elements a thread stages per step buffer */

template <int LPR> struct RowsGeom {
    static constexpr int RPW = 32 / LPR;             /* rows a warp load covers           */
    static constexpr int BV = 4 * LPR;               /* value columns a block             */
    static constexpr int ROUND = ROWS_WARPS * RPW;   /* consecutive rows the block covers */
};

/* What a launch fixes at compile time. MT > 0: M = MT steps a token; DT >= 0: q, k, v and o in
 * dtype DT and K = KP (the padded rows are real), so the index arithmetic of the staging, the
 * raw-word copies and the conversions folds to constants (NOTES-ops.md v10: v9's generic
 * launch executed 2,500 warp instructions an item where the work needs about 800). MT = 0 and
 * DT = -1 read them from p (every other shape). */
template <int MT> __device__ __forceinline__ int rows_m(const RecurrentParams &p) {
    return MT > 0 ? MT : p.steps_per_token;
}
template <int DT> __device__ __forceinline__ gdp_dtype_t rows_qdt(const RecurrentParams &p) {
    return DT >= 0 ? static_cast<gdp_dtype_t>(DT) : p.qkv_dtype;
}
template <int DT> __device__ __forceinline__ gdp_dtype_t rows_odt(const RecurrentParams &p) {
    return DT >= 0 ? static_cast<gdp_dtype_t>(DT) : p.o_dtype;
}
template <int DT, int KP> __device__ __forceinline__ int rows_k(const RecurrentParams &p) { return DT >= 0 ? KP : p.K; }

/* Shared floats of one token's inputs: q, k [M][KP], v [M][BV], exp(g) [M], beta [M], padded
 * to 4 floats. */
__host__ __device__ constexpr int rows_stage_floats(int m, int kp, int bv) {
    return (m * (2 * kp + bv) + 2 * m + 3) & ~3;
}
/* Dot products a token needs: k_j . k_t and k_j . q_t at [j][t] (j <= t), |q_t|^2 at [t]. */
__host__ __device__ constexpr int rows_dot_floats(int m) { return (2 * m * m + m + 3) & ~3; }
/* The whole dynamic area: two stage buffers, the partials [warps][2M][BV], then by token
 * parity two sets of totals [2M][BV] and of dots (so a token's partials and dots may be
 * written while slow warps still read the previous token's totals: no barrier between). */
__host__ __device__ constexpr int64_t rows_smem_floats(int m, int kp, int bv) {
    return 2 * (int64_t)rows_stage_floats(m, kp, bv) + (int64_t)ROWS_WARPS * 2 * m * bv + 2 * (2 * m * bv) +
           2 * rows_dot_floats(m);
}

/* Stages token s's M steps (raw q, k, v of the slice, exp(g), beta) into buf; every load of
 * the thread before its first store. */
template <int KP, int BV, int MT, int DT>
__device__ __forceinline__ void rows_stage(const RecurrentParams &p, int64_t b, int h, int vb, int s, float *buf) {
    const int M = rows_m<MT>(p), K = rows_k<DT, KP>(p);
    const gdp_dtype_t qdt = rows_qdt<DT>(p);
    static_assert(ROWS_MAX_M * KP <= ROWS_STAGE_UNROLL * ROWS_THREADS, "one round stages q and k");
    static_assert(ROWS_MAX_M * BV <= ROWS_STAGE_UNROLL * ROWS_THREADS, "one round stages v");
    const int tid = threadIdx.x;
    const int t0 = s * M;
    const int64_t bth0 = (b * p.T + t0) * p.H + h; /* 64-bit base, 32-bit offsets within the token */
    float rq[ROWS_STAGE_UNROLL], rk[ROWS_STAGE_UNROLL], rv[ROWS_STAGE_UNROLL];
#pragma unroll
    for (int u = 0; u < ROWS_STAGE_UNROLL; u++) {
        const int idx = tid + u * ROWS_THREADS;
        const int j = idx / KP, kk = idx - j * KP;
        const bool ok = j < M && kk < K;
        const int64_t off = bth0 * K + (j * p.H * K + kk);
        rq[u] = ok ? load_as_float(p.q, qdt, off) : 0.0f;
        rk[u] = ok ? load_as_float(p.k, qdt, off) : 0.0f;
        const int jv = idx / BV, c = idx - jv * BV;
        rv[u] = jv < M ? load_as_float(p.v, qdt, bth0 * p.V + (jv * p.H * p.V + vb * BV + c)) : 0.0f;
    }
    float g_raw = 0.0f, beta = 1.0f;
    if (tid < M) {
        const int64_t bth = bth0 + tid * p.H;
        if (p.g != nullptr)
            g_raw = p.g[bth];
        if (p.beta != nullptr)
            beta = load_as_float(p.beta, p.beta_dtype, bth);
    }
    float *qs = buf, *ks = buf + M * KP, *vs = buf + 2 * M * KP, *decay = vs + M * BV, *betas = decay + M;
#pragma unroll
    for (int u = 0; u < ROWS_STAGE_UNROLL; u++) {
        const int idx = tid + u * ROWS_THREADS;
        if (idx < M * KP) {
            qs[idx] = rq[u];
            ks[idx] = rk[u];
        }
        if (idx < M * BV)
            vs[idx] = rv[u];
    }
    if (tid < M) {
        decay[tid] = p.g != nullptr ? expf(g_raw) : 1.0f;
        betas[tid] = beta;
    }
}

/* N = rows_vec<R>() consecutive floats of a staged q or k vector (a thread's rows are
 * consecutive, rbase + i, so the entries it needs come 4 to a 16-byte load, not one each). */
template <int R> __host__ __device__ constexpr int rows_vec() { return R % 4 == 0 ? 4 : 2; }
template <int N> __device__ __forceinline__ void rows_load_vec(const float *x, float (&out)[N]) {
    if constexpr (N == 4) {
        const float4 a = *reinterpret_cast<const float4 *>(x);
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    } else {
        const float2 a = *reinterpret_cast<const float2 *>(x);
        out[0] = a.x, out[1] = a.y;
    }
}

/* This warp's partial sums of NV reduction vectors over its R rows (rbase + i), combined over
 * the RPW lanes that share columns, stored as float4 at out + v BV + 4 (lane % LPR). */
template <int R, int LPR, int NV>
__device__ __forceinline__ void rows_partials(const float (&st)[R][4], const float *const *vec, int rbase, float *out,
                                              int lane) {
    using G = RowsGeom<LPR>;
    constexpr int N = rows_vec<R>();
    float s[NV][4];
#pragma unroll
    for (int v = 0; v < NV; v++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            s[v][c] = 0.0f;
#pragma unroll
    for (int i0 = 0; i0 < R; i0 += N) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float x[N];
            rows_load_vec<N>(vec[v] + rbase + i0, x);
#pragma unroll
            for (int ii = 0; ii < N; ii++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    s[v][c] = fmaf(st[i0 + ii][c], x[ii], s[v][c]);
        }
    }
#pragma unroll
    for (int off = 16; off >= LPR; off >>= 1) /* the lanes of one column slot, fixed order */
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                s[v][c] += __shfl_xor_sync(0xffffffffu, s[v][c], off);
    if (lane < LPR)
#pragma unroll
        for (int v = 0; v < NV; v++)
            *reinterpret_cast<float4 *>(out + v * G::BV + 4 * lane) = make_float4(s[v][0], s[v][1], s[v][2], s[v][3]);
}

/* The t-th set bit of mask (t counted from 0), mask < 2^ROWS_MAX_M. */
__device__ __forceinline__ int rows_nth_bit(unsigned mask, int n) {
    int at = 0;
#pragma unroll
    for (int t = 0; t < ROWS_MAX_M; t++)
        if ((mask >> t) & 1u) {
            if (n == 0)
                at = t;
            n--;
        }
    return at;
}

/* The 8 warps' partials of vector v for this thread's 4 columns, warp 0 first. */
template <int BV>
__device__ __forceinline__ void rows_sum(const float *red, int M, int v, int c0, float (&out)[4]) {
    const float4 x0 = *reinterpret_cast<const float4 *>(red + v * BV + c0);
    out[0] = x0.x, out[1] = x0.y, out[2] = x0.z, out[3] = x0.w;
#pragma unroll
    for (int w = 1; w < ROWS_WARPS; w++) {
        const float4 x = *reinterpret_cast<const float4 *>(red + (w * 2 * M + v) * BV + c0);
        out[0] += x.x, out[1] += x.y, out[2] += x.z, out[3] += x.w;
    }
}

/* Stage 2 of the cross-warp sum: each of the nvec vectors' BV / 4 column groups summed over the
 * 8 warps once (rows_sum's order, so the same bits), into the totals tot, by nvec BV / 4 <=
 * 2 ROWS_MAX_M 32 threads; after the next barrier every thread reads its totals with one
 * 16-byte load a vector (v9 had every thread sum all 8 warps' partials itself: 8x the shared
 * reads, about a quarter of the item's shared-memory wavefronts). */
template <int BV> __device__ __forceinline__ void rows_reduce(const float *red, float *tot, int M, int nvec) {
    for (int x = threadIdx.x; x < nvec * (BV / 4); x += ROWS_THREADS) {
        const int v = x / (BV / 4), c0 = 4 * (x - v * (BV / 4));
        float s[4];
        rows_sum<BV>(red, M, v, c0, s);
        *reinterpret_cast<float4 *>(tot + v * BV + c0) = make_float4(s[0], s[1], s[2], s[3]);
    }
}
/* Vector v's total for this thread's 4 columns (after rows_reduce and a barrier). */
template <int BV> __device__ __forceinline__ void rows_total(const float *tot, int v, int c0, float (&out)[4]) {
    const float4 x = *reinterpret_cast<const float4 *>(tot + v * BV + c0);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
}

/* Resident blocks a launch bound asks for: 2, 128 registers a thread (the 16 state rows of
 * K = 128 without spills). Three (80 registers) for the 64-column slices measured slower at every
 * row of gdp-bench ops (NOTES-ops.md, session 11: the spills cost more than the third block gave). */
constexpr int ROWS_MIN_BLOCKS = 2;

/* The thread's state cells in shared memory: row i of its R rows at cell i * ROWS_THREADS +
 * tid (16 bytes each; a 16-bit state uses the first 8), so a warp's accesses are contiguous. */
template <int SDT, int R, int BV, int ROUND, int DT>
__device__ __forceinline__ void rows_issue_state(const RecurrentParams &p, int64_t row, int h, int vb, int rbase,
                                                 int c0, float *cells) {
    const int K = rows_k<DT, ROUND * R>(p);
    using Bits = typename StateStorage<SDT>::Bits;
    const Bits *in = p.state_in == nullptr
                         ? nullptr
                         : static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + h * p.in_stride_head;
    const int col = vb * BV + c0;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = rbase + i;
        float *cell = cells + 4 * (i * ROWS_THREADS + (int)threadIdx.x);
        if (in == nullptr || r >= K)
            *reinterpret_cast<float4 *>(cell) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else if constexpr (sizeof(Bits) == 4)
            cp_async_16(cell, in + r * p.V + col);
        else
            cp_async_8(cell, in + r * p.V + col);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Loads whose first use is an item later. The compiler put each use right after its load
 * (the slot index of the item after next went straight into a uniform register, beta was
 * widened at once), so every warp waited a DRAM latency an item for values it needed a whole
 * item later: ncu's source page of v10b at B=256 put 12 % of the fp32 launch's stall samples on
 * that one R2UR, and beta's widening held warp 0 (and so the block at its next barrier).
 * beta (a per-thread value of the first M threads) keeps its raw bits, and rows_late() at the
 * load and again at the use hides them from the compiler until there (an empty asm emits no
 * instruction, so nothing waits before the first real use). The slot index, loaded at one
 * address by every thread, ptxas still moved into a uniform register at once, and under
 * register pressure spilled it at once (a store that waits for the load), so it takes no
 * register: lane 0 of each warp copies it by cp.async into the warp's word of the block's
 * shared memory, and the warp reads it back after the next item's wait. */
__device__ __forceinline__ uint32_t rows_late(uint32_t x) {
    asm volatile("" : "+r"(x));
    return x;
}
constexpr int ROWS_SLOT_WORDS = 2 * ROWS_WARPS; /* a warp's two words (by item parity) */
/* beta of step t of item (b, h)'s token 0 as loaded (its dtype's bits), converted by
 * rows_beta_value at its use (1 without beta). */
__device__ __forceinline__ uint32_t rows_beta_bits(const RecurrentParams &p, int64_t b, int h, int t) {
    if (p.beta == nullptr)
        return 0u;
    const int64_t at = (b * p.T + t) * p.H + h;
    if (p.beta_dtype == GDP_DTYPE_FP32)
        return rows_late(static_cast<const uint32_t *>(p.beta)[at]);
    return rows_late(static_cast<const uint16_t *>(p.beta)[at]);
}
__device__ __forceinline__ float rows_beta_value(const RecurrentParams &p, uint32_t bits) {
    if (p.beta == nullptr)
        return 1.0f;
    bits = rows_late(bits);
    if (p.beta_dtype == GDP_DTYPE_FP32)
        return __uint_as_float(bits);
    if (p.beta_dtype == GDP_DTYPE_BF16)
        return __uint_as_float(bits << 16);
    return __half2float(__ushort_as_half((unsigned short)bits));
}

/* Token 0 of an item as raw 4-byte words, copied by cp.async into the block's raw area while
 * the item before computes: q, k rows [M][K es / 4], the v slice [M][BV es / 4], g [M] (when
 * present). Thread tid copies words tid + ROWS_THREADS j and later converts exactly those, so
 * no barrier guards the raw area (rows_inputs_fit: 4-byte aligned rows). */
constexpr int ROWS_RAW_UNROLL = 5; /* words a thread: 2 M K + M BV + M <= 1155 fp32 words at M 3, K = BV = 128 */
__host__ __device__ constexpr int rows_raw_words(int m, int k, int bv, int es, bool has_g) {
    return m * (2 * (k * es / 4) + bv * es / 4) + (has_g ? m : 0);
}

__device__ __forceinline__ void cp_async_4(void *smem_dst, const void *gmem_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

template <int BV, int KP, int MT, int DT>
__device__ __forceinline__ void rows_issue_inputs(const RecurrentParams &p, int64_t b, int h, int vb, uint32_t *raw) {
    const int M = rows_m<MT>(p), K = rows_k<DT, KP>(p);
    const int es = gdp_dtype_size_device(rows_qdt<DT>(p));
    const int qkw = K * es / 4, vw = BV * es / 4;
    const int total = rows_raw_words(M, K, BV, es, p.g != nullptr);
    const int64_t bth0 = (b * p.T) * p.H + h; /* token 0 of the item: step t at bth0 + t H */
#pragma unroll
    for (int j = 0; j < ROWS_RAW_UNROLL; j++) {
        const int w = (int)threadIdx.x + j * ROWS_THREADS;
        if (w >= total)
            break;
        const char *src;
        if (w < 2 * M * qkw) {
            const int wq = w < M * qkw ? w : w - M * qkw, t = wq / qkw, x = wq - t * qkw;
            src = static_cast<const char *>(w < M * qkw ? p.q : p.k) + (bth0 + t * p.H) * K * es + 4 * x;
        } else if (w < M * (2 * qkw + vw)) {
            const int wv = w - 2 * M * qkw, t = wv / vw, x = wv - t * vw;
            src = static_cast<const char *>(p.v) + ((bth0 + t * p.H) * p.V + vb * BV) * es + 4 * x;
        } else {
            src = reinterpret_cast<const char *>(p.g + bth0 + (w - M * (2 * qkw + vw)) * p.H);
        }
        cp_async_4(raw + w, src);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory"); /* its own group: rows_item waits for it alone */
}

/* The words this thread copied, as fp32 into the stage buffer; beta (loaded an item ahead into
 * a register) and exp(0) = 1 without g by the first M threads. */
template <int KP, int BV, int MT, int DT>
__device__ __forceinline__ void rows_convert_inputs(const RecurrentParams &p, const uint32_t *raw, uint32_t beta_bits,
                                                    float *buf) {
    const int M = rows_m<MT>(p), K = rows_k<DT, KP>(p);
    const gdp_dtype_t qdt = rows_qdt<DT>(p);
    const int es = gdp_dtype_size_device(qdt);
    const int qkw = K * es / 4, vw = BV * es / 4;
    const int total = rows_raw_words(M, K, BV, es, p.g != nullptr);
    float *qs = buf, *ks = buf + M * KP, *vs = buf + 2 * M * KP, *decay = vs + M * BV, *betas = decay + M;
#pragma unroll
    for (int j = 0; j < ROWS_RAW_UNROLL; j++) {
        const int w = (int)threadIdx.x + j * ROWS_THREADS;
        if (w >= total)
            break;
        const uint32_t word = raw[w];
        float lo, hi;
        if (qdt == GDP_DTYPE_FP32) {
            lo = __uint_as_float(word), hi = 0.0f;
        } else if (qdt == GDP_DTYPE_BF16) {
            lo = __uint_as_float(word << 16), hi = __uint_as_float(word & 0xffff0000u);
        } else {
            lo = __half2float(__ushort_as_half((unsigned short)(word & 0xffffu)));
            hi = __half2float(__ushort_as_half((unsigned short)(word >> 16)));
        }
        float *dst;
        if (w < 2 * M * qkw) {
            const int wq = w < M * qkw ? w : w - M * qkw, t = wq / qkw, x = wq - t * qkw;
            dst = (w < M * qkw ? qs : ks) + t * KP + x * (4 / es);
        } else if (w < M * (2 * qkw + vw)) {
            const int wv = w - 2 * M * qkw, t = wv / vw, x = wv - t * vw;
            dst = vs + t * BV + x * (4 / es);
        } else {
            decay[w - M * (2 * qkw + vw)] = expf(__uint_as_float(word)); /* g is fp32 whatever q's dtype */
            continue;
        }
        dst[0] = lo;
        if (es == 2)
            dst[1] = hi;
    }
    if ((int)threadIdx.x < M) {
        betas[threadIdx.x] = rows_beta_value(p, beta_bits);
        if (p.g == nullptr)
            decay[threadIdx.x] = 1.0f;
    }
}

/* One item's tokens from the state in st (registers): see the file comment. tok counts the
 * block's tokens (it picks the stage buffer and the totals' set); the first token's inputs are
 * staged already, and published by a barrier of the item before when published is set (then
 * its first barrier is skipped). ahead: the next item's token-0 inputs sit in raw (their own
 * cp.async group) and are converted into the other stage buffer before this item's last
 * barrier, which publishes them (S = 1 only). */
template <int SDT, int R, int LPR, int MT, int DT>
__device__ __forceinline__ void rows_item(const RecurrentParams &p, int64_t b, int h, int vb, int64_t row,
                                          float (&st)[R][4], int &tok, float *smem_rows, bool published, bool ahead,
                                          const uint32_t *raw, uint32_t next_beta) {
    using G = RowsGeom<LPR>;
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int BV = G::BV, KP = G::ROUND * R;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int M = rows_m<MT>(p), K = rows_k<DT, KP>(p);
    const gdp_dtype_t odt = rows_odt<DT>(p);
    const int c0 = 4 * (lane % LPR), col = vb * BV + c0;
    const int rbase = (warp * G::RPW + lane / LPR) * R; /* the thread's rows: rbase + i, i < R */
    const int stage_floats = rows_stage_floats(M, KP, BV);
    float *red = smem_rows + 2 * stage_floats; /* [warps][2M][BV] */
    float *const tots = red + ROWS_WARPS * 2 * M * BV; /* [2][2M][BV] by token parity */
    float *const dotss = tots + 2 * (2 * M * BV);      /* [2][kk [M][M], kq [M][M], qq [M]] */
    const int64_t KV = (int64_t)K * p.V;

    for (int s = 0; s < p.S; s++, tok++) {
        /* an offset, not an array of two pointers: a runtime index would put it in local memory */
        const float *buf = smem_rows + (tok & 1) * stage_floats;
        const float *qs = buf, *ks = buf + M * KP, *vs = buf + 2 * M * KP, *decay = vs + M * BV, *betas = decay + M;
        float *tot = tots + (tok & 1) * (2 * M * BV), *dots = dotss + (tok & 1) * rows_dot_floats(M);
        if (s > 0 || !published)
            __syncthreads(); /* B1: token staged; every thread is past the block's previous token */
        if (s + 1 < p.S) /* the next token into the other buffer, read last by the token before */
            rows_stage<KP, BV, MT, DT>(p, b, h, vb, s + 1, smem_rows + ((tok + 1) & 1) * stage_floats);

        /* Which queries are nonzero (the same answer in every warp). */
        const unsigned qmask = token_query_mask<KP>(qs, M, lane);
        const int nvec = M + __popc(qmask);

        /* Partial sums of S^T k_t and S^T q_t (nonzero t), ROWS_GROUP vectors a pass. */
        for (int g0 = 0; g0 < nvec; g0 += ROWS_GROUP) {
            const float *vec[ROWS_GROUP];
#pragma unroll
            for (int v = 0; v < ROWS_GROUP; v++) {
                const int idx = min(g0 + v, nvec - 1);
                vec[v] = idx < M ? ks + idx * KP : qs + rows_nth_bit(qmask, idx - M) * KP;
            }
            float *out = red + (warp * 2 * M + g0) * BV;
            switch (min(ROWS_GROUP, nvec - g0)) {
            case 1: rows_partials<R, LPR, 1>(st, vec, rbase, out, lane); break;
            case 2: rows_partials<R, LPR, 2>(st, vec, rbase, out, lane); break;
            case 3: rows_partials<R, LPR, 3>(st, vec, rbase, out, lane); break;
            default: rows_partials<R, LPR, 4>(st, vec, rbase, out, lane); break;
            }
        }
        /* The raw dot products, one warp each: kk [j][t], kq [j][t] (j <= t), qq [t]. */
        for (int f = warp; f < 2 * M * M + M; f += ROWS_WARPS) {
            float acc;
            if (token_dot<KP>(qs, ks, M, qmask, f, lane, acc) && lane == 0)
                dots[f] = acc;
        }
        __syncthreads(); /* B2: partials and dots complete (and every thread past the last token) */
        rows_reduce<BV>(red, tot, M, nvec);
        if (ahead && s + 1 == p.S) { /* the other stage buffer was read last by the token before */
            asm volatile("cp.async.wait_group 1;\n" ::: "memory"); /* the inputs, not the state after them */
            rows_convert_inputs<KP, BV, MT, DT>(p, raw, next_beta, smem_rows + ((tok + 1) & 1) * stage_floats);
        }
        __syncthreads(); /* B3: the totals complete (and the next item's inputs staged) */

        /* Per column: deltas and outputs in closed form (token_closed_form, 4 columns a thread). */
        float d[ROWS_MAX_M][4];
        const float p0 = token_closed_form<4, ROWS_MAX_M>(
            M, qmask, decay, betas, dots, p.l2norm != 0, p.scale,
            [&](int v, float(&u)[4]) { rows_total<BV>(tot, v, c0, u); }, [&](int t, int c) { return vs[t * BV + c0 + c]; },
            [&](int t, float(&o)[4]) {
                if (warp == t % ROWS_WARPS && lane < LPR) {
                    const int64_t o_off = ((b * p.T + s * M + t) * p.H + h) * p.V + col;
                    if (DT >= 0) /* o 16-byte aligned (launch_rows_spec), col a multiple of 4 */
                        store_vec_from_float<4>(p.o, odt, o_off, o);
                    else
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            store_from_float(p.o, odt, o_off + c, o[c]);
                }
            },
            d);
        /* The rank-M update: S <- P(-1, M-1) S + sum_j k_j e_j^T (d holds e_j = P(j, M-1) f_j d_j). */
        const bool decayed = p0 != 1.0f;
        Bits *snap = p.inter != nullptr ? static_cast<Bits *>(p.inter) + ((row * p.S + s) * p.H + h) * KV : nullptr;
        constexpr int N = rows_vec<R>();
#pragma unroll
        for (int i0 = 0; i0 < R; i0 += N) {
            float kv[ROWS_MAX_M][N]; /* k_j of the group's N rows, one load a step */
#pragma unroll
            for (int j = 0; j < ROWS_MAX_M; j++)
                if (j < M)
                    rows_load_vec<N>(ks + j * KP + rbase + i0, kv[j]);
#pragma unroll
            for (int ii = 0; ii < N; ii++) {
                const int i = i0 + ii, r = rbase + i;
                if (decayed)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        st[i][c] *= p0;
#pragma unroll
                for (int j = 0; j < ROWS_MAX_M; j++) {
                    if (j >= M)
                        break;
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        st[i][c] = fmaf(kv[j][ii], d[j][c], st[i][c]);
                }
                if (snap != nullptr && r < K)
                    store_columns<SDT, 4>(snap + (int64_t)r * p.V + col, st[i]);
            }
        }
    }

    /* The final state: back into the slot (its dtype), or dense fp32. One 64-bit base and the
     * dtype branch outside the row loop (ncu: the per-row 64-bit offsets were 288 instructions
     * a warp and item of the bf16 launch). */
    if (p.state_out != nullptr) {
        const int64_t base = row * p.out_stride_row + h * p.out_stride_head + (int64_t)rbase * p.V + col;
        if (SDT == GDP_DTYPE_FP32 || p.out_fp32) {
            float *out = static_cast<float *>(p.state_out) + base;
#pragma unroll
            for (int i = 0; i < R; i++)
                if (rbase + i < K)
                    store_columns_f32<4>(out + i * p.V, st[i]);
        } else {
            Bits *out = static_cast<Bits *>(p.state_out) + base;
#pragma unroll
            for (int i = 0; i < R; i++)
                if (rbase + i < K)
                    store_columns<SDT, 4>(out + i * p.V, st[i]);
        }
    }
}

/* A resident grid: block j takes items j, j + grid, ... While an item computes, the next
 * item's state streams into the thread's own shared-memory cells by cp.async (no registers
 * held, no barrier: each thread reads back only what it copied), and its q, k, v rows into L2;
 * the slot of the item after that is copied a whole item ahead. So a block's state load
 * overlaps its previous item's compute instead of following it. The grid lets a programmatic
 * dependent (the layer's out_proj norm-GEMV, kernels/gemv.cu) start at once, so that its weight
 * streams while the update runs. */
template <int SDT, int R, int LPR, int MT, int DT>
__global__ void __launch_bounds__(ROWS_THREADS, ROWS_MIN_BLOCKS) recurrent_rows_kernel(const RecurrentParams p) {
    pdl_trigger();
    using G = RowsGeom<LPR>;
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int BV = G::BV, KP = G::ROUND * R;
    extern __shared__ __align__(16) float smem_rows[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int M = rows_m<MT>(p);
    const int c0 = 4 * (lane % LPR);
    const int rbase = (warp * G::RPW + lane / LPR) * R; /* the thread's rows: rbase + i, i < R */
    float *cells = smem_rows + rows_smem_floats(M, KP, BV); /* [R][threads] 16-byte cells */
    uint32_t *raw = reinterpret_cast<uint32_t *>(cells + R * ROWS_THREADS * 4); /* token 0's raw words */
    uint32_t *slot_words = raw + ROWS_RAW_UNROLL * ROWS_THREADS + 2 * (tid >> 5); /* the warp's two slot words */
    const bool slots_copied = p.cache && p.indices != nullptr; /* else the state row is the request */
    const int stage_floats = rows_stage_floats(M, KP, BV);
    const int64_t items = p.B * p.H * p.n_vblocks;
    const int64_t step = gridDim.x;
    int64_t item = blockIdx.x;
    if (item >= items)
        return;
    /* Both stage buffers zeroed once: the conversions write only real elements, so the rows
     * of q and k past K stay 0. */
    for (int x = tid; x < 2 * stage_floats; x += ROWS_THREADS)
        smem_rows[x] = 0.0f;
    __syncthreads();
    int64_t b, nb = 0;
    int h, vb, nh = 0, nvb = 0;
    item_coords(p, item, b, h, vb);
    int64_t row = state_row(p, b);
    uint32_t beta = 0u, next_beta = 0u; /* rows_beta_bits */
    /* The first item's state before its inputs: launched as the layer's decode front's programmatic
     * dependent (p.after_front), the block reads what the front writes (q, k, v, g, beta) only after
     * pdl_wait, and the state, which the front never writes, while the front still runs (a no-op
     * wait on a plain launch). */
    const bool first_real = !row_is_padding(p, row);
    if (first_real)
        rows_issue_state<SDT, R, BV, G::ROUND, DT>(p, row, h, vb, rbase, c0, cells);
    pdl_wait();
    if (first_real) {
        rows_issue_inputs<BV, KP, MT, DT>(p, b, h, vb, raw);
        if (tid < M)
            beta = rows_beta_bits(p, b, h, tid);
    }
    int64_t next_row = -1;
    if (item + step < items) {
        item_coords(p, item + step, nb, nh, nvb);
        next_row = state_row(p, nb);
    }
    int tok = 0;
    bool published = false;    /* this item's token-0 inputs staged and published by the item before */
    int parity = 0;            /* the slot word the next copy goes to, and the next read comes from */
    bool next_in_word = false; /* next_row still sits in slot_words[parity] (copied an item ago) */
    for (; item < items; item += step) {
        const int64_t next = item + step;
        const bool padding = row_is_padding(p, row);
        float st[R][4];
        if (!padding) {
            cp_async_wait_all();
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float *cell = cells + 4 * (i * ROWS_THREADS + tid);
                if constexpr (sizeof(Bits) == 4) {
                    const float4 x = *reinterpret_cast<const float4 *>(cell);
                    st[i][0] = x.x, st[i][1] = x.y, st[i][2] = x.z, st[i][3] = x.w;
                } else {
                    load_columns<SDT, 4>(reinterpret_cast<const Bits *>(cell), st[i]);
                }
            }
            if (!published)
                rows_convert_inputs<KP, BV, MT, DT>(p, raw, beta, smem_rows + (tok & 1) * stage_floats);
        }
        if (next_in_word) { /* the next item's slot, copied by lane 0 an item ago: complete after its wait */
            if (padding && (tid & 31) == 0)
                cp_async_wait_all();
            __syncwarp(); /* also orders every lane's read before lane 0's next copy into the other word */
            /* lane 0's word through a shuffle: a value the compiler knows to be warp-uniform keeps
             * the row's address arithmetic in uniform registers (a plain shared read spilled) */
            const uint32_t word = *reinterpret_cast<volatile const uint32_t *>(slot_words + parity);
            next_row = (int64_t)(int32_t)__shfl_sync(0xffffffffu, word, 0);
            parity ^= 1;
        }
        /* the next item: its inputs and state into the words and cells just read, and the slot
         * of the one after it into the warp's other slot word (issued first: the inputs' group
         * commits it) */
        int64_t ab = 0;
        int ah = 0, avb = 0;
        bool has_after = false;
        const bool ahead = !padding && p.S == 1 && next < items && !row_is_padding(p, next_row);
        if (next < items) {
            if (next + step < items) {
                item_coords(p, next + step, ab, ah, avb);
                has_after = true;
                if (slots_copied && (tid & 31) == 0)
                    cp_async_4(slot_words + parity, p.indices + ab);
            }
            if (!row_is_padding(p, next_row)) {
                rows_issue_inputs<BV, KP, MT, DT>(p, nb, nh, nvb, raw);
                rows_issue_state<SDT, R, BV, G::ROUND, DT>(p, next_row, nh, nvb, rbase, c0, cells);
                if (tid < M)
                    next_beta = rows_beta_bits(p, nb, nh, tid);
            }
        }
        if (padding) { /* -1: zero outputs of the slice, no slot read or written */
            zero_slice_outputs<BV, ROWS_THREADS>(p, b, h, vb);
        } else {
            rows_item<SDT, R, LPR, MT, DT>(p, b, h, vb, row, st, tok, smem_rows, published, ahead, raw, next_beta);
        }
        published = ahead;
        b = nb, h = nh, vb = nvb, row = next_row, beta = next_beta;
        nb = ab, nh = ah, nvb = avb;
        next_in_word = has_after && slots_copied;
        next_row = has_after && !slots_copied ? ab : -1;
    }
}
