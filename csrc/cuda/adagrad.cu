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
  const float clr = adagrad::clr(*l.lr, double(*c.t.step) + 1.0, h.lr_decay);
  one_state_update(c, adagrad::Elem<float>(clr, h, adagrad::grad_mul(h, grad_multiplier(l, false))));
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
