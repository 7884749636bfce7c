// Adagrad update loop (compiled once per ISA) on the shared math of
// common/adagrad.h: one pass, reads p, g, s and writes s, p (20 bytes/param).
#include "cpu/adagrad.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const AdagradArgs& args) {
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const adagrad::Elem<fVec> e(args.clr[c.tensor], args.hyper, args.grad_mul);
    T* param = static_cast<T*>(t.param);
    float* sum = state_f32(t, 0);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      const F2 g = load2(static_cast<const T*>(t.grad) + i, n);
      F2 p = load_param(param, t.master, i, n), s = load2(sum + i, n);
      p = {e.step(g.a, p.a, s.a), e.step(g.b, p.b, s.b)};
      store2(sum + i, n, s);
      store_param(param, t.master, i, n, p);
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const AdagradKernels INDUCTOR_LAMB_ISA_SYMBOL(adagrad_kernels) = {&update};

}  // namespace inductor_lamb::cpu
