// LARS on CUDA (PaddlePaddle merged lars_momentum semantics). reduce: per-chunk
// partial ||p||^2, ||g||^2, totalled per tensor into the reductions; apply: one
// thread per tensor computes the local lr, then the momentum and param update.
// Weight decay and layer adaptation are per tensor (TensorMeta::option).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

enum { kLocalLr = 0 };

__device__ __forceinline__ float grad_mul(const Launch& l, const LarsHyper& h) {
  return float(h.rescale_grad * double(grad_multiplier(l, false)));
}

__global__ void norms(Launch l, LarsHyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float mul = grad_mul(l, h);
  float p_sq = 0.f, g_sq = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i), g = load(t.grad, t.dtype, i) * mul;
    p_sq += p * p;
    g_sq += g * g;
  }
  write_partial(l, 0, p_sq);
  write_partial(l, 1, g_sq);
}

__global__ void coeffs(Launch l, LarsHyper h) {
  const int32_t i = tensor_index();
  if (i >= l.num_tensors || skip_step(l)) return;
  const TensorMeta& t = l.tensors[i];
  const double wd = t.option[0], lr = *l.lr;
  const bool adapt = t.option[1] != 0.f;
  const double p_norm = sqrt(double(l.reductions[2 * i])), g_norm = sqrt(double(l.reductions[2 * i + 1]));
  double local_lr = lr;
  if (adapt && wd > 0 && p_norm > 0 && g_norm > 0) local_lr = lr * h.lars_coeff * p_norm / (g_norm + wd * p_norm + h.eps);
  l.coeffs[i * kCoeffs + kLocalLr] = float(local_lr);
}

__global__ void update(Launch l, LarsHyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float mul = grad_mul(l, h), momentum = *h.momentum, wd = t.option[0];
  const float local_lr = l.coeffs[c.tensor * kCoeffs + kLocalLr];
  float* buf = static_cast<float*>(t.state[0]);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i), g = load(t.grad, t.dtype, i) * mul;
    const float v = buf[i] * momentum + local_lr * (g + wd * p);
    buf[i] = v;
    store_param(t, i, p - v);
  }
}

}  // namespace
}  // namespace inductor_lamb::cuda

extern "C" int inductor_lamb_cuda_lars_reduce(const inductor_lamb::cuda::Launch* l,
                                              const inductor_lamb::cuda::LarsHyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_chunks > 0) norms<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  return launch_finish_reductions(*l, 2, 0u);
}

extern "C" int inductor_lamb_cuda_lars_apply(const inductor_lamb::cuda::Launch* l,
                                             const inductor_lamb::cuda::LarsHyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_tensors > 0) coeffs<<<tensor_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  if (l->num_chunks > 0) update<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  return cudaGetLastError();
}
