// LARS update loop (compiled once per ISA) on the shared math of common/lars.h.
// The norms come first from the engine's sum-of-squares kernel (reads p, g:
// 8 bytes/param); this pass reads p, g, v and writes v, p (20 bytes/param): 28 in all.
#include "cpu/lars.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const LarsArgs& args) {
  one_state_update(args.chunks, args.tensors, [&](const Chunk& c) {
    const LarsCoeffs& k = args.coeffs[c.tensor];
    return lars::Elem<fVec>(args.momentum, k.local_lr, k.weight_decay, args.grad_mul, args.step_size);
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const LarsKernels INDUCTOR_LAMB_ISA_SYMBOL(lars_kernels) = {&update};

}  // namespace inductor_lamb::cpu
