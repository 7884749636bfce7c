// Adagrad update loop (compiled once per ISA): one pass, reads p, g, s and
// writes s, p (20 bytes/param).
#include "cpu/adagrad.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const AdagradArgs& args) {
  const fVec wd(args.weight_decay), eps(args.eps), grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, const AdagradTensor& t, const Chunk& c) {
    using T = decltype(tag);
    const fVec clr(args.clr[c.tensor]);
    T* param = static_cast<T*>(t.param);
    const T* grad = static_cast<const T*>(t.grad);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      F2 g = load2(grad + i, n), p = load_param(param, t.master, i, n), s = load2(t.state_sum + i, n);
      g.a = g.a * grad_mul + wd * p.a;
      g.b = g.b * grad_mul + wd * p.b;
      s.a = s.a + g.a * g.a;
      s.b = s.b + g.b * g.b;
      p.a = p.a - clr * g.a * inv_sqrt_plus_eps(s.a, eps);
      p.b = p.b - clr * g.b * inv_sqrt_plus_eps(s.b, eps);
      store2(t.state_sum + i, n, s);
      store_param(param, t.master, i, n, p);
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const AdagradKernels INDUCTOR_LAMB_ISA_SYMBOL(adagrad_kernels) = {&update};

}  // namespace inductor_lamb::cpu
