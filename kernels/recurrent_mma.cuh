/*
 * recurrent_mma.cuh: the tensor-core decode kernel (v11, NOTES-ops.md, fortieth session;
 * GDP_DECODE_STATE=mma), included by recurrent.cu inside its anonymous namespace after the row
 * kernel (it uses RecurrentParams, StateStorage, item_coords, the cp.async helpers and the row
 * kernel's beta loads).
 *
 * Why: the row kernel (recurrent_rows.cuh) is bound by its instructions, not by its bytes: about
 * 1,500 warp instructions a warp and item with an fp32 state, 2,000 with a bf16 one (ncu, v10b),
 * where a block's 8 warps each sum S^T k and S^T q over their rows on the FMA pipe, exchange the
 * partials through shared memory behind three barriers a token, and rebuild the rank-M update
 * element by element. The bf16 state moves half the bytes and ran at 3/4 of the fp32 time.
 *
 * Design: the same closed form of a token's M steps as the row kernel (one product of the
 * token-start state with every k_t and q_t, the raw dot products, the deltas and outputs per
 * column, one rank-M update), with both matrix products on the tensor cores (mma.sync m16n8k8,
 * tf32 in, fp32 accumulate), and a warp owning whole columns so that no sum crosses warps:
 *   - a warp owns 16 value columns x all K rows of an item (request, head, slice of 16 NW
 *     columns; NW warps a block). Lane (g = lane / 4, t = lane % 4) holds columns c0 = 2g and
 *     c0 + 1 of rows 8j + 2t and 8j + 2t + 1 (j < K / 8) in st[j][0..3]: that is the A operand
 *     of S^T X (m = column, k = row) and, renamed, the accumulator of the update (m = column,
 *     n = row) at once, so the state never moves between the two products;
 *   - S^T X with X = [k_0 .. k_{M-1}, q_0 .. q_{M-1}] (n = vector): bf16 q and k are exact in
 *     tf32; a bf16 state as loaded is exact too (one mma a k-tile); an fp32 state (and a bf16
 *     one after its first token) is split S = hi + lo (hi = tf32(S), lo = S - hi, two mmas: the
 *     product to about 2^-21, where plain tf32 would give 2^-11). The Gram matrix X^T X (the
 *     raw dot products) takes the same B fragments as its A operand: one more mma a k-tile, no
 *     reduction over lanes;
 *   - each lane gathers its two columns' 2M sums from its quad by shuffles and runs the closed
 *     form for them (the 4 lanes of a quad redundantly: it is a few dozen FLOPs), lane t
 *     storing the output of step t;
 *   - the update S <- P S + sum_j k_j e_j^T is one mma a 8-row tile: A = [hi(e) | lo(e)] (2M
 *     of the 8 k columns), B = [k | k], C = P S in the registers;
 *   - a resident grid whose blocks walk the items; the next item's state streams by 16-byte
 *     cp.async into padded shared rows (mma_issue_rows) and its inputs (q, k, v, g of all S
 *     tokens, raw bf16 words) into the other half of a double-buffered area while the current
 *     item computes: two block barriers an item (its data complete; its rows read).
 * Not the row kernel's bits (other sum orders, tf32 halves): the CPU reference's bar, its own
 * bits on a second run, and with an fp32 cache S tokens in one call equal to S one-token calls
 * (between tokens the state stays fp32 in the registers, as in the row kernel and the CPU
 * reference; a 16-bit state is rounded where it is stored).
 * Scope (mma_fit): K 64 or 128, V a multiple of 16, M <= 3, S <= MMA_MAX_S, bf16 q, k and v,
 * an fp32 or bf16 state with 16-byte columns, no fused norm; anything else runs the row kernel.
 * Measured (H100, NOTES-ops.md, fortieth session): about 600 instructions a thread and item
 * against the row kernel's 1,500-2,000, and now memory-bound at lower occupancy (16 warps an SM,
 * DRAM 60-68 %): faster than the row kernel with a bf16 state (B=256 119.7 against 127.1 us; its
 * default from 256 request-head pairs, MMA_MIN_PAIRS_BF16 in recurrent.cu), slower with an fp32
 * state (222.6 against 208.2) and at B=1 (one warp's chain of 16 tiles).
 */

constexpr int MMA_MAX_M = 3;
constexpr int MMA_MAX_S = 4; /* tokens a request the input area holds */

template <int KP, int M, int NW> struct MmaGeom {
    static constexpr int THREADS = NW * 32;
    static constexpr int BV = 16 * NW;                 /* value columns of an item              */
    static constexpr int NKT = KP / 8;                 /* 8-row tiles of the state              */
    static constexpr int XW = KP / 2 + 4;              /* words of a staged q or k row, padded  */
    static constexpr int X_OFF = 0;                    /* [2M][XW]: k_0 .. k_{M-1}, q_0 ..      */
    static constexpr int V_OFF = 2 * M * XW;           /* [M][BV / 2]: v of the item's columns  */
    static constexpr int G_OFF = V_OFF + M * (BV / 2); /* [M]: g (fp32 words)                   */
    static constexpr int TOKEN_WORDS = G_OFF + M;
};

/* Registers: the 64 fp32 state values of K = 128 plus the fragments fit 128 a thread, so
 * 64 K registers hold 16 / NW blocks of NW warps an SM. */
template <int NW> constexpr int mma_min_blocks() { return 16 / NW; }

/* Item (b, h, vb)'s inputs for all S tokens as raw 4-byte words into area (MmaGeom's layout a
 * token; the padding words are not written and never read). */
template <int KP, int M, int NW>
__device__ __forceinline__ void mma_issue_inputs(const RecurrentParams &p, int64_t b, int h, int vb, uint32_t *area) {
    using G = MmaGeom<KP, M, NW>;
    const int words = p.S * G::TOKEN_WORDS;
    for (int w = threadIdx.x; w < words; w += G::THREADS) {
        const int s = w / G::TOKEN_WORDS, x = w - s * G::TOKEN_WORDS;
        const int64_t bt = b * p.T + (int64_t)s * M; /* step 0 of token s */
        const char *src;
        if (x < G::V_OFF) {
            const int u = x / G::XW, c = x - u * G::XW;
            if (c >= KP / 2)
                continue;
            const int step = u < M ? u : u - M;
            src = static_cast<const char *>(u < M ? p.k : p.q) + ((bt + step) * p.H + h) * (KP * 2) + 4 * c;
        } else if (x < G::G_OFF) {
            const int xv = x - G::V_OFF, step = xv / (G::BV / 2), c = xv - step * (G::BV / 2);
            src = static_cast<const char *>(p.v) + (((bt + step) * p.H + h) * p.V + (int64_t)vb * G::BV) * 2 + 4 * c;
        } else {
            if (p.g == nullptr)
                continue;
            src = reinterpret_cast<const char *>(p.g + (bt + (x - G::G_OFF)) * p.H + h);
        }
        cp_async_4(area + w, src);
    }
}

/* The item's state as whole rows: every thread copies 16-byte chunks, a warp instruction 512
 * contiguous bytes (the row kernel's stream), into shared rows of mma_pitch bytes: 32 (fp32) or
 * 16 (16-bit) bytes past the row's columns; each thread then reads its fragments. (With 32 bytes
 * the fp32 rows t and t + 2 of a half warp's 8-byte reads share banks: ncu, 2.5-way conflicts;
 * kernels/pending/mma-pitch16.patch pads 16, not yet run.) v11 had each thread copy its own
 * fragments, 8 or 4 bytes a cp.async, into its own cells with no barrier: 20 % slower
 * (NOTES-ops.md, fortieth session). */
template <int SDT, int BV> __host__ __device__ constexpr int mma_pitch() {
    return SDT == GDP_DTYPE_FP32 ? BV * 4 + 32 : BV * 2 + 16;
}
template <int SDT, int KP, int NW>
__device__ __forceinline__ void mma_issue_rows(const RecurrentParams &p, int64_t row, int h, int vb, uint32_t *buf) {
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int THREADS = NW * 32, BV = 16 * NW, ES = sizeof(Bits), CPR = BV * ES / 16, PITCH = mma_pitch<SDT, BV>();
    char *dst0 = reinterpret_cast<char *>(buf);
    if (p.state_in == nullptr) {
        for (int c = threadIdx.x; c < KP * CPR; c += THREADS) {
            const int r = c / CPR, x = c - r * CPR;
            *reinterpret_cast<uint4 *>(dst0 + r * PITCH + 16 * x) = make_uint4(0u, 0u, 0u, 0u);
        }
        return;
    }
    const Bits *in = static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + h * p.in_stride_head +
                     (int64_t)vb * BV;
#pragma unroll 4
    for (int c = threadIdx.x; c < KP * CPR; c += THREADS) {
        const int r = c / CPR, x = c - r * CPR;
        cp_async_16(dst0 + r * PITCH + 16 * x, in + (int64_t)r * p.V + x * (16 / ES));
    }
}
/* Rows r, r + 1 of columns cw, cw + 1 (within the item) from the row buffer. */
template <int SDT, int BV>
__device__ __forceinline__ void mma_read_rows(const uint32_t *buf, int r, int cw, float (&dst)[4]) {
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int PITCH = mma_pitch<SDT, BV>();
    const char *at = reinterpret_cast<const char *>(buf) + r * PITCH + cw * (int)sizeof(Bits);
    if constexpr (SDT == GDP_DTYPE_FP32) {
        const float2 a = *reinterpret_cast<const float2 *>(at), b = *reinterpret_cast<const float2 *>(at + PITCH);
        dst[0] = a.x, dst[1] = a.y, dst[2] = b.x, dst[3] = b.y;
    } else {
        const float2 a = StateStorage<SDT>::unpack2(*reinterpret_cast<const uint32_t *>(at));
        const float2 b = StateStorage<SDT>::unpack2(*reinterpret_cast<const uint32_t *>(at + PITCH));
        dst[0] = a.x, dst[1] = a.y, dst[2] = b.x, dst[3] = b.y;
    }
}

/* Words of the state rows. */
template <int SDT, int KP, int NW> __host__ __device__ constexpr int mma_state_words() {
    return KP * mma_pitch<SDT, 16 * NW>() / 4;
}

/* Columns c0, c0 + 1 of one row to a state tensor of dtype SDT (8 bytes fp32, one word 16-bit). */
template <int SDT>
__device__ __forceinline__ void mma_store_pair(typename StateStorage<SDT>::Bits *dst, float lo, float hi) {
    if constexpr (SDT == GDP_DTYPE_FP32)
        *reinterpret_cast<float2 *>(dst) = make_float2(lo, hi);
    else
        *reinterpret_cast<uint32_t *>(dst) = StateStorage<SDT>::pack2(lo, hi);
}

/* One token of an item for this warp's 16 columns: see the file comment. tok: the token's
 * staged words; beta_bits: its M betas as loaded (rows_beta_bits). */
template <int SDT, int KP, int M, int NW>
__device__ __forceinline__ void mma_token(const RecurrentParams &p, int64_t b, int h, int64_t row, int s, int col0,
                                          float (&st)[KP / 8][4], const uint32_t *tok, const uint32_t (&beta_bits)[M]) {
    using G = MmaGeom<KP, M, NW>;
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr unsigned FULL = 0xffffffffu;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool has_vec = g < 2 * M; /* lane g's B column is vector g (zero past 2M) */
    /* The state stays fp32 between tokens (as the CPU reference holds it), so only a 16-bit
     * state's first token is exact in tf32; every other product takes the hi + lo split. */
    const bool split = SDT == GDP_DTYPE_FP32 || s > 0;

    /* S^T X (acc: m = column c0 / c0 + 1, n = vector 2t / 2t + 1) and X^T X (gram: m = vector g). */
    /* independent chains (even and odd tiles; hi and lo), summed in a fixed order after the loop,
     * so that consecutive mmas do not wait on one accumulator */
    float part[4][4], gpart[2][4];
#pragma unroll
    for (int x = 0; x < 4; x++)
#pragma unroll
        for (int y = 0; y < 4; y++)
            part[x][y] = 0.0f, gpart[x & 1][y] = 0.0f;
    const uint32_t *xw = tok + G::X_OFF + (has_vec ? g : 0) * G::XW + t;
#pragma unroll
    for (int j = 0; j < G::NKT; j++) {
        const uint32_t w = has_vec ? xw[4 * j] : 0u; /* rows 8j + 2t (low half), 8j + 2t + 1 */
        const uint32_t b0 = w << 16, b1 = w & 0xffff0000u;
        if (split) {
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int x = 0; x < 4; x++)
                mma_tf32_split(st[j][x], hi[x], lo[x]);
            mma_tf32(part[j & 1], hi[0], hi[1], hi[2], hi[3], b0, b1);
            mma_tf32(part[2 + (j & 1)], lo[0], lo[1], lo[2], lo[3], b0, b1);
        } else { /* a 16-bit state as loaded is exact in tf32 */
            mma_tf32(part[j & 1], __float_as_uint(st[j][0]), __float_as_uint(st[j][1]), __float_as_uint(st[j][2]),
                     __float_as_uint(st[j][3]), b0, b1);
        }
        mma_tf32(gpart[j & 1], b0, 0u, b1, 0u, b0, b1);
    }
    float acc[4], gram[4];
#pragma unroll
    for (int y = 0; y < 4; y++) {
        acc[y] = (part[0][y] + part[1][y]) + (part[2][y] + part[3][y]);
        gram[y] = gpart[0][y] + gpart[1][y];
    }

    /* The quad's 2M sums for both columns: vector n sits in lane 4g + n / 2, element n % 2. */
    float u[2][2 * M];
#pragma unroll
    for (int tp = 0; tp < M; tp++) {
        const int src = (lane & ~3) | tp;
        u[0][2 * tp] = __shfl_sync(FULL, acc[0], src);
        u[0][2 * tp + 1] = __shfl_sync(FULL, acc[1], src);
        u[1][2 * tp] = __shfl_sync(FULL, acc[2], src);
        u[1][2 * tp + 1] = __shfl_sync(FULL, acc[3], src);
    }
    /* Gram entry (x, y), x, y < 2M: lane 4x + y / 2, element y % 2. */
    const auto gram_at = [&](int x, int y) { return __shfl_sync(FULL, (y & 1) ? gram[1] : gram[0], 4 * x + (y >> 1)); };

    const uint32_t *vw = tok + G::V_OFF + (col0 % G::BV) / 2;
    const float eps = (float)GDP_L2NORM_EPS;
    float d[M][2], pj[M], fk[M], o_mine[2] = {0.0f, 0.0f};
    float p0 = 1.0f; /* P(-1, t) */
#pragma unroll
    for (int tt = 0; tt < M; tt++) {
        const float a = p.g != nullptr ? expf(__uint_as_float(tok[G::G_OFF + tt])) : 1.0f;
        p0 *= a;
#pragma unroll
        for (int j = 0; j < tt; j++)
            pj[j] *= a;
        pj[tt] = 1.0f;
        fk[tt] = p.l2norm ? 1.0f / sqrtf(gram_at(tt, tt) + eps) : 1.0f;
        const float2 v = StateStorage<GDP_DTYPE_BF16>::unpack2(vw[tt * (G::BV / 2)]);
        const float cu = p0 * fk[tt];
        d[tt][0] = fmaf(-cu, u[0][tt], v.x);
        d[tt][1] = fmaf(-cu, u[1][tt], v.y);
#pragma unroll
        for (int j = 0; j < tt; j++) {
            const float cj = pj[j] * fk[j] * fk[tt] * gram_at(j, tt);
            d[tt][0] = fmaf(-cj, d[j][0], d[tt][0]);
            d[tt][1] = fmaf(-cj, d[j][1], d[tt][1]);
        }
        const float bt = rows_beta_value(p, beta_bits[tt]);
        d[tt][0] *= bt;
        d[tt][1] *= bt;
        const float qq = gram_at(M + tt, M + tt);
        if (qq != 0.0f) { /* a zero query (GDP's copies < M-1): o = 0 */
            const float ht = (p.l2norm ? 1.0f / sqrtf(qq + eps) : 1.0f) * p.scale;
            const float cw = p0 * ht;
            float o0 = u[0][M + tt] * cw, o1 = u[1][M + tt] * cw;
#pragma unroll
            for (int j = 0; j <= tt; j++) {
                const float cj = pj[j] * fk[j] * ht * gram_at(j, M + tt);
                o0 = fmaf(cj, d[j][0], o0);
                o1 = fmaf(cj, d[j][1], o1);
            }
            if (t == tt)
                o_mine[0] = o0, o_mine[1] = o1;
        }
    }
    if (t < M) /* o 4-byte aligned for 16-bit, 8 for fp32 (mma_fit) */
        store_vec_from_float<2>(p.o, p.o_dtype, ((b * p.T + (int64_t)s * M + t) * p.H + h) * p.V + col0, o_mine);

    /* The update's A: k column t is hi(e_t) (t < M) or lo(e_{t-M}) (t < 2M), column t + 4 likewise. */
    uint32_t ea[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < M; j++) {
        uint32_t h0, h1, l0, l1;
        mma_tf32_split(pj[j] * fk[j] * d[j][0], h0, l0);
        mma_tf32_split(pj[j] * fk[j] * d[j][1], h1, l1);
        if (t == j)
            ea[0] = h0, ea[1] = h1;
        if (t == M + j)
            ea[0] = l0, ea[1] = l1;
        if (t + 4 == j)
            ea[2] = h0, ea[3] = h1;
        if (t + 4 == M + j)
            ea[2] = l0, ea[3] = l1;
    }
    /* B: k column t (t + 4) is k_{t mod M} (zero past 2M), n = row 8j + g. */
    const uint16_t *kh = reinterpret_cast<const uint16_t *>(tok + G::X_OFF);
    const bool kb0 = t < 2 * M, kb1 = t + 4 < 2 * M;
    const uint16_t *k0 = kh + (kb0 ? t % M : 0) * (2 * G::XW) + g, *k1 = kh + (kb1 ? (t + 4) % M : 0) * (2 * G::XW) + g;
    Bits *snap = p.inter != nullptr ? static_cast<Bits *>(p.inter) + ((row * p.S + s) * p.H + h) * (int64_t)KP * p.V +
                                          (int64_t)(2 * t) * p.V + col0
                                    : nullptr;
#pragma unroll
    for (int j = 0; j < G::NKT; j++) {
        const uint32_t b0 = kb0 ? (uint32_t)k0[8 * j] << 16 : 0u, b1 = kb1 ? (uint32_t)k1[8 * j] << 16 : 0u;
        /* C: m = column (c0, c0 + 1), n = row 8j + 2t, 8j + 2t + 1 */
        float c[4] = {st[j][0] * p0, st[j][2] * p0, st[j][1] * p0, st[j][3] * p0};
        mma_tf32(c, ea[0], ea[1], ea[2], ea[3], b0, b1);
        st[j][0] = c[0], st[j][1] = c[2], st[j][2] = c[1], st[j][3] = c[3];
        if (snap != nullptr) {
            mma_store_pair<SDT>(snap + (int64_t)(8 * j) * p.V, st[j][0], st[j][1]);
            mma_store_pair<SDT>(snap + (int64_t)(8 * j + 1) * p.V, st[j][2], st[j][3]);
        }
    }
}

/* A resident grid: block j takes items j, j + grid, ...; two barriers an item: the top (the item's
 * state and inputs complete for every warp, and every warp past the item before, whose half of
 * the input area the next item's copies reuse) and the rows read (the next item's state may
 * overwrite them). */
template <int SDT, int KP, int M, int NW>
__global__ void __launch_bounds__(NW * 32, mma_min_blocks<NW>()) recurrent_mma_kernel(const RecurrentParams p) {
    pdl_trigger();
    using G = MmaGeom<KP, M, NW>;
    using Bits = typename StateStorage<SDT>::Bits;
    extern __shared__ __align__(16) uint32_t smem_mma[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    uint32_t *rows = smem_mma;                              /* [KP][mma_pitch bytes]  */
    uint32_t *area = rows + mma_state_words<SDT, KP, NW>(); /* [2][S][TOKEN_WORDS]    */
    const int area_words = p.S * G::TOKEN_WORDS;
    const int r0 = 2 * t, cw = 16 * warp + 2 * g; /* the thread's first row and column within the item */
    const int64_t items = p.B * p.H * p.n_vblocks;
    const int64_t step = gridDim.x;
    int64_t item = blockIdx.x;
    if (item >= items)
        return;
    int64_t b, nb = 0;
    int h, vb, nh = 0, nvb = 0;
    item_coords(p, item, b, h, vb);
    int64_t row = state_row(p, b);
    uint32_t beta[M], next_beta[M];
#pragma unroll
    for (int x = 0; x < M; x++)
        beta[x] = next_beta[x] = 0u;
    /* the first item's state before its inputs and pdl_wait (recurrent_rows_kernel's prologue) */
    const bool first_real = !row_is_padding(p, row);
    if (first_real)
        mma_issue_rows<SDT, KP, NW>(p, row, h, vb, rows);
    pdl_wait();
    if (first_real) {
        mma_issue_inputs<KP, M, NW>(p, b, h, vb, area);
#pragma unroll
        for (int x = 0; x < M; x++)
            beta[x] = rows_beta_bits(p, b, h, x);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    int64_t next_row = -1;
    if (item + step < items) {
        item_coords(p, item + step, nb, nh, nvb);
        next_row = state_row(p, nb);
    }
    for (int par = 0; item < items; item += step, par ^= 1) {
        cp_async_wait_all();
        __syncthreads();
        const bool padding = row_is_padding(p, row);
        const int col0 = vb * G::BV + cw;
        float st[G::NKT][4];
        if (!padding)
#pragma unroll
            for (int j = 0; j < G::NKT; j++)
                mma_read_rows<SDT, G::BV>(rows, 8 * j + r0, cw, st[j]);
        __syncthreads(); /* every thread has its fragments: the rows may take the next item */
        /* the next item into the rows just read and the other half of the area; the slot of
         * the one after it */
        const int64_t next = item + step;
        int64_t ab = 0, after_row = -1;
        int ah = 0, avb = 0;
        if (next < items) {
            if (!row_is_padding(p, next_row)) {
                mma_issue_inputs<KP, M, NW>(p, nb, nh, nvb, area + (par ^ 1) * area_words);
                mma_issue_rows<SDT, KP, NW>(p, next_row, nh, nvb, rows);
#pragma unroll
                for (int x = 0; x < M; x++)
                    next_beta[x] = rows_beta_bits(p, nb, nh, x);
            }
            if (next + step < items) {
                item_coords(p, next + step, ab, ah, avb);
                after_row = state_row(p, ab);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (padding) { /* -1: zero outputs of the slice, no slot read or written */
            zero_slice_outputs<G::BV, G::THREADS>(p, b, h, vb);
        } else {
            const uint32_t *mine = area + par * area_words;
            for (int s = 0; s < p.S; s++) {
                uint32_t bb[M];
#pragma unroll
                for (int x = 0; x < M; x++)
                    bb[x] = s == 0 ? beta[x] : rows_beta_bits(p, b, h, s * M + x);
                mma_token<SDT, KP, M, NW>(p, b, h, row, s, col0, st, mine + s * G::TOKEN_WORDS, bb);
            }
            if (p.state_out != nullptr) {
                const int64_t base = row * p.out_stride_row + h * p.out_stride_head + (int64_t)r0 * p.V + col0;
                if (SDT == GDP_DTYPE_FP32 || p.out_fp32) {
                    float *out = static_cast<float *>(p.state_out) + base;
#pragma unroll
                    for (int j = 0; j < G::NKT; j++) {
                        *reinterpret_cast<float2 *>(out + (int64_t)(8 * j) * p.V) = make_float2(st[j][0], st[j][1]);
                        *reinterpret_cast<float2 *>(out + (int64_t)(8 * j + 1) * p.V) = make_float2(st[j][2], st[j][3]);
                    }
                } else {
                    Bits *out = static_cast<Bits *>(p.state_out) + base;
#pragma unroll
                    for (int j = 0; j < G::NKT; j++) {
                        mma_store_pair<SDT>(out + (int64_t)(8 * j) * p.V, st[j][0], st[j][1]);
                        mma_store_pair<SDT>(out + (int64_t)(8 * j + 1) * p.V, st[j][2], st[j][3]);
                    }
                }
            }
        }
#pragma unroll
        for (int x = 0; x < M; x++)
            beta[x] = next_beta[x];
        b = nb, h = nh, vb = nvb, row = next_row;
        nb = ab, nh = ah, nvb = avb, next_row = after_row;
    }
}
