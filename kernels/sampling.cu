/*
 * sampling.cu: the CUDA kernels of gdp_sample_candidates (stage 1: one vocabulary slice of
 * each row reduced to a candidate record) and gdp_sample_merge (stage 2: the records of all
 * slices merged into a token), as src/sampling.c states them for the CPU reference; the record
 * layout, the row modes, the (logit, id) key and the hash are src/sampling_internal.h.
 *
 * Stage 1, one CTA of 512 threads per row:
 *   pass 1 over the row: max / second / argmax / max|l| / non-finite (a fixed reduction
 *     tree), plus by mode the best Gumbel key l / T + G over the row (temperature sampling,
 *     float), or a 14-bit histogram of the keys' top bits in shared memory (candidates);
 *   candidates: a radix select on the unique 64-bit keys (ord(logit) << 32 | ~id) finds the
 *     C-th largest: each further pass over the row (rare: only while more than GATHER_CAP
 *     keys share the threshold bin) histograms the next 14 bits among keys of the prefix;
 *     then one pass gathers every key at or above the threshold prefix into shared memory
 *     (and sums Z = sum exp((l - max) / T) for top-p without top-k), the select continues on
 *     the gathered keys (11-bit digits) until at most SORT_CAP remain, and a bitonic sort in
 *     shared memory orders them; the first C are written. The keys are unique, so the
 *     candidates do not depend on the order the atomics land in.
 * Stage 2, one CTA of 512 threads per row: the slices' headers (thread 0, in slice order),
 *   then for top-k / top-p the global top K of the union of candidates by each candidate's
 *   rank (its index plus a binary search in every other slice's sorted list), an inclusive
 *   scan of w = exp((l - max) / T) in double over the K, the nucleus by a min-reduction, and
 *   the Gumbel-max draw in double over the kept prefix.
 * No allocation, no host synchronization: graph-capturable on ctx->stream. Every reduction
 * has a fixed shape, so the same inputs give the same bits.
 */
#include <math.h>
#include <stdint.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "gdp_kernels.h"
#include "src/cuda_check.h"
#include "src/internal.h"
#include "src/sampling_internal.h"

// CUDA kernels

namespace {

constexpr int CAND_THREADS = 512;
constexpr int HIST_BITS = 14; /* digits of the passes over the row               */
constexpr int HIST_BINS = 1 << HIST_BITS;
constexpr int GATHER_CAP = HIST_BINS * 4 / 8; /* keys the histogram's shared memory holds  */
constexpr int SORT_CAP = 2048;                /* keys the bitonic sort takes               */
constexpr int SHIST_BITS = 11;                /* digits of the select on gathered keys     */
constexpr int SHIST_BINS = 1 << SHIST_BITS;
constexpr size_t CAND_SMEM = HIST_BINS * 4 + SORT_CAP * 8 + SHIST_BINS * 4; /* 88 KiB */

constexpr int MERGE_THREADS = 512;
constexpr int MERGE_ITEMS = GDP_SAMPLING_MAX_CANDIDATES / MERGE_THREADS; /* 2 per thread */

/* A slice's running top-2 and checks (idx local; ties keep the smaller idx). */
struct RowStats {
    float max;
    int idx;
    float second;
    float absmax;
    int nonfinite;
};

__device__ __forceinline__ RowStats stats_init() { return RowStats{-INFINITY, INT32_MAX, -INFINITY, 0.0f, 0}; }

/* Elements reach a thread in increasing idx order, so a strict > keeps the first of equals. */
__device__ __forceinline__ void stats_add(RowStats &s, float x, int i) {
    if (!isfinite(x)) {
        s.nonfinite = 1;
        return;
    }
    if (x > s.max) {
        s.second = s.max;
        s.max = x;
        s.idx = i;
    } else if (x > s.second) {
        s.second = x;
    }
    s.absmax = fmaxf(s.absmax, fabsf(x));
}

struct StatsMerge {
    __device__ __forceinline__ RowStats operator()(const RowStats &a, const RowStats &b) const {
        const bool a_first = a.max > b.max || (a.max == b.max && a.idx < b.idx);
        RowStats w = a_first ? a : b;
        w.second = fmaxf(w.second, a_first ? b.max : a.max);
        w.absmax = fmaxf(a.absmax, b.absmax);
        w.nonfinite = a.nonfinite | b.nonfinite;
        return w;
    }
};

/* The best (key, id): the larger key, then the smaller id. */
template <typename K> struct KeyArg {
    K key;
    uint32_t id;
};
template <typename K> struct KeyArgBest {
    __device__ __forceinline__ KeyArg<K> operator()(const KeyArg<K> &a, const KeyArg<K> &b) const {
        return (b.key > a.key || (b.key == a.key && b.id < a.id)) ? b : a;
    }
};

struct IntMin {
    __device__ __forceinline__ int operator()(int a, int b) const { return b < a ? b : a; }
};

using StatsReduce = cub::BlockReduce<RowStats, CAND_THREADS>;
using KeyReduceF = cub::BlockReduce<KeyArg<float>, CAND_THREADS>;
using CountScan = cub::BlockScan<uint32_t, CAND_THREADS>;
using SumReduce = cub::BlockReduce<double, CAND_THREADS>;

/* Calls f(x, i) for every logit of the row, each thread in increasing i (16-byte loads, two
 * in flight per thread, when the row is aligned). */
template <typename F> __device__ __forceinline__ void visit_row(const float *__restrict__ row, int V, F &&f) {
    const int t = threadIdx.x, nt = blockDim.x;
    int start = 0;
    if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
        const float4 *row4 = reinterpret_cast<const float4 *>(row);
        const int nvec = V >> 2;
        int i = t;
        for (; i + nt < nvec; i += 2 * nt) {
            const float4 a = __ldg(row4 + i), b = __ldg(row4 + i + nt);
            const int ia = 4 * i, ib = 4 * (i + nt);
            f(a.x, ia), f(a.y, ia + 1), f(a.z, ia + 2), f(a.w, ia + 3);
            f(b.x, ib), f(b.y, ib + 1), f(b.z, ib + 2), f(b.w, ib + 3);
        }
        if (i < nvec) {
            const float4 a = __ldg(row4 + i);
            const int ia = 4 * i;
            f(a.x, ia), f(a.y, ia + 1), f(a.z, ia + 2), f(a.w, ia + 3);
        }
        start = nvec << 2;
    }
    for (int i = start + t; i < V; i += nt)
        f(__ldg(row + i), i);
}

struct Threshold {
    uint32_t bin;   /* the bin holding the need-th largest key                       */
    uint32_t above; /* keys in the bins above it                                     */
    uint32_t tied;  /* keys in it                                                    */
};

/* The bin where the count from the top bin down reaches `need` (1 <= need <= sum of hist).
 * Thread t sums a fixed run of bins (the top ones to thread 0); an exclusive scan of those
 * sums tells the one thread whose run holds the bin. Ends with a barrier. */
__device__ void find_threshold(const uint32_t *hist, int nbins, uint32_t need, Threshold *out,
                               CountScan::TempStorage &scan) {
    const int per = nbins >= CAND_THREADS ? nbins / CAND_THREADS : 1;
    const int hi = nbins - 1 - (int)threadIdx.x * per; /* this thread's top bin; < 0: none */
    uint32_t part = 0;
    if (hi >= 0)
        for (int j = 0; j < per; j++)
            part += hist[hi - j];
    uint32_t before;
    CountScan(scan).ExclusiveSum(part, before);
    if (hi >= 0 && before < need && need <= before + part) {
        uint32_t cum = before;
        for (int j = 0; j < per; j++) {
            const uint32_t h = hist[hi - j];
            if (cum + h >= need) {
                *out = Threshold{(uint32_t)(hi - j), cum, h};
                break;
            }
            cum += h;
        }
    }
    __syncthreads();
}

/* Sorts s[0 .. n) (n a power of two) by key, descending. */
__device__ void bitonic_sort_desc(uint64_t *s, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const uint64_t a = s[i], b = s[ixj];
                    if (((i & k) == 0) ? (a < b) : (a > b)) {
                        s[i] = b;
                        s[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

struct CandParams {
    const float *logits;
    int64_t ld;
    int32_t vocab_local;
    uint32_t vocab_offset;
    const gdp_sample_row *rows;
    int32_t max_candidates;
    int32_t words;
    int32_t *records;
};

__global__ void __launch_bounds__(CAND_THREADS, 2) candidates_kernel(const CandParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    uint32_t *hist = reinterpret_cast<uint32_t *>(smem);                              /* [HIST_BINS]  */
    uint64_t *gathered = reinterpret_cast<uint64_t *>(smem);                          /* [GATHER_CAP],
                                                                                         after hist    */
    uint64_t *sorted = reinterpret_cast<uint64_t *>(smem + HIST_BINS * 4);            /* [SORT_CAP]   */
    uint32_t *shist = reinterpret_cast<uint32_t *>(smem + HIST_BINS * 4 + SORT_CAP * 8); /* [SHIST_BINS] */
    __shared__ union {
        StatsReduce::TempStorage stats;
        KeyReduceF::TempStorage key;
        CountScan::TempStorage scan;
        SumReduce::TempStorage sum;
    } tmp;
    __shared__ RowStats s_stats;
    __shared__ KeyArg<float> s_best;
    __shared__ Threshold s_thr;
    __shared__ uint32_t s_count, s_count2; /* the gather's and the sort's fill counters */

    const int64_t r = blockIdx.x;
    const float *row = p.logits + r * p.ld;
    const gdp_sample_row opt = p.rows[r];
    int32_t *rec = p.records + r * (int64_t)p.words;
    const int V = p.vocab_local;
    const int mode = gdp_sample_row_mode(&opt, p.max_candidates);
    const float T = opt.temperature;

    if (mode == GDP_SMODE_CANDIDATES) {
        for (int i = threadIdx.x; i < HIST_BINS; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
    }

    /* ---- pass 1 ---- */
    RowStats st = stats_init();
    KeyArg<float> best{-INFINITY, UINT32_MAX};
    if (mode == GDP_SMODE_TEMPERATURE) {
        const uint64_t stream = gdp_sample_stream(opt.seed, opt.position);
        visit_row(row, V, [&](float x, int i) {
            stats_add(st, x, i);
            const float key = __fdiv_rn(x, T) + gdp_sample_gumbel_f32(gdp_sample_bits(stream, p.vocab_offset + i));
            if (key > best.key)
                best = KeyArg<float>{key, (uint32_t)i};
        });
    } else if (mode == GDP_SMODE_CANDIDATES) {
        visit_row(row, V, [&](float x, int i) {
            stats_add(st, x, i);
            atomicAdd(&hist[gdp_sample_ord(x) >> (32 - HIST_BITS)], 1u);
        });
    } else {
        visit_row(row, V, [&](float x, int i) { stats_add(st, x, i); });
    }
    st = StatsReduce(tmp.stats).Reduce(st, StatsMerge());
    if (threadIdx.x == 0)
        s_stats = st;
    __syncthreads();
    if (mode == GDP_SMODE_TEMPERATURE) {
        best = KeyReduceF(tmp.key).Reduce(best, KeyArgBest<float>());
        if (threadIdx.x == 0)
            s_best = best;
        __syncthreads();
    }
    st = s_stats;
    const int32_t flags =
        (st.nonfinite ? GDP_SAMPLE_NONFINITE : 0) | (mode == GDP_SMODE_INVALID ? GDP_SAMPLE_INVALID_ROW : 0);

    int32_t n_cand = 0;
    double z = 0.0;
    if (flags == 0 && mode == GDP_SMODE_CANDIDATES) {
        const uint32_t C = (uint32_t)gdp_sample_row_candidates(&opt, p.max_candidates, V);
        const bool need_z = opt.top_k == 0;

        /* ---- the radix select over the row: the prefix of the C-th largest key ---- */
        find_threshold(hist, HIST_BINS, C, &s_thr, tmp.scan);
        Threshold th = s_thr;
        uint64_t prefix = th.bin;
        int pbits = HIST_BITS;
        uint32_t above = th.above, tied = th.tied;
        while (above + tied > (uint32_t)GATHER_CAP) {
            const int dbits = min(HIST_BITS, 64 - pbits), shift = 64 - pbits - dbits;
            const uint32_t mask = (1u << dbits) - 1;
            __syncthreads(); /* everyone has read s_thr */
            for (int i = threadIdx.x; i < (1 << dbits); i += blockDim.x)
                hist[i] = 0;
            __syncthreads();
            visit_row(row, V, [&](float x, int i) {
                const uint64_t k = gdp_sample_key(x, (uint32_t)i);
                if ((k >> (shift + dbits)) == prefix)
                    atomicAdd(&hist[(uint32_t)(k >> shift) & mask], 1u);
            });
            __syncthreads();
            find_threshold(hist, 1 << dbits, C - above, &s_thr, tmp.scan);
            th = s_thr;
            above += th.above;
            tied = th.tied;
            prefix = (prefix << dbits) | th.bin;
            pbits += dbits;
        }

        /* ---- gather every key at or above the prefix (and Z) ---- */
        const uint64_t thr = prefix << (64 - pbits);
        if (threadIdx.x == 0)
            s_count = 0;
        __syncthreads(); /* hist and s_thr are read; the same memory now gathers */
        const float M = st.max;
        double zsum = 0.0;
        visit_row(row, V, [&](float x, int i) {
            const uint64_t k = gdp_sample_key(x, (uint32_t)i);
            if (k >= thr)
                gathered[atomicAdd(&s_count, 1u)] = k;
            if (need_z)
                zsum += (double)expf(__fdiv_rn(x - M, T));
        });
        if (need_z)
            z = SumReduce(tmp.sum).Sum(zsum); /* valid in thread 0, which writes it */
        __syncthreads();
        const uint32_t G = s_count; /* == above + tied */

        /* ---- the select continues on the gathered keys, down to SORT_CAP ---- */
        while (above + tied > (uint32_t)SORT_CAP) {
            const int dbits = min(SHIST_BITS, 64 - pbits), shift = 64 - pbits - dbits;
            const uint32_t mask = (1u << dbits) - 1;
            for (int i = threadIdx.x; i < (1 << dbits); i += blockDim.x)
                shist[i] = 0;
            __syncthreads();
            for (uint32_t j = threadIdx.x; j < G; j += blockDim.x) {
                const uint64_t k = gathered[j];
                if ((k >> (shift + dbits)) == prefix)
                    atomicAdd(&shist[(uint32_t)(k >> shift) & mask], 1u);
            }
            __syncthreads();
            find_threshold(shist, 1 << dbits, C - above, &s_thr, tmp.scan);
            th = s_thr;
            above += th.above;
            tied = th.tied;
            prefix = (prefix << dbits) | th.bin;
            pbits += dbits;
            __syncthreads(); /* everyone has read s_thr and shist */
        }
        const uint64_t thr2 = prefix << (64 - pbits);
        if (threadIdx.x == 0)
            s_count2 = 0;
        __syncthreads();
        for (uint32_t j = threadIdx.x; j < G; j += blockDim.x) {
            const uint64_t k = gathered[j];
            if (k >= thr2)
                sorted[atomicAdd(&s_count2, 1u)] = k;
        }
        __syncthreads();
        const int n = (int)s_count2; /* == above + tied, in [C, SORT_CAP] */
        int n2 = 1;
        while (n2 < n)
            n2 <<= 1;
        for (int j = n + threadIdx.x; j < n2; j += blockDim.x)
            sorted[j] = 0; /* below every real key */
        __syncthreads();
        bitonic_sort_desc(sorted, n2);
        for (uint32_t j = threadIdx.x; j < C; j += blockDim.x) {
            const uint64_t k = sorted[j];
            rec[GDP_SREC_HEADER + 2 * j] = (int32_t)gdp_sample_f32_bits(gdp_sample_key_value(k));
            rec[GDP_SREC_HEADER + 2 * j + 1] = (int32_t)(p.vocab_offset + gdp_sample_key_id(k));
        }
        n_cand = (int32_t)C;
    }

    if (threadIdx.x == 0) {
        const bool temp = flags == 0 && mode == GDP_SMODE_TEMPERATURE;
        const uint32_t argmax = st.idx == INT32_MAX ? 0u : (uint32_t)st.idx;
        rec[GDP_SREC_FLAGS] = flags;
        rec[GDP_SREC_ARGMAX] = (int32_t)(p.vocab_offset + argmax);
        rec[GDP_SREC_MAX] = (int32_t)gdp_sample_f32_bits(st.max);
        rec[GDP_SREC_SECOND] = (int32_t)gdp_sample_f32_bits(st.second);
        rec[GDP_SREC_ABSMAX] = (int32_t)gdp_sample_f32_bits(st.absmax);
        rec[GDP_SREC_N_CAND] = n_cand;
        gdp_sample_put_f64(rec + GDP_SREC_Z, z);
        gdp_sample_put_f64(rec + GDP_SREC_GUMBEL_KEY, temp ? (double)s_best.key : 0.0);
        rec[GDP_SREC_GUMBEL_ID] = temp ? (int32_t)(p.vocab_offset + s_best.id) : 0;
        rec[GDP_SREC_RESERVED] = 0;
    }
}

struct MergeParams {
    const int32_t *records;
    int32_t n_parts;
    int64_t n_rows;
    int32_t max_candidates;
    int32_t words;
    const gdp_sample_row *rows;
    gdp_sample_out *out;
};

using WeightScan = cub::BlockScan<double, MERGE_THREADS>;
using FirstReduce = cub::BlockReduce<int, MERGE_THREADS>;
using KeyReduceD = cub::BlockReduce<KeyArg<double>, MERGE_THREADS>;

__device__ __forceinline__ uint64_t cand_key(const int32_t *rec, int j) {
    return gdp_sample_key(gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_HEADER + 2 * j]),
                          (uint32_t)rec[GDP_SREC_HEADER + 2 * j + 1]);
}

__device__ __forceinline__ int cand_count(const int32_t *rec, int max_candidates) {
    const int n = rec[GDP_SREC_N_CAND];
    return n < 0 ? 0 : (n > max_candidates ? max_candidates : n);
}

/* Keys of a slice's list (descending) that come before e. */
__device__ __forceinline__ int count_before(const int32_t *rec, int n, uint64_t e) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (cand_key(rec, mid) > e)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__global__ void __launch_bounds__(MERGE_THREADS) merge_kernel(const MergeParams p) {
    __shared__ uint64_t merged[GDP_SAMPLING_MAX_CANDIDATES];
    __shared__ union {
        WeightScan::TempStorage scan;
        FirstReduce::TempStorage first;
        KeyReduceD::TempStorage key;
    } tmp;
    __shared__ struct {
        float max, second, absmax;
        uint32_t argmax, best_id;
        double best_key, z;
        int32_t flags, total;
        int first;
    } h;

    const int64_t r = blockIdx.x;
    const gdp_sample_row opt = p.rows[r];
    const int mode = gdp_sample_row_mode(&opt, p.max_candidates);
    const int64_t part_stride = p.n_rows * p.words;
    const int32_t *rec0 = p.records + r * p.words;
    const double T = opt.temperature;

    if (threadIdx.x == 0) {
        gdp_sample_fold f = gdp_sample_fold_init(mode == GDP_SMODE_INVALID ? GDP_SAMPLE_INVALID_ROW : 0);
        int32_t total = 0;
        for (int q = 0; q < p.n_parts; q++) {
            const int32_t *rec = rec0 + q * part_stride;
            gdp_sample_fold_part(&f, rec);
            total += cand_count(rec, p.max_candidates);
        }
        double z = 0.0;
        if (f.flags == 0 && mode == GDP_SMODE_CANDIDATES && opt.top_k == 0)
            for (int q = 0; q < p.n_parts; q++) {
                const int32_t *rec = rec0 + q * part_stride;
                const double m = gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_MAX]);
                z += gdp_sample_get_f64(rec + GDP_SREC_Z) * exp((m - (double)f.max) / T);
            }
        h.max = f.max, h.second = f.second, h.absmax = f.absmax, h.argmax = f.argmax, h.best_id = f.best_id;
        h.best_key = f.best_key, h.z = z, h.flags = f.flags, h.total = total;
    }
    __syncthreads();

    gdp_sample_out *out = p.out + r;
    if (h.flags != 0 || mode != GDP_SMODE_CANDIDATES || h.total == 0) {
        if (threadIdx.x == 0) {
            gdp_sample_out o;
            if (h.flags & GDP_SAMPLE_INVALID_ROW)
                o = gdp_sample_out{0, 0.0f, 0.0f, h.flags};
            else if (h.flags & GDP_SAMPLE_NONFINITE)
                o = gdp_sample_out{0, 0.0f, INFINITY, h.flags};
            else
                o = gdp_sample_out{(int32_t)(mode == GDP_SMODE_TEMPERATURE ? h.best_id : h.argmax),
                                   h.max - h.second, h.absmax, 0};
            *out = o;
        }
        return;
    }

    /* ---- the global top K of the union, each candidate placed at its rank ---- */
    const int K_cap = opt.top_k > 0 ? opt.top_k : p.max_candidates;
    const int K = min(K_cap, (int)h.total);
    if (p.n_parts == 1) {
        for (int j = threadIdx.x; j < K; j += blockDim.x)
            merged[j] = cand_key(rec0, j);
    } else {
        for (int q = 0; q < p.n_parts; q++) {
            const int32_t *rec = rec0 + q * part_stride;
            const int n = min(cand_count(rec, p.max_candidates), K);
            for (int j = threadIdx.x; j < n; j += blockDim.x) {
                const uint64_t e = cand_key(rec, j);
                int rank = j;
                for (int o = 0; o < p.n_parts && rank < K; o++)
                    if (o != q) {
                        const int32_t *other = rec0 + o * part_stride;
                        rank += count_before(other, cand_count(other, p.max_candidates), e);
                    }
                if (rank < K)
                    merged[rank] = e;
            }
        }
    }
    __syncthreads();

    /* ---- the nucleus: the shortest prefix whose w reaches top_p Z ---- */
    const double M = h.max;
    double w[MERGE_ITEMS], cum[MERGE_ITEMS], total;
    for (int it = 0; it < MERGE_ITEMS; it++) {
        const int i = threadIdx.x * MERGE_ITEMS + it;
        w[it] = i < K ? exp(((double)gdp_sample_key_value(merged[i]) - M) / T) : 0.0;
    }
    WeightScan(tmp.scan).InclusiveSum(w, cum, total);
    int keep = K;
    const float top_p = gdp_sample_row_top_p(&opt);
    if (top_p < 1.0f) {
        const double Z = opt.top_k > 0 ? total : h.z;
        const double target = (double)top_p * Z;
        int first = INT32_MAX;
        for (int it = 0; it < MERGE_ITEMS; it++) {
            const int i = threadIdx.x * MERGE_ITEMS + it;
            if (i < K && cum[it] >= target && i < first)
                first = i;
        }
        __syncthreads(); /* tmp.scan is done */
        first = FirstReduce(tmp.first).Reduce(first, IntMin());
        if (threadIdx.x == 0)
            h.first = first;
        __syncthreads();
        if (h.first != INT32_MAX)
            keep = h.first + 1;
    }

    /* ---- the draw: Gumbel-max over the kept prefix, in double ---- */
    const uint64_t stream = gdp_sample_stream(opt.seed, opt.position);
    KeyArg<double> best{-INFINITY, UINT32_MAX};
    for (int i = threadIdx.x; i < keep; i += blockDim.x) {
        const uint64_t k = merged[i];
        const uint32_t id = gdp_sample_key_id(k);
        const double key = (double)gdp_sample_key_value(k) / T + gdp_sample_gumbel(gdp_sample_bits(stream, id));
        if (key > best.key || (key == best.key && id < best.id))
            best = KeyArg<double>{key, id};
    }
    __syncthreads(); /* tmp is free */
    best = KeyReduceD(tmp.key).Reduce(best, KeyArgBest<double>());
    if (threadIdx.x == 0)
        *out = gdp_sample_out{(int32_t)best.id, h.max - h.second, h.absmax, 0};
}

} // namespace

// kernel launchers

extern "C" gdp_status_t gdp_cuda_sample_candidates(struct gdp_ctx *ctx, const gdp_sample_candidates_args *a) {
    static const char *op = "gdp_sample_candidates";
    CandParams p;
    p.logits = a->logits;
    p.ld = a->ld;
    p.vocab_local = (int32_t)a->vocab_local;
    p.vocab_offset = (uint32_t)a->vocab_offset;
    p.rows = a->rows;
    p.max_candidates = a->max_candidates;
    p.words = (int32_t)gdp_sample_record_words(a->max_candidates);
    p.records = a->records;
    /* Above the 48 KiB default: set on every launch (cheap, and allowed under stream capture). */
    cudaError_t err = cudaFuncSetAttribute(candidates_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)CAND_SMEM);
    if (err == cudaSuccess) {
        candidates_kernel<<<(unsigned)a->n_rows, CAND_THREADS, CAND_SMEM, static_cast<cudaStream_t>(ctx->stream)>>>(
            p);
        err = cudaGetLastError();
    }
    GDP_CUDA_LAUNCH_CHECK(op, err, "%lld rows", (long long)a->n_rows);
    return GDP_STATUS_SUCCESS;
}

extern "C" gdp_status_t gdp_cuda_sample_merge(struct gdp_ctx *ctx, const gdp_sample_merge_args *a) {
    static const char *op = "gdp_sample_merge";
    MergeParams p;
    p.records = a->records;
    p.n_parts = a->n_parts;
    p.n_rows = a->n_rows;
    p.max_candidates = a->max_candidates;
    p.words = (int32_t)gdp_sample_record_words(a->max_candidates);
    p.rows = a->rows;
    p.out = a->out;
    merge_kernel<<<(unsigned)a->n_rows, MERGE_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(p);
    GDP_CUDA_LAUNCH_CHECK(op, cudaGetLastError(), "%lld rows", (long long)a->n_rows);
    return GDP_STATUS_SUCCESS;
}
