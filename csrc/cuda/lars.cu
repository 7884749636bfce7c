// LARS on CUDA, on the shared math of common/lars.h. reduce: per-chunk partial ||p||^2, ||g||^2, totalled per tensor; apply: per
// tensor the local lr, then the momentum and param update. Weight decay and layer adaptation are
// per tensor (TensorMeta::per_param, as lars::options_of resolves them).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

enum { kLocalLr = 0 };

// A tensor's per-param options, as the glue stored them (ops_cuda.cpp, LarsCall).
__device__ __forceinline__ lars::Options options(const TensorMeta& t) {
  return {t.per_param[0], t.per_param[1] != 0.0};
}

__device__ __forceinline__ float grad_mul(const Launch& l, const lars::Hyper& h) {
  return lars::grad_mul(h, grad_multiplier(l, false));
}

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) norms(Launch l, lars::Hyper h, bool) {
  const float mul = grad_mul(l, h);
  for_each_chunk<P>(l, [&](const BlockChunk& c) { write_partials(l, c.chunk, walk(c, SumsOfSquares<P, true>{{c.t}, mul})); });
}

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) update(Launch l, lars::Hyper h) {
  const float mul = grad_mul(l, h);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const lars::Elem<float> e(*h.momentum, l.coeffs[c.tensor * kCoeffs + kLocalLr], float(options(c.t).weight_decay), mul,
                              lars::step_size(h, *l.lr));
    // (LARS counts no steps: its params' rounding keys on step 0)
    walk(c, OneStateUpdate<P, lars::Elem<float>>{{c.t}, e, param_round<P>(h.stochastic_rounding, h.seed, 0.f)});
  });
}

struct Op {
  using Hyper = lars::Hyper;
  static constexpr int kReductions = lars::kReductions;
  static constexpr unsigned kMaxMask = 0u;
  template <typename P>
  static constexpr auto pass1() { return norms<P>; }
  template <typename P>
  static constexpr auto pass2() { return update<P>; }
  static __device__ void coeffs(const Launch& l, const Hyper& h, int32_t i, const Totals<kReductions>& r) {
    l.coeffs[i * kCoeffs + kLocalLr] = lars::local_lr(h, options(l.tensors[i]), *l.lr, r.r[0], r.r[1]);
  }
};

}  // namespace

extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lars, reduce) { return reduce_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lars, apply) { return apply_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lars, step) { return one_call<Op>(*l, *h); }

}  // namespace inductor_lamb::cuda
