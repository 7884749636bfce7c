// Adagrad on CUDA (exactly torch.optim.Adagrad), on the shared math of
// common/adagrad.h: one element-wise launch, then one thread per tensor
// increments the steps (the update reads step + 1, so no block of a tensor ever
// sees a half-updated counter).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

__global__ void update(Launch l, adagrad::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const adagrad::Elem<float> e(adagrad::clr(*l.lr, double(*t.step) + 1.0, h.lr_decay), h,
                               adagrad::grad_mul(h, grad_multiplier(l, false)));
  float* sum = state_f32(t, 0);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    float s = sum[i];
    const float p = e.step(load(t.grad, t.dtype, i), load_param(t, i), s);
    sum[i] = s;
    store_param(t, i, p);
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
                                               const inductor_lamb::adagrad::Hyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_chunks > 0) update<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  if (l->num_tensors > 0) increment_steps<<<tensor_grid(*l), kThreads, 0, l->stream>>>(*l);
  return cudaGetLastError();
}
