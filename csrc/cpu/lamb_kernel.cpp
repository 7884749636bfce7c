// LAMB element loops (compiled once per ISA) on the shared math of common/lamb.h.
// Two passes at the 40 bytes/param floor: pass 1 reads p, g, m, v, writes m, v
// and reduces ||p||, ||u||; pass 2 reads p, m, v, recomputes u and writes p. In
// a one-call step pass 1 also stores u (UpdateStash), from which pass 2 reads it
// instead of m and v: one core's streaming time follows the lines it reads, and
// the stash stays in cache (or, past the last-level cache, is streamed out at
// the bytes m and v would have cost).
#include "cpu/lamb.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using Elem = lamb::Elem<fVec>;

// LAMB's loops prefetch half a page ahead: its pass 1 writes the stash beside its four streams,
// and a page ahead took it 4-7% longer (AMD EPYC Zen 5, 1 and 2 threads) where the other
// ops gained from it.
constexpr int64_t kLambPrefetchBytes = kPrefetchBytes / 2;

void pass1(const LambArgs& args) {
  const fVec grad_mul(args.grad_mul);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t ci, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const LambCoeffs& k = args.coeffs[c.tensor];
    const Elem e(args.consts, k.inv_bc1, k.inv_bc2);
    float* m_ptr = state_f32(t, 0);
    float* v_ptr = state_f32(t, 1);
    float* const stash = stash_of(args.stash, c.tensor);
    const bool stream = args.stash.stream;
    SumSq p_sq, u_sq;
    vec_range<kLambPrefetchBytes>(
        c.begin, c.end,
        [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
          F2 g = load2(static_cast<const T*>(t.grad) + i, n);
          F2 p = load_param(static_cast<const T*>(t.param), t.master, i, n);
          F2 m = load2(m_ptr + i, n), v = load2(v_ptr + i, n);
          e.moments(g.a * grad_mul, m.a, v.a);
          e.moments(g.b * grad_mul, m.b, v.b);
          store2(m_ptr + i, n, m);
          store2(v_ptr + i, n, v);
          const F2 u{e.update(p.a, m.a, v.a), e.update(p.b, m.b, v.b)};
          if (stash) stash_store(stash, stream, i, n, u);
          p_sq.add(p, n);
          u_sq.add(u, n);
        },
        static_cast<const T*>(t.grad), t.master ? nullptr : static_cast<const T*>(t.param), t.master, m_ptr, v_ptr);
    if (stash) stream_fence(stream);
    args.partials[2 * ci] = p_sq.value();
    args.partials[2 * ci + 1] = u_sq.value();
  });
}

void pass2(const LambArgs& args) {
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const LambCoeffs& k = args.coeffs[c.tensor];
    const Elem e(args.consts, k.inv_bc1, k.inv_bc2);
    const fVec step_size(k.step_size), keep(args.keep);
    const bool decays = args.keep != 1.f;  // (decoupled decay: p scaled before the update)
    T* param = static_cast<T*>(t.param);
    if (const float* stash = stash_of(args.stash, c.tensor)) {  // u from pass 1
      vec_range<kLambPrefetchBytes>(
          c.begin, c.end,
          [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
            F2 p0 = load_param(param, t.master, i, n);
            const F2 u = load2(stash + i, n);
            if (decays) p0 = {p0.a * keep, p0.b * keep};
            store_param(param, t.master, i, n, {p0.a - step_size * u.a, p0.b - step_size * u.b});
          },
          static_cast<const T*>(param), t.master, stash);
      return;
    }
    const float* m_ptr = state_f32(t, 0);
    const float* v_ptr = state_f32(t, 1);
    vec_range<kLambPrefetchBytes>(
        c.begin, c.end,
        [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
          const F2 p0 = load_param(param, t.master, i, n);
          const F2 m = load2(m_ptr + i, n), v = load2(v_ptr + i, n);
          const F2 pk = decays ? F2{p0.a * keep, p0.b * keep} : p0;
          const F2 p{pk.a - step_size * e.update(p0.a, m.a, v.a), pk.b - step_size * e.update(p0.b, m.b, v.b)};
          store_param(t, param, i, n, p, p0, m);  // (a rounded param hashes the new m: pass 2 reads no grad)
        },
        static_cast<const T*>(param), t.master, m_ptr, v_ptr);
  });
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const LambKernels INDUCTOR_LAMB_ISA_SYMBOL(lamb_kernels) = {&pass1, &pass2};

}  // namespace inductor_lamb::cpu
