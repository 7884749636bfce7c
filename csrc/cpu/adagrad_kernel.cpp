// Adagrad update loop (compiled once per ISA) on the shared math of
// common/adagrad.h: one pass, reads p, g, s and writes s, p (20 bytes/param).
#include "cpu/adagrad.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const AdagradArgs& args) {
  one_state_update(args.chunks, args.tensors, [&](const Chunk& c) {
    return adagrad::Elem<fVec>(args.clr[c.tensor], args.hyper, args.grad_mul);
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const AdagradKernels INDUCTOR_LAMB_ISA_SYMBOL(adagrad_kernels) = {&update};

}  // namespace inductor_lamb::cpu
