// LAMB16 element loops (compiled once per ISA). Two passes at the 26 bytes/param
// floor: pass 1 reads p, g, m8, v8 and reduces ||p||, ||u||, amax |m|, amax v
// (the new scales need the whole tensor); pass 2 re-reads them, recomputes m,
// v, u, writes p and stores m, v in float8 with the new scales.
#include "cpu/lamb16.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using M8 = c10::Float8_e4m3fn;
using V8 = c10::Float8_e5m2;

struct Lamb16Math {
  fVec beta1_scale, beta2_scale, one_minus_beta1, one_minus_beta2, eps, wd;
  Lamb16Math(const Lamb16Args& a, const Lamb16Coeffs& k)
      : beta1_scale(k.beta1_scale), beta2_scale(k.beta2_scale), one_minus_beta1(a.one_minus_beta1),
        one_minus_beta2(a.one_minus_beta2), eps(a.eps), wd(a.weight_decay) {}
  // m8, v8 hold the stored float8 values as float32; on return the new m, v.
  inline void moments(const fVec& g, fVec& m, fVec& v) const {
    m = m * beta1_scale + g * one_minus_beta1;
    v = v * beta2_scale + g * g * one_minus_beta2;
  }
  inline fVec update(const fVec& p, const fVec& m, const fVec& v) const {
    return m * inv_sqrt_plus_eps(v, eps) + wd * p;
  }
};

// The per-element work both passes share: new m, v (float32) and u.
template <typename T>
struct Lamb16Row {
  F2 p, m, v, u;
  inline Lamb16Row(const Lamb16Tensor& t, const Lamb16Math& math, const fVec& grad_mul, int64_t i, int64_t n) {
    F2 g = load2(static_cast<const T*>(t.grad) + i, n);
    p = load_param(static_cast<const T*>(t.param), t.master, i, n);
    m = load2(static_cast<const M8*>(t.exp_avg) + i, n);
    v = load2(static_cast<const V8*>(t.exp_avg_sq) + i, n);
    g.a = g.a * grad_mul;
    g.b = g.b * grad_mul;
    math.moments(g.a, m.a, v.a);
    math.moments(g.b, m.b, v.b);
    u = {math.update(p.a, m.a, v.a), math.update(p.b, m.b, v.b)};
  }
};

void pass1(const Lamb16Args& args) {
  const fVec grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, const Lamb16Tensor& t, const Chunk& c) {
    using T = decltype(tag);
    const Lamb16Math math(args, args.coeffs[c.tensor]);
    SumSq p_sq, u_sq;
    AbsMax m_max, v_max;
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      const Lamb16Row<T> r(t, math, grad_mul, i, n);
      p_sq.add(r.p, n);
      u_sq.add(r.u, n);
      m_max.add(r.m, n);
      v_max.add(r.v, n);
    });
    const int64_t ci = &c - args.chunks.data;  // c is an element of the chunk array
    args.sums[2 * ci] = p_sq.value();
    args.sums[2 * ci + 1] = u_sq.value();
    args.maxes[2 * ci] = m_max.value();
    args.maxes[2 * ci + 1] = v_max.value();
  });
}

void pass2(const Lamb16Args& args) {
  const fVec grad_mul(args.grad_mul), m_hi(kE4M3Max), m_lo(-kE4M3Max), v_hi(kE5M2Max);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, const Lamb16Tensor& t, const Chunk& c) {
    using T = decltype(tag);
    const Lamb16Coeffs& k = args.coeffs[c.tensor];
    const Lamb16Math math(args, k);
    const fVec step_size(k.step_size), inv_m_scale(k.inv_m_scale), inv_v_scale(k.inv_v_scale);
    T* param = static_cast<T*>(t.param);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      Lamb16Row<T> r(t, math, grad_mul, i, n);
      r.p.a = r.p.a - step_size * r.u.a;
      r.p.b = r.p.b - step_size * r.u.b;
      store_param(param, t.master, i, n, r.p);
      // Saturate before rounding: float8 conversions turn overflow into NaN/inf.
      store2(static_cast<M8*>(t.exp_avg) + i, n,
             F2{at::vec::clamp(r.m.a * inv_m_scale, m_lo, m_hi), at::vec::clamp(r.m.b * inv_m_scale, m_lo, m_hi)});
      store2(static_cast<V8*>(t.exp_avg_sq) + i, n,
             F2{at::vec::minimum(r.v.a * inv_v_scale, v_hi), at::vec::minimum(r.v.b * inv_v_scale, v_hi)});
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const Lamb16Kernels INDUCTOR_LAMB_ISA_SYMBOL(lamb16_kernels) = {&pass1, &pass2};

}  // namespace inductor_lamb::cpu
