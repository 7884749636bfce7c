// NovoGrad on CUDA, on the shared math of common/novograd.h. reduce: per-chunk partial ||g||^2,
// totalled per tensor; apply: per tensor its second moments (written) and the grads'
// multiplier, then the m and param update.
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

enum { kGradMul = 0 };

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) norms(Launch l, novograd::Hyper h, bool) {
  const float mul = grad_multiplier(l, false);
  for_each_chunk<P>(l, [&](const BlockChunk& c) { write_partials(l, c.chunk, walk(c, SumsOfSquares<P, false>{{c.t}, mul})); });
}

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) update(Launch l, novograd::Hyper h) {
  const float lr = *l.lr;
  const float keep = novograd::keep(h, lr);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const novograd::Elem<float> e(h, l.coeffs[c.tensor * kCoeffs + kGradMul], lr, keep);
    // (a rounded param hashes the grad as stored, keyed by this step's count)
    walk(c, OneStateUpdate<P, novograd::Elem<float>>{{c.t}, e, param_round<P>(h.stochastic_rounding, h.seed, *c.t.step)});
  });
}

struct Op {
  using Hyper = novograd::Hyper;
  static constexpr int kReductions = novograd::kReductions;
  static constexpr unsigned kMaxMask = 0u;
  template <typename P>
  static constexpr auto pass1() { return norms<P>; }
  template <typename P>
  static constexpr auto pass2() { return update<P>; }
  static __device__ void coeffs(const Launch& l, const Hyper& h, int32_t i, const Totals<kReductions>& r) {
    const TensorMeta& t = l.tensors[i];
    const novograd::Moments m = novograd::moments(h, *t.scalars[0], *t.scalars[1], r.r[0]);
    *t.scalars[0] = m.v;
    *t.scalars[1] = m.v_max;
    l.coeffs[i * kCoeffs + kGradMul] = novograd::grad_mul(h, m, grad_multiplier(l, false));
  }
};

}  // namespace

extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, reduce) { return reduce_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, apply) { return apply_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, step) { return one_call<Op>(*l, *h); }

}  // namespace inductor_lamb::cuda
