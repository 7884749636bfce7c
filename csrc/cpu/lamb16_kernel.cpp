// LAMB16 element loops (compiled once per ISA) on the shared math of
// common/lamb16.h. Two passes at the 26 bytes/param floor: pass 1 reads p, g,
// m8, v8 and reduces ||p||, ||u||, amax |m|, amax v (the new scales need the
// whole tensor); pass 2 re-reads them, recomputes m, v, u, writes p and stores
// m, v in float8 with the new scales, rounded stochastically by default
// (common/rounding.h). In the one-call step pass 1 leaves u and the new m, v in
// the stash's three planes, and pass 2 reads them from cache instead of decoding
// and recomputing (it still reads g and the old codes: the rounding hashes them).
#include "cpu/lamb16.h"
#include "cpu/vec_engine.h"

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using M8 = c10::Float8_e4m3fn;
using V8 = c10::Float8_e5m2;
using Elem = lamb16::Elem<fVec>;

// m's codes are decoded in their unit (Fp8Codec::kUnitScale), whose power of two the element
// math's factor of m takes instead (Elem's beta1_scale times kUnitScale): a multiply fewer.
constexpr float kMUnitScale = Fp8Codec<M8>::kUnitScale;

// g divided by grad_scale (times grad_mul; when that is 1, as without a GradScaler, the multiply is
// skipped, as the lowering skips it: x * 1 is x, but for a subnormal under flush-to-zero or a
// signalling NaN, whose bits the rounding's hash would then see unflushed or unquieted).
INDUCTOR_LAMB_LOOP_INLINE void scale_grad(F2& g, const fVec& grad_mul, bool scaled) {
  if (scaled) g = {g.a * grad_mul, g.b * grad_mul};
}

// One loop step's inputs: g (divided by grad_scale: the rounding hashes its
// bits), p, and the decoded codes of m (in their unit) and v.
template <typename T>
struct Lamb16Loads {
  F2 g, p, m, v;
  INDUCTOR_LAMB_LOOP_INLINE Lamb16Loads(const TensorPtrs& t, const fVec& grad_mul, bool scaled, int64_t i, int64_t n)
      : g(load2(static_cast<const T*>(t.grad) + i, n)),
        p(load_param(static_cast<const T*>(t.param), t.master, i, n)),
        m(load2_unit(static_cast<const M8*>(t.state[0]) + i, n)),
        v(load2(static_cast<const V8*>(t.state[1]) + i, n)) {
    scale_grad(g, grad_mul, scaled);
  }
  // Pass 2 of the one-call step: the new moments from the stash's m and v planes.
  INDUCTOR_LAMB_LOOP_INLINE Lamb16Loads(const TensorPtrs& t, const fVec& grad_mul, bool scaled, int64_t i, int64_t n,
                                        const float* stash, int64_t plane)
      : g(load2(static_cast<const T*>(t.grad) + i, n)),
        p(load_param(static_cast<const T*>(t.param), t.master, i, n)),
        m(load2(stash + plane + i, n)),
        v(load2(stash + 2 * plane + i, n)) {
    scale_grad(g, grad_mul, scaled);
  }
};

// The per-vector work both passes share: m, v (the decoded codes) become the new
// float32 moments; returns u. The passes finish one vector before the next (not
// both halves of a loop step op by op): fewer live registers, no spills on AVX2.
// Finite: Elem::update's (every new v of the tensor finite).
template <bool Finite>
INDUCTOR_LAMB_LOOP_INLINE fVec moments_update(const Elem& e, const fVec& g, const fVec& p, fVec& m, fVec& v) {
  e.moments(g, m, v);
  return e.template update<Finite>(p, m, v);
}

// Pass 1 over one chunk: its partial ||p||^2, ||u||^2, amax |m|, amax v (and the stash). Returns
// whether every new v was finite (always true when checked, Finite = false).
template <bool Finite, typename T>
bool pass1_chunk(const Lamb16Args& args, int64_t ci, const TensorPtrs& t, const Chunk& c) {
  const fVec grad_mul(args.grad_mul);
  const bool scaled = args.grad_mul != 1.f;
  const Lamb16Coeffs& k = args.coeffs[c.tensor];
  const Elem e(args.consts, k.beta1_scale * kMUnitScale, k.beta2_scale);
  float* const stash = stash_of(args.stash, c.tensor);
  const bool stream = args.stash.stream;
  const int64_t plane = args.stash.plane;
  SumSq p_sq, u_sq;
  AbsMax m_max, v_max;
  vec_range(
      c.begin, c.end,
      [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
        Lamb16Loads<T> r(t, grad_mul, scaled, i, n);
        const F2 u{moments_update<Finite>(e, r.g.a, r.p.a, r.m.a, r.v.a),
                   moments_update<Finite>(e, r.g.b, r.p.b, r.m.b, r.v.b)};
        if (stash) {  // u, and the new moments (moments_update left them in r.m, r.v)
          stash_store(stash, stream, i, n, u);
          stash_store(stash + plane, stream, i, n, r.m);
          stash_store(stash + 2 * plane, stream, i, n, r.v);
        }
        p_sq.add(r.p, n);
        u_sq.add(u, n);
        m_max.add(r.m, n);
        v_max.add(r.v, n);
      },
      static_cast<const T*>(t.grad), static_cast<const T*>(t.param), t.master,
      static_cast<const uint8_t*>(t.state[0]), static_cast<const uint8_t*>(t.state[1]));
  if (stash) stream_fence(stream);
  args.sums[2 * ci] = p_sq.value();
  args.sums[2 * ci + 1] = u_sq.value();
  args.maxes[2 * ci] = m_max.value();
  args.maxes[2 * ci + 1] = v_max.value();
  return !Finite || std::isfinite(args.maxes[2 * ci + 1]);
}

// Pass 1 computes u unchecked (Finite) and learns from its amax v whether that was right; a chunk
// with a non-finite v runs again checked (pass 1 writes only its partials and the stash). Pass 2
// knows it per tensor beforehand (Lamb16Coeffs::finite).
void pass1(const Lamb16Args& args) {
  const bool unchecked = kUncheckedInvSqrt && lamb16::eps_allows_finite(args.consts);
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t ci, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    if constexpr (kUncheckedInvSqrt) {
      if (unchecked && pass1_chunk<true, T>(args, ci, t, c)) return;
    }
    pass1_chunk<false, T>(args, ci, t, c);
  });
}

// One chunk of pass 2. Stochastic: whether m, v are rounded stochastically; Stashed: whether u
// and the new m, v come from pass 1's stash; Finite: Elem::update's, when recomputing (template
// arguments, so the loop has no branch on them).
template <bool Stochastic, bool Stashed, bool Finite, typename T>
void pass2_chunk(const Lamb16Args& args, const TensorPtrs& t, const Chunk& c, const float* stash) {
  constexpr int64_t W = fVec::size();
  const fVec grad_mul(args.grad_mul);
  const bool scaled = args.grad_mul != 1.f;
  const Lamb16Coeffs& k = args.coeffs[c.tensor];
  const Elem e(args.consts, k.beta1_scale * kMUnitScale, k.beta2_scale, k.inv_m_scale, k.inv_v_scale);
  const fVec step_size(k.step_size);
  const uint32_t key = k.round_key;
  T* const param = static_cast<T*>(t.param);
  float* const master = t.master;
  uint8_t* const m8 = static_cast<uint8_t*>(t.state[0]);
  uint8_t* const v8 = static_cast<uint8_t*>(t.state[1]);
  const int64_t plane = args.stash.plane;
  vec_range(
      c.begin, c.end,
      [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
        // (stashed: the u, m, v pass 1 computed from the same inputs: the same bits)
        Lamb16Loads<T> r = [&] {
          if constexpr (Stashed) return Lamb16Loads<T>(t, grad_mul, scaled, i, n, stash, plane);
          else return Lamb16Loads<T>(t, grad_mul, scaled, i, n);
        }();
        const OldCodes old(m8 + i, v8 + i, n);  // (the stochastic rounding hashes them)
        MomentCodes codes[2];
        F2 u;
        if constexpr (Stashed) u = load2(stash + i, n);
        // p stepped, m and v turned into their unrounded codes (and rounded stochastically)
        const auto finish = [&](const fVec& g, fVec& p, fVec& m, fVec& v, int half) INDUCTOR_LAMB_LOOP_BODY {
          if constexpr (Stashed) {
            p = p - step_size * (half ? u.b : u.a);
          } else {
            p = p - step_size * moments_update<Finite>(e, g, p, m, v);
          }
          m = e.m_code(m);
          v = e.v_code(v);
          if constexpr (Stochastic) codes[half] = stochastic_codes(key, g, m, v, old.m + half * W, old.v + half * W);
        };
        finish(r.g.a, r.p.a, r.m.a, r.v.a, 0);
        finish(r.g.b, r.p.b, r.m.b, r.v.b, 1);
        if constexpr (Stochastic)  // (a rounded param's bits come from its moments' element hash)
          store_param(t, param, i, n, r.p, [&](int half) { return param_hash_of_element(codes[half].hash); });
        else
          store_param(param, master, i, n, r.p);
        if constexpr (Stochastic) {
          store_codes(codes[0], codes[1], m8 + i, v8 + i, n);
        } else {
          store2(reinterpret_cast<M8*>(m8 + i), n, r.m);
          store2(reinterpret_cast<V8*>(v8 + i), n, r.v);
        }
      },
      static_cast<const T*>(t.grad), static_cast<const T*>(param), master, static_cast<const uint8_t*>(m8),
      static_cast<const uint8_t*>(v8), stash);
}

template <bool Stochastic>
void pass2_loop(const Lamb16Args& args) {
  for_each_typed_chunk(args.chunks, args.tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    if (const float* stash = stash_of(args.stash, c.tensor)) return pass2_chunk<Stochastic, true, false, T>(args, t, c, stash);
    if constexpr (kUncheckedInvSqrt) {
      if (args.coeffs[c.tensor].finite) return pass2_chunk<Stochastic, false, true, T>(args, t, c, nullptr);
    }
    pass2_chunk<Stochastic, false, false, T>(args, t, c, nullptr);
  });
}

void pass2(const Lamb16Args& args) {
  if (args.stochastic_rounding) pass2_loop<true>(args);
  else pass2_loop<false>(args);
}

}  // namespace
}  // namespace CPU_CAPABILITY

extern const Lamb16Kernels INDUCTOR_LAMB_ISA_SYMBOL(lamb16_kernels) = {&pass1, &pass2};

}  // namespace inductor_lamb::cpu
