// LARS update loop (compiled once per ISA). The norms come first from the engine's
// sum-of-squares kernel (reads p, g: 8 bytes/param); this pass reads p, g, v and
// writes v, p (20 bytes/param): 28 in all.
#include "cpu/lars.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const LarsArgs& args) {
  const fVec momentum(args.momentum), grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, const LarsTensor& t, const Chunk& c) {
    using T = decltype(tag);
    const LarsCoeffs& k = args.coeffs[c.tensor];
    const fVec local_lr(k.local_lr), wd(k.weight_decay);
    T* param = static_cast<T*>(t.param);
    const T* grad = static_cast<const T*>(t.grad);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      F2 g = load2(grad + i, n), p = load_param(param, t.master, i, n), v = load2(t.momentum_buffer + i, n);
      v.a = v.a * momentum + local_lr * (g.a * grad_mul + wd * p.a);
      v.b = v.b * momentum + local_lr * (g.b * grad_mul + wd * p.b);
      p.a = p.a - v.a;
      p.b = p.b - v.b;
      store2(t.momentum_buffer + i, n, v);
      store_param(param, t.master, i, n, p);
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const LarsKernels INDUCTOR_LAMB_ISA_SYMBOL(lars_kernels) = {&update};

}  // namespace inductor_lamb::cpu
