/*
 * recurrent_warps.cuh: the warp kernel of the decode op (GDP_DECODE_STATE=warps), included by
 * recurrent.cu inside its anonymous namespace after recurrent_rows.cuh (it uses RecurrentParams,
 * StateStorage, the column helpers and the row kernel's rows_m / rows_qdt / rows_odt / rows_k).
 *
 * Why (NOTES-ops.md, twenty-ninth session, the row kernel's ncu card at B = 256): the row kernel
 * spends 35 % of its fp32 stall samples at its two block barriers a token, where 8 warps' partial
 * sums over K meet in shared memory. Issue 14 names the cure: a warp that owns whole columns
 * reduces over K inside itself, so no item needs a block barrier or shared memory at all.
 *
 * Design:
 *   - one warp per item (request, head, block of WARPS_BV = 16 value columns); lane l holds the 4
 *     adjacent columns 4 (l % 4) of the R consecutive rows (l / 4) R + i (i < R, R = KP / 8: 16
 *     for K = 128): 64 fp32 values a lane, read once and written once, in registers in between;
 *     a warp load covers 8 rows x 64 bytes (full 32-byte sectors);
 *   - per token one pass over the lane's rows, 4 at a time, gives the partial sums of S^T k_t,
 *     S^T q_t (every step t of the token) and of the raw dot products the closed form needs
 *     (k_j . k_t, k_j . q_t, |q_t|^2); three xor-shuffles over the 8 lanes of a column group
 *     finish them, every lane of the group ending with the same bits (the butterfly adds the
 *     same two operands on both sides);
 *   - then per column the deltas and outputs in the row kernel's closed form (recurrent_rows.cuh,
 *     its file comment) and the rank-M update of the registers, k re-read from L1;
 *   - a zero query (GDP's copies before the last) skips its shuffles and writes o = 0;
 *   - a resident grid of warps (blocks of one warp while the items do not fill every SM four
 *     times, B = 1: 128 items on 128 SMs; of four beyond) walking the items; each warp streams its
 *     next item's state into its own shared cells by cp.async while the current item computes
 *     (the first version loaded each item's state into registers at its start, no overlap:
 *     NOTES-ops.md, thirtieth session).
 * S tokens of a request (drafts) run one after another with the state in registers (fp32 between
 * tokens, so S tokens in one call equal S one-token calls bit for bit for an fp32 state), the
 * snapshot of each written after its update. The arithmetic is the row kernel's closed form
 * summed in another order: the same values to fp32 rounding, not the same bits (test_recurrent_gpu
 * holds it to the CPU reference's bar, and to itself across runs).
 * Scope (warps_fit): V a multiple of 16, K <= 128, M <= ROWS_MAX_M, no fused norm, 16-byte state
 * columns (the caller's vec); anything else runs the other kernels.
 */

constexpr int WARPS_LANE_COLS = 4;                      /* adjacent value columns a lane holds  */
constexpr int WARPS_GROUPS = 4;                         /* column groups a warp                 */
constexpr int WARPS_SLICES = 32 / WARPS_GROUPS;         /* lanes sharing a column group: 8      */
constexpr int WARPS_BV = WARPS_GROUPS * WARPS_LANE_COLS; /* value columns an item: 16           */
constexpr int WARPS_CHUNK = 4;                          /* rows of q and k read per step at once */
constexpr int WARPS_MAX_WARPS = 4;                      /* warps a block, at most               */
/* 4-warp blocks an SM the launch bound asks for: 3 (at most 170 registers a thread) for the
 * compiled-in M = 1 and 2, 2 (255) for M = 3 (spilled 0.1 KB a thread at 170) and the generic
 * instances (their run-time dtype branches and step loops spilled 0.9 KB at 170) */
template <int MT> constexpr int warps_min_blocks() { return MT == 1 || MT == 2 ? 3 : 2; }

/* WARPS_CHUNK rows [r0, r0 + 4) of a q or k vector whose row 0 is element off of base, as floats
 * (rows past K read 0). vec: 8- or 16-byte loads (K % 4 == 0, base 16-byte aligned). */
template <int DT>
__device__ __forceinline__ void warps_rows(const RecurrentParams &p, const void *base, int64_t off, int r0, int K,
                                           bool vec, float (&x)[WARPS_CHUNK]) {
    const gdp_dtype_t dt = rows_qdt<DT>(p);
    if (vec && r0 + WARPS_CHUNK <= K) {
        load_vec_as_float<WARPS_CHUNK>(base, dt, off + r0, x);
        return;
    }
#pragma unroll
    for (int n = 0; n < WARPS_CHUNK; n++)
        x[n] = r0 + n < K ? load_as_float(base, dt, off + r0 + n) : 0.0f;
}

/* x summed over the 8 lanes of this lane's column group (lanes l, l ^ 4, l ^ 8, ...): the same
 * bits in each of them. */
__device__ __forceinline__ float warps_group_sum(float x) {
#pragma unroll
    for (int off = WARPS_GROUPS; off < 32; off <<= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* The lane's R cells of the item's state (row, h, the lane's columns col) into its own cells of the
 * warp's shared buffer (cell i of lane l at i * 32 + l, 16 bytes), by cp.async in one group: rows
 * past K, or no state_in, as zeros. */
template <int SDT, int R, int DT>
__device__ __forceinline__ void warps_issue_state(const RecurrentParams &p, int64_t row, int h, int col, int rbase,
                                                  int lane, float4 *cells) {
    using Bits = typename StateStorage<SDT>::Bits;
    const int K = rows_k<DT, WARPS_SLICES * R>(p);
    const Bits *in = p.state_in == nullptr ? nullptr
                                           : static_cast<const Bits *>(p.state_in) + row * p.in_stride_row +
                                                 h * p.in_stride_head + (int64_t)rbase * p.V + col;
#pragma unroll
    for (int i = 0; i < R; i++) {
        float4 *cell = cells + i * 32 + lane;
        if (in == nullptr || rbase + i >= K)
            *cell = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else if constexpr (sizeof(Bits) == 4)
            cp_async_16(cell, in + (int64_t)i * p.V);
        else
            cp_async_8(cell, in + (int64_t)i * p.V);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* The state of one item (row, h, vb) from st (registers) through its S tokens, then back to the
 * slot or the dense final state: see the file comment. vec_in: q, k, v as 8- or 16-byte loads;
 * vec_o: o likewise. */
template <int SDT, int R, int MT, int DT>
__device__ __forceinline__ void warps_item(const RecurrentParams &p, int64_t b, int h, int vb, int64_t row,
                                           float (&st)[R][WARPS_LANE_COLS], bool vec_in, bool vec_o) {
    using Bits = typename StateStorage<SDT>::Bits;
    constexpr int KP = WARPS_SLICES * R;
    const int lane = threadIdx.x & 31;
    const int M = rows_m<MT>(p), K = rows_k<DT, KP>(p);
    const gdp_dtype_t odt = rows_odt<DT>(p);
    const int col = vb * WARPS_BV + WARPS_LANE_COLS * (lane % WARPS_GROUPS);
    const int rbase = (lane / WARPS_GROUPS) * R; /* the lane's rows: rbase + i, i < R */
    const bool writes_o = lane < WARPS_GROUPS;   /* row slice 0 stores the outputs */
    const int64_t KV = (int64_t)K * p.V;
    const float eps = (float)GDP_L2NORM_EPS;

    for (int s = 0; s < p.S; s++) {
        const int64_t bth0 = (b * p.T + (int64_t)s * M) * p.H + h; /* step t of the token at bth0 + t H */
        float vv[ROWS_MAX_M][WARPS_LANE_COLS], decay[ROWS_MAX_M], betas[ROWS_MAX_M];
#pragma unroll
        for (int t = 0; t < ROWS_MAX_M; t++) {
            if (t >= M)
                break;
            const int64_t bth = bth0 + (int64_t)t * p.H;
            if (vec_in)
                load_vec_as_float<WARPS_LANE_COLS>(p.v, rows_qdt<DT>(p), bth * p.V + col, vv[t]);
            else
#pragma unroll
                for (int c = 0; c < WARPS_LANE_COLS; c++)
                    vv[t][c] = load_as_float(p.v, rows_qdt<DT>(p), bth * p.V + col + c);
            decay[t] = p.g != nullptr ? expf(p.g[bth]) : 1.0f;
            betas[t] = p.beta != nullptr ? load_as_float(p.beta, p.beta_dtype, bth) : 1.0f;
        }

        /* One pass over the lane's rows: partial S^T k_t, S^T q_t and the raw dot products
         * kk[j][t], kq[j][t] (j <= t), qq[t]. */
        float tk[ROWS_MAX_M][WARPS_LANE_COLS], tq[ROWS_MAX_M][WARPS_LANE_COLS];
        float kk[ROWS_MAX_M][ROWS_MAX_M], kq[ROWS_MAX_M][ROWS_MAX_M], qq[ROWS_MAX_M];
        bool qnz[ROWS_MAX_M];
#pragma unroll
        for (int t = 0; t < ROWS_MAX_M; t++) {
            qq[t] = 0.0f;
            qnz[t] = false;
#pragma unroll
            for (int c = 0; c < WARPS_LANE_COLS; c++)
                tk[t][c] = tq[t][c] = 0.0f;
#pragma unroll
            for (int j = 0; j < ROWS_MAX_M; j++)
                kk[j][t] = kq[j][t] = 0.0f;
        }
#pragma unroll
        for (int i0 = 0; i0 < R; i0 += WARPS_CHUNK) {
            float xk[ROWS_MAX_M][WARPS_CHUNK], xq[ROWS_MAX_M][WARPS_CHUNK];
#pragma unroll
            for (int t = 0; t < ROWS_MAX_M; t++) {
                if (t >= M)
                    break;
                const int64_t off = (bth0 + (int64_t)t * p.H) * K;
                warps_rows<DT>(p, p.k, off, rbase + i0, K, vec_in, xk[t]);
                warps_rows<DT>(p, p.q, off, rbase + i0, K, vec_in, xq[t]);
            }
#pragma unroll
            for (int t = 0; t < ROWS_MAX_M; t++) {
                if (t >= M)
                    break;
#pragma unroll
                for (int n = 0; n < WARPS_CHUNK; n++) {
                    qnz[t] |= xq[t][n] != 0.0f;
                    qq[t] = fmaf(xq[t][n], xq[t][n], qq[t]);
#pragma unroll
                    for (int c = 0; c < WARPS_LANE_COLS; c++) {
                        tk[t][c] = fmaf(st[i0 + n][c], xk[t][n], tk[t][c]);
                        tq[t][c] = fmaf(st[i0 + n][c], xq[t][n], tq[t][c]);
                    }
                }
#pragma unroll
                for (int j = 0; j <= t; j++)
#pragma unroll
                    for (int n = 0; n < WARPS_CHUNK; n++) {
                        kk[j][t] = fmaf(xk[j][n], xk[t][n], kk[j][t]);
                        kq[j][t] = fmaf(xk[j][n], xq[t][n], kq[j][t]);
                    }
            }
        }
        /* Which queries are nonzero (the same answer in every lane), then the group sums of
         * what the closed form reads. */
        unsigned qmask = 0;
#pragma unroll
        for (int t = 0; t < ROWS_MAX_M; t++)
            if (t < M && __any_sync(0xffffffffu, qnz[t]))
                qmask |= 1u << t;
#pragma unroll
        for (int t = 0; t < ROWS_MAX_M; t++) {
            if (t >= M)
                break;
#pragma unroll
            for (int c = 0; c < WARPS_LANE_COLS; c++)
                tk[t][c] = warps_group_sum(tk[t][c]);
            if (p.l2norm)
                kk[t][t] = warps_group_sum(kk[t][t]);
#pragma unroll
            for (int j = 0; j < t; j++)
                kk[j][t] = warps_group_sum(kk[j][t]);
            if ((qmask >> t) & 1u) {
#pragma unroll
                for (int c = 0; c < WARPS_LANE_COLS; c++)
                    tq[t][c] = warps_group_sum(tq[t][c]);
#pragma unroll
                for (int j = 0; j <= t; j++)
                    kq[j][t] = warps_group_sum(kq[j][t]);
                if (p.l2norm)
                    qq[t] = warps_group_sum(qq[t]);
            }
        }

        /* Per column: deltas and outputs in closed form (recurrent_rows.cuh, rows_item). */
        float d[ROWS_MAX_M][WARPS_LANE_COLS], fk[ROWS_MAX_M], pj[ROWS_MAX_M];
        float p0 = 1.0f; /* P(-1, t) */
#pragma unroll
        for (int t = 0; t < ROWS_MAX_M; t++) {
            if (t >= M)
                break;
            const float a = decay[t];
            p0 *= a;
#pragma unroll
            for (int j = 0; j < t; j++)
                pj[j] *= a;
            pj[t] = 1.0f;
            fk[t] = p.l2norm ? 1.0f / sqrtf(kk[t][t] + eps) : 1.0f;
            const float cu = p0 * fk[t];
#pragma unroll
            for (int c = 0; c < WARPS_LANE_COLS; c++)
                d[t][c] = fmaf(-cu, tk[t][c], vv[t][c]);
#pragma unroll
            for (int j = 0; j < t; j++) {
                const float cj = pj[j] * fk[j] * fk[t] * kk[j][t];
#pragma unroll
                for (int c = 0; c < WARPS_LANE_COLS; c++)
                    d[t][c] = fmaf(-cj, d[j][c], d[t][c]);
            }
#pragma unroll
            for (int c = 0; c < WARPS_LANE_COLS; c++)
                d[t][c] *= betas[t];
            float o[WARPS_LANE_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
            if ((qmask >> t) & 1u) {
                const float ht = (p.l2norm ? 1.0f / sqrtf(qq[t] + eps) : 1.0f) * p.scale;
                const float cw = p0 * ht;
#pragma unroll
                for (int c = 0; c < WARPS_LANE_COLS; c++)
                    o[c] = tq[t][c] * cw;
#pragma unroll
                for (int j = 0; j <= t; j++) {
                    const float cj = pj[j] * fk[j] * ht * kq[j][t];
#pragma unroll
                    for (int c = 0; c < WARPS_LANE_COLS; c++)
                        o[c] = fmaf(cj, d[j][c], o[c]);
                }
            }
            if (writes_o) {
                const int64_t o_off = (bth0 + (int64_t)t * p.H) * p.V + col;
                if (vec_o)
                    store_vec_from_float<WARPS_LANE_COLS>(p.o, odt, o_off, o);
                else
#pragma unroll
                    for (int c = 0; c < WARPS_LANE_COLS; c++)
                        store_from_float(p.o, odt, o_off + c, o[c]);
            }
        }

        /* The rank-M update: S <- P(-1, M-1) S + sum_j k_j e_j^T, e_j = P(j, M-1) f_j d_j; k
         * re-read (the pass above brought it into L1). */
#pragma unroll
        for (int j = 0; j < ROWS_MAX_M; j++) {
            if (j >= M)
                break;
            const float e = pj[j] * fk[j];
#pragma unroll
            for (int c = 0; c < WARPS_LANE_COLS; c++)
                d[j][c] *= e;
        }
        const bool decayed = p0 != 1.0f;
        Bits *snap = p.inter != nullptr ? static_cast<Bits *>(p.inter) + ((row * p.S + s) * p.H + h) * KV : nullptr;
#pragma unroll
        for (int i0 = 0; i0 < R; i0 += WARPS_CHUNK) {
            float xk[ROWS_MAX_M][WARPS_CHUNK];
#pragma unroll
            for (int j = 0; j < ROWS_MAX_M; j++)
                if (j < M)
                    warps_rows<DT>(p, p.k, (bth0 + (int64_t)j * p.H) * K, rbase + i0, K, vec_in, xk[j]);
#pragma unroll
            for (int n = 0; n < WARPS_CHUNK; n++) {
                const int i = i0 + n, r = rbase + i;
                if (decayed)
#pragma unroll
                    for (int c = 0; c < WARPS_LANE_COLS; c++)
                        st[i][c] *= p0;
#pragma unroll
                for (int j = 0; j < ROWS_MAX_M; j++) {
                    if (j >= M)
                        break;
#pragma unroll
                    for (int c = 0; c < WARPS_LANE_COLS; c++)
                        st[i][c] = fmaf(xk[j][n], d[j][c], st[i][c]);
                }
                if (snap != nullptr && r < K)
                    store_columns<SDT, WARPS_LANE_COLS>(snap + (int64_t)r * p.V + col, st[i]);
            }
        }
    }

    /* The final state: back into the slot (its dtype), or dense fp32. */
    if (p.state_out != nullptr) {
        const int64_t base = row * p.out_stride_row + h * p.out_stride_head + (int64_t)rbase * p.V + col;
        if (SDT == GDP_DTYPE_FP32 || p.out_fp32) {
            float *out = static_cast<float *>(p.state_out) + base;
#pragma unroll
            for (int i = 0; i < R; i++)
                if (rbase + i < K)
                    store_columns_f32<WARPS_LANE_COLS>(out + (int64_t)i * p.V, st[i]);
        } else {
            Bits *out = static_cast<Bits *>(p.state_out) + base;
#pragma unroll
            for (int i = 0; i < R; i++)
                if (rbase + i < K)
                    store_columns<SDT, WARPS_LANE_COLS>(out + (int64_t)i * p.V, st[i]);
        }
    }
}

/* A resident grid of warps: warp w takes items w, w + warps, ... While an item computes, the
 * next item's state streams into the lane's own cells of the warp's shared buffer by cp.async (no
 * registers held, no barrier: each lane reads back only what it copied), so a warp's state load
 * overlaps its previous item's arithmetic. */
template <int SDT, int R, int MT, int DT>
__global__ void __launch_bounds__(WARPS_MAX_WARPS * 32, warps_min_blocks<MT>())
    recurrent_warps_kernel(const RecurrentParams p, int vec_in, int vec_o) {
    using Bits = typename StateStorage<SDT>::Bits;
    extern __shared__ __align__(16) float4 warps_cells[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4 *cells = warps_cells + warp * (R * 32); /* [R][32] 16-byte cells: this warp's */
    const int64_t items = p.B * p.H * p.n_vblocks, step = (int64_t)gridDim.x * (blockDim.x >> 5);
    const int rbase = (lane / WARPS_GROUPS) * R, lcol = WARPS_LANE_COLS * (lane % WARPS_GROUPS);
    int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (item >= items)
        return;
    int64_t b;
    int h, vb;
    item_coords(p, item, b, h, vb);
    int64_t row = state_row(p, b);
    if (!row_is_padding(p, row))
        warps_issue_state<SDT, R, DT>(p, row, h, vb * WARPS_BV + lcol, rbase, lane, cells);
    for (; item < items; item += step) {
        const bool padding = row_is_padding(p, row);
        float st[R][WARPS_LANE_COLS];
        if (!padding) {
            asm volatile("cp.async.wait_all;\n" ::: "memory");
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float4 *cell = cells + i * 32 + lane;
                if constexpr (sizeof(Bits) == 4) {
                    const float4 x = *cell;
                    st[i][0] = x.x, st[i][1] = x.y, st[i][2] = x.z, st[i][3] = x.w;
                } else {
                    load_columns<SDT, WARPS_LANE_COLS>(reinterpret_cast<const Bits *>(cell), st[i]);
                }
            }
        }
        /* the next item's state into the cells just read */
        int64_t nb = 0, nrow = -1;
        int nh = 0, nvb = 0;
        if (item + step < items) {
            item_coords(p, item + step, nb, nh, nvb);
            nrow = state_row(p, nb);
            if (!row_is_padding(p, nrow))
                warps_issue_state<SDT, R, DT>(p, nrow, nh, nvb * WARPS_BV + lcol, rbase, lane, cells);
        }
        if (padding) { /* -1: zero outputs of the item's columns, no slot read or written */
            for (int x = lane; x < p.T * WARPS_BV; x += 32) {
                const int t = x / WARPS_BV, c = x - t * WARPS_BV;
                store_from_float(p.o, p.o_dtype, ((b * p.T + t) * p.H + h) * p.V + vb * WARPS_BV + c, 0.0f);
            }
        } else {
            warps_item<SDT, R, MT, DT>(p, b, h, vb, row, st, vec_in != 0, vec_o != 0);
        }
        b = nb, h = nh, vb = nvb, row = nrow;
    }
}
