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
  const float step = *c.t.step + 1.f;  // (incremented after this launch)
  const float clr = adagrad::clr(*l.lr, double(step), h.lr_decay);
  one_state_update(c, adagrad::Elem<float>(clr, h, adagrad::grad_mul(h, grad_multiplier(l, false))),
                   param_round(c.t, h.stochastic_rounding, h.seed, step));
}

__global__ void increment_steps(Launch l) {
  const int32_t i = live_tensor(l);
  if (i < 0) return;
  *l.tensors[i].step += 1.f;
}

}  // namespace

extern "C" int inductor_lamb_cuda_adagrad_step(const Launch* l, const adagrad::Hyper* h) {
  on_chunks(update, *l, *h);
  on_tensors(increment_steps, *l);
  return cudaGetLastError();
}

}  // namespace inductor_lamb::cuda
