// NovoGrad update loop (compiled once per ISA) on the shared math of common/novograd.h. The grad
// norms come first from the engine's sum-of-squares kernel (reads g: 4 bytes/param); this pass
// reads p, g, m and writes m, p (20 bytes/param): 24 in all.
#include "cpu/novograd.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

void update(const NovogradArgs& args) {
  one_state_update(args.chunks, args.tensors, [&](const Chunk& c) {
    return novograd::Elem<fVec>(*args.hyper, args.coeffs[c.tensor].grad_mul, args.lr, args.keep);
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const NovogradKernels INDUCTOR_LAMB_ISA_SYMBOL(novograd_kernels) = {&update};

}  // namespace inductor_lamb::cpu
