/*
 * recurrent_ring.cuh: the ring kernel of the decode op (GDP_DECODE_STATE=ring; v12 of
 * NOTES-ops.md), included by recurrent.cu inside its anonymous namespace after the tensor-core
 * kernel (it uses RecurrentParams, StateStorage, item_coords and the mbarrier helpers).
 *
 * Why (NOTES-ops.md, v10b and v11 cards): the row kernel keeps one item's state in flight a block
 * (two an SM) and meets its 8 warps' partial sums at block barriers, so an SM's memory pipe idles
 * between one item's last store and the next item's first bytes (H200 fp32 B=256: 83 % of the copy
 * rate); the tensor-core kernel waits the same way (ncu: DRAM 60-68 %, no eligible warp 59 % of
 * cycles). Both hold the state in registers across a token so that its bytes cross the SM once.
 *
 * Design:
 *   - a resident grid of one block an SM, RING_CONSUMER_WARPS warps in groups of KS BV / 32 warps;
 *     a group takes one item (request, head, slice of BV value columns) at a time, the block's items
 *     i = g, g + NG, ... to group g;
 *   - a ring of stages in shared memory, filled by the copy engine (cp.async.bulk: one copy for a
 *     whole-row item's state, else one a row; the raw q and k rows and the v slice of the item's
 *     tokens), completion on the stage's FULL mbarrier. Warp 0 fills the ring at the start; after
 *     that the group that has read a stage (its named barrier) refills it with the block's item
 *     nst later, its slot read before the group's wait. So nst items' bytes are in flight an SM,
 *     no warp waits for them but the group that needs them next, and no warp is spent on a
 *     producer role (a ninth warp would put three on one scheduler: 168 registers a thread);
 *   - a thread owns one value column: it reads its K state values from the stage into registers.
 *     Every sum over K is then in-thread: no shuffle, no block barrier; a group meets at two named
 *     barriers an item (its q, k and v converted to fp32 in the group's buffer and the stage read;
 *     the raw dot products, a warp each). With GDP_DECODE_RING_KSPLIT=2 (KS = 2) two threads share
 *     a column, K / 2 rows each, and add their partial sums (through shared memory, at the second
 *     barrier, in a fixed order): half the serial chain an item and half the state registers, for
 *     small batches, where that chain rather than the memory sets the time (NOTES-ops.md, v12;
 *     measured slower at every batch but B=1 on an H100, forty-second session: kept as an option);
 *   - the row kernel's closed form of a token's M steps per column (recurrent_rows.cuh), the outputs,
 *     the rank-M update in registers, snapshots and the final state stored from registers (a warp
 *     a 128-byte piece of a row for fp32).
 * S tokens of a request run one after another with the state in registers (an fp32 state stays
 * fp32 between tokens, so S tokens in one call equal S one-token calls bit for bit).
 * Scope (ring_fit): K 64 or 128, V a multiple of 32, M <= 3, S <= RING_MAX_S, bf16 q, k and v
 * with 16-byte aligned rows, an fp32 or bf16 state with 16-byte aligned items, no fused norm, sm_90.
 */

constexpr int RING_CONSUMER_WARPS = 8;
constexpr int RING_THREADS = 32 * RING_CONSUMER_WARPS;
constexpr int RING_MAX_STAGES = 16;
constexpr int RING_MAX_M = 3;
constexpr int RING_MAX_S = 4;
constexpr int RING_DOT_FLOATS = 32; /* kk [M][M], kq [M][M], qq [M] a token: 21 at M = 3 */

/* What a stage says about its item, written by its issuing warp before the FULL arrival. */
struct RingMeta {
    int64_t b, row;
    int32_t h, vb;
};

/* The block's dynamic shared memory, in bytes from its start (host and device compute it alike):
 * the FULL mbarriers, the stages' issue counts (ring_wait), the stages' metadata, each group's two
 * fp32 input buffers (by item parity: q [S M][K], k [S M][K], v [S M][BV]), dot areas and, with the
 * K rows split over KS threads a column, partial-sum areas (by token parity: [KS][2 M][BV]), then the
 * stages (state [K][BV] in its dtype, raw bf16 q [S M][K], k [S M][K], v [S M][BV]). */
struct RingLayout {
    int64_t issued, meta, buffers, buffer_floats, dots, parts, stages, stage_bytes, state_bytes, fixed;
    __host__ __device__ RingLayout(int S, int M, int K, int BV, int state_es, int groups, int ks) {
        issued = RING_MAX_STAGES * 8;
        meta = issued + RING_MAX_STAGES * 4;
        buffers = meta + RING_MAX_STAGES * (int64_t)sizeof(RingMeta);
        buffer_floats = (int64_t)S * M * (2 * K + BV);
        dots = buffers + (int64_t)groups * 2 * buffer_floats * 4;
        parts = dots + (int64_t)groups * 2 * RING_DOT_FLOATS * 4;
        stages = (parts + (ks > 1 ? (int64_t)groups * 2 * ks * 2 * RING_MAX_M * BV * 4 : 0) + 127) / 128 * 128;
        state_bytes = (int64_t)K * BV * state_es;
        stage_bytes = (state_bytes + (int64_t)S * M * (2 * K + BV) * 2 + 127) / 128 * 128;
        fixed = stages;
    }
};

/* One warp issues block item i's copies into stage st, the stage's use-th use (item: its index in
 * the grid, row: its state row): the metadata and the stage's issue count, then the FULL arrival
 * announcing the bytes (a plain arrival for a padding row, which copies nothing), then the copies.
 * Every lane calls it. */
template <int SDT, int KP, int BV>
__device__ __forceinline__ void ring_issue(const RecurrentParams &p, unsigned char *smem, const RingLayout &L,
                                           int64_t item, int64_t row, int st, uint32_t use) {
    using Bits = typename StateStorage<SDT>::Bits;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem);
    RingMeta *meta = reinterpret_cast<RingMeta *>(smem + L.meta);
    const int lane = threadIdx.x & 31, n = p.S * p.steps_per_token;
    int64_t b;
    int h, vb;
    item_coords(p, item, b, h, vb);
    unsigned char *stage = smem + L.stages + st * L.stage_bytes;
    const bool padding = row_is_padding(p, row);
    const bool has_state = !padding && p.state_in != nullptr;
    if (lane == 0) {
        meta[st] = RingMeta{b, row, h, vb};
        uint32_t *issued = reinterpret_cast<uint32_t *>(smem + L.issued) + st;
        uint32_t was; /* an atomic, as the consumer's read: a release and an acquire on one word (racecheck) */
        asm volatile("atom.release.cta.shared.exch.b32 %0, [%1], %2;\n"
                     : "=r"(was)
                     : "r"(smem_u32(issued)), "r"(use + 1)
                     : "memory");
        if (padding)
            mbar_arrive(&full[st]); /* nothing to copy: the group writes zero outputs */
        else
            mbar_arrive_expect_tx(&full[st], (uint32_t)n * (2 * KP + BV) * 2 + (has_state ? (uint32_t)L.state_bytes : 0u));
    }
    if (padding)
        return;
    __syncwarp();
    if (has_state) {
        const Bits *src = static_cast<const Bits *>(p.state_in) + row * p.in_stride_row + h * p.in_stride_head;
        if (BV == p.V) { /* the item's rows are one contiguous block */
            if (lane == 0)
                bulk_copy_g2s(stage, src, (uint32_t)L.state_bytes, &full[st]);
        } else {
            for (int r = lane; r < KP; r += 32)
                bulk_copy_g2s(stage + (int64_t)r * BV * sizeof(Bits), src + (int64_t)r * p.V + vb * BV,
                              BV * sizeof(Bits), &full[st]);
        }
    }
    unsigned char *raw = stage + L.state_bytes;
    const int64_t bth0 = b * p.T * p.H + h; /* position t at bth0 + t H */
    for (int x = lane; x < 3 * n; x += 32) {
        const int which = x / n, t = x - which * n;
        const int64_t bth = bth0 + (int64_t)t * p.H;
        if (which < 2)
            bulk_copy_g2s(raw + ((int64_t)which * n + t) * KP * 2,
                          static_cast<const uint16_t *>(which == 0 ? p.q : p.k) + bth * KP, KP * 2, &full[st]);
        else
            bulk_copy_g2s(raw + (2 * (int64_t)n * KP + (int64_t)t * BV) * 2,
                          static_cast<const uint16_t *>(p.v) + bth * p.V + vb * BV, BV * 2, &full[st]);
    }
}

/* Waits until block item i's copies into stage st = i % nst have landed (its use u = i / nst of the
 * stage). An mbarrier's parity wait is exact only for a waiter at most one phase ahead, and a group
 * may reach item i before another group has consumed item i - nst (nst need not be a multiple of
 * the groups): then the stage's barrier is still in phase u - 1, whose parity differs, and the wait
 * would return at once. So the wait first sees the stage issued for the (u + 1)-th time (its issue
 * count, stored by the issuing lane before the FULL arrival): that issue followed item i - nst's
 * consumption, so phase u - 1 is complete and phase u the one in progress. */
__device__ __forceinline__ void ring_wait(unsigned char *smem, const RingLayout &L, int64_t i, int nst) {
    const int st = (int)(i % nst);
    const uint32_t use = (uint32_t)(i / nst);
    const uint32_t *issued = reinterpret_cast<const uint32_t *>(smem + L.issued) + st;
    if ((threadIdx.x & 31) == 0) { /* one lane a warp polls (an atomic read: 32 on one word would queue) */
        uint32_t seen;
        for (;;) {
            asm volatile("atom.acquire.cta.shared.or.b32 %0, [%1], 0;\n" : "=r"(seen) : "r"(smem_u32(issued)) : "memory");
            if (seen > use)
                break;
            __nanosleep(64);
        }
    }
    __syncwarp(); /* the warp's lanes after lane 0's acquire: each then waits on the phase itself */
    mbar_wait(reinterpret_cast<uint64_t *>(smem) + st, (int)(use & 1));
}

/* exp's argument g and beta of the M steps of request b's token tok at head h (0 and 1 without them). */
template <int M>
__device__ __forceinline__ void ring_gates(const RecurrentParams &p, int64_t b, int h, int tok, float (&decay)[RING_MAX_M],
                                           float (&betas)[RING_MAX_M]) {
#pragma unroll
    for (int t = 0; t < M; t++) {
        const int64_t bth = (b * p.T + tok * M + t) * p.H + h;
        decay[t] = p.g != nullptr ? p.g[bth] : 0.0f;
        betas[t] = p.beta != nullptr ? load_as_float(p.beta, p.beta_dtype, bth) : 1.0f;
    }
}

/* The state row of the block's item i (its grid index blockIdx.x + i gridDim.x), -1 past the end. */
__device__ __forceinline__ int64_t ring_row(const RecurrentParams &p, int64_t i, int64_t items) {
    const int64_t item = blockIdx.x + i * gridDim.x;
    if (item >= items)
        return -1;
    int64_t b;
    int h, vb;
    item_coords(p, item, b, h, vb);
    return state_row(p, b);
}

/* Sums over the thread's KH rows of the state column st against NV staged vectors, two chains a
 * vector (even and odd rows of each group of 4), added at the end. */
template <int KH, int NV>
__device__ __forceinline__ void ring_sums(const float (&st)[KH], const float *const (&vec)[2 * RING_MAX_M], float *out) {
    float a[NV][2];
#pragma unroll
    for (int v = 0; v < NV; v++)
        a[v][0] = a[v][1] = 0.0f;
#pragma unroll
    for (int r = 0; r < KH; r += 4) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const float4 x = *reinterpret_cast<const float4 *>(vec[v] + r);
            a[v][0] = fmaf(st[r], x.x, a[v][0]);
            a[v][1] = fmaf(st[r + 1], x.y, a[v][1]);
            a[v][0] = fmaf(st[r + 2], x.z, a[v][0]);
            a[v][1] = fmaf(st[r + 3], x.w, a[v][1]);
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++)
        out[v] = a[v][0] + a[v][1];
}

/* One consumer group of NGW warps: its items, KS threads a column (thread gt of the group: column
 * gt % BV of the slice, rows KH (gt / BV) .. + KH of the K = KP rows). */
template <int SDT, int KP, int MT, int NGW, int KS>
__device__ __forceinline__ void ring_consume(const RecurrentParams &p, unsigned char *smem, const RingLayout &L,
                                             int group) {
    using Store = StateStorage<SDT>;
    using Bits = typename Store::Bits;
    constexpr int GT = 32 * NGW, BV = GT / KS, KH = KP / KS, NG = RING_CONSUMER_WARPS / NGW, M = MT;
    static_assert(BV % 32 == 0 && KP % (4 * KS) == 0, "a warp's lanes are 32 columns of one row split");
    const RingMeta *meta = reinterpret_cast<const RingMeta *>(smem + L.meta);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp % NGW, gt = wg * 32 + lane;
    const int c = gt % BV, r0 = KH * (gt / BV); /* the thread's column in the slice and first row */
    const int nst = p.ring_stages, S = p.S, n = S * M;
    const int64_t items = p.B * p.H * p.n_vblocks, step = gridDim.x;
    const int64_t KV = (int64_t)KP * p.V;
    float *const bufs = reinterpret_cast<float *>(smem + L.buffers) + (int64_t)group * 2 * L.buffer_floats;
    float *const dotss = reinterpret_cast<float *>(smem + L.dots) + group * 2 * RING_DOT_FLOATS;
    float *const partss = reinterpret_cast<float *>(smem + L.parts) + group * 2 * KS * 2 * RING_MAX_M * BV;
    int parity = 0;   /* the input buffer: by item */
    int tok_count = 0; /* the dot area: by token (a fast warp writes the next token's while a slow one reads) */
    for (int64_t i = group, item = blockIdx.x + group * step; item < items; i += NG, item += NG * step, parity ^= 1) {
        const int st = (int)(i % nst);
        /* the slot of the item this group refills the stage with (the block's item i + nst) */
        const int64_t later_row = wg == 0 ? ring_row(p, i + nst, items) : -1;
        /* token 0's g and beta before the wait: their latency hides behind it */
        int64_t bi;
        int hi, vbi;
        item_coords(p, item, bi, hi, vbi);
        float decay[RING_MAX_M], betas[RING_MAX_M];
        ring_gates<M>(p, bi, hi, 0, decay, betas);
        ring_wait(smem, L, i, nst);
        const RingMeta m = meta[st];
        const int64_t b = m.b, row = m.row;
        const int h = m.h, col = m.vb * BV + c;
        const unsigned char *stage = smem + L.stages + st * L.stage_bytes;
        if (row_is_padding(p, row)) { /* -1: zero outputs of the column, no slot read or written */
            for (int t = 0; t < p.T && r0 == 0; t++)
                store_from_float(p.o, p.o_dtype, ((b * p.T + t) * p.H + h) * p.V + col, 0.0f);
            bar_sync(1 + group, GT); /* every warp of the group past the stage's metadata */
            if (wg == 0 && blockIdx.x + (i + nst) * step < items) /* the stage's next item */
                ring_issue<SDT, KP, BV>(p, smem, L, blockIdx.x + (i + nst) * step, later_row, st,
                                        (uint32_t)((i + nst) / nst));
            continue;
        }
        /* q, k and v of every token as fp32 into this item's buffer (read last two items ago) */
        float *const buf = bufs + parity * L.buffer_floats;
        const uint32_t *raw = reinterpret_cast<const uint32_t *>(stage + L.state_bytes);
        for (int x = gt; x < n * (2 * KP + BV) / 2; x += GT) {
            const float2 v = StateStorage<GDP_DTYPE_BF16>::unpack2(raw[x]);
            buf[2 * x] = v.x, buf[2 * x + 1] = v.y;
        }
        /* the thread's part of the state column */
        float s[KH];
        if (p.state_in != nullptr) {
            const Bits *cells = reinterpret_cast<const Bits *>(stage) + r0 * BV + c;
#pragma unroll
            for (int r = 0; r < KH; r++) {
                if constexpr (sizeof(Bits) == 4)
                    s[r] = __uint_as_float(cells[r * BV]);
                else
                    s[r] = Store::to_float(cells[r * BV]);
            }
        } else {
#pragma unroll
            for (int r = 0; r < KH; r++)
                s[r] = 0.0f;
        }
        bar_sync(1 + group, GT); /* B1: the buffer complete; every thread of the group past the stage */
        if (wg == 0 && blockIdx.x + (i + nst) * step < items) { /* the stage's next item, in flight while we compute */
            fence_proxy_async_smem(); /* the group's reads of the stage before the copy engine's writes */
            ring_issue<SDT, KP, BV>(p, smem, L, blockIdx.x + (i + nst) * step, later_row, st,
                                        (uint32_t)((i + nst) / nst));
        }

        const float *const qs0 = buf, *const ks0 = buf + n * KP, *const vs0 = buf + 2 * n * KP;
        for (int tok = 0; tok < S; tok++, tok_count++) {
            float *const dots = dotss + (tok_count & 1) * RING_DOT_FLOATS;
            const float *qs = qs0 + tok * M * KP, *ks = ks0 + tok * M * KP, *vs = vs0 + tok * M * BV;
            if (tok > 0)
                ring_gates<M>(p, b, h, tok, decay, betas);
            /* which queries are nonzero (the same answer in every warp) */
            const unsigned qmask = token_query_mask<KP>(qs, M, lane);
            /* the raw dot products, a warp each: kk [j][t], kq [j][t] (j <= t), qq [t] */
            for (int f = wg; f < 2 * M * M + M; f += NGW) {
                float acc;
                if (token_dot<KP>(qs, ks, M, qmask, f, lane, acc) && lane == 0)
                    dots[f] = acc;
            }
            /* S^T k_t for every step and S^T q_t for the nonzero queries, in-thread over the K rows */
            const int nvec = M + __popc(qmask);
            const float *vec[2 * RING_MAX_M]; /* k_0 .. k_{M-1}, the nonzero queries, the last repeated */
#pragma unroll
            for (int v = 0; v < 2 * RING_MAX_M; v++) {
                const int idx = min(v, nvec - 1);
                vec[v] = (idx < M ? ks + idx * KP : qs + rows_nth_bit(qmask, idx - M) * KP) + r0;
            }
            float sums[2 * RING_MAX_M];
            switch (nvec) {
            case 1: ring_sums<KH, 1>(s, vec, sums); break;
            case 2: ring_sums<KH, 2>(s, vec, sums); break;
            case 3: ring_sums<KH, 3>(s, vec, sums); break;
            case 4: ring_sums<KH, 4>(s, vec, sums); break;
            case 5: ring_sums<KH, 5>(s, vec, sums); break;
            default: ring_sums<KH, 6>(s, vec, sums); break;
            }
            float *const parts = partss + (tok_count & 1) * KS * 2 * RING_MAX_M * BV; /* [KS][2M][BV] */
            if constexpr (KS > 1) {
#pragma unroll
                for (int v = 0; v < 2 * RING_MAX_M; v++)
                    if (v < nvec)
                        parts[((gt / BV) * 2 * RING_MAX_M + v) * BV + c] = sums[v];
            }
            bar_sync(1 + group, GT); /* B2: the dots (and the partial sums) complete */
            if constexpr (KS > 1) { /* the column's sums over all K rows, the splits in order */
#pragma unroll
                for (int v = 0; v < 2 * RING_MAX_M; v++) {
                    if (v >= nvec)
                        break;
                    float total = parts[v * BV + c];
#pragma unroll
                    for (int k = 1; k < KS; k++)
                        total += parts[(k * 2 * RING_MAX_M + v) * BV + c];
                    sums[v] = total;
                }
            }

            /* Per column: deltas and outputs in closed form (token_closed_form, one column). */
            float a[RING_MAX_M];
#pragma unroll
            for (int t = 0; t < M; t++)
                a[t] = p.g != nullptr ? expf(decay[t]) : 1.0f;
            float d[RING_MAX_M][1];
            const float p0 = token_closed_form<1, RING_MAX_M>(
                M, qmask, a, betas, dots, p.l2norm != 0, p.scale, [&](int v, float(&u)[1]) { u[0] = sums[v]; },
                [&](int t, int) { return vs[t * BV + c]; },
                [&](int t, const float(&o)[1]) {
                    if (r0 == 0) /* the column's first split writes its outputs */
                        store_from_float(p.o, p.o_dtype, ((b * p.T + tok * M + t) * p.H + h) * p.V + col, o[0]);
                },
                d);
            /* The rank-M update: S <- P(-1, M-1) S + sum_j k_j e_j (d holds e_j). */
            const bool decayed = p0 != 1.0f;
#pragma unroll
            for (int r = 0; r < KH; r += 4) {
                float4 kv[RING_MAX_M];
#pragma unroll
                for (int j = 0; j < M; j++)
                    kv[j] = *reinterpret_cast<const float4 *>(ks + j * KP + r0 + r);
                if (decayed)
#pragma unroll
                    for (int x = 0; x < 4; x++)
                        s[r + x] *= p0;
#pragma unroll
                for (int j = 0; j < M; j++) {
                    s[r] = fmaf(kv[j].x, d[j][0], s[r]);
                    s[r + 1] = fmaf(kv[j].y, d[j][0], s[r + 1]);
                    s[r + 2] = fmaf(kv[j].z, d[j][0], s[r + 2]);
                    s[r + 3] = fmaf(kv[j].w, d[j][0], s[r + 3]);
                }
            }
            if (p.inter != nullptr) { /* the snapshot after this token, in the state's dtype */
                Bits *snap = static_cast<Bits *>(p.inter) + ((row * S + tok) * p.H + h) * KV + (int64_t)r0 * p.V + col;
#pragma unroll
                for (int r = 0; r < KH; r++)
                    snap[(int64_t)r * p.V] = Store::from_float(s[r]);
            }
        }
        /* The final state: back into the slot (its dtype), or dense fp32. */
        if (p.state_out != nullptr) {
            const int64_t base = row * p.out_stride_row + h * p.out_stride_head + (int64_t)r0 * p.V + col;
            if (SDT == GDP_DTYPE_FP32 || p.out_fp32) {
                float *out = static_cast<float *>(p.state_out) + base;
#pragma unroll
                for (int r = 0; r < KH; r++)
                    out[(int64_t)r * p.V] = s[r];
            } else {
                Bits *out = static_cast<Bits *>(p.state_out) + base;
#pragma unroll
                for (int r = 0; r < KH; r++)
                    out[(int64_t)r * p.V] = Store::from_float(s[r]);
            }
        }
    }
}

template <int SDT, int KP, int MT, int NGW, int KS>
__global__ void __launch_bounds__(RING_THREADS, 1) recurrent_ring_kernel(const RecurrentParams p) {
    pdl_trigger();
    constexpr int BV = 32 * NGW / KS, NG = RING_CONSUMER_WARPS / NGW;
    extern __shared__ __align__(128) unsigned char ring_smem[];
    const RingLayout L(p.S, MT, KP, BV, (int)sizeof(typename StateStorage<SDT>::Bits), NG, KS);
    uint64_t *full = reinterpret_cast<uint64_t *>(ring_smem);
    const int64_t items = p.B * p.H * p.n_vblocks;
    const int nst = p.ring_stages;
    if (threadIdx.x == 0) {
        for (int st = 0; st < nst; st++) {
            mbar_init(&full[st], 1);
            reinterpret_cast<uint32_t *>(ring_smem + L.issued)[st] = 0;
        }
        fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0 fills the ring: the block's first nst items, their slots read at once */
        const int64_t row = ring_row(p, threadIdx.x, items);
        for (int st = 0; st < nst && blockIdx.x + (int64_t)st * gridDim.x < items; st++)
            ring_issue<SDT, KP, BV>(p, ring_smem, L, blockIdx.x + (int64_t)st * gridDim.x,
                                    __shfl_sync(0xffffffffu, row, st), st, 0u);
    }
    ring_consume<SDT, KP, MT, NGW, KS>(p, ring_smem, L, (threadIdx.x >> 5) / NGW);
}
