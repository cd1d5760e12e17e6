// Device sampling and speculative acceptance, token-identical to tileinfer.sampling's host
// definition (see its docstring): the same counter-based hash (mix32 "lowbias32"), the same 23
// uniform bits, Gumbel-max over the filtered scores, top-k / top-p thresholds that are the
// largest float32 order keys t with enough mass in {key >= t}.
//
// One block of 1024 threads per logit row; the row (vocab float32) is read several times, from
// L2 after the first pass. Thresholds:
//   * top-k: the k-th largest order key, found exactly by a radix select (4 passes of 8-bit
//     digits, histograms in shared memory with warp-aggregated atomics), which equals what the
//     host's 32-step bisection over counts finds.
//   * top-p: the largest key t whose upper set {key >= t} of the kept tokens holds at least
//     top_p of the kept mass sum exp(s - max s). Masses are summed in 64-bit fixed point
//     (exp(s - max) * 2^40, truncated) so that every sum is exact and order-independent, hence
//     deterministic and exactly monotone in t. The bisection runs over the candidates with the
//     CAP largest keys, compacted into shared memory, when their mass reaches the target (the
//     usual case); otherwise over the whole row (32 passes).
// The host sums float32 in its own order, so host and device can disagree only when a
// threshold's mass lands within float32 rounding of top_p (about one row in a million).
// Compiled with -fmad=false: every float operation rounds as the host's does.
#include "common.cuh"

constexpr int THREADS = 1024;
constexpr int WARPS = THREADS / 32;
constexpr int CAP = 4096;                    // top-p candidates kept in shared memory
constexpr u32 ACCEPT_SALT = 0xFFFFFFFFu;
constexpr float FIXED_ONE = 1099511627776.0f;  // 2^40

#include "sampling_block.cuh"  // mix32, stream_key, uniform, gumbel, Shared, block_*

// The k-th largest order key of s = row * inv_t (1 <= k <= vocab): radix select from the most
// significant byte of the unsigned order (key ^ 0x80000000).
__device__ int kth_largest_key(const float* row, int vocab, float inv_t, int k, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31;
    u32 prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += THREADS) sh.hist[i] = 0;
        __syncthreads();
        for (int base = 0; base < vocab; base += THREADS) {  // block-uniform trip count
            const int i = base + tid;
            int bin = 256;
            if (i < vocab) {
                const u32 u = (u32)order_key(row[i] * inv_t) ^ 0x80000000u;
                if ((u & mask) == prefix) bin = (u >> shift) & 255;
            }
            const u32 peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], (u32)__popc(peers));
        }
        __syncthreads();
        if (tid < 32) {  // lane l scans bins 255 - 8l down to 248 - 8l
            u32 c[8], total = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) { c[j] = sh.hist[255 - 8 * lane - j]; total += c[j]; }
            u32 incl = total;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const u32 excl = incl - total;
            if (excl < (u32)remaining && incl >= (u32)remaining) {
                u32 acc = excl;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (acc + c[j] >= (u32)remaining) {
                        sh.digit = 255 - 8 * lane - j;
                        sh.remaining = remaining - (int)acc;
                        break;
                    }
                    acc += c[j];
                }
            }
        }
        __syncthreads();
        prefix |= (u32)sh.digit << shift;
        mask |= 255u << shift;
        remaining = sh.remaining;
        __syncthreads();
    }
    return (int)(prefix ^ 0x80000000u);
}

// The top-p threshold: the largest key t with S(t) >= need, S(t) = sum of fixed_mass over the
// tokens with key >= max(t, keep_from). `lo` must satisfy S(lo) >= need; S(2^31) = 0 < need.
__device__ int bisect_candidates(i64 lo, double need, int n, Shared& sh) {
    i64 hi = 1LL << 31;
    while (hi - lo > 1) {
        const i64 mid = lo + ((hi - lo) >> 1);
        u64 part = 0;
        for (int c = threadIdx.x; c < n; c += THREADS)
            if (sh.cand_key[c] >= mid) part += fixed_mass(sh.cand_e[c]);
        if ((double)block_sum_u64(part, sh) >= need) lo = mid; else hi = mid;
    }
    return (int)lo;
}
__device__ int bisect_row(const float* row, int vocab, float inv_t, float m, int keep_from,
                          double need, Shared& sh) {
    i64 lo = -(1LL << 31), hi = 1LL << 31;
    while (hi - lo > 1) {
        const i64 mid = lo + ((hi - lo) >> 1);
        u64 part = 0;
        for (int i = threadIdx.x; i < vocab; i += THREADS) {
            const float s = row[i] * inv_t;
            const int key = order_key(s);
            if (key >= keep_from && key >= mid) part += fixed_mass(expf(s - m));
        }
        if ((double)block_sum_u64(part, sh) >= need) lo = mid; else hi = mid;
    }
    return (int)lo;
}

// The filter of one row: tokens with order key >= keep_from are kept; m = max s, z = the kept
// float32 mass sum exp(s - m) (the softmax denominator).
struct Filter {
    int keep_from;
    float m, z;
};

__device__ Filter make_filter(const float* row, int vocab, float inv_t, int top_k, float top_p,
                              float m, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31;
    int keep_from = (int)0x80000000;  // everything
    if (top_k > 0 && top_k < vocab) keep_from = kth_largest_key(row, vocab, inv_t, top_k, sh);
    if (top_p < 1.0f) {
        // Candidates: the CAP largest keys (ties at the cut may overflow; then the slow path).
        int cut = keep_from;
        if (vocab > CAP) cut = max(cut, kth_largest_key(row, vocab, inv_t, CAP, sh));
        if (tid == 0) sh.n_cand = 0;
        __syncthreads();
        u64 total = 0, above_cut = 0;
        for (int base = 0; base < vocab; base += THREADS) {
            const int i = base + tid;
            bool take = false;
            int key = 0;
            float e = 0.0f;
            if (i < vocab) {
                const float s = row[i] * inv_t;
                key = order_key(s);
                if (key >= keep_from) {
                    e = expf(s - m);
                    total += fixed_mass(e);
                    take = key >= cut;
                    if (take) above_cut += fixed_mass(e);
                }
            }
            const u32 ballot = __ballot_sync(0xffffffffu, take);
            int pos = 0;
            if (lane == 0 && ballot) pos = atomicAdd(&sh.n_cand, __popc(ballot));
            pos = __shfl_sync(0xffffffffu, pos, 0) + __popc(ballot & ((1u << lane) - 1));
            if (take && pos < CAP) { sh.cand_key[pos] = key; sh.cand_e[pos] = e; }
        }
        total = block_sum_u64(total, sh);
        above_cut = block_sum_u64(above_cut, sh);
        const int n = sh.n_cand;
        const double need = (double)top_p * (double)total;
        const int top_p_key = (n <= CAP && (double)above_cut >= need)
                                  ? bisect_candidates(cut, need, n, sh)
                                  : bisect_row(row, vocab, inv_t, m, keep_from, need, sh);
        keep_from = max(keep_from, top_p_key);
    }
    float z = 0.0f;
    for (int i = tid; i < vocab; i += THREADS) {
        const float s = row[i] * inv_t;
        if (order_key(s) >= keep_from) z += expf(s - m);
    }
    return Filter{keep_from, m, block_sum_f(z, sh)};
}

__device__ __forceinline__ float kept_prob(const Filter& f, float s) {
    return order_key(s) >= f.keep_from ? expf(s - f.m) / f.z : 0.0f;
}

// The token of one row (this block's), written to *out: greedy, the argmax of the raw logits;
// else Gumbel-max with the stream key over the filtered scores. probs, if not null, receives the
// filtered distribution (one-hot when greedy). Every argument is the same for the whole block.
__device__ void sample_row(int* __restrict__ out, const float* __restrict__ row, int vocab,
                           bool greedy, float inv_t, int top_k, float top_p, u32 key,
                           float* __restrict__ probs, Shared& sh) {
    const int tid = threadIdx.x;
    const float scale = greedy ? 1.0f : inv_t;

    float best = neg_inf();
    int best_i = 0x7FFFFFFF;
    for (int i = tid; i < vocab; i += THREADS) better(best, best_i, row[i] * scale, i);
    if (greedy) {
        const int token = block_argmax(best, best_i, sh);
        if (tid == 0) *out = token;
        if (probs)
            for (int i = tid; i < vocab; i += THREADS) probs[i] = i == token ? 1.0f : 0.0f;
        return;
    }
    const float m = block_max(best, sh);
    const Filter f = make_filter(row, vocab, inv_t, top_k, top_p, m, sh);
    best = neg_inf();
    best_i = 0x7FFFFFFF;
    for (int i = tid; i < vocab; i += THREADS) {
        const float s = row[i] * inv_t;
        const bool kept = order_key(s) >= f.keep_from;
        if (kept) better(best, best_i, s + gumbel(key, (u32)i), i);
        if (probs) probs[i] = kept ? expf(s - f.m) / f.z : 0.0f;
    }
    const int token = block_argmax(best, best_i, sh);
    if (tid == 0) *out = token;
}

// sample: out[j] = the token of row j with one set of parameters and the stream (seed, counter
// + j) (see tileinfer.sampling.sample_rows); probs_out, if not null, receives the filtered
// distribution. greedy: argmax of the raw logits.
extern "C" __global__ void __launch_bounds__(THREADS)
sample(int* __restrict__ out, const float* __restrict__ logits, int vocab, int greedy,
       float inv_t, int top_k, float top_p, const i64* __restrict__ seed,
       const i64* __restrict__ counter, float* __restrict__ probs_out) {
    __shared__ Shared sh;
    const int j = blockIdx.x;
    sample_row(out + j, logits + (i64)j * vocab, vocab, greedy != 0, inv_t, top_k, top_p,
               stream_key(seed[0], counter[0] + j), probs_out ? probs_out + (i64)j * vocab : nullptr,
               sh);
}

// sample_per_row: out[j] = the token of row j with its own parameters and stream (seed[j],
// counter[j]) (tileinfer.sampling.sample_per_row): inv_temperature[j] 0 is greedy.
extern "C" __global__ void __launch_bounds__(THREADS)
sample_per_row(int* __restrict__ out, const float* __restrict__ logits, int vocab,
               const float* __restrict__ inv_temperature, const int* __restrict__ top_k,
               const float* __restrict__ top_p, const i64* __restrict__ seed,
               const i64* __restrict__ counter) {
    __shared__ Shared sh;
    const int j = blockIdx.x;
    const float inv_t = inv_temperature[j];
    sample_row(out + j, logits + (i64)j * vocab, vocab, inv_t == 0.0f, inv_t, top_k[j], top_p[j],
               stream_key(seed[j], counter[j]), nullptr, sh);
}

// argmax_split: greedy sampling of row j = blockIdx.y split over the vocabulary (one block of one
// row is latency-bound: benchmarks/RESULTS.md, 2026-11-30, "GEMV tables from the sweeps, the
// split greedy sampler"). Block c takes the CHUNK logits from
// c * CHUNK, writes its maximum and that maximum's first index to part_v / part_i[j][c], and the
// last block of the row to arrive (counter[j], zero between launches, re-armed by that block)
// picks among the chunks in chunk order: the same first index of the maximum as sample's greedy
// branch (NaNs never win; an all-NaN row gives 0x7FFFFFFF, as there). With sums (else null),
// each block also adds up its chunk into part_s[j][c] and the last block writes the row's sum
// (the engine's check for NaN or infinity, tileinfer/engine/runtime/finite.py). Launched with
// PDL: the logits are read after pdl_wait.
constexpr int SPLIT_THREADS = 256;

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
argmax_split(int* __restrict__ out, const float* __restrict__ logits, int vocab, int chunk,
             float* __restrict__ part_v, int* __restrict__ part_i, int* __restrict__ counter,
             float* __restrict__ sums, float* __restrict__ part_s) {
    __shared__ float red_v[SPLIT_THREADS / 32];
    __shared__ int red_i[SPLIT_THREADS / 32];
    __shared__ float red_s[SPLIT_THREADS / 32];
    __shared__ int is_last;
    const int j = blockIdx.y, c = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunks = gridDim.x;
    pdl_launch_dependents();
    pdl_wait();
    const float* row = logits + (i64)j * vocab;
    float best = neg_inf(), total = 0.0f;
    int best_i = 0x7FFFFFFF;
    const int end = min(vocab, (c + 1) * chunk);
    for (int i = c * chunk + tid; i < end; i += SPLIT_THREADS) {
        const float v = row[i];
        better(best, best_i, v, i);
        total += v;
    }
    warp_argmax(best, best_i);
    if (sums) total = warp_sum(total);
    if (lane == 0) { red_v[warp] = best; red_i[warp] = best_i; red_s[warp] = total; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < SPLIT_THREADS / 32; ++w) {
            better(best, best_i, red_v[w], red_i[w]);
            total += red_s[w];
        }
        part_v[(i64)j * chunks + c] = best;
        part_i[(i64)j * chunks + c] = best_i;
        if (sums) part_s[(i64)j * chunks + c] = total;
        __threadfence();  // the chunk's result is visible before it is counted
        is_last = atomicAdd(counter + j, 1) == chunks - 1;
    }
    __syncthreads();
    if (!is_last || warp != 0) return;
    __threadfence();
    // One warp: lane l takes chunks l, l + 32, ... in order, then the lanes' results merge
    // (better() keeps the lower index on ties, so the order of merging does not matter).
    best = neg_inf();
    best_i = 0x7FFFFFFF;
    total = 0.0f;
    for (int k = lane; k < chunks; k += 32) {
        better(best, best_i, __ldcg(part_v + (i64)j * chunks + k), __ldcg(part_i + (i64)j * chunks + k));
        if (sums) total += __ldcg(part_s + (i64)j * chunks + k);
    }
    warp_argmax(best, best_i);
    if (sums) total = warp_sum(total);
    if (lane == 0) {
        out[j] = best_i;
        if (sums) sums[j] = total;
        counter[j] = 0;  // ready for the next launch (and the next graph replay)
    }
}

// accept: the p/q rule for row j (tileinfer.sampling.accept_rows). draft_probs (n, vocab) or
// null (a one-hot q at the draft).
extern "C" __global__ void __launch_bounds__(THREADS)
accept(int* __restrict__ out, const float* __restrict__ logits, const int* __restrict__ draft_ids,
       const float* __restrict__ draft_probs, int vocab, int greedy, float inv_t, int top_k,
       float top_p, const i64* __restrict__ seed, const i64* __restrict__ counter) {
    __shared__ Shared sh;
    const int j = blockIdx.x, tid = threadIdx.x;
    const float* row = logits + (i64)j * vocab;
    const float* q = draft_probs ? draft_probs + (i64)j * vocab : nullptr;
    const int d = draft_ids[j];
    const u32 key = stream_key(seed[0], counter[0] + j);
    const float scale = greedy ? 1.0f : inv_t;

    float best = neg_inf();
    int best_i = 0x7FFFFFFF;
    for (int i = tid; i < vocab; i += THREADS) better(best, best_i, row[i] * scale, i);
    int argmax_token = 0;
    Filter f{0, 0.0f, 1.0f};
    if (greedy) {
        argmax_token = block_argmax(best, best_i, sh);
    } else {
        f = make_filter(row, vocab, inv_t, top_k, top_p, block_max(best, sh), sh);
    }
    // p[i]: the target's filtered distribution (one-hot at the argmax when greedy).
    auto p_of = [&](int i) -> float {
        return greedy ? (i == argmax_token ? 1.0f : 0.0f) : kept_prob(f, row[i] * inv_t);
    };
    auto q_of = [&](int i) -> float { return q ? q[i] : (i == d ? 1.0f : 0.0f); };
    if (tid == 0) {
        const bool in_range = d >= 0 && d < vocab;
        const float p_d = in_range ? p_of(d) : 0.0f, q_d = in_range ? q_of(d) : 0.0f;
        sh.accept = uniform(key, ACCEPT_SALT) * q_d < p_d;
    }
    __syncthreads();
    if (sh.accept) {
        if (tid == 0) out[j] = d;
        return;
    }
    // Rejected: a sample of max(p - q, 0) by Gumbel-max with the row's noise.
    best = neg_inf();
    best_i = 0x7FFFFFFF;
    for (int i = tid; i < vocab; i += THREADS) {
        const float r = fmaxf(p_of(i) - q_of(i), 0.0f);
        better(best, best_i, r > 0.0f ? logf(r) + gumbel(key, (u32)i) : neg_inf(), i);
    }
    const int token = block_argmax(best, best_i, sh);
    if (tid == 0) out[j] = token;
}
