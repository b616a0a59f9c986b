// lltm_sequence_cuda.cu - the LLTM's recurrence over a whole sequence, one persistent
// kernel per direction: prl_lltm_sequence_forward_cuda, prl_lltm_sequence_backward_cuda and
// prl_lltm_sequence_cuda_fits; prl_lltm_sequence_persistent_forward_cuda runs the input half
// of every step (a tiled product) before the forward's recurrence, in the same call;
// prl_lltm_sequence_packed_forward_cuda / _backward_cuda run the same kernels over a packed
// batch (step t over its first batch_sizes[t] rows), whose sizes prl_upload_cuda puts in
// device memory.
//
// Run step by step, each step of the recurrence is a small GEMM (h_{t-1} [B, S] times
// W_h^T [S, 3S]) and a pointwise launch: a few microseconds each, and at small batches
// the GEMM cannot fill the GPU.  Here one cooperative grid runs every step:
//   - each block owns a tile of JT state columns j (with the gate rows j, S+j and 2S+j of
//     W_h) and of BT batch rows.  Its slice of W_h is read once, into registers, and stays
//     there for the whole sequence: thread (kc, jj) holds rows/columns k in
//     [kc*KC, kc*KC + KC) of state column j0 + jj;
//   - per step the block stages the BT rows of h_{t-1} in shared memory, every thread forms
//     its partial dot products, the partials meet in shared memory and are summed in a
//     fixed order (the result does not depend on scheduling), and the thread that owns a
//     (row, column) applies the pointwise cell of lltm.h to it (one pair a thread; where no
//     such tile fits, a tensor-core kernel of its own owns two pairs a thread: kMmaOwn);
//   - then the whole grid waits (cooperative_groups' grid sync) until step t's h is
//     written before any block starts step t + 1;
//   - unless one block holds every state column (JT >= S: small states).  Rows do not
//     depend on each other, so a block then reads only the rows it wrote itself: its
//     owners put step t's h (d_gates, backward) straight into the staged rows, and the
//     block's own barrier separates the steps.  The grid barrier, a round trip through L2
//     for every block, was most of a step's time there;
//   - or, on sm_90 and later, unless the column tiles of a row tile fit in one thread-block
//     cluster (at most 16 blocks): the owners then write step t's h into the staged rows of
//     every block of their cluster (distributed shared memory), and the cluster's barrier
//     separates the steps.  Row tiles never wait for each other.
//   - float16/bfloat16 on sm_80 and later: the product on tensor cores where the plan finds
//     that faster (make_plan): each warp holds its weights as mma A fragments and reads the
//     staged rows, stored in 16 bits, as B fragments; its partial sums go where the CUDA
//     cores' threads put theirs, and the rest is shared.
// The backward runs the same machine over d_gates[t+1] [B, 3S] times W_h [3S, S] (the
// gradient reaching h_t), followed by the pointwise backward of step t; a last phase forms
// d_h0 = d_gates[0] W_h.  Cross-block data is read with ld.global.cg (L2, not the
// per-SM L1, which other SMs' writes do not update).
//
// The grid (or every cluster of it) must be co-resident: prl_lltm_sequence_cuda_fits says whether the weights and
// tiles of a (batch, state) fit on the device (2: only with two pairs a thread); otherwise the
// caller runs the steps one by one (prl_lltm_forward_cuda / prl_lltm_backward_cuda and its own GEMMs).
#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "cuda_common.cuh"
#include "lltm.h"

namespace cg = cooperative_groups;

namespace {

constexpr int kSeqThreads = 256;  // threads per block, at most
constexpr int kPad = 4;           // elements between chunks of a staged row (spreads them over the banks)
constexpr int kMaxCluster = 16;   // blocks of a cluster at most (above 8: non-portable, sm_90)

// The tensor-core product (float16/bfloat16 on sm_80+, mma.sync m16n8k16, accumulating in
// float): 8 warps a block; warp (cg, ks) holds, as A fragments in registers, the weights of
// column group cg (16 state columns: their three gate rows forward, the columns themselves
// backward) over its share ks of the k-tiles (16 of the reduction each): at most kMmaTiles
// k-tiles, 96 registers either way.
constexpr int kMmaWarps = 8;
constexpr int kMmaPad = 8;  // elements after a staged row (16 bytes: a row's words fall in distinct banks)
template <bool Backward> constexpr int kMmaGates = Backward ? 1 : 3;
template <bool Backward> constexpr int kMmaTiles = Backward ? 24 : 8;
// (row, column) pairs a thread of the tensor-core kernel may finish a step (its kernel with
// O = kMmaOwn): the row tile may then hold up to kMmaOwn * threads / JT rows, so that a batch
// too wide for one pair a thread (BT * JT <= threads) still fits in one co-resident grid.
// Taken only where no tile of one pair a thread fits (make_plan).
constexpr int kMmaOwn = 2;
static_assert(kMmaOwn > 1, "make_plan tries one pair a thread, then kMmaOwn");

// Weights per thread: 96 float registers (48 doubles); the forward holds three gate rows of
// KC columns each, the backward one column of 3 * KC rows.
template <typename A> constexpr int kChunk = 32 * 4 / (int)sizeof(A);
template <typename A, bool Backward> constexpr int kWeights = Backward ? 3 * kChunk<A> : kChunk<A>;

template <typename T> struct SequenceArgs {
    T *gates;                // [steps, batch, 3S]: in, x_t W_x^T + b; out (forward), the full pre-activations
    const T *w_h;            // [3S, S] with row stride ldw: the first S columns of weights [3S, S+I]
    int64_t ldw;
    const T *h0, *c0;        // [batch, S]
    T *output, *cells;       // [steps, batch, S]: new_h and new_cell of each step (forward out, backward in)
    T *c_n;                  // [batch, S], or NULL: the last new_cell again (forward out)
    const T *grad_output;    // [steps, batch, S]               (backward)
    const T *grad_c_n;       // [batch, S], or NULL: zero        (backward)
    T *d_gates;              // [steps, batch, 3S]              (backward out)
    T *d_h0, *d_c0;          // [batch, S]                      (backward out; d_c0 carries d_cell between steps)
    const int64_t *sizes;    // [steps] in device memory: rows of each step (a packed batch), or NULL: batch
    int steps, batch, state;
    int jt, bt;              // the tile: JT state columns x BT batch rows per block
    int vec;                 // 1: every staged row starts 16-byte aligned (16-byte loads)
    int local;               // 1: one column tile (JT >= S): a block's product reads only rows it writes
    int cluster;             // > 1: the column tiles of a row tile are one thread-block cluster (sm_90+)
};

// A value another block wrote during this kernel, read from L2.
__device__ __forceinline__ float raw_cg(const float *p) { return __ldcg(p); }
__device__ __forceinline__ double raw_cg(const double *p) { return __ldcg(p); }
__device__ __forceinline__ prl::half_t raw_cg(const prl::half_t *p) {
    return prl::half_t{__ldcg(reinterpret_cast<const unsigned short *>(p))};
}
__device__ __forceinline__ prl::bfloat16_t raw_cg(const prl::bfloat16_t *p) {
    return prl::bfloat16_t{__ldcg(reinterpret_cast<const unsigned short *>(p))};
}

// Four consecutive staged elements (16-byte aligned): one or two shared-memory accesses.
__device__ __forceinline__ float4 load4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void fma4(float &acc, const float *w, float4 a) {
    acc = fmaf(w[0], a.x, acc);
    acc = fmaf(w[1], a.y, acc);
    acc = fmaf(w[2], a.z, acc);
    acc = fmaf(w[3], a.w, acc);
}
struct double4_ { double2 lo, hi; };
__device__ __forceinline__ double4_ load4(const double *p) {
    return {reinterpret_cast<const double2 *>(p)[0], reinterpret_cast<const double2 *>(p)[1]};
}
__device__ __forceinline__ void fma4(double &acc, const double *w, double4_ a) {
    acc = fma(w[0], a.lo.x, acc);
    acc = fma(w[1], a.lo.y, acc);
    acc = fma(w[2], a.hi.x, acc);
    acc = fma(w[3], a.hi.y, acc);
}

// The tile sizes of one direction, and the block and shared memory they take.
struct Shape {
    int k;        // the reduction length: S (forward) or 3S (backward)
    int chunks;   // NK: threads per state column, each holding KC of the k (tensor cores: the k-splits)
    int jt;       // state columns per block
    int threads;  // NK * JT, rounded up to whole warps
    bool mma;     // the tensor-core product (16-bit types, sm_80+)
};

template <typename A, bool Backward> Shape shape_of(int64_t state) {
    constexpr int KC = kWeights<A, Backward>;
    Shape s{};
    s.k = (int)((Backward ? 3 : 1) * state);
    s.chunks = (s.k + KC - 1) / KC;
    if (s.chunks > kSeqThreads) return s;  // jt = 0: does not fit
    int jt = 1;
    while (2 * jt * s.chunks <= kSeqThreads && jt < state) jt *= 2;
    s.jt = jt;
    s.threads = (s.chunks * jt + 31) / 32 * 32;
    return s;
}

// The tensor cores' tile: the most columns per block (a power of two, 16 to 128, no more than
// the state needs) whose k-tiles fit the warps' registers.  jt = 0: does not fit.
template <bool Backward> Shape mma_shape_of(int64_t state) {
    Shape s{};
    s.k = (int)((Backward ? 3 : 1) * state);
    const int k_tiles = (s.k + 15) / 16;
    for (int jt = 128; jt >= 16; jt /= 2) {
        if ((jt > 16 && jt / 2 >= state) || jt / 16 > kMmaWarps) continue;
        const int splits = kMmaWarps / (jt / 16);
        if ((k_tiles + splits - 1) / splits <= kMmaTiles<Backward>) {
            s.jt = jt;
            s.chunks = splits;
            s.threads = 32 * kMmaWarps;
            s.mma = true;
            break;
        }
    }
    return s;
}

template <typename A, bool Backward> __host__ __device__ constexpr int row_stride(int chunks) {
    return chunks * (kWeights<A, Backward> + kPad);
}

// A staged row: its elements (CUDA cores: acc_t<T> in chunks of KC with kPad between; tensor
// cores: the 16-bit values as stored, contiguous, k padded to whole k-tiles, then kMmaPad), and
// the rows a buffer holds (tensor cores: whole n-tiles of 8).
template <typename A, bool Backward> __host__ __device__ constexpr int staged_stride(bool mma, int k, int chunks) {
    return mma ? (k + 15) / 16 * 16 + kMmaPad : row_stride<A, Backward>(chunks);
}
__host__ __device__ constexpr int staged_rows(bool mma, int bt) { return mma ? (bt + 7) / 8 * 8 : bt; }

// `buffers` staged row sets: one, or two for a cluster (a step reads one while the next is
// written); then the partial sums.
template <typename A, bool Backward> int64_t shared_bytes(const Shape &s, int bt, int buffers = 1) {
    constexpr int G = Backward ? 1 : 3;
    const int64_t staged = (int64_t)buffers * staged_rows(s.mma, bt) * staged_stride<A, Backward>(s.mma, s.k, s.chunks)
        * (s.mma ? 2 : (int64_t)sizeof(A));
    const int64_t partials = (int64_t)s.chunks * (bt * G * s.jt + kPad);
    return staged + partials * (int64_t)sizeof(A);
}

// Where column c of a staged row lies: chunks of KC with kPad between, or (KC = 0) contiguous.
template <int KC> __device__ __forceinline__ int staged_col(int c) { return KC ? (c / KC) * (KC + kPad) + c % KC : c; }

// A value as staged: acc_t<T> (CUDA cores) or the stored bits (tensor cores).
template <typename S, typename T> __device__ __forceinline__ S to_staged(T v) {
    if constexpr (std::is_same<S, T>::value) return v;
    else return prl::load(v);
}

// Stages rows b0 .. b0 + BT - 1 of src ([B, K], row-major) in shared memory as
// staged[r][staged_col<KC>(k)] (zeros past the edges, up to `width`).  Each thread issues kBatch loads before
// it stores any (one round trip to L2, not kBatch of them), of 16 bytes each when `vec`.
constexpr int kBatch = 8;

template <typename T, typename ST, int KC, int V>
__device__ __forceinline__ void stage_rows(ST *staged, int row_stride, const T *src, int b0, int BT, int B, int K,
                                           int width) {
    using Chunk = prl::Vec<T, V>;
    const int per_row = width / V, total = BT * per_row;
    for (int base = threadIdx.x; base < total; base += kBatch * blockDim.x) {
        Chunk v[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int e = base + i * blockDim.x, r = e / per_row, c = (e - r * per_row) * V, b = b0 + r;
            if (e < total && b < B && c < K) {
                if (V == 1) {
                    v[i].v[0] = raw_cg(src + (int64_t)b * K + c);
                } else {
                    const uint4 bits = __ldcg(reinterpret_cast<const uint4 *>(src + (int64_t)b * K + c));
                    memcpy(&v[i], &bits, sizeof bits);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int e = base + i * blockDim.x, r = e / per_row, c = (e - r * per_row) * V, b = b0 + r;
            if (e >= total) break;
            ST *to = staged + r * row_stride + staged_col<KC>(c);
            const bool in = b < B && c < K;
#pragma unroll
            for (int j = 0; j < V; ++j)
                to[j] = in ? to_staged<ST>(v[i].v[j]) : ST{};
        }
    }
}

// The bits of two 16-bit values as one register: lo in the low half (the mma's element order).
template <typename T> __device__ __forceinline__ uint32_t pair_bits(T lo, T hi) {
    return (uint32_t)lo.bits | ((uint32_t)hi.bits << 16);
}

// d += a b: a the 16 x 16 A fragment (row-major), b0/b1 the 16 x 8 B fragment (by columns), d
// the 16 x 8 float accumulator (PTX ISA, "Matrix Fragments for mma.m16n8k16").  sm_80+ only:
// a plan never chooses the tensor cores on an older device.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same<T, prl::half_t>::value)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1;
#endif
}

// A cluster's shared memory and barrier (sm_90+; a cluster is never planned on older devices).
template <typename A> __device__ __forceinline__ void put_in_cluster(A *buf, int at, A value, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cluster = cg::this_cluster();
    for (int q = 0; q < blocks; ++q) cluster.map_shared_rank(buf, q)[at] = value;
#else
    (void)buf, (void)at, (void)value, (void)blocks;
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#endif
}

// The rows of step t: sizes[t] for a packed batch (0 outside the sequence), else batch.
template <typename T> __device__ __forceinline__ int rows_at(const SequenceArgs<T> &p, int t) {
    if (t < 0 || t >= p.steps) return 0;
    return p.sizes ? (int)__ldg(p.sizes + t) : p.batch;
}

// Mma: the product on tensor cores (16-bit T, sm_80+), else on CUDA cores.  Cluster: launched
// as clusters (sm_90+), each block's column tile one of its row tile's; a kernel of its own, so
// that the others carry none of its code (the one-column-tile steps took 1.07-1.10x their time
// with it, H100).
// SC > 0: a kernel for state size SC alone, one column tile of SC columns (no cluster): the
// sizes the loop's indices and partial sums depend on are compile-time constants.
// O: the (row, column) pairs a thread finishes each step, at most (kMmaOwn, or one).
template <typename T, bool Backward, bool Mma, bool Cluster, int SC = 0, int O = 1>
__global__ void __launch_bounds__(kSeqThreads, 1) lltm_sequence_kernel(SequenceArgs<T> p) {
    using A = prl::acc_t<T>;
    using ST = std::conditional_t<Mma, T, A>;   // a staged element
    constexpr int G = Backward ? 1 : 3;          // outputs per (row, column): three gates, or d_h
    constexpr int KC = kWeights<A, Backward>;
    constexpr int LC = Mma ? 0 : KC;             // the staged rows' chunks (staged_col)
    constexpr int V = prl::kVec16<T>;
    static_assert(SC == 0 || !Cluster, "a kernel for one state size runs one column tile");
    static_assert(O == 1 || (Mma && !Cluster && SC == 0), "several pairs a thread: the general tensor-core kernel");
    const int S = SC ? SC : p.state, B = p.batch, JT = SC ? SC : p.jt, BT = p.bt;
    const int K = Backward ? 3 * S : S;
    const int NK = Mma ? kMmaWarps / (JT / 16) : (K + KC - 1) / KC;  // partial sums of each output
    const int RS = staged_stride<A, Backward>(Mma, K, NK), PS = BT * G * JT + kPad;
    const int RB = staged_rows(Mma, BT) * RS;  // a buffer's elements
    constexpr bool clustered = Cluster;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    ST *staged = reinterpret_cast<ST *>(shared_raw);                          // [buffers][rows][RS]
    A *partial = reinterpret_cast<A *>(staged + (clustered ? 2 : 1) * RB);  // [NK][BT][G][JT] (+ kPad per chunk)

    const int tid = threadIdx.x, kc = tid / JT, jj = tid % JT;
    const int j_tiles = (S + JT - 1) / JT;
    const int j0 = (blockIdx.x % j_tiles) * JT, b0 = (blockIdx.x / j_tiles) * BT;
    const bool computes = kc < NK && j0 + jj < S;
    // tensor cores: lane (gid, tig) of warp (cg, ks) = (tid / 32 % col_groups, tid / 32 / col_groups);
    // the warp's k-tiles are kt0 .. kt0 + kts - 1 (those below k_tiles)
    const int lane = tid % 32, gid = lane / 4, tig = lane % 4, col_groups = JT / 16;
    const int cg = tid / 32 % (Mma ? col_groups : 1), ks = tid / 32 / (Mma ? col_groups : 1);
    const int k_tiles = (K + 15) / 16, kts = (k_tiles + NK - 1) / NK, kt0 = ks * kts;

    // This thread's slice of W_h, for the whole sequence (zero past the edges): CUDA cores,
    // thread (kc, jj) holds k in [kc * KC, kc * KC + KC) of column j0 + jj (three gate rows
    // forward); tensor cores, the A fragments of its warp's weights, element (m, k) of k-tile
    // kt0 + f being row m of the column group (gate row g * S + j forward, column j of W_h
    // backward).
    A w[G][Mma ? 1 : KC];
    uint32_t wa[Mma ? kMmaGates<Backward> : 1][Mma ? kMmaTiles<Backward> : 1][4];
    if constexpr (Mma) {
#pragma unroll
        for (int g = 0; g < kMmaGates<Backward>; ++g)
#pragma unroll
            for (int f = 0; f < kMmaTiles<Backward>; ++f)
#pragma unroll
                for (int q = 0; q < 4; ++q) {  // a0 .. a3: rows gid, gid + 8; columns tig * 2, + 8
                    const int j = j0 + cg * 16 + gid + (q & 1) * 8, k = (kt0 + f) * 16 + tig * 2 + (q >> 1) * 8;
                    T e[2];
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const bool in = f < kts && j < S && k + i < K;
                        const int64_t at = Backward ? (int64_t)(k + i) * p.ldw + j : (int64_t)(g * S + j) * p.ldw + k + i;
                        e[i] = in ? p.w_h[at] : T{};
                    }
                    wa[g][f][q] = pair_bits(e[0], e[1]);
                }
    } else {
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < KC; ++i) {
                const int k = kc * KC + i, j = j0 + jj;
                const bool in = computes && k < K;
                const int64_t at = Backward ? (int64_t)k * p.ldw + j : (int64_t)(g * S + j) * p.ldw + k;
                w[g][i] = in ? prl::load(p.w_h[at]) : A(0);
            }
    }

    // The (row, column) pairs this thread finishes each step: pair o is element tid + o *
    // blockDim.x of the tile (BT * JT <= O * blockDim.x: one each or none, or up to O); each
    // pair's cell (forward) or the gradient of its cell (backward) stays in a register.
    int out_r[O], out_c[O], out_b[O], out_j[O];
    int64_t k_own[O], kg_own[O];  // the pair's element of [B, S] and of [B, 3S]
    bool owns[O];
    A carried[O];
#pragma unroll
    for (int o = 0; o < O; ++o) {
        const int e = tid + o * (int)blockDim.x;
        out_r[o] = e / JT;
        out_c[o] = e - out_r[o] * JT;
        out_b[o] = b0 + out_r[o];
        out_j[o] = j0 + out_c[o];
        owns[o] = e < BT * JT && out_b[o] < B && out_j[o] < S;
        k_own[o] = (int64_t)out_b[o] * S + out_j[o];
        kg_own[o] = (int64_t)out_b[o] * 3 * S + out_j[o];
        carried[o] = A(0);
        if (owns[o])
            carried[o] = Backward ? (p.grad_c_n ? prl::load(p.grad_c_n[k_own[o]]) : A(0)) : prl::load(p.c0[k_own[o]]);
    }

    cg::grid_group grid = cg::this_grid();
    const int phases = Backward ? p.steps + 1 : p.steps;
    const int width = Mma ? k_tiles * 16 : NK * KC;  // staged columns (zeros past K)
    // One column tile: every column of a row is in this block, so the product's operand (h_{t-1},
    // or d_gates[t+1]) is what this block's owners wrote the step before.  They write it into
    // the staged rows too (as stored, rounded to T), and the steps are separated by the block's
    // barrier, not the grid's: no block waits for another.  The backward's rows start at zero
    // (a row not yet begun contributes nothing).
    // A cluster: the column tiles of a row tile are the blocks of one cluster, and the owners
    // write into the staged rows of every block of it (distributed shared memory), into the
    // buffer the next step reads (step s reads buffer s % 2: a block may still read this step's
    // while another writes the next), and the cluster's barrier separates the steps.  Both
    // buffers start at zero (their padding is read, and a row not yet begun contributes nothing).
    // The tensor cores read whole n-tiles of 8 rows, zeros past BT.
    const bool local = SC ? true : p.local, own_rows = local || clustered;
    if (Mma || (local && Backward) || clustered) {
        for (int i = tid; i < (clustered ? 2 : 1) * RB; i += blockDim.x) staged[i] = ST{};
        if (clustered) cluster_sync();
        else __syncthreads();
    }
    // writes value at column c of this thread's staged row, in the buffer the next step reads;
    // never in the last step (no step reads it, and another block of the cluster may have
    // exited: its shared memory is gone)
    auto put = [&](ST *buffer, int r, int c, ST value) {
        const int at = r * RS + staged_col<LC>(c);
        if (clustered) put_in_cluster(buffer, at, value, p.cluster);
        else buffer[at] = value;
    };
    // Step t's rows start at row `first` of the step-major buffers (t * B when every step has
    // all B rows); a row past a packed step's size has ended (forward: its state is final) or
    // not yet begun (backward: its gradient is still grad_c_n) and is left alone.
    int64_t first = 0;
    if (Backward) {  // the backward starts past the last step: after every row
        if (p.sizes) {
#pragma unroll 8
            for (int t = 0; t < p.steps; ++t) first += __ldg(p.sizes + t);
        } else {
            first = (int64_t)p.steps * B;
        }
    }
    int64_t before = 0;  // the first row of the step the product reads: t - 1 (forward) or t + 1 (backward)
    // The backward's sizes of steps t + 1, t and t - 1, carried from step to step: one load a
    // step, of step t - 2's size, used a step later.  Loaded where they were used (t - 1's for
    // the previous cell's address, after the step's own loads), the wait for that load also
    // waited for the own loads issued before it (they share a scoreboard): the owners stalled
    // there each step until their operands arrived (ncu, H200: long-scoreboard stalls at that
    // instruction were 20% of the S = 64 backward's samples; benchmarks/NOTES.md).
    int size_after = 0, size_here = rows_at(p, p.steps - 1), size_before = rows_at(p, p.steps - 2);
    for (int s = 0; s < phases; ++s) {
        const int t = Backward ? p.steps - 1 - s : s;  // the step; -1: the backward's d_h0 phase
        const int rows = t < 0 ? B : Backward ? size_here : rows_at(p, t);
        const int size_further = Backward ? rows_at(p, t - 2) : 0;
        if (Backward) {
            before = first;
            first -= size_here;
        }
        // the product's left operand, h_{t-1} or d_gates[t + 1], has `src_rows` rows: those of
        // step t (forward), or of step t + 1 (backward; none at the last step); a block with
        // none of them has no product this step
        const int src_rows = Backward ? size_after : rows;
        const bool product = (!Backward || s > 0) && b0 < src_rows;
        bool mine[O];  // this thread's pair o is in step t
#pragma unroll
        for (int o = 0; o < O; ++o) mine[o] = owns[o] && out_b[o] < rows;
        ST *const reads = clustered && (s & 1) ? staged + RB : staged;  // this step's staged rows
        ST *const writes = clustered && !(s & 1) ? staged + RB : staged;  // the next step's
        // this step's own operands, none written by another block: loaded first, they arrive
        // while the product runs.  Kept as stored until their use after it: a 16-bit value
        // converted where it is loaded made the warp wait for the load there, before the
        // product (H100: a bfloat16 step took 1.24x a float32 one at (B, S) = (16, 64),
        // benchmarks/NOTES.md).
        T g_own[O][3], extra[O], old_own[O];
#pragma unroll
        for (int o = 0; o < O; ++o) {
            g_own[o][0] = g_own[o][1] = g_own[o][2] = extra[o] = old_own[o] = T{};
            if (mine[o] && t >= 0) {
                const int64_t at = first * S + k_own[o], at_g = first * 3 * S + kg_own[o];
#pragma unroll
                for (int i = 0; i < 3; ++i) g_own[o][i] = p.gates[at_g + i * S];
                if (Backward) {
                    extra[o] = p.grad_output[at];
                    old_own[o] = t == 0 ? p.c0[k_own[o]] : p.cells[(first - size_before) * S + k_own[o]];
                }
            }
        }
        if (product) {
            if (!own_rows || (!Backward && t == 0)) {
                const T *src = Backward ? p.d_gates + before * 3 * S : (t == 0 ? p.h0 : p.output + before * S);
                if (p.vec) stage_rows<T, ST, LC, V>(reads, RS, src, b0, BT, src_rows, K, width);
                else stage_rows<T, ST, LC, 1>(reads, RS, src, b0, BT, src_rows, K, width);
                __syncthreads();
            }
            if constexpr (Mma) {  // each warp: its column group's outputs over its k-tiles, 8 rows at a time
                constexpr int MG = kMmaGates<Backward>, MT = kMmaTiles<Backward>, C = Backward ? 4 : 2;
                for (int n0 = 0; n0 < BT; n0 += 8) {
                    float acc[MG][C][4] = {};  // C independent sums per output: the mma's latency hidden
                    const ST *b = reads + (n0 + gid) * RS + kt0 * 16 + tig * 2;  // B: k tig * 2 (+ 8), row gid
#pragma unroll
                    for (int f = 0; f < MT; ++f) {
                        if (f < kts && kt0 + f < k_tiles) {
                            const uint32_t lo = *reinterpret_cast<const uint32_t *>(b + f * 16);
                            const uint32_t hi = *reinterpret_cast<const uint32_t *>(b + f * 16 + 8);
#pragma unroll
                            for (int g = 0; g < MG; ++g) mma_16816<T>(acc[g][f % C], wa[g][f], lo, hi);
                        }
                    }
#pragma unroll
                    for (int g = 0; g < MG; ++g)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {  // d0 .. d3: rows (columns) gid, gid + 8; batch rows tig * 2, + 1
                            const int r = n0 + tig * 2 + (q & 1), c = cg * 16 + gid + (q >> 1) * 8;
                            float total = acc[g][0][q];
#pragma unroll
                            for (int i = 1; i < C; ++i) total += acc[g][i][q];
                            if (r < BT) partial[ks * PS + (r * G + g) * JT + c] = total;
                        }
                }
            } else if (kc < NK) {
                for (int r = 0; r < BT; ++r) {
                    const A *a = reads + r * RS + kc * (KC + kPad);
                    constexpr int C = G == 1 ? 4 : 2;  // independent sums per output: FMA latency hidden
                    A acc[G][C];
#pragma unroll
                    for (int g = 0; g < G; ++g)
#pragma unroll
                        for (int q = 0; q < C; ++q) acc[g][q] = A(0);
#pragma unroll
                    for (int i = 0; i < KC; i += 4) {
                        const auto a4 = load4(a + i);
#pragma unroll
                        for (int g = 0; g < G; ++g) fma4(acc[g][(i / 4) % C], &w[g][i], a4);
                    }
#pragma unroll
                    for (int g = 0; g < G; ++g) {
                        A total = acc[g][0];
#pragma unroll
                        for (int q = 1; q < C; ++q) total += acc[g][q];
                        partial[kc * PS + (r * G + g) * JT + jj] = total;
                    }
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int o = 0; o < O; ++o) {
            if (!mine[o]) continue;
            const int64_t at = first * S + k_own[o], at_g = first * 3 * S + kg_own[o];
            // each output's partial sums, in the order q = 0, 1, ...; on CUDA cores the gates'
            // sums side by side, so that their shared-memory reads overlap (0.84-0.90x the time
            // of a sum at a time at small states; the tensor-core kernels took 1.05-1.2x with it:
            // benchmarks/NOTES.md)
            A sum[G];
#pragma unroll
            for (int g = 0; g < G; ++g) sum[g] = A(0);
            if (product) {
                const A *part = partial + out_r[o] * G * JT + out_c[o];
                if constexpr (Mma) {
#pragma unroll
                    for (int g = 0; g < G; ++g)
                        for (int q = 0; q < NK; ++q) sum[g] += part[q * PS + g * JT];
                } else {
#pragma unroll 4
                    for (int q = 0; q < NK; ++q)
#pragma unroll
                        for (int g = 0; g < G; ++g) sum[g] += part[q * PS + g * JT];
                }
            }
            if (Backward && t < 0) {  // d_h0 = d_gates[0] W_h
                p.d_h0[k_own[o]] = prl::store<T>(sum[0]);
            } else if (!Backward) {
                T *g_t = p.gates + at_g;
                A g[3], h, c_new;
#pragma unroll
                for (int i = 0; i < 3; ++i) {  // the pre-activations as stored, as the step-by-step path reads them
                    const T stored = prl::store<T>(prl::load(g_own[o][i]) + sum[i]);
                    g_t[i * S] = stored;
                    g[i] = prl::load(stored);
                }
                prl::lltm_forward_math<T>(g[0], g[1], g[2], carried[o], h, c_new);
                const T c_stored = prl::store<T>(c_new), h_stored = prl::store<T>(h);
                p.output[at] = h_stored;
                if (own_rows && s + 1 < phases) put(writes, out_r[o], out_j[o], to_staged<ST>(h_stored));
                p.cells[at] = c_stored;
                if (p.c_n && out_b[o] >= rows_at(p, t + 1)) p.c_n[k_own[o]] = c_stored;  // the row's last step
                carried[o] = prl::load(c_stored);  // the next step reads the cell as stored
            } else {
                // the gradient reaching h_t (rounded as the step-by-step path stores it), and new_cell's
                const A grad_h = prl::load(prl::store<T>(prl::load(extra[o]) + sum[0]));
                A d[3], d_cell;
                prl::lltm_backward_math<T>(grad_h, carried[o], prl::load(g_own[o][0]), prl::load(g_own[o][1]),
                                           prl::load(g_own[o][2]), prl::load(old_own[o]), d[0], d[1], d[2],
                                           d_cell);
                T *dg = p.d_gates + at_g;
#pragma unroll
                for (int i = 0; i < 3; ++i) {
                    const T stored = prl::store<T>(d[i]);
                    dg[i * S] = stored;
                    if (own_rows && s + 1 < phases) put(writes, out_r[o], i * S + out_j[o], to_staged<ST>(stored));
                }
                const T d_cell_stored = prl::store<T>(d_cell);
                carried[o] = prl::load(d_cell_stored);
                if (t == 0) p.d_c0[k_own[o]] = d_cell_stored;
            }
        }
        if (Backward) {
            size_after = size_here;
            size_here = size_before;
            size_before = size_further;
        } else {
            before = first;
            first += rows;
        }
        if (s + 1 < phases) {  // step t is written everywhere (local: in this block; a cluster: in it)
            if (clustered) cluster_sync();
            else if (local) __syncthreads();
            else grid.sync();
        }
    }
}

// The forward for state size SC on CUDA cores, a thread a gate row (3 * SC threads): thread g
// holds row g of W_h (gate g / SC of column g % SC) and forms that gate's pre-activation for each
// of the block's BT rows (at most kRowsMax) over all SC of the k, then activates it; after the
// block's barrier the first SC threads combine a column's three activations into its cell and h.
// lltm_sequence_kernel<SC> splits the k of three gates among two threads and finishes the whole
// cell in one: a step there was one long dependent chain in the owning warps (benchmarks/NOTES.md).
// The same sums in the same order as lltm_sequence_kernel<SC> (chunks of KC, two sums each, added
// chunk by chunk), the same activations and cell: the same bits.  A step's own pre-activation
// inputs are loaded a step ahead.
constexpr int kRowsMax = 4;

template <typename T, int SC>
__global__ void __launch_bounds__(3 * SC) lltm_forward_rows_kernel(SequenceArgs<T> p) {
    using A = prl::acc_t<T>;
    constexpr int S = SC, G3 = 3 * SC, KC = kWeights<A, false>, NK = S / KC;
    static_assert(S % KC == 0 && KC % 8 == 0 && S % 32 == 0, "whole chunks, whole warps");
    const int B = p.batch, BT = p.bt, tid = threadIdx.x, gate = tid / S;
    const int b0 = blockIdx.x * BT;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    A *staged = reinterpret_cast<A *>(shared_raw);  // [BT][S]: h_{t-1} of the block's rows, as stored
    A *active = staged + BT * S;                     // [BT][3S]: the step's activations

    A w[S];
#pragma unroll
    for (int k = 0; k < S; ++k) w[k] = prl::load(p.w_h[(int64_t)tid * p.ldw + k]);
    A carried[kRowsMax];  // thread j < S: the cell of (b0 + r, j)
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r)
        carried[r] = tid < S && r < BT && b0 + r < B ? prl::load(p.c0[(int64_t)(b0 + r) * S + tid]) : A(0);
    for (int i = tid; i < BT * S; i += blockDim.x)
        staged[i] = b0 + i / S < B ? prl::load(p.h0[(int64_t)b0 * S + i]) : A(0);

    int rows = rows_at(p, 0);
    int64_t first = 0;  // step t's first row in the step-major buffers
    T own[kRowsMax];    // gates[t] of this thread's gate row, as stored (x_t W_x^T + b)
#pragma unroll
    for (int r = 0; r < kRowsMax; ++r)
        own[r] = r < BT && b0 + r < rows ? p.gates[(first + b0 + r) * G3 + tid] : T{};
    __syncthreads();
    for (int t = 0; t < p.steps; ++t) {
        const int next_rows = rows_at(p, t + 1);
        const int64_t next = first + rows;
        T ahead[kRowsMax];
#pragma unroll
        for (int r = 0; r < kRowsMax; ++r)
            ahead[r] = r < BT && b0 + r < next_rows ? p.gates[(next + b0 + r) * G3 + tid] : T{};
#pragma unroll
        for (int r = 0; r < kRowsMax; ++r) {
            if (r >= BT || b0 + r >= rows) break;  // a packed step's rows are its first ones
            const A *a = staged + r * S;
            A acc[NK][2];
#pragma unroll
            for (int c = 0; c < NK; ++c) acc[c][0] = acc[c][1] = A(0);
#pragma unroll
            for (int c = 0; c < NK; ++c)
#pragma unroll
                for (int i = 0; i < KC; i += 4) fma4(acc[c][(i / 4) % 2], &w[c * KC + i], load4(a + c * KC + i));
            A sum = A(0);
#pragma unroll
            for (int c = 0; c < NK; ++c) {
                const A part = acc[c][0] + acc[c][1];
                sum += part;
            }
            const T stored = prl::store<T>(prl::load(own[r]) + sum);
            p.gates[(first + b0 + r) * G3 + tid] = stored;  // the pre-activations as stored, as the steps read them
            active[r * G3 + tid] = prl::lltm_activation<T>(gate, prl::load(stored));
        }
        __syncthreads();
        if (tid < S) {
#pragma unroll
            for (int r = 0; r < kRowsMax; ++r) {
                if (r >= BT || b0 + r >= rows) break;
                const A *act = active + r * G3 + tid;
                A h, c_new;
                prl::lltm_cell_of<A>(act[0], act[S], act[2 * S], carried[r], h, c_new);
                const T c_stored = prl::store<T>(c_new), h_stored = prl::store<T>(h);
                const int64_t at = (first + b0 + r) * S + tid;
                p.output[at] = h_stored;
                p.cells[at] = c_stored;
                if (p.c_n && b0 + r >= next_rows) p.c_n[(int64_t)(b0 + r) * S + tid] = c_stored;  // its last step
                staged[r * S + tid] = prl::load(h_stored);
                carried[r] = prl::load(c_stored);  // the next step reads the cell as stored
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kRowsMax; ++r) own[r] = ahead[r];
        first = next;
        rows = next_rows;
    }
}

// ---- planning: the tile that fits in one co-resident grid ----------------------------------

struct Plan {
    Shape shape;
    int bt = 0, blocks = 0;
    int sc = 0;       // > 0: the kernel for this state size (state_kernel)
    int cluster = 0;  // > 1: blocks per cluster (the column tiles), launched as clusters
    int own = 1;      // (row, column) pairs a thread finishes (kMmaOwn: that kernel)
    int64_t smem = 0;
    bool fits() const { return blocks > 0; }
};

// The state sizes with a kernel of their own (SC above), taken where the plan's tile is one
// block of exactly their columns: 64 on CUDA cores, 128 on tensor cores.  Their loops' sizes fold
// into the code.  On an H100 (2026-11-27, the kernels' GPU time, torch.profiler, 3 alternating
// processes each): at S = 64 0.82-0.90x the backward's time (B = 1-64), the forward's 0.76-0.82x
// in 16 bits and 0.88-0.95x in float32 (1.03x at B = 64); at S = 128 in 16 bits 0.67-0.73x the
// forward's, 0.71-0.83x the backward's (B = 1-64).  The same sums in the same order, so the same
// bits.  PYROUNDLIB_STATE_KERNELS=0 keeps every size on the general kernel (the with-and-without).
// At S = 64 the forward is lltm_forward_rows_kernel, a thread a gate row: on an H200 (2026-11-28,
// CUDA events, 7 interleaved rounds in one process) 0.56-0.76x the time of lltm_sequence_kernel<64>
// in float32 inference at seven (T, B) from (200, 1) to (1000, 64), 0.76-0.89x in bfloat16 at five
// of them; the same bits.
constexpr int kStateKernel = 64, kMmaStateKernel = 128;
bool state_kernels_off() {
    const char *value = std::getenv("PYROUNDLIB_STATE_KERNELS");
    return value && std::strcmp(value, "0") == 0;
}
template <typename T> int state_kernel(const Shape &shape, int64_t state) {
    const int sc = shape.mma ? kMmaStateKernel : std::is_same<T, double>::value ? 0 : kStateKernel;
    return sc && state == sc && shape.jt == state && !state_kernels_off() ? sc : 0;
}

template <typename T, bool Backward> void *kernel_of(bool mma, bool cluster, int sc = 0, int own = 1) {
    if constexpr (prl::stored_in_16_bits<T>::value)
        if (mma && own > 1)
            return reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, true, false, 0, kMmaOwn>);
    if constexpr (!std::is_same<T, double>::value)
        if (sc == kStateKernel)  // the forward: a thread a gate row
            return Backward ? reinterpret_cast<void *>(&lltm_sequence_kernel<T, true, false, false, kStateKernel>)
                            : reinterpret_cast<void *>(&lltm_forward_rows_kernel<T, kStateKernel>);
    if constexpr (prl::stored_in_16_bits<T>::value)
        if (sc == kMmaStateKernel)
            return reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, true, false, kMmaStateKernel>);
    if constexpr (prl::stored_in_16_bits<T>::value)
        if (mma)
            return cluster ? reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, true, true>)
                           : reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, true, false>);
    return cluster ? reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, false, true>)
                   : reinterpret_cast<void *>(&lltm_sequence_kernel<T, Backward, false, false>);
}

// A launch of `blocks` blocks as clusters of `cluster` (sm_90+): the occupancy query's and the
// launch's configuration.
struct ClusterLaunch {
    cudaLaunchAttribute attribute{};
    cudaLaunchConfig_t config{};
    ClusterLaunch(int cluster, int64_t blocks, int threads, int64_t smem, cudaStream_t stream) {
        attribute.id = cudaLaunchAttributeClusterDimension;
        attribute.val.clusterDim.x = (unsigned)cluster;
        attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
        config.gridDim = dim3((unsigned)blocks);
        config.blockDim = dim3((unsigned)threads);
        config.dynamicSmemBytes = (size_t)smem;
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
    }
    ClusterLaunch(const ClusterLaunch &) = delete;  // config points at attribute
    ClusterLaunch &operator=(const ClusterLaunch &) = delete;
};

// Where 16-bit products take the tensor cores (sm_80+): PYROUNDLIB_TENSOR_CORES unset, by the
// plan's rule (make_plan); =1 wherever their tile fits, =0 never (diagnostics: each product
// measured and tested on one GPU, the CUDA cores' as older GPUs run it).
enum TensorCores { kTensorCoresNever, kTensorCoresAlways, kTensorCoresByRule };
TensorCores tensor_cores_setting() {
    const char *value = std::getenv("PYROUNDLIB_TENSOR_CORES");
    if (value && std::strcmp(value, "0") == 0) return kTensorCoresNever;
    if (value && std::strcmp(value, "1") == 0) return kTensorCoresAlways;
    return kTensorCoresByRule;
}

// B * S * S from which a 16-bit step's product takes the tensor cores, whatever the tiles.
constexpr int64_t kMmaMinWork = int64_t(1) << 20;

// The smallest power-of-two row tile whose grid is co-resident: the most blocks, each
// with the least work per step.  Fills `plan` or leaves it empty (does not fit); returns
// a CUDA error of the queries.  16-bit types on sm_80+ take the tensor cores (where their tile
// fits) by `tensor_cores`; by the rule, where their tile holds every state column and the
// CUDA cores' does not (the step then needs no other block), where a step's product is large
// (B * S * S >= kMmaMinWork), or where the CUDA cores' tile does not fit.  Elsewhere the CUDA
// cores' step is quicker: on an H100 (one run, 2026-11-26, sequences of 500-1000 steps) the
// tensor cores took 1.36-1.45x their time at (B, S) = (16, 64), both tiles one block of
// columns, and 1.09-1.12x at (4, 256), a cluster of 4 against one of 16; 0.67-0.90x from
// B * S * S = 2^20 up, and 0.85-0.88x at (1, 128), one block against a cluster of 4.
template <typename T, bool Backward>
cudaError_t make_plan(int64_t batch, int64_t state, int device, TensorCores tensor_cores, Plan &plan) {
    using A = prl::acc_t<T>;
    plan = Plan{};
    if (batch <= 0 || state <= 0 || batch * 3 * state >= (int64_t(1) << 31)) return cudaSuccess;
    int sms = 0, smem_max = 0, cooperative = 0, major = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess || !cooperative) return err;
    Shape shape = shape_of<A, Backward>(state);
    if (prl::stored_in_16_bits<T>::value && tensor_cores != kTensorCoresNever && major >= 8) {
        const Shape mma = mma_shape_of<Backward>(state);
        const bool by_rule = (mma.jt >= state && shape.jt < state) || batch * state * state >= kMmaMinWork
                             || shape.jt == 0;
        if (mma.jt && (tensor_cores == kTensorCoresAlways || by_rule)) shape = mma;
    }
    if (shape.jt == 0) return cudaSuccess;
    int sc = state_kernel<T>(shape, state);
    if (!Backward && sc == kStateKernel) {  // a thread a gate row (3S threads), up to kRowsMax rows a block
        void *rows = kernel_of<T, Backward>(false, false, sc);
        err = cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max);
        if (err != cudaSuccess) return err;
        const int threads = 3 * (int)state;
        for (int64_t bt = 1; bt <= kRowsMax; bt *= 2) {
            const int64_t smem = bt * 4 * state * (int64_t)sizeof(A), blocks = (batch + bt - 1) / bt;
            int per_sm = 0;
            err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rows, threads, (size_t)smem);
            if (err != cudaSuccess) return err;
            if (smem <= smem_max && blocks <= (int64_t)per_sm * sms) {
                plan.shape = shape;
                plan.shape.threads = threads;
                plan.bt = (int)bt;
                plan.blocks = (int)blocks;
                plan.smem = smem;
                plan.sc = sc;
                return cudaSuccess;
            }
            if (bt >= batch) break;
        }
        sc = 0;  // too many rows for its grid: the general kernel
    }
    void *kernel = kernel_of<T, Backward>(shape.mma, false, sc);
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max);
    if (err != cudaSuccess) return err;
    const int64_t j_tiles = (state + shape.jt - 1) / shape.jt;
    // sm_90 and later: the column tiles of a row tile as one cluster, where one fits (at most
    // kMaxCluster blocks) and every cluster of the grid is resident at once
    if (major >= 9 && j_tiles > 1 && j_tiles <= kMaxCluster) {
        void *clustered = kernel_of<T, Backward>(shape.mma, true);
        const bool portable = j_tiles <= 8;
        err = cudaFuncSetAttribute(clustered, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max);
        if (err != cudaSuccess) return err;
        if (portable || cudaFuncSetAttribute(clustered, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
            for (int64_t bt = 1;; bt *= 2) {
                const int64_t smem = shared_bytes<A, Backward>(shape, (int)bt, 2);
                if (smem > smem_max || bt * shape.jt > shape.threads) break;
                const int64_t blocks = j_tiles * ((batch + bt - 1) / bt);
                const ClusterLaunch launch((int)j_tiles, blocks, shape.threads, smem, nullptr);
                int clusters = 0;
                if (cudaOccupancyMaxActiveClusters(&clusters, clustered, &launch.config) != cudaSuccess) {
                    (void)cudaGetLastError();  // no cluster of this size here: the grid barrier instead
                    break;
                }
                if (blocks <= (int64_t)clusters * j_tiles) {
                    plan.shape = shape;
                    plan.bt = (int)bt;
                    plan.blocks = (int)blocks;
                    plan.smem = smem;
                    plan.cluster = (int)j_tiles;
                    return cudaSuccess;
                }
                if (bt >= batch) break;
            }
        } else {
            (void)cudaGetLastError();
        }
    }
    // One pair a thread first; then, for the tensor cores' general tile, row tiles of up to
    // kMmaOwn pairs a thread (the same sums: only where no tile of one pair fits).
    for (int own = 1; own <= kMmaOwn; own *= kMmaOwn) {
        if (own > 1) {
            if (!shape.mma || sc) break;
            kernel = kernel_of<T, Backward>(true, false, 0, own);
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max);
            if (err != cudaSuccess) return err;
        }
        for (int64_t bt = 1;; bt *= 2) {
            const int64_t smem = shared_bytes<A, Backward>(shape, (int)bt);
            if (smem > smem_max || bt * shape.jt > (int64_t)own * shape.threads) break;  // pairs a thread: own at most
            const int64_t blocks = j_tiles * ((batch + bt - 1) / bt);
            int per_sm = 0;
            err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, shape.threads, (size_t)smem);
            if (err != cudaSuccess) return err;
            if (blocks <= (int64_t)per_sm * sms) {
                plan.shape = shape;
                plan.bt = (int)bt;
                plan.blocks = (int)blocks;
                plan.smem = smem;
                plan.sc = sc;
                plan.own = own;
                return cudaSuccess;
            }
            if (bt >= batch) break;
        }
    }
    return cudaSuccess;
}

// Plans are made once per (device, dtype, direction, batch, state) and kept.
template <typename T, bool Backward>
cudaError_t cached_plan(int64_t batch, int64_t state, int dtype, int device, Plan &plan) {
    using Key = std::tuple<int, int, bool, int64_t, int64_t, int, bool>;
    static std::mutex mutex;
    static std::map<Key, Plan> plans;
    const TensorCores tensor_cores = tensor_cores_setting();
    const Key key{device, dtype, Backward, batch, state, tensor_cores, state_kernels_off()};
    {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = plans.find(key);
        if (it != plans.end()) {
            plan = it->second;
            return cudaSuccess;
        }
    }
    const cudaError_t err = make_plan<T, Backward>(batch, state, device, tensor_cores, plan);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> lock(mutex);
    if (plans.size() < 4096) plans.emplace(key, plan);
    return cudaSuccess;
}

// The grid of one direction for (batch, state) on the current device `device`, planned
// once (cached_plan); an error status when it does not fit.
template <typename T, bool Backward>
prl_status plan_sequence(const char *fn, int64_t batch, int64_t state, int dtype, int device, Plan &plan) {
    const cudaError_t err = cached_plan<T, Backward>(batch, state, dtype, device, plan);
    if (err != cudaSuccess) return prl::cuda_fail(fn, "planning the persistent grid", err);
    if (!plan.fits())
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT,
                         "%s: batch=%lld, state=%lld does not fit in one co-resident grid on CUDA device %d "
                         "(prl_lltm_sequence_cuda_fits says so): run the steps one by one", fn, (long long)batch,
                         (long long)state, device);
    return PRL_SUCCESS;
}

// Launches the planned grid on `stream`, on the current device; never synchronises.
template <typename T, bool Backward>
prl_status launch_planned(const char *fn, SequenceArgs<T> args, const Plan &plan, void *stream) {
    args.jt = plan.shape.jt;
    args.bt = plan.bt;
    args.local = plan.shape.jt >= args.state;
    args.cluster = plan.cluster;
    void *params[] = {&args};
    cudaError_t err;
    if (plan.cluster > 1) {  // no grid barrier: the row tiles' clusters are independent
        const ClusterLaunch launch(plan.cluster, plan.blocks, plan.shape.threads, plan.smem,
                                   static_cast<cudaStream_t>(stream));
        err = cudaLaunchKernelExC(&launch.config, kernel_of<T, Backward>(plan.shape.mma, true), params);
    } else {
        err = cudaLaunchCooperativeKernel(kernel_of<T, Backward>(plan.shape.mma, false, plan.sc, plan.own),
                                          dim3(plan.blocks), dim3(plan.shape.threads), params, (size_t)plan.smem,
                                          static_cast<cudaStream_t>(stream));
    }
    if (err != cudaSuccess) return prl::cuda_fail(fn, "the persistent kernel launch", err);
    return PRL_SUCCESS;
}

// Plans the grid (or reuses the plan) and launches it on `stream`; never synchronises.
template <typename T, bool Backward>
prl_status launch_sequence(const char *fn, SequenceArgs<T> args, int dtype, int device, void *stream) {
    prl::DeviceGuard guard(device);
    if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
    Plan plan;
    PRL_TRY((plan_sequence<T, Backward>(fn, args.batch, args.state, dtype, guard.device(), plan)));
    return launch_planned<T, Backward>(fn, args, plan, stream);
}

// ---- the input half of every step: gates = x W_x^T + b, one tiled product ------------------------
// gates[r][n] = b[n] + sum_k x[r][k] w[n][S + k] over the rows r = t*B + b of all steps: tiles of
// 64 rows x 64 gates, a block of 16 x 16 threads with 4 x 4 of them each, the input features
// staged through shared memory 16 at a time.  On CUDA cores in acc_t<T> (float32 without
// TF32), each sum in a fixed order.  It runs before the recurrence in the same library call:
// a GEMM launched from Python first would cost that call's host time before the GPU starts.
constexpr int kHalfTile = 64, kHalfK = 16, kHalfThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kHalfThreads)
    input_half_kernel(const T *__restrict__ x, const T *__restrict__ w, int64_t ldw, int64_t state,
                      const T *__restrict__ bias, T *__restrict__ gates, int64_t rows, int64_t features,
                      int64_t tiles_n) {
    using A = prl::acc_t<T>;
    __shared__ __align__(16) A xs[kHalfK][kHalfTile + 4], ws[kHalfK][kHalfTile + 4];  // [k][row], [k][gate]
    const int64_t cols = 3 * state;
    const int64_t r0 = (int64_t)(blockIdx.x / tiles_n) * kHalfTile, n0 = (int64_t)(blockIdx.x % tiles_n) * kHalfTile;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int lr = threadIdx.x / 4, lk = threadIdx.x % 4 * 4;  // stages row lr, features lk .. lk + 3
    const bool x_in = r0 + lr < rows, w_in = n0 + lr < cols;
    const T *x_row = x + (x_in ? (r0 + lr) * features : 0);
    const T *w_row = w + (w_in ? (n0 + lr) * ldw + state : 0);
    A acc[4][4] = {};
    for (int64_t k0 = 0; k0 < features; k0 += kHalfK) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t k = k0 + lk + j;
            xs[lk + j][lr] = x_in && k < features ? prl::load(x_row[k]) : A(0);
            ws[lk + j][lr] = w_in && k < features ? prl::load(w_row[k]) : A(0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kHalfK; ++kk) {
            A a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = xs[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t r = r0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t n = n0 + tx * 4 + j;
            if (r < rows && n < cols) gates[r * cols + n] = prl::store<T>(acc[i][j] + prl::load(bias[n]));
        }
    }
}

// The arguments both directions share; each entry point adds its buffers.
template <typename T>
SequenceArgs<T> shared_args(const void *w_h, int64_t ldw, int64_t steps, int64_t batch, int64_t state) {
    SequenceArgs<T> args{};
    args.w_h = static_cast<const T *>(w_h);
    args.ldw = ldw;
    args.steps = (int)steps;
    args.batch = (int)batch;
    args.state = (int)state;
    return args;
}

// The forward's arguments: the shared ones and its buffers.
template <typename T>
SequenceArgs<T> forward_args(void *gates, const void *w_h, int64_t ldw, const void *h0, const void *c0, void *output,
                             void *cells, void *c_n, int64_t steps, int64_t batch, int64_t state) {
    SequenceArgs<T> args = shared_args<T>(w_h, ldw, steps, batch, state);
    args.gates = static_cast<T *>(gates);
    args.h0 = static_cast<const T *>(h0);
    args.c0 = static_cast<const T *>(c0);
    args.output = static_cast<T *>(output);
    args.cells = static_cast<T *>(cells);
    args.c_n = static_cast<T *>(c_n);
    args.vec = state % prl::kVec16<T> == 0 && prl::aligned16(h0) && prl::aligned16(output);
    return args;
}

// The recurrence's forward over all rows of every step (sizes NULL) or a packed batch's.
prl_status sequence_forward(const char *fn, void *gates, const void *w_h, int64_t ldw, const void *h0, const void *c0,
                            void *output, void *cells, void *c_n, const int64_t *sizes, int64_t steps, int64_t batch,
                            int64_t state, int dtype, int device, void *stream) {
    PRL_TRY(prl::check_sequence_forward_args(fn, gates, w_h, ldw, h0, c0, output, cells, steps, batch, state));
    const int64_t all = steps * batch * state;
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all == 0) return PRL_SUCCESS;
        SequenceArgs<T> args = forward_args<T>(gates, w_h, ldw, h0, c0, output, cells, c_n, steps, batch, state);
        args.sizes = sizes;
        return launch_sequence<T, false>(fn, args, dtype, device, stream);
    });
}

// The recurrence's backward, likewise.
prl_status sequence_backward(const char *fn, const void *grad_output, const void *grad_c_n, const void *gates,
                             const void *w_h, int64_t ldw, const void *c0, const void *cells, void *d_gates,
                             void *d_h0, void *d_c0, const int64_t *sizes, int64_t steps, int64_t batch,
                             int64_t state, int dtype, int device, void *stream) {
    PRL_TRY(prl::check_sequence_backward_args(fn, grad_output, gates, w_h, ldw, c0, cells, d_gates, d_h0, d_c0, steps,
                                              batch, state));
    const int64_t all = steps * batch * state;
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (all == 0) return PRL_SUCCESS;
        SequenceArgs<T> args = shared_args<T>(w_h, ldw, steps, batch, state);
        args.grad_output = static_cast<const T *>(grad_output);
        args.grad_c_n = static_cast<const T *>(grad_c_n);
        args.gates = const_cast<T *>(static_cast<const T *>(gates));  // read only in the backward
        args.c0 = static_cast<const T *>(c0);
        args.cells = const_cast<T *>(static_cast<const T *>(cells));
        args.d_gates = static_cast<T *>(d_gates);
        args.d_h0 = static_cast<T *>(d_h0);
        args.d_c0 = static_cast<T *>(d_c0);
        args.sizes = sizes;
        args.vec = state % prl::kVec16<T> == 0 && prl::aligned16(d_gates);
        return launch_sequence<T, true>(fn, args, dtype, device, stream);
    });
}

// Copies n <= kUploadCount values carried in the kernel's parameters to dst.
constexpr int kUploadCount = 480;  // 3840 bytes: with dst and n, within the 4 KiB of parameters any CUDA takes
struct UploadChunk {
    int64_t values[kUploadCount];
};
__global__ void upload_kernel(UploadChunk chunk, int64_t *dst, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = chunk.values[i];
}

}  // namespace

extern "C" PRL_API prl_status prl_lltm_sequence_cuda_fits(int64_t batch, int64_t state, int dtype, int device,
                                                          int *fits) {
    PRL_API_BEGIN
    const char *fn = __func__;
    if (fits == nullptr) return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'fits' is NULL", fn);
    *fits = 0;
    PRL_TRY(prl::check_lltm_sizes(fn, batch, state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        Plan forward, backward;
        cudaError_t err = cached_plan<T, false>(batch, state, dtype, guard.device(), forward);
        if (err == cudaSuccess) err = cached_plan<T, true>(batch, state, dtype, guard.device(), backward);
        if (err != cudaSuccess) return prl::cuda_fail(fn, "planning the persistent grid", err);
        *fits = !(forward.fits() && backward.fits()) ? 0 : forward.own > 1 || backward.own > 1 ? 2 : 1;
        return PRL_SUCCESS;
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_forward_cuda(void *gates, const void *w_h, int64_t ldw,
                                                             const void *h0, const void *c0, void *output,
                                                             void *cells, void *c_n, int64_t steps, int64_t batch,
                                                             int64_t state, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    return sequence_forward(__func__, gates, w_h, ldw, h0, c0, output, cells, c_n, nullptr, steps, batch, state,
                            dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_packed_forward_cuda(void *gates, const void *w_h, int64_t ldw,
                                                                    const void *h0, const void *c0, void *output,
                                                                    void *cells, void *c_n,
                                                                    const int64_t *batch_sizes, int64_t steps,
                                                                    int64_t batch, int64_t state, int dtype,
                                                                    int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    if (batch_sizes == nullptr) return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'batch_sizes' is NULL", fn);
    return sequence_forward(fn, gates, w_h, ldw, h0, c0, output, cells, c_n, batch_sizes, steps, batch, state, dtype,
                            device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_upload_cuda(void *dst, const int64_t *src, int64_t count, int device,
                                              void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_count(fn, "count", count));
    PRL_TRY(prl::check_pointer(fn, "dst", dst, count));
    PRL_TRY(prl::check_pointer(fn, "src", src, count));
    return prl::cuda_launch(fn, device, [&] {
        for (int64_t done = 0; done < count; done += kUploadCount) {
            const int n = (int)(count - done < kUploadCount ? count - done : kUploadCount);
            UploadChunk chunk;
            memcpy(chunk.values, src + done, (size_t)n * sizeof(int64_t));
            upload_kernel<<<1, 128, 0, static_cast<cudaStream_t>(stream)>>>(chunk, static_cast<int64_t *>(dst) + done, n);
        }
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_persistent_forward_cuda(
    const void *input, const void *weights, const void *bias, const void *h0, const void *c0, void *output,
    void *cells, void *gates, void *c_n, int64_t steps, int64_t batch, int64_t features, int64_t state, int dtype,
    int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    PRL_TRY(prl::check_count(fn, "features", features));
    const int64_t ldw = state + features;
    PRL_TRY(prl::check_sequence_forward_args(fn, gates, weights, ldw, h0, c0, output, cells, steps, batch, state,
                                              "weights"));
    const int64_t rows = steps * batch, all = rows * state;
    PRL_TRY(prl::check_pointer(fn, "input", input, rows * features));
    PRL_TRY(prl::check_pointer(fn, "bias", bias, all));
    const int64_t tiles_m = (rows + kHalfTile - 1) / kHalfTile, tiles_n = (3 * state + kHalfTile - 1) / kHalfTile;
    if (tiles_m * tiles_n > INT32_MAX)
        return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: steps * batch=%lld rows of 3 * state=%lld gates: too many "
                         "tiles for one grid", fn, (long long)rows, (long long)(3 * state));
    return prl::dispatch_dtype(fn, dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        prl::DeviceGuard guard(device);
        if (guard.error() != cudaSuccess) return prl::cuda_fail(fn, "selecting the CUDA device", guard.error());
        const cudaStream_t s = static_cast<cudaStream_t>(stream);
        if (all == 0) {  // no step: c_n is c0
            const size_t state_bytes = (size_t)(batch * state) * sizeof(T);
            const cudaError_t err = c_n && state_bytes ? cudaMemcpyAsync(c_n, c0, state_bytes, cudaMemcpyDeviceToDevice, s)
                                                       : cudaSuccess;
            return err == cudaSuccess ? PRL_SUCCESS : prl::cuda_fail(fn, "copying c0 to c_n", err);
        }
        Plan plan;  // before any launch: a grid that does not fit launches nothing
        PRL_TRY((plan_sequence<T, false>(fn, batch, state, dtype, guard.device(), plan)));
        input_half_kernel<T><<<(unsigned)(tiles_m * tiles_n), kHalfThreads, 0, s>>>(
            static_cast<const T *>(input), static_cast<const T *>(weights), ldw, state, static_cast<const T *>(bias),
            static_cast<T *>(gates), rows, features, tiles_n);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return prl::cuda_fail(fn, "the input-half launch", err);
        return launch_planned<T, false>(fn, forward_args<T>(gates, weights, ldw, h0, c0, output, cells, c_n, steps,
                                                            batch, state), plan, stream);
    });
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_backward_cuda(const void *grad_output, const void *grad_c_n,
                                                              const void *gates, const void *w_h, int64_t ldw,
                                                              const void *c0, const void *cells, void *d_gates,
                                                              void *d_h0, void *d_c0, int64_t steps, int64_t batch,
                                                              int64_t state, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    return sequence_backward(__func__, grad_output, grad_c_n, gates, w_h, ldw, c0, cells, d_gates, d_h0, d_c0, nullptr,
                             steps, batch, state, dtype, device, stream);
    PRL_API_END
}

extern "C" PRL_API prl_status prl_lltm_sequence_packed_backward_cuda(
    const void *grad_output, const void *grad_c_n, const void *gates, const void *w_h, int64_t ldw, const void *c0,
    const void *cells, void *d_gates, void *d_h0, void *d_c0, const int64_t *batch_sizes, int64_t steps,
    int64_t batch, int64_t state, int dtype, int device, void *stream) {
    PRL_API_BEGIN
    const char *fn = __func__;
    if (batch_sizes == nullptr) return prl::fail(PRL_ERROR_INVALID_ARGUMENT, "%s: argument 'batch_sizes' is NULL", fn);
    return sequence_backward(fn, grad_output, grad_c_n, gates, w_h, ldw, c0, cells, d_gates, d_h0, d_c0, batch_sizes,
                             steps, batch, state, dtype, device, stream);
    PRL_API_END
}
