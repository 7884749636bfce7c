// Adagrad on CUDA (exactly torch.optim.Adagrad): one element-wise launch, then
// one thread per tensor increments the steps (the update reads step + 1, so no
// block of a tensor ever sees a half-updated counter).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

__global__ void update(Launch l, AdagradHyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const double step = double(*t.step) + 1.0;
  const float clr = float(double(*l.lr) / (1.0 + (step - 1.0) * h.lr_decay));
  const float mul = (h.maximize ? -1.f : 1.f) * grad_multiplier(l, false);
  const float wd = float(h.weight_decay), eps = float(h.eps);
  float* sum = static_cast<float*>(t.state[0]);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i);
    const float g = load(t.grad, t.dtype, i) * mul + wd * p;
    const float s = sum[i] + g * g;
    sum[i] = s;
    store_param(t, i, p - clr * g / (sqrtf(s) + eps));
  }
}

__global__ void increment_steps(Launch l) {
  const int32_t i = tensor_index();
  if (i >= l.num_tensors || skip_step(l)) return;
  *l.tensors[i].step += 1.f;
}

}  // namespace
}  // namespace inductor_lamb::cuda

extern "C" int inductor_lamb_cuda_adagrad_step(const inductor_lamb::cuda::Launch* l,
                                               const inductor_lamb::cuda::AdagradHyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_chunks > 0) update<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  if (l->num_tensors > 0) increment_steps<<<tensor_grid(*l), kThreads, 0, l->stream>>>(*l);
  return cudaGetLastError();
}
