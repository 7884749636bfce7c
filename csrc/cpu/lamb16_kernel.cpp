// LAMB16 element loops (compiled once per ISA) on the shared math of
// common/lamb16.h. Two passes at the 26 bytes/param floor: pass 1 reads p, g,
// m8, v8 and reduces ||p||, ||u||, amax |m|, amax v (the new scales need the
// whole tensor); pass 2 re-reads them, recomputes m, v, u, writes p and stores
// m, v in float8 with the new scales, rounded stochastically by default
// (common/rounding.h).
#include "cpu/lamb16.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using M8 = c10::Float8_e4m3fn;
using V8 = c10::Float8_e5m2;
using Elem = lamb16::Elem<fVec>;

// The per-element work both passes share: new m, v (float32) and u.
template <typename T>
struct Lamb16Row {
  F2 g, p, m, v, u;  // g: the grads divided by grad_scale (the rounding hashes their bits)
  inline Lamb16Row(const TensorPtrs& t, const Elem& e, const fVec& grad_mul, int64_t i, int64_t n) {
    g = load2(static_cast<const T*>(t.grad) + i, n);
    g = {g.a * grad_mul, g.b * grad_mul};
    p = load_param(static_cast<const T*>(t.param), t.master, i, n);
    m = load2(static_cast<const M8*>(t.state[0]) + i, n);
    v = load2(static_cast<const V8*>(t.state[1]) + i, n);
    e.moments(g.a, m.a, v.a);
    e.moments(g.b, m.b, v.b);
    u = {e.update(p.a, m.a, v.a), e.update(p.b, m.b, v.b)};
  }
};

void pass1(const Lamb16Args& args) {
  const fVec grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t ci, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const Lamb16Coeffs& k = args.coeffs[c.tensor];
    const Elem e(args.consts, k.beta1_scale, k.beta2_scale);
    SumSq p_sq, u_sq;
    AbsMax m_max, v_max;
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      const Lamb16Row<T> r(t, e, grad_mul, i, n);
      p_sq.add(r.p, n);
      u_sq.add(r.u, n);
      m_max.add(r.m, n);
      v_max.add(r.v, n);
    });
    args.sums[2 * ci] = p_sq.value();
    args.sums[2 * ci + 1] = u_sq.value();
    args.maxes[2 * ci] = m_max.value();
    args.maxes[2 * ci + 1] = v_max.value();
  });
}

void pass2(const Lamb16Args& args) {
  const fVec grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const Lamb16Coeffs& k = args.coeffs[c.tensor];
    const Elem e(args.consts, k.beta1_scale, k.beta2_scale, k.inv_m_scale, k.inv_v_scale);
    const fVec step_size(k.step_size);
    T* param = static_cast<T*>(t.param);
    vec_range(c.begin, c.end, [&](int64_t i, int64_t n) {
      Lamb16Row<T> r(t, e, grad_mul, i, n);
      r.p.a = r.p.a - step_size * r.u.a;
      r.p.b = r.p.b - step_size * r.u.b;
      store_param(param, t.master, i, n, r.p);
      uint8_t* m8 = static_cast<uint8_t*>(t.state[0]) + i;
      uint8_t* v8 = static_cast<uint8_t*>(t.state[1]) + i;
      const F2 m{e.m_code(r.m.a), e.m_code(r.m.b)}, v{e.v_code(r.v.a), e.v_code(r.v.b)};
      if (args.stochastic_rounding) {
        stochastic_store_moments(k.round_key, r.g, m8, v8, n, m, v);
      } else {
        store2(reinterpret_cast<M8*>(m8), n, m);
        store2(reinterpret_cast<V8*>(v8), n, v);
      }
    });
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const Lamb16Kernels INDUCTOR_LAMB_ISA_SYMBOL(lamb16_kernels) = {&pass1, &pass2};

}  // namespace inductor_lamb::cpu
