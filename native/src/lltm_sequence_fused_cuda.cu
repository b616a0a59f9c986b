// lltm_sequence_fused_cuda.cu - a short LLTM sequence in one library call per direction, its
// products included: prl_lltm_sequence_fused_cuda_fits, prl_lltm_sequence_fused_forward_cuda
// and prl_lltm_sequence_fused_backward_cuda.
//
// For a short sequence with a small state the GPU work is a few microseconds a step, and
// what a call costs is host time: every GEMM launched from Python (the input half before
// the recurrence, the input, weight and bias gradients after it) costs tens of
// microseconds of dispatch.  Here the library does all of it:
//   - the recurrence: each block owns `rows` batch rows for the whole sequence.  A row's
//     recurrence reads only its own row of the step before, so blocks never wait for each
//     other (a plain launch, no grid-wide barrier).  The block stages the weights once, in
//     shared memory and transposed, with the bias as one more row: wt[k][j] = W[j][k] for
//     k < S+I and wt[S+I][j] = b[j], so gates[r][j] = sum_k wt[k][j] * xh[r][k] with
//     xh[r] = [h_{t-1}, x_t, 1].  KQ adjacent lanes (Layout::split: 4, 2 or 1) form the three
//     gates of (row r, state column s), lane q summing k = q, q + KQ, ... in order; the
//     lanes' sums meet by shuffles in a fixed order, and lane 0 applies the cell of lltm.h.
//     h_t goes to the other of two xh buffers, so one barrier a step separates the steps.
//     The split shortens each warp's chain of dependent reads and FMAs a step, which is what
//     bounds it (benchmarks/NOTES.md).
//   - the backward walks the steps in reverse the same way: d_h = grad_output[t] +
//     d_gates[t+1] W_h from the block's own rows of d_gates[t+1], kept in shared memory (its
//     sum split over KQ lanes as the forward's), then the cell's backward; a last product
//     gives d_h0 = d_gates[0] W_h.
//   - then the products over all steps, tiled, over d_gates, both in one launch: d_weights
//     with d_bias as one more column ([3S, T*B] x [T*B, S+I+1], the last column ones) and
//     d_input ([T*B, 3S] x [3S, I]), the first in 8 x 8 tiles with four threads per
//     output (its T*B rows outnumber its outputs), the second in 32 x 32 tiles.  Every sum
//     runs in a fixed order: the results do not depend on scheduling.
// The staged weights' row pitches put the KQ lanes of a warp's outputs in distinct banks
// (0.61-0.87x the kernel time of an odd pitch at S = 32-64, H100).  What fits is what the
// staged weights and rows need of the device's shared memory (prl_lltm_sequence_fused_cuda_fits);
// the work per step is serial in S + I, so the caller keeps this route to short
// sequences of small states (the persistent kernels of lltm_sequence_cuda.cu run longer ones).
#include <map>
#include <mutex>

#include "cuda_common.cuh"
#include "lltm.h"

namespace {

constexpr int kFusedThreads = 256;  // threads per recurrence block, at most

template <typename T> struct FusedArgs {
    const T *x;                        // [steps, batch, I]
    const T *w;                        // [3S, S+I], contiguous
    const T *bias;                     // [3S]
    const T *h0, *c0;                  // [batch, S]
    T *output, *cells;                 // [steps, batch, S]: forward out, backward in
    T *gates;                          // [steps, batch, 3S]: the pre-activations; forward out, backward in
    T *c_n, *h_n;                      // [batch, S] or NULL (forward out)
    const T *grad_output, *grad_c_n;   // [steps, batch, S], [batch, S] or NULL = zero (backward in)
    T *d_gates;                        // [steps, batch, 3S] (backward out: the products read it)
    T *d_h0, *d_c0;                    // [batch, S] (backward out)
    int steps, batch, features, state;
    int rows;   // batch rows per block
    int pitch;  // row pitch of the staged weights, in elements (the forward's or the backward's)
    // A layer's inference (the forward kernel's kLayer): step t reads x and writes output at
    // t' = reverse ? steps - 1 - t : t, output rows `output_pitch` elements apart (a layer's two
    // directions share one output [steps, batch, 2S], each at its own columns); cells and gates
    // are not written, h_n is.
    int reverse, output_pitch;
    // A pack (NULL: a padded batch): x and output hold its rows, step t's first sequence at row
    // first[t]; sequence b runs lengths[b] steps (non-increasing in b, as a PackedSequence sorts
    // them; the reverse direction from its own last step), and its h_n, c_n are its last step's.
    const int64_t *first, *lengths;
    // A layer's inference (NULL: the identity): the row of h0, c0, h_n and c_n of the batch's
    // row b is order[b] (a PackedSequence's sorted_indices: its state rows in the caller's order).
    const int64_t *order;
};

// A forward launch: blockIdx.y picks the direction (one, or a layer's two side by side).
template <typename T> struct FusedDirections {
    FusedArgs<T> d[2];
};

// The block's shape and shared memory for (batch, state): `rows` batch rows of S outputs, KQ
// lanes each (the most of 4, 2, 1 with S * KQ <= 256 threads).  The pitches (at least 3S) put
// the lanes of a warp in distinct banks: forward, lane (s, q) reads row k = q + KQ i at k * P +
// s, so P = 32 / KQ (mod 32); backward, row s at s * P + q + KQ i, so P = KQ (mod 32) (odd for
// KQ = 1: a warp's 32 columns s); where such a pitch would not fit in the device's shared memory
// the least odd one (as before the split) takes its place: at S = 128, 400 floats against 385.
struct Layout {
    int rows = 0, split = 1, threads = 0, forward_pitch = 0, backward_pitch = 0;
    int64_t forward_smem = 0, backward_smem = 0;
};

inline int pitch_at_least(int64_t n, int residue) {  // the least P >= n with P = residue (mod 32)
    return (int)((n - residue + 31) / 32 * 32 + residue);
}

template <typename A> Layout layout_of(int64_t batch, int64_t features, int64_t state, int64_t smem_max) {
    Layout l;
    if (batch <= 0 || state <= 0) return l;  // nothing to run
    l.split = state * 4 <= kFusedThreads ? 4 : state * 2 <= kFusedThreads ? 2 : 1;
    const int64_t lanes = state * l.split;
    l.rows = (int)(lanes >= kFusedThreads ? 1 : kFusedThreads / lanes);
    if (l.rows > batch) l.rows = (int)batch;
    const int64_t work = l.rows * lanes;
    l.threads = (int)(work >= kFusedThreads ? kFusedThreads : (work + 31) / 32 * 32);
    const int64_t k1 = state + features + 1, r = l.rows, odd = (3 * state) | 1;
    const auto forward_smem = [&](int64_t pitch) { return (k1 * pitch + 2 * r * k1 + r * state) * (int64_t)sizeof(A); };
    const auto backward_smem = [&](int64_t pitch) {
        return (state * pitch + 2 * r * 3 * state + r * state) * (int64_t)sizeof(A);
    };
    l.forward_pitch = l.split > 1 ? pitch_at_least(3 * state, 32 / l.split) : (int)odd;
    if (forward_smem(l.forward_pitch) > smem_max) l.forward_pitch = (int)odd;
    l.backward_pitch = l.split > 1 ? pitch_at_least(3 * state, l.split) : (int)odd;
    if (backward_smem(l.backward_pitch) > smem_max) l.backward_pitch = (int)odd;
    l.forward_smem = forward_smem(l.forward_pitch);
    l.backward_smem = backward_smem(l.backward_pitch);
    return l;
}

// The sum of v over the KQ adjacent lanes of an output, the same bits in each: lanes (0 + 1) +
// (2 + 3).  Every lane of the warp calls it.
template <int KQ, typename A> __device__ __forceinline__ A lanes_sum(A v) {
    if (KQ >= 2) v += __shfl_xor_sync(0xffffffffu, v, 1);
    if (KQ >= 4) v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// KQ: the lanes of an output (Layout::split).  A block's threads take the flat index e = (r * S +
// s) * KQ + q of (row, column, lane) up to whole warps (every lane of a warp takes part in the
// shuffles; those past the block's rows compute row rows - 1 and keep nothing).  kLayer: a
// layer's inference (FusedArgs), compiled apart from the training forward (its kernel below).
template <typename T, int KQ, bool kLayer> __device__ __forceinline__ void fused_forward(const FusedArgs<T> &p) {
    using A = prl::acc_t<T>;
    const int S = p.state, I = p.features, K1 = S + I + 1, G3 = 3 * S, P = p.pitch, B = p.batch;
    const int b0 = blockIdx.x * p.rows, rows = min(p.rows, B - b0), work = (rows * S * KQ + 31) / 32 * 32;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    A *wt = reinterpret_cast<A *>(shared_raw);  // [K1][P]: W^T with the bias as its last row
    A *xh = wt + (int64_t)K1 * P;               // [2][rows][K1]: [h_{t-1}, x_t, 1], by step parity
    A *cell = xh + 2 * p.rows * K1;             // [rows][S]: the cell as stored

    for (int e = threadIdx.x; e < G3 * (K1 - 1); e += blockDim.x) {  // coalesced along each row of W
        const int j = e / (K1 - 1), k = e - j * (K1 - 1);
        wt[k * P + j] = prl::load(p.w[e]);
    }
    for (int j = threadIdx.x; j < G3; j += blockDim.x) wt[(K1 - 1) * P + j] = prl::load(p.bias[j]);
    // the state row of batch row b (an order out of range: none, nothing read or written there)
    const auto state_row = [&](int b) -> int64_t { return kLayer && p.order ? p.order[b] : b; };
    for (int e = threadIdx.x; e < rows * S; e += blockDim.x) {
        const int r = e / S, s = e - r * S;
        const int64_t row = state_row(b0 + r), at = row * S + s;
        const bool given = row >= 0 && row < B;
        xh[r * K1 + s] = p.h0 && given ? prl::load(p.h0[at]) : A(0);  // NULL (a layer's state not given): zeros
        cell[r * S + s] = p.c0 && given ? prl::load(p.c0[at]) : A(0);
    }
    for (int e = threadIdx.x; e < 2 * rows; e += blockDim.x) xh[(e / rows) * p.rows * K1 + (e % rows) * K1 + K1 - 1] = A(1);

    // row r's steps, and the row of x and output of its t-th step (t below its steps)
    const bool packed = p.first != nullptr;
    const auto steps_of = [&](int r) { return packed ? (int)p.lengths[b0 + r] : p.steps; };
    const auto row_at = [&](int r, int t) {
        const int at = kLayer && p.reverse ? steps_of(r) - 1 - t : t;
        return packed ? p.first[at] + b0 + r : (int64_t)at * B + b0 + r;
    };
    const int steps = steps_of(0);  // the block's: its first row's, the longest
    for (int t = 0; t < steps; ++t) {
        A *cur = xh + (t & 1) * p.rows * K1, *next = xh + ((t + 1) & 1) * p.rows * K1;
        for (int e = threadIdx.x; e < rows * I; e += blockDim.x) {
            const int r = e / I, i = e - r * I;
            if (!packed || t < steps_of(r)) cur[r * K1 + S + i] = prl::load(p.x[row_at(r, t) * I + i]);
        }
        __syncthreads();  // x_t staged, and h_{t-1} written by every thread of step t - 1
        for (int e = threadIdx.x; e < work; e += blockDim.x) {
            const int q = e % KQ, rs = min(e / KQ, rows * S - 1), r = rs / S, s = rs - r * S;
            const bool keeps = q == 0 && e / KQ < rows * S && (!packed || t < steps_of(r));  // past its steps: no
            const A *a = cur + r * K1;
            A acc[3] = {A(0), A(0), A(0)};
            for (int k = q; k < K1; k += KQ) {
                const A v = a[k];
                const A *wk = wt + k * P + s;
#pragma unroll
                for (int g = 0; g < 3; ++g) acc[g] = fma(wk[g * S], v, acc[g]);
            }
#pragma unroll
            for (int g = 0; g < 3; ++g) acc[g] = lanes_sum<KQ>(acc[g]);
            if (!keeps) continue;
            const int64_t row = row_at(r, t);
            A g[3];
#pragma unroll
            for (int i = 0; i < 3; ++i) {  // the pre-activations as stored, as the backward reads them
                const T stored = prl::store<T>(acc[i]);
                if (!kLayer) p.gates[row * G3 + i * S + s] = stored;
                g[i] = prl::load(stored);
            }
            A h, c_new;
            prl::lltm_forward_math<T>(g[0], g[1], g[2], cell[r * S + s], h, c_new);
            const T h_stored = prl::store<T>(h), c_stored = prl::store<T>(c_new);
            p.output[row * (kLayer ? p.output_pitch : S) + s] = h_stored;
            if (!kLayer) p.cells[row * S + s] = c_stored;
            if (t == steps_of(r) - 1) {
                const int64_t at = state_row(b0 + r);
                if (at >= 0 && at < B) {
                    if (p.c_n) p.c_n[at * S + s] = c_stored;
                    if (kLayer) p.h_n[at * S + s] = h_stored;
                }
            }
            cell[r * S + s] = prl::load(c_stored);  // the next step reads both as stored
            next[r * K1 + s] = prl::load(h_stored);
        }
    }
}

// The training forward, and a layer's inference: blockIdx.y its direction.
template <typename T, int KQ>
__global__ void __launch_bounds__(kFusedThreads) fused_forward_kernel(FusedArgs<T> p) {
    fused_forward<T, KQ, false>(p);
}
template <typename T, int KQ>
__global__ void __launch_bounds__(kFusedThreads) fused_layer_forward_kernel(FusedDirections<T> directions) {
    fused_forward<T, KQ, true>(directions.d[blockIdx.y]);
}

template <typename T, int KQ>
__global__ void __launch_bounds__(kFusedThreads) fused_backward_kernel(FusedArgs<T> p) {
    using A = prl::acc_t<T>;
    const int S = p.state, K = S + p.features, G3 = 3 * S, P = p.pitch, B = p.batch;
    const int b0 = blockIdx.x * p.rows, rows = min(p.rows, B - b0), work = (rows * S * KQ + 31) / 32 * 32;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    A *wt = reinterpret_cast<A *>(shared_raw);  // [S][P]: W_h^T; lanes (s, q) read row s at q + KQ i
    A *dg = wt + (int64_t)S * P;                // [2][rows][3S]: d_gates of the block's rows, by step parity
    A *d_cell = dg + 2 * p.rows * G3;           // [rows][S]: the gradient reaching the cell, as stored

    for (int e = threadIdx.x; e < G3 * S; e += blockDim.x) {
        const int j = e / S, k = e - j * S;
        wt[k * P + j] = prl::load(p.w[(int64_t)j * K + k]);
    }
    for (int e = threadIdx.x; e < rows * S; e += blockDim.x) {
        const int r = e / S, s = e - r * S;
        d_cell[r * S + s] = p.grad_c_n ? prl::load(p.grad_c_n[(int64_t)(b0 + r) * S + s]) : A(0);
    }
    // row r of a [rows][3S] times column s of W_h^T's rows (row s of wt): lane q sums j = q, q +
    // KQ, ... in order, then the lanes' sums meet
    auto product = [&](const A *a, int r, int s, int q) {
        const A *ar = a + r * G3, *wk = wt + s * P;
        A sum = A(0);
        for (int j = q; j < G3; j += KQ) sum = fma(ar[j], wk[j], sum);
        return lanes_sum<KQ>(sum);
    };
    // a pack (p.first): row r's steps, and the row of its step t (t below its steps); a row
    // past its steps waits, its cell's gradient kept, until its own last step
    const bool packed = p.first != nullptr;
    const auto steps_of = [&](int r) { return packed ? (int)p.lengths[b0 + r] : p.steps; };
    const auto row_at = [&](int r, int t) { return packed ? p.first[t] + b0 + r : (int64_t)t * B + b0 + r; };
    for (int t = (packed ? steps_of(0) : p.steps) - 1; t >= 0; --t) {
        const A *later = dg + ((t + 1) & 1) * p.rows * G3;  // d_gates[t + 1]
        A *now = dg + (t & 1) * p.rows * G3;
        __syncthreads();  // d_gates[t + 1] complete; every read of `now` (as d_gates[t + 2]) done
        for (int e = threadIdx.x; e < work; e += blockDim.x) {
            const int q = e % KQ, rs = min(e / KQ, rows * S - 1), r = rs / S, s = rs - r * S;
            const A sum = t + 1 < p.steps ? product(later, r, s, q) : A(0);
            if (q != 0 || e / KQ >= rows * S || t >= steps_of(r)) continue;
            const int64_t row = row_at(r, t), k_own = row * S + s;
            // the gradient reaching h_t (none from a step past the row's last), rounded as the
            // step-by-step path stores it
            const A grad_h = prl::load(prl::store<T>(prl::load(p.grad_output[k_own]) +
                                                     (t + 1 < steps_of(r) ? sum : A(0))));
            const T *g_t = p.gates + row * G3 + s;
            const A old_cell = prl::load(t == 0 ? p.c0[(int64_t)(b0 + r) * S + s]
                                                : p.cells[row_at(r, t - 1) * S + s]);
            A d[3], d_old;
            prl::lltm_backward_math<T>(grad_h, d_cell[r * S + s], prl::load(g_t[0]), prl::load(g_t[S]),
                                       prl::load(g_t[2 * S]), old_cell, d[0], d[1], d[2], d_old);
            T *dg_t = p.d_gates + row * G3 + s;
#pragma unroll
            for (int i = 0; i < 3; ++i) {
                const T stored = prl::store<T>(d[i]);
                dg_t[i * S] = stored;
                now[r * G3 + i * S + s] = prl::load(stored);
            }
            const T d_old_stored = prl::store<T>(d_old);
            d_cell[r * S + s] = prl::load(d_old_stored);
            if (t == 0) p.d_c0[(int64_t)(b0 + r) * S + s] = d_old_stored;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < work; e += blockDim.x) {  // d_h0 = d_gates[0] W_h
        const int q = e % KQ, rs = min(e / KQ, rows * S - 1), r = rs / S, s = rs - r * S;
        const A sum = product(dg, r, s, q);
        if (q == 0 && e / KQ < rows * S) p.d_h0[(int64_t)(b0 + r) * S + s] = prl::store<T>(sum);
    }
}

// The kernels of a split of KQ lanes (Layout::split: 4, 2 or 1).
template <typename T, bool kLayer> const void *forward_kernel_of(int split) {
    if (kLayer)
        return split == 4   ? reinterpret_cast<const void *>(&fused_layer_forward_kernel<T, 4>)
               : split == 2 ? reinterpret_cast<const void *>(&fused_layer_forward_kernel<T, 2>)
                            : reinterpret_cast<const void *>(&fused_layer_forward_kernel<T, 1>);
    return split == 4   ? reinterpret_cast<const void *>(&fused_forward_kernel<T, 4>)
           : split == 2 ? reinterpret_cast<const void *>(&fused_forward_kernel<T, 2>)
                        : reinterpret_cast<const void *>(&fused_forward_kernel<T, 1>);
}
template <typename T> const void *backward_kernel_of(int split) {
    return split == 4   ? reinterpret_cast<const void *>(&fused_backward_kernel<T, 4>)
           : split == 2 ? reinterpret_cast<const void *>(&fused_backward_kernel<T, 2>)
                        : reinterpret_cast<const void *>(&fused_backward_kernel<T, 1>);
}

// ---- the products over all steps: out[m][n] = sum_q a(m, q) b(q, n), 32 x 32 tiles ----------

constexpr int kTile = 32, kTileRows = 8;  // a block of 32 x 8 threads, 4 outputs each

// d_weights [3S, S+I] and d_bias [3S]: m = gate j, n = column k of [h_{t-1}, x_t, 1], q = row t*B + b.
template <typename T> struct WeightGrads {
    const T *d_gates, *x, *h0, *output;
    T *d_w, *d_b;
    int64_t batch, features, state, steps;
    int64_t rows;          // steps * batch, or a pack's rows
    const int64_t *first;  // a pack's (NULL: a padded batch): step t's first row
    __device__ int64_t m() const { return 3 * state; }
    __device__ int64_t n() const { return state + features + 1; }
    __device__ int64_t q() const { return rows; }
    __device__ prl::acc_t<T> a(int64_t j, int64_t row) const { return prl::load(d_gates[row * 3 * state + j]); }
    __device__ prl::acc_t<T> b(int64_t row, int64_t k) const {
        if (k == state + features) return prl::acc_t<T>(1);
        if (k >= state) return prl::load(x[row * features + k - state]);
        if (row < batch) return prl::load(h0[row * state + k]);  // step 0's rows (every sequence has one)
        return prl::load(output[previous(row) * state + k]);
    }
    // the row of h_{t-1} for a row of step t > 0: B rows before in a padded batch; in a pack,
    // the same sequence's row of step t - 1 (step t found by bisecting `first`)
    __device__ int64_t previous(int64_t row) const {
        if (!first) return row - batch;
        int64_t lo = 1, hi = steps - 1;  // first[lo] <= row; the largest such step
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (first[mid] <= row) lo = mid;
            else hi = mid - 1;
        }
        return first[lo - 1] + (row - first[lo]);
    }
    __device__ void put(int64_t j, int64_t k, prl::acc_t<T> v) const {
        if (k < state + features) d_w[j * (state + features) + k] = prl::store<T>(v);
        else d_b[j] = prl::store<T>(v);
    }
};

// d_input [T*B, I]: m = row t*B + b, n = input feature i, q = gate j.
template <typename T> struct InputGrads {
    const T *d_gates, *w;
    T *d_x;
    int64_t batch, features, state, steps;
    int64_t rows;  // steps * batch, or a pack's rows
    __device__ int64_t m() const { return rows; }
    __device__ int64_t n() const { return features; }
    __device__ int64_t q() const { return 3 * state; }
    __device__ prl::acc_t<T> a(int64_t row, int64_t j) const { return prl::load(d_gates[row * 3 * state + j]); }
    __device__ prl::acc_t<T> b(int64_t j, int64_t i) const { return prl::load(w[j * (state + features) + state + i]); }
    __device__ void put(int64_t row, int64_t i, prl::acc_t<T> v) const { d_x[row * features + i] = prl::store<T>(v); }
};

// One 32 x 32 tile of out = a b (tile (tile_m, tile_n)), by a block of kTile x kTileRows threads.
template <typename T, typename Product>
__device__ void product_tile(const Product &p, int64_t tile_m, int64_t tile_n) {
    using A = prl::acc_t<T>;
    __shared__ A as[kTile][kTile + 1], bs[kTile][kTile + 1];  // [q][m], [q][n]
    const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
    const int64_t m0 = tile_m * kTile, n0 = tile_n * kTile;
    const int64_t M = p.m(), N = p.n(), Q = p.q();
    A acc[kTile / kTileRows] = {};
    for (int64_t q0 = 0; q0 < Q; q0 += kTile) {
        for (int i = ty; i < kTile; i += kTileRows) {  // row i of the chunk; tx along m (n)
            const int64_t q = q0 + i;
            as[i][tx] = q < Q && m0 + tx < M ? p.a(m0 + tx, q) : A(0);
            bs[i][tx] = q < Q && n0 + tx < N ? p.b(q, n0 + tx) : A(0);
        }
        __syncthreads();
#pragma unroll 8
        for (int i = 0; i < kTile; ++i) {
            const A a = as[i][tx];
#pragma unroll
            for (int u = 0; u < kTile / kTileRows; ++u) acc[u] = fma(a, bs[i][ty + u * kTileRows], acc[u]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kTile / kTileRows; ++u) {
        const int64_t m = m0 + tx, n = n0 + ty + u * kTileRows;
        if (m < M && n < N) p.put(m, n, acc[u]);
    }
}

// The weight product, d_weights|d_bias: its m and n are small (3S and S+I+1, whose product the
// staged weights bound to ~58K elements in float32) and its q, T*B rows, large.  32 x 32
// tiles left a few blocks (4 at S = I = 16) each summing every row alone: 8 x 8 tiles give 16
// times the blocks, and four threads share each output, each summing every fourth row of a
// staged chunk; the four meet in shared memory in a fixed order.
constexpr int kNarrow = 8, kNarrowLanes = 4, kNarrowRows = 64;
static_assert(kNarrow * kNarrow * kNarrowLanes == kTile * kTileRows, "one block shape for every product tile");

template <typename T, typename Product>
__device__ void narrow_tile(const Product &p, int64_t tile_m, int64_t tile_n) {
    using A = prl::acc_t<T>;
    constexpr int kOutputs = kNarrow * kNarrow;
    __shared__ A as[kNarrowRows][kNarrow + 1], bs[kNarrowRows][kNarrow + 1];  // [q][m], [q][n]
    __shared__ A lanes[kNarrowLanes][kOutputs];
    const int o = threadIdx.x % kOutputs, lane = threadIdx.x / kOutputs, om = o / kNarrow, on = o % kNarrow;
    const int64_t m0 = tile_m * kNarrow, n0 = tile_n * kNarrow;
    const int64_t M = p.m(), N = p.n(), Q = p.q();
    A acc = A(0);
    for (int64_t q0 = 0; q0 < Q; q0 += kNarrowRows) {
        for (int i = threadIdx.x; i < kNarrowRows * kNarrow; i += kOutputs * kNarrowLanes) {
            const int r = i / kNarrow, c = i % kNarrow;  // consecutive threads along m (n) of one row
            const int64_t q = q0 + r;
            as[r][c] = q < Q && m0 + c < M ? p.a(m0 + c, q) : A(0);
            bs[r][c] = q < Q && n0 + c < N ? p.b(q, n0 + c) : A(0);
        }
        __syncthreads();
#pragma unroll 4
        for (int r = lane; r < kNarrowRows; r += kNarrowLanes) acc = fma(as[r][om], bs[r][on], acc);
        __syncthreads();
    }
    lanes[lane][o] = acc;
    __syncthreads();
    if (lane == 0) {
        A sum = lanes[0][o];
#pragma unroll
        for (int l = 1; l < kNarrowLanes; ++l) sum += lanes[l][o];
        if (m0 + om < M && n0 + on < N) p.put(m0 + om, n0 + on, sum);
    }
}

// Both products of the backward in one launch (one launch less of host time): the first
// `weight_tiles` blocks take the 8 x 8 tiles of d_weights|d_bias, row-major over
// `weight_tiles_m` tiles of m; the rest the 32 x 32 tiles of d_input, over `input_tiles_m`.
template <typename T>
__global__ void __launch_bounds__(kTile * kTileRows)
    products_kernel(WeightGrads<T> wg, InputGrads<T> ig, int64_t weight_tiles, int64_t weight_tiles_m,
                    int64_t input_tiles_m) {
    const int64_t b = blockIdx.x;
    if (b < weight_tiles) narrow_tile<T>(wg, b % weight_tiles_m, b / weight_tiles_m);
    else product_tile<T>(ig, (b - weight_tiles) % input_tiles_m, (b - weight_tiles) / input_tiles_m);
}

int64_t tiles(int64_t n, int64_t tile = kTile) { return (n + tile - 1) / tile; }

// The shared memory a block of the current device `device` may opt into, asked once per
// device (a call's host time is what counts at these sizes).  The recurrence kernels take
// more than the default 48 KiB: the first ask allows them that much (a kernel's attribute
// is per device).
template <typename T> cudaError_t shared_memory_of(int device, int &smem_max) {
    static std::mutex mutex;
    static std::map<int, int> known;  // device -> its opt-in shared memory per block
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(device);
    if (it != known.end()) {
        smem_max = it->second;
        return cudaSuccess;
    }
    cudaError_t err = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    for (int split = 1; split <= 4 && err == cudaSuccess; split *= 2) {
        err = cudaFuncSetAttribute(forward_kernel_of<T, false>(split), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem_max);
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(forward_kernel_of<T, true>(split), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem_max);
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(backward_kernel_of<T>(split), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem_max);
    }
    if (err == cudaSuccess) known.emplace(device, smem_max);
    return err;
}

// The layout of (batch, features, state) on the current device `device`, and whether it fits
// its shared memory.
template <typename T>
cudaError_t fits_device(int64_t batch, int64_t features, int64_t state, int device, bool &fits, Layout &l) {
    using A = prl::acc_t<T>;
    fits = false;
    if (batch <= 0 || state <= 0) return cudaSuccess;
    int smem_max = 0;
    const cudaError_t err = shared_memory_of<T>(device, smem_max);
    if (err != cudaSuccess) return err;
    l = layout_of<A>(batch, features, state, smem_max);
    fits = l.forward_smem <= smem_max && l.backward_smem <= smem_max;
    return cudaSuccess;
}

template <typename T>
FusedArgs<T> fused_args(const void *x, const void *w, const void *h0, const void *c0, int64_t steps, int64_t batch,
                        int64_t features, int64_t state, const Layout &l) {
    FusedArgs<T> a{};
    a.x = static_cast<const T *>(x);
    a.w = static_cast<const T *>(w);
    a.h0 = static_cast<const T *>(h0);
    a.c0 = static_cast<const T *>(c0);
    a.steps = (int)steps;
    a.batch = (int)batch;
    a.features = (int)features;
    a.state = (int)state;
    a.rows = l.rows;
    a.output_pitch = (int)state;
    return a;
}

// What every entry checks and prepares, on the current device: sizes every index stays
// within, the layout fits, the buffers all read, and the kernels' shared-memory allowance.
template <typename T>
prl_status prepare_fused(const char *fn, const void *input, const void *weights, const void *h0, const void *c0,
                         int64_t steps, int64_t batch, int64_t features, int64_t state, int device, Layout &l,
                         bool state_given = true) {
    PRL_TRY(prl::check_count(fn, "features", features));
    PRL_TRY(prl::check_sequence_sizes(fn, steps, batch, state, state + features));
    if (features >= (int64_t(1) << 24) || steps * batch * (3 * state + features) >= (int64_t(1) << 40))
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: features=%lld with steps=%lld, batch=%lld: too large for "
                         "the fused route", fn, (long long)features, (long long)steps, (long long)batch);
    bool fits = false;
    cudaError_t err = fits_device<T>(batch, features, state, device, fits, l);
    if (err != cudaSuccess) return prl::cuda_fail(fn, "querying the device", err);
    if (!fits && batch > 0 && state > 0)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT,
                         "%s: features=%lld, state=%lld does not fit in the shared memory of CUDA device %d "
                         "(prl_lltm_sequence_fused_cuda_fits says so): use prl_lltm_sequence_forward_cuda / "
                         "_backward_cuda and GEMMs of your own", fn, (long long)features, (long long)state, device);
    PRL_TRY(prl::check_pointer(fn, "input", input, steps * batch * features));
    PRL_TRY(prl::check_pointer(fn, "weights", weights, 3 * state * (state + features)));
    if (!state_given) return PRL_SUCCESS;
    PRL_TRY(prl::check_pointer(fn, "h0", h0, batch * state));
    return prl::check_pointer(fn, "c0", c0, batch * state);
}

// The buffers a training forward writes and its backward reads.
prl_status check_saved(const char *fn, const void *output, const void *cells, const void *gates, int64_t steps,
                       int64_t batch, int64_t state) {
    PRL_TRY(prl::check_pointer(fn, "output", output, steps * batch * state));
    PRL_TRY(prl::check_pointer(fn, "cells", cells, steps * batch * state));
    return prl::check_pointer(fn, "gates", gates, steps * batch * 3 * state);
}

// The forward kernel over `count` directions: a training forward's one (FusedArgs), or a
// layer's (kLayer: FusedDirections).
template <typename T, bool kLayer, typename Args>
prl_status launch_forward(const char *fn, Args params, int count, int64_t batch, const Layout &l, cudaStream_t s) {
    const dim3 blocks((unsigned)((batch + l.rows - 1) / l.rows), (unsigned)count);
    void *args[] = {&params};
    const cudaError_t err = cudaLaunchKernel(forward_kernel_of<T, kLayer>(l.split), blocks, dim3(l.threads), args,
                                             (size_t)l.forward_smem, s);
    return err == cudaSuccess ? PRL_SUCCESS : prl::cuda_fail(fn, "the kernel launch", err);
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_fused_cuda_fits(int64_t batch, int64_t features, int64_t state,
                                                                int dtype, int device, int *fits) {
    PRL_API_BEGIN
    const char *fn = __func__;
    if (fits == nullptr) return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'fits' is NULL", fn);
    *fits = 0;
    PRL_TRY(prl::check_count(fn, "features", features));
    PRL_TRY(prl::check_lltm_sizes(fn, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        bool ok = false;
        Layout l;
        const cudaError_t err = fits_device<T>(batch, features, state, guard.device(), ok, l);
        if (err != cudaSuccess) return prl::cuda_fail(fn, "querying the device", err);
        *fits = ok && features < (int64_t(1) << 24);
        return PRL_SUCCESS;
    });
    PRL_API_END
}

namespace {

// The training forward over a padded batch (first, lengths NULL) or a pack's rows.
prl_status fused_forward_entry(const char *fn, const void *input, const void *weights, const void *bias,
                               const void *h0, const void *c0, const int64_t *first, const int64_t *lengths,
                               void *output, void *cells, void *gates, void *c_n, int64_t steps, int64_t batch,
                               int64_t features, int64_t state, int dtype, int device, void *stream) {
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        Layout l;
        PRL_TRY(prepare_fused<T>(fn, input, weights, h0, c0, steps, batch, features, state, guard.device(), l));
        PRL_TRY(check_saved(fn, output, cells, gates, steps, batch, state));
        const int64_t all = steps * batch * state;
        PRL_TRY(prl::check_pointer(fn, "bias", bias, 3 * state));
        const cudaStream_t s = static_cast<cudaStream_t>(stream);
        const size_t state_bytes = (size_t)(batch * state) * sizeof(T);
        if (all == 0) {  // no step: c_n is c0
            const cudaError_t err = c_n && state_bytes ? cudaMemcpyAsync(c_n, c0, state_bytes, cudaMemcpyDeviceToDevice, s)
                                                       : cudaSuccess;
            return err == cudaSuccess ? PRL_SUCCESS : prl::cuda_fail(fn, "copying c0 to c_n", err);
        }
        FusedArgs<T> a = fused_args<T>(input, weights, h0, c0, steps, batch, features, state, l);
        a.bias = static_cast<const T *>(bias);
        a.output = static_cast<T *>(output);
        a.cells = static_cast<T *>(cells);
        a.gates = static_cast<T *>(gates);
        a.c_n = static_cast<T *>(c_n);
        a.first = first;
        a.lengths = lengths;
        a.pitch = l.forward_pitch;
        return launch_forward<T, false>(fn, a, 1, batch, l, s);
    });
}

// Its backward: `rows` the rows of the input (steps * batch, or a pack's).
prl_status fused_backward_entry(const char *fn, const void *grad_output, const void *grad_c_n, const void *input,
                                const void *weights, const void *h0, const void *c0, const int64_t *first,
                                const int64_t *lengths, const void *output, const void *cells, const void *gates,
                                void *d_gates, void *d_input, void *d_weights, void *d_bias, void *d_h0, void *d_c0,
                                int64_t steps, int64_t batch, int64_t rows, int64_t features, int64_t state,
                                int dtype, int device, void *stream) {
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        Layout l;
        PRL_TRY(prepare_fused<T>(fn, input, weights, h0, c0, steps, batch, features, state, guard.device(), l));
        PRL_TRY(check_saved(fn, output, cells, gates, steps, batch, state));
        const int64_t all = rows * state;
        PRL_TRY(prl::check_pointer(fn, "grad_output", grad_output, all));
        PRL_TRY(prl::check_pointer(fn, "d_gates", d_gates, 3 * all));
        PRL_TRY(prl::check_pointer(fn, "d_input", d_input, rows * features));
        PRL_TRY(prl::check_pointer(fn, "d_weights", d_weights, 3 * state * (state + features)));
        PRL_TRY(prl::check_pointer(fn, "d_bias", d_bias, 3 * state));
        PRL_TRY(prl::check_pointer(fn, "d_h0", d_h0, batch * state));
        PRL_TRY(prl::check_pointer(fn, "d_c0", d_c0, batch * state));
        cudaError_t err = cudaSuccess;
        const cudaStream_t s = static_cast<cudaStream_t>(stream);
        const size_t state_bytes = (size_t)(batch * state) * sizeof(T);
        if (steps == 0 && state_bytes) {  // no step: d_h0 is zero, d_c0 is grad_c_n; the products write zeros
            err = cudaMemsetAsync(d_h0, 0, state_bytes, s);
            if (err == cudaSuccess)
                err = grad_c_n ? cudaMemcpyAsync(d_c0, grad_c_n, state_bytes, cudaMemcpyDeviceToDevice, s)
                               : cudaMemsetAsync(d_c0, 0, state_bytes, s);
            if (err != cudaSuccess) return prl::cuda_fail(fn, "writing d_h0 and d_c0", err);
        }
        FusedArgs<T> a = fused_args<T>(input, weights, h0, c0, steps, batch, features, state, l);
        a.output = const_cast<T *>(static_cast<const T *>(output));  // read only in the backward
        a.cells = const_cast<T *>(static_cast<const T *>(cells));
        a.gates = const_cast<T *>(static_cast<const T *>(gates));
        a.grad_output = static_cast<const T *>(grad_output);
        a.grad_c_n = static_cast<const T *>(grad_c_n);
        a.d_gates = static_cast<T *>(d_gates);
        a.d_h0 = static_cast<T *>(d_h0);
        a.d_c0 = static_cast<T *>(d_c0);
        a.first = first;
        a.lengths = lengths;
        if (all) {
            const unsigned blocks = (unsigned)((batch + l.rows - 1) / l.rows);
            a.pitch = l.backward_pitch;
            void *args[] = {&a};
            err = cudaLaunchKernel(backward_kernel_of<T>(l.split), dim3(blocks), dim3(l.threads), args,
                                   (size_t)l.backward_smem, s);
            if (err != cudaSuccess) return prl::cuda_fail(fn, "the kernel launches", err);
        }
        // with no rows (steps or batch 0) the products are sums of nothing: zeros
        const WeightGrads<T> wg{static_cast<const T *>(d_gates), a.x, a.h0, a.output, static_cast<T *>(d_weights),
                                static_cast<T *>(d_bias), batch, features, state, steps, rows, first};
        const InputGrads<T> ig{static_cast<const T *>(d_gates), a.w, static_cast<T *>(d_input), batch, features,
                               state, steps, rows};
        const int64_t weight_tiles = tiles(3 * state, kNarrow) * tiles(state + features + 1, kNarrow);
        const int64_t blocks = weight_tiles + tiles(rows) * tiles(features);
        if (blocks)
            products_kernel<T><<<(unsigned)blocks, kTile * kTileRows, 0, s>>>(wg, ig, weight_tiles,
                                                                              tiles(3 * state, kNarrow), tiles(rows));
        err = cudaGetLastError();
        if (err != cudaSuccess) return prl::cuda_fail(fn, "the kernel launches", err);
        return PRL_SUCCESS;
    });
}

// A pack's arguments: first [steps] and lengths [batch] given, rows within steps * batch.
prl_status check_pack(const char *fn, const int64_t *first, const int64_t *lengths, int64_t steps, int64_t batch,
                      int64_t rows) {
    PRL_TRY(prl::check_pointer(fn, "first", first, steps));
    PRL_TRY(prl::check_pointer(fn, "lengths", lengths, batch));
    if (rows < (steps ? batch : 0) || rows > steps * batch || (steps > 0 && (first == nullptr || lengths == nullptr)))
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: rows=%lld is not a pack's of steps=%lld, batch=%lld "
                         "(batch <= rows <= steps * batch)", fn, (long long)rows, (long long)steps, (long long)batch);
    return PRL_SUCCESS;
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_fused_forward_cuda(
    const void *input, const void *weights, const void *bias, const void *h0, const void *c0, void *output,
    void *cells, void *gates, void *c_n, int64_t steps, int64_t batch, int64_t features, int64_t state, int dtype,
    int device, void *stream) {
    PRL_API_BEGIN
    return fused_forward_entry(__func__, input, weights, bias, h0, c0, nullptr, nullptr, output, cells, gates, c_n,
                               steps, batch, features, state, dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_fused_backward_cuda(
    const void *grad_output, const void *grad_c_n, const void *input, const void *weights, const void *h0,
    const void *c0, const void *output, const void *cells, const void *gates, void *d_gates, void *d_input,
    void *d_weights, void *d_bias, void *d_h0, void *d_c0, int64_t steps, int64_t batch, int64_t features,
    int64_t state, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    return fused_backward_entry(__func__, grad_output, grad_c_n, input, weights, h0, c0, nullptr, nullptr, output,
                                cells, gates, d_gates, d_input, d_weights, d_bias, d_h0, d_c0, steps, batch,
                                steps * batch, features, state, dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_packed_fused_forward_cuda(
    const void *input, const void *weights, const void *bias, const void *h0, const void *c0, const int64_t *first,
    const int64_t *lengths, void *output, void *cells, void *gates, void *c_n, int64_t steps, int64_t batch,
    int64_t rows, int64_t features, int64_t state, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(check_pack(fn, first, lengths, steps, batch, rows));
    return fused_forward_entry(fn, input, weights, bias, h0, c0, first, lengths, output, cells, gates, c_n, steps,
                               batch, features, state, dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_packed_fused_backward_cuda(
    const void *grad_output, const void *grad_c_n, const void *input, const void *weights, const void *h0,
    const void *c0, const int64_t *first, const int64_t *lengths, const void *output, const void *cells,
    const void *gates, void *d_gates, void *d_input, void *d_weights, void *d_bias, void *d_h0, void *d_c0,
    int64_t steps, int64_t batch, int64_t rows, int64_t features, int64_t state, int dtype, int device,
    void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(check_pack(fn, first, lengths, steps, batch, rows));
    return fused_backward_entry(fn, grad_output, grad_c_n, input, weights, h0, c0, first, lengths, output, cells,
                                gates, d_gates, d_input, d_weights, d_bias, d_h0, d_c0, steps, batch, rows, features,
                                state, dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_layer_fused_inference_cuda(
    const void *input, const void *weights, const void *bias, const void *weights_reverse, const void *bias_reverse,
    const void *h0, const void *c0, const int64_t *first, const int64_t *lengths, const int64_t *order, void *output,
    void *h_n, void *c_n, int64_t directions, int64_t steps, int64_t batch, int64_t features, int64_t state, int dtype, int device,
    void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    if (directions != 1 && directions != 2)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: directions must be 1 or 2, got %lld", fn,
                         (long long)directions);
    if (steps < 1)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: steps must be >= 1, got %lld", fn, (long long)steps);
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        Layout l;
        const int64_t states = directions * batch * state;  // h0, c0, h_n, c_n: [directions, batch, S]
        PRL_TRY(prepare_fused<T>(fn, input, weights, h0, c0, steps, batch, features, state, guard.device(), l, false));
        if ((h0 == nullptr) != (c0 == nullptr))
            return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: h0 and c0 must both be given or both be NULL", fn);
        if ((first == nullptr) != (lengths == nullptr))
            return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: first and lengths must both be given (a pack) or both "
                             "be NULL (a padded batch)", fn);
        PRL_TRY(prl::check_pointer(fn, "bias", bias, 3 * state));
        PRL_TRY(prl::check_pointer(fn, "output", output, steps * states));
        PRL_TRY(prl::check_pointer(fn, "h_n", h_n, states));
        PRL_TRY(prl::check_pointer(fn, "c_n", c_n, states));
        if (directions == 2) {
            PRL_TRY(prl::check_pointer(fn, "weights_reverse", weights_reverse, 3 * state * (state + features)));
            PRL_TRY(prl::check_pointer(fn, "bias_reverse", bias_reverse, 3 * state));
        }
        FusedDirections<T> run{};
        for (int d = 0; d < directions; ++d) {
            const int64_t own = d * batch * state;  // this direction's [batch, S] of h0, c0, h_n and c_n
            FusedArgs<T> &a = run.d[d];
            a = fused_args<T>(input, d ? weights_reverse : weights, h0 ? static_cast<const T *>(h0) + own : nullptr,
                              c0 ? static_cast<const T *>(c0) + own : nullptr, steps, batch, features, state, l);
            a.bias = static_cast<const T *>(d ? bias_reverse : bias);
            a.output = static_cast<T *>(output) + d * state;
            a.output_pitch = (int)(directions * state);
            a.h_n = static_cast<T *>(h_n) + own;
            a.c_n = static_cast<T *>(c_n) + own;
            a.reverse = d;
            a.first = first;
            a.lengths = lengths;
            a.order = order;
            a.pitch = l.forward_pitch;
        }
        return launch_forward<T, true>(fn, run, (int)directions, batch, l, static_cast<cudaStream_t>(stream));
    });
    PRL_API_END
}
