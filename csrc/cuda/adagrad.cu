// Adagrad on CUDA (exactly torch.optim.Adagrad), on the shared math of common/adagrad.h: one
// element-wise launch, then one per tensor increments the steps (the update reads step + 1, so
// no block of a tensor ever sees a half-updated counter).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) update(Launch l, adagrad::Hyper h) {
  const float mul = adagrad::grad_mul(h, grad_multiplier(l, false));
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const float step = *c.t.step + 1.f;  // (incremented after this launch)
    const adagrad::Elem<float> e(adagrad::clr(*l.lr, double(step), h.lr_decay), h, mul);
    walk(c, OneStateUpdate<P, adagrad::Elem<float>>{{c.t}, e, param_round<P>(h.stochastic_rounding, h.seed, step)});
  });
}

__global__ void __launch_bounds__(kThreads) increment_steps(Launch l) {
  const int32_t i = warp_tensor(l);
  if (i >= 0 && threadIdx.x % 32 == 0 && !skip_step(l)) *l.tensors[i].step += 1.f;
}

}  // namespace

extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(adagrad, step) {
  for_each_variant(*l, [&](auto p) { on_chunks(update<decltype(p)>, *l, *h); });
  on_tensors(increment_steps, *l);
  return launched(*l);
}

}  // namespace inductor_lamb::cuda
