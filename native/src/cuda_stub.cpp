// cuda_stub.cpp - the CUDA entry points of a CPU-only build: each returns
// PRL_ERROR_CUDA_NOT_COMPILED, so the ABI is the same whether or not CUDA was found.
#include "common.h"

namespace {
prl_status not_compiled(const char *fn) {
    return prl::fail(PRL_ERROR_CUDA_NOT_COMPILED,
                     "%s: this libpyroundlib was built without CUDA; rebuild it on a machine with nvcc "
                     "(cmake -DPYROUNDLIB_WITH_CUDA=ON) to run on GPU tensors", fn);
}
}  // namespace

extern "C" {

PRL_API prl_status prl_round_cuda(const void *, void *, int64_t, int, int, void *) { return not_compiled(__func__); }

PRL_API prl_status prl_lltm_forward_cuda(const void *, const void *, void *, void *, int64_t, int64_t, int, int,
                                         void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_backward_cuda(const void *, const void *, const void *, const void *, void *, void *,
                                          void *, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_backward_parts_cuda(const void *, const void *, int64_t, const void *, const void *,
                                                const void *, void *, void *, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_cuda_fits(int64_t, int64_t, int, int, int *fits) {
    if (fits != nullptr) *fits = 0;
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_forward_cuda(void *, const void *, int64_t, const void *, const void *, void *,
                                                  void *, void *, int64_t, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_backward_cuda(const void *, const void *, const void *, const void *, int64_t,
                                                   const void *, const void *, void *, void *, void *, int64_t,
                                                   int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_packed_forward_cuda(void *, const void *, int64_t, const void *, const void *,
                                                         void *, void *, void *, const int64_t *, int64_t, int64_t,
                                                         int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_packed_backward_cuda(const void *, const void *, const void *, const void *,
                                                          int64_t, const void *, const void *, void *, void *, void *,
                                                          const int64_t *, int64_t, int64_t, int64_t, int, int,
                                                          void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_packed_steps_forward_cuda(prl_cublas_gemm_fn, void *, int, void *, const void *, int64_t,
                                                      int64_t, const void *, const void *, void *, void *,
                                                      const int64_t *, int64_t, int64_t, int64_t, int64_t, int, int,
                                                      void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_packed_steps_backward_cuda(prl_cublas_gemm_fn, void *, int, const void *, const void *,
                                                       const void *, int64_t, int64_t, const void *, const void *,
                                                       void *, void *, void *, void *, void *, const int64_t *,
                                                       int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                                                       void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_upload_cuda(void *, const int64_t *, int64_t, int, void *) { return not_compiled(__func__); }

PRL_API prl_status prl_lltm_sequence_persistent_forward_cuda(const void *, const void *, const void *, const void *,
                                                             const void *, void *, void *, void *, void *, int64_t,
                                                             int64_t, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_fused_cuda_fits(int64_t, int64_t, int64_t, int, int, int *fits) {
    if (fits != nullptr) *fits = 0;
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_fused_forward_cuda(const void *, const void *, const void *, const void *,
                                                        const void *, void *, void *, void *, void *, int64_t,
                                                        int64_t, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_sequence_fused_backward_cuda(const void *, const void *, const void *, const void *,
                                                         const void *, const void *, const void *, const void *,
                                                         const void *, void *, void *, void *, void *, void *, void *,
                                                         int64_t, int64_t, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_packed_fused_forward_cuda(const void *, const void *, const void *, const void *,
                                                      const void *, const int64_t *, const int64_t *, void *, void *,
                                                      void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t,
                                                      int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_packed_fused_backward_cuda(const void *, const void *, const void *, const void *,
                                                       const void *, const void *, const int64_t *, const int64_t *,
                                                       const void *, const void *, const void *, void *, void *,
                                                       void *, void *, void *, void *, int64_t, int64_t, int64_t,
                                                       int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

PRL_API prl_status prl_lltm_layer_fused_inference_cuda(const void *, const void *, const void *, const void *,
                                                       const void *, const void *, const void *, const int64_t *,
                                                       const int64_t *, const int64_t *, void *, void *, void *,
                                                       int64_t, int64_t,
                                                       int64_t, int64_t, int64_t, int, int, void *) {
    return not_compiled(__func__);
}

}  // extern "C"
