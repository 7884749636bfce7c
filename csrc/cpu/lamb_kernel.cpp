// LAMB element loops (compiled once per ISA). Two passes at the 40 bytes/param
// floor: pass 1 reads p, g, m, v, writes m, v and reduces ||p||, ||u||; pass 2
// reads p, m, v, recomputes u (cheaper than storing it) and writes p.
#include "cpu/lamb.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

struct LambMath {
  fVec beta1, beta2, beta3, one_minus_beta2, inv_bc1, inv_bc2, eps, wd;
  LambMath(const LambArgs& a, const LambCoeffs& k)
      : beta1(a.beta1), beta2(a.beta2), beta3(a.beta3), one_minus_beta2(1.f - a.beta2), inv_bc1(k.inv_bc1),
        inv_bc2(k.inv_bc2), eps(a.eps), wd(a.weight_decay) {}
  inline void moments(const fVec& g, fVec& m, fVec& v) const {
    m = m * beta1 + g * beta3;
    v = v * beta2 + g * g * one_minus_beta2;
  }
  inline fVec update(const fVec& p, const fVec& m, const fVec& v) const {
    return m * inv_bc1 * inv_sqrt_plus_eps(v * inv_bc2, eps) + wd * p;
  }
};

void pass1(const LambArgs& args) {
  const fVec grad_mul(args.grad_mul);
  for_each_chunk(args.chunks, [&](int64_t ci, const Chunk& c) {
    const LambTensor& t = args.tensors[c.tensor];
    const LambMath math(args, args.coeffs[c.tensor]);
    SumSq p_sq, u_sq;
    dispatch_dtype(t.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* grad = static_cast<const T*>(t.grad);
      vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
        F2 g = load2(grad + i, n);
        F2 p = load_param(static_cast<const T*>(t.param), t.master, i, n);
        F2 m = load2(t.exp_avg + i, n), v = load2(t.exp_avg_sq + i, n);
        g.a = g.a * grad_mul;
        g.b = g.b * grad_mul;
        math.moments(g.a, m.a, v.a);
        math.moments(g.b, m.b, v.b);
        store2(t.exp_avg + i, n, m);
        store2(t.exp_avg_sq + i, n, v);
        p_sq.add(p, n);
        u_sq.add({math.update(p.a, m.a, v.a), math.update(p.b, m.b, v.b)}, n);
      });
    });
    args.partials[2 * ci] = p_sq.value();
    args.partials[2 * ci + 1] = u_sq.value();
  });
}

void pass2(const LambArgs& args) {
  for_each_chunk(args.chunks, [&](int64_t, const Chunk& c) {
    const LambTensor& t = args.tensors[c.tensor];
    const LambCoeffs& k = args.coeffs[c.tensor];
    const LambMath math(args, k);
    const fVec step_size(k.step_size);
    dispatch_dtype(t.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* param = static_cast<T*>(t.param);
      vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
        F2 p = load_param(param, t.master, i, n);
        F2 m = load2(t.exp_avg + i, n), v = load2(t.exp_avg_sq + i, n);
        p.a = p.a - step_size * math.update(p.a, m.a, v.a);
        p.b = p.b - step_size * math.update(p.b, m.b, v.b);
        store_param(param, t.master, i, n, p);
      });
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const LambKernels INDUCTOR_LAMB_ISA_SYMBOL(lamb_kernels) = {&pass1, &pass2};

}  // namespace inductor_lamb::cpu
