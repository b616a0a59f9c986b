// grid_experiment.cu - the standalone experiment behind benchmarks/NOTES.md ("GPU kernels"):
// which grid shape / unrolling / cache hint / block size lets a 16-byte-vector round kernel
// (float32, then bfloat16) reach cudaMemcpy bandwidth on this GPU?  Standalone CUDA; build
// and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 benchmarks/grid_experiment.cu -o /tmp/grid && /tmp/grid
#include <cstdio>
#include <vector>
#include <algorithm>
#include <functional>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
struct alignas(16) V4 { float v[4]; };
template <int U, bool HINT>
__global__ void k(const float* x, float* y, long long groups) {
  long long stride = (long long)blockDim.x * gridDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += U * stride) {
    V4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) if (i + u * stride < groups) {
      if (HINT) { float4 t = __ldcs(reinterpret_cast<const float4*>(x) + i + u * stride); v[u] = *reinterpret_cast<V4*>(&t); }
      else v[u] = reinterpret_cast<const V4*>(x)[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) if (i + u * stride < groups) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[u].v[j] = rintf(v[u].v[j]);
      if (HINT) __stcs(reinterpret_cast<float4*>(y) + i + u * stride, *reinterpret_cast<float4*>(&v[u]));
      else reinterpret_cast<V4*>(y)[i + u * stride] = v[u];
    }
  }
}
// one vector per thread, with separate load / store cache hints
template <bool LDCS, bool STCS>
__global__ void k2(const float* x, float* y, long long groups) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  float4 t = LDCS ? __ldcs(reinterpret_cast<const float4*>(x) + i) : reinterpret_cast<const float4*>(x)[i];
  t.x = rintf(t.x); t.y = rintf(t.y); t.z = rintf(t.z); t.w = rintf(t.w);
  if (STCS) __stcs(reinterpret_cast<float4*>(y) + i, t); else reinterpret_cast<float4*>(y)[i] = t;
}
// torch-like: each thread exactly U vectors, block-contiguous, no loop
template <int U>
__global__ void oneshot(const float* x, float* y, long long groups) {
  long long base = ((long long)blockIdx.x * blockDim.x * U) + threadIdx.x;
  V4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) { long long i = base + u * blockDim.x; if (i < groups) v[u] = reinterpret_cast<const V4*>(x)[i]; }
#pragma unroll
  for (int u = 0; u < U; ++u) { long long i = base + u * blockDim.x; if (i < groups) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[u].v[j] = rintf(v[u].v[j]);
      reinterpret_cast<V4*>(y)[i] = v[u]; } }
}
// bfloat16: 8 elements per 16-byte vector, U vectors per thread (block-strided)
template <int U>
__global__ void kb(const uint4* x, uint4* y, long long groups) {
  long long base = (long long)blockIdx.x * blockDim.x * U + threadIdx.x;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    long long i = base + (long long)u * blockDim.x;
    if (i < groups) {
      uint4 v = x[i];
      __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = __float2bfloat16_rn(rintf(__bfloat162float(h[j])));
      y[i] = v;
    }
  }
}
int main() {
  const long long n = 1LL << 28, groups = n / 4;
  float *x, *y; cudaMalloc(&x, n * 4); cudaMalloc(&y, n * 4); cudaMemset(x, 0, n * 4);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto occ = [&](auto kern, int threads) { int b; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, threads, 0); return b; };
  struct Var { const char* name; std::function<void()> f; };
  std::vector<std::pair<const char*, std::function<void()>>> vars;
  int w4 = sms * occ(k<4, false>, 256), w1 = sms * occ(k<1, false>, 256), w2 = sms * occ(k<2,false>,256);
  printf("SMs %d, blocks/SM U4 %d U1 %d U2 %d\n", sms, w4 / sms, w1 / sms, w2/sms);
  vars.push_back({"memcpy D2D", [&] { cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice); }});
  vars.push_back({"wave U4 (current)", [&] { k<4, false><<<w4, 256>>>(x, y, groups); }});
  vars.push_back({"wave U1", [&] { k<1, false><<<w1, 256>>>(x, y, groups); }});
  vars.push_back({"wave U2", [&] { k<2, false><<<w2, 256>>>(x, y, groups); }});
  vars.push_back({"4 waves U4", [&] { k<4, false><<<4 * w4, 256>>>(x, y, groups); }});
  vars.push_back({"wave U4 + ldcs/stcs", [&] { k<4, true><<<w4, 256>>>(x, y, groups); }});
  vars.push_back({"unclamped U1", [&] { k<1, false><<<(unsigned)((groups + 255) / 256), 256>>>(x, y, groups); }});
  vars.push_back({"unclamped U4", [&] { k<4, false><<<(unsigned)((groups + 1023) / 1024), 256>>>(x, y, groups); }});
  vars.push_back({"oneshot U4 b128", [&] { oneshot<4><<<(unsigned)((groups + 511) / 512), 128>>>(x, y, groups); }});
  vars.push_back({"oneshot U1 b128", [&] { oneshot<1><<<(unsigned)((groups + 127) / 128), 128>>>(x, y, groups); }});
  vars.push_back({"oneshot U2 b256", [&] { oneshot<2><<<(unsigned)((groups + 511) / 512), 256>>>(x, y, groups); }});
  vars.push_back({"unclamped U1 stcs", [&] { k2<false, true><<<(unsigned)((groups + 255) / 256), 256>>>(x, y, groups); }});
  vars.push_back({"unclamped U1 ldcs+stcs", [&] { k2<true, true><<<(unsigned)((groups + 255) / 256), 256>>>(x, y, groups); }});
  vars.push_back({"unclamped U1 b128", [&] { k<1, false><<<(unsigned)((groups + 127) / 128), 128>>>(x, y, groups); }});
  vars.push_back({"unclamped U1 b512", [&] { k<1, false><<<(unsigned)((groups + 511) / 512), 512>>>(x, y, groups); }});
  vars.push_back({"unclamped U1 b1024", [&] { k<1, false><<<(unsigned)((groups + 1023) / 1024), 1024>>>(x, y, groups); }});
  vars.push_back({"unclamped U2", [&] { k<2, false><<<(unsigned)((groups + 511) / 512), 256>>>(x, y, groups); }});
  auto run = [&](std::vector<std::pair<const char*, std::function<void()>>>& vars) {
    std::vector<std::vector<float>> t(vars.size());
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (auto& v : vars) for (int i = 0; i < 3; ++i) v.second();
    for (int r = 0; r < 41; ++r) for (size_t i = 0; i < vars.size(); ++i) {
      cudaEventRecord(a); vars[i].second(); cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); t[i].push_back(ms);
    }
    float base = 0;
    for (size_t i = 0; i < vars.size(); ++i) {
      std::sort(t[i].begin(), t[i].end()); float med = t[i][t[i].size() / 2]; if (i == 0) base = med;
      printf("%-24s %8.1f us  x%.3f of memcpy\n", vars[i].first, med * 1e3, med / base);
    }
  };
  run(vars);
  // bfloat16, 2^28 elements (the first half of the same buffers)
  const long long g16 = n * 2 / 16;
  const uint4 *xb = reinterpret_cast<const uint4*>(x); uint4 *yb = reinterpret_cast<uint4*>(y);
  std::vector<std::pair<const char*, std::function<void()>>> bvars;
  bvars.push_back({"bf16 memcpy D2D", [&] { cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice); }});
  bvars.push_back({"bf16 U1 b128 (current)", [&] { kb<1><<<(unsigned)((g16 + 127) / 128), 128>>>(xb, yb, g16); }});
  bvars.push_back({"bf16 U1 b64", [&] { kb<1><<<(unsigned)((g16 + 63) / 64), 64>>>(xb, yb, g16); }});
  bvars.push_back({"bf16 U1 b256", [&] { kb<1><<<(unsigned)((g16 + 255) / 256), 256>>>(xb, yb, g16); }});
  bvars.push_back({"bf16 U2 b128", [&] { kb<2><<<(unsigned)((g16 + 255) / 256), 128>>>(xb, yb, g16); }});
  bvars.push_back({"bf16 U4 b128", [&] { kb<4><<<(unsigned)((g16 + 511) / 512), 128>>>(xb, yb, g16); }});
  run(bvars);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
