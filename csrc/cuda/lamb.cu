// LAMB on CUDA, on the shared math of common/lamb.h, whatever the number of tensors: pass 1
// updates m, v and reduces ||p||^2, ||u||^2 per chunk (two launches before it with global grad
// clipping); per tensor, the totals and the step size (lr times the trust ratio); pass 2
// recomputes u from the new m, v and writes p: 40 bytes/param, like the CPU kernel.
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

using Elem = lamb::Elem<float>;
enum { kInvBc1 = 0, kInvBc2 = 1, kStepSize = 2 };

template <typename P>
struct Pass1 : Body<P> {
  Elem e;
  float mul;
  template <int W>
  __device__ __forceinline__ Partials<2> operator()(Width<W>, int64_t i) const {
    const TensorMeta& t = this->t;
    float p[W], g[W];
    load_param_and_grad<W, Access::Keep, P>(t, i, p, g);
    Partials<2> s;
    // m and v one 16-byte vector at a time, each written before the next is read: with 16-bit
    // params (8 elements a pack) all of them at once would not leave half an SM's threads resident.
    constexpr int S = W == 1 ? 1 : kPerVector<float>;
#pragma unroll
    for (int h = 0; h < W; h += S) {
      float m[S], v[S];
      load<S, Access::Keep, float>(t.state[0], i + h, m);
      load<S, Access::Keep, float>(t.state[1], i + h, v);
#pragma unroll
      for (int j = 0; j < S; ++j) moments_and_norms(e, g[h + j] * mul, p[h + j], m[j], v[j], s);
      store<S, Access::Keep, float>(t.state[0], i + h, m);
      store<S, Access::Keep, float>(t.state[1], i + h, v);
    }
    return s;
  }
};

template <typename P>
struct Pass2 : Body<P> {
  Elem e;
  float step_size, keep;  // keep: the param's factor before the update (decoupled decay; else 1)
  ParamRound round;
  template <int W>
  __device__ __forceinline__ NoPartials operator()(Width<W>, int64_t i) const {
    const TensorMeta& t = this->t;
    float p[W], m[W], v[W];
    P::template load<W, Access::Stream>(t, i, p);
    load<W, Access::Stream, float>(t.state[0], i, m);
    load<W, Access::Stream, float>(t.state[1], i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) {  // (a rounded param hashes the new m, as on CPU)
      const float pk = keep != 1.f ? p[j] * keep : p[j];
      p[j] = round.apply<P>(pk - step_size * e.update(p[j], m[j], v[j]), m[j], p[j]);
    }
    P::template store<W, Access::Stream>(t, i, p);
    return {};
  }
};

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pass1(Launch l, lamb::Hyper h, bool clipped) {
  const float mul = grad_multiplier(l, clipped);
  const lamb::Consts k = lamb::consts(h);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const double step = double(*c.t.step) + 1.0;  // the totals kernel stores it
    const Elem e(k, lamb::inv_bias_correction(*h.beta1, step, h.bias_correction),
                 lamb::inv_bias_correction(*h.beta2, step, h.bias_correction));
    write_partials(l, c.chunk, walk(c, Pass1<P>{{c.t}, e, mul}));
  });
}

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pass2(Launch l, lamb::Hyper h) {
  const lamb::Consts consts = lamb::consts(h);
  const float keep = lamb::keep(h, *l.lr);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const float* k = l.coeffs + c.tensor * kCoeffs;
    const Elem e(consts, k[kInvBc1], k[kInvBc2]);
    walk(c, Pass2<P>{{c.t}, e, k[kStepSize], keep, param_round<P>(h.stochastic_rounding, h.seed, *c.t.step)});
  });
}

struct Op {
  using Hyper = lamb::Hyper;
  static constexpr int kReductions = lamb::kReductions;
  static constexpr unsigned kMaxMask = 0u;
  template <typename P>
  static constexpr auto pass1() { return cuda::pass1<P>; }
  template <typename P>
  static constexpr auto pass2() { return cuda::pass2<P>; }
  static __device__ void coeffs(const Launch& l, const Hyper& h, int32_t i, const Totals<kReductions>& r) {
    const double step = double(*l.tensors[i].step);  // incremented
    float* k = l.coeffs + i * kCoeffs;
    k[kInvBc1] = lamb::inv_bias_correction(*h.beta1, step, h.bias_correction);
    k[kInvBc2] = lamb::inv_bias_correction(*h.beta2, step, h.bias_correction);
    k[kStepSize] = lamb::step_size(h, *l.lr, r.r[0], r.r[1]);
  }
};

}  // namespace

extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, reduce) { return reduce_phase<Op>(*l, *h, h->max_grad_norm); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, apply) { return apply_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, step) { return one_call<Op>(*l, *h, h->max_grad_norm); }

}  // namespace inductor_lamb::cuda
