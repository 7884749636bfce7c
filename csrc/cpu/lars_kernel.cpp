// LARS update loop (compiled once per ISA) on the shared math of common/lars.h.
// The norms come first from the engine's sum-of-squares kernel (reads p, g:
// 8 bytes/param); this pass reads p, g, v and writes v, p (20 bytes/param): 28 in all.
#include "cpu/lars.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const LarsArgs& args) {
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const LarsCoeffs& k = args.coeffs[c.tensor];
    const lars::Elem<fVec> e(args.momentum, k.local_lr, k.weight_decay, args.grad_mul);
    T* param = static_cast<T*>(t.param);
    float* buf = state_f32(t, 0);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      const F2 g = load2(static_cast<const T*>(t.grad) + i, n);
      F2 p = load_param(param, t.master, i, n), v = load2(buf + i, n);
      p = {e.step(g.a, p.a, v.a), e.step(g.b, p.b, v.b)};
      store2(buf + i, n, v);
      store_param(param, t.master, i, n, p);
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const LarsKernels INDUCTOR_LAMB_ISA_SYMBOL(lars_kernels) = {&update};

}  // namespace inductor_lamb::cpu
