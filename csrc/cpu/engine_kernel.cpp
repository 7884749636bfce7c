// Engine kernels shared by every optimizer (compiled once per ISA).
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void sumsq(const SumSqArgs& args) {
  const fVec scale(args.scale);
  for_each_chunk(args.chunks, [&](int64_t ci, const Chunk& c) {
    SumSq acc;
    dispatch_dtype(args.dtypes[c.tensor], [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(args.ptrs[c.tensor]);
      vec_range(
          c.begin, c.end,
          [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
            F2 v = load2(x + i, n);
            acc.add({v.a * scale, v.b * scale}, n);
          },
          x);
    });
    args.partials[ci] = acc.value();
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const EngineKernels INDUCTOR_LAMB_ISA_SYMBOL(engine_kernels) = {&sumsq};

}  // namespace inductor_lamb::cpu
