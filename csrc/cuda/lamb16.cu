// LAMB16 on CUDA (LAMB with float8 moments), on the shared math of common/lamb16.h. Pass 1
// reduces ||p||^2, ||u||^2, amax |m|, amax v per chunk (reading p, g, m8, v8 and the old
// scales); per tensor, the totals, the trust ratio and the new scales (the old ones folded into
// the coefficients first, then overwritten); pass 2 recomputes m, v, u, writes p and stores m, v
// in float8 (26 bytes/param), rounded stochastically by default. A thread takes 16 elements a
// pack: one 16-byte vector of each code stream, decoded and encoded two codes at a time.
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

using Elem = lamb16::Elem<float>;
enum { kBeta1Scale = 0, kBeta2Scale = 1, kStepSize = 2, kInvMScale = 3, kInvVScale = 4 };
// The codes of a pack are decoded and encoded N at a time: pairs, or one in the scalar parts.
template <int W>
constexpr int kPair = W == 1 ? 1 : 2;

// The param and grad streams of a pack are read kSub elements at a time (one 16-byte vector of
// each: float32 4, bfloat16 8), each after the math of the previous ones: the whole pack's
// (40 registers of float32 loads) would not leave half of an SM's threads resident.
template <typename P, int W>
constexpr int kSub = W == 1 ? 1 : kPackElems<typename P::Storage>;

template <typename P>
struct Pass1 : Body<P> {
  static constexpr int kElems = 16;  // one 16-byte vector of each code stream
  Elem e;
  float mul;
  template <int W>
  __device__ __forceinline__ Partials<2, 2> operator()(Width<W>, int64_t i) const {
    const TensorMeta& t = this->t;
    constexpr int N = kPair<W>, H = kSub<P, W>;
    const Codes<W> mc = load_codes<W, Access::Keep>(t.state[0], i), vc = load_codes<W, Access::Keep>(t.state[1], i);
    Partials<2, 2> s;  // ||p||^2, ||u||^2, amax |m|, amax v
#pragma unroll
    for (int h = 0; h < W; h += H) {
      float p[H], g[H];
      load_param_and_grad<H, Access::Keep, P>(t, i + h, p, g);
#pragma unroll
      for (int j = 0; j < H; j += N) {
        float m[N], v[N];
        decode<__NV_E4M3>(mc.get(h + j, N), m);
        decode<__NV_E5M2>(vc.get(h + j, N), v);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          moments_and_norms(e, g[j + k] * mul, p[j + k], m[k], v[k], s);
          s.v[2] = nan_max(s.v[2], fabsf(m[k]));
          s.v[3] = nan_max(s.v[3], v[k]);
        }
      }
    }
    return s;
  }
};

template <typename P>
struct Pass2 : Body<P> {
  static constexpr int kElems = 16;  // one 16-byte vector of each code stream
  Elem e;
  float mul, step_size;
  uint32_t key;    // of the moments' stochastic rounding
  bool stochastic;
  template <int W>
  __device__ __forceinline__ NoPartials operator()(Width<W>, int64_t i) const {
    using namespace rounding;
    const TensorMeta& t = this->t;
    constexpr int N = kPair<W>;
    float p[W], g[W];
    load_param_and_grad<W, Access::Stream, P>(t, i, p, g);
    const Codes<W> mc = load_codes<W, Access::Stream>(t.state[0], i), vc = load_codes<W, Access::Stream>(t.state[1], i);
    Codes<W> m_out, v_out;
#pragma unroll
    for (int j = 0; j < W; j += N) {
      float m[N], v[N], m_code[N], v_code[N];
      decode<__NV_E4M3>(mc.get(j, N), m);
      decode<__NV_E5M2>(vc.get(j, N), v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float gk = g[j + k] * mul, pk = p[j + k];
        e.moments(gk, m[k], v[k]);
        m_code[k] = e.m_code(m[k]);
        v_code[k] = e.v_code(v[k]);
        uint32_t hash = 0u;
        if (stochastic) {  // (hashes the codes before the step)
          hash = element_hash(key, ScalarLanes::as_bits(gk), mc.get(j + k, 1), vc.get(j + k, 1));
          m_code[k] = stochastic_round<E4M3, ScalarLanes>(m_code[k], dither<E4M3>(hash));
          v_code[k] = stochastic_round<E5M2, ScalarLanes>(v_code[k], dither<E5M2>(hash));
        }
        const float x = pk - step_size * e.update(pk, m[k], v[k]);
        // (a rounded param hashes its moments' element hash, as on CPU)
        p[j + k] = P::low_precision && stochastic ? round_param<P>(x, param_hash_of_element(hash)) : x;
      }
      m_out.put(j, encode<__NV_E4M3>(m_code));
      v_out.put(j, encode<__NV_E5M2>(v_code));
    }
    P::template store<W, Access::Stream>(t, i, p);
    store_codes<W, Access::Stream>(t.state[0], i, m_out);
    store_codes<W, Access::Stream>(t.state[1], i, v_out);
    return {};
  }
};

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pass1(Launch l, lamb16::Hyper h, bool) {
  const float mul = grad_multiplier(l, false);
  const lamb16::Consts k = lamb16::consts(h);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const Elem e(k, lamb16::beta_scale(h.beta1, *c.t.scalars[0]), lamb16::beta_scale(h.beta2, *c.t.scalars[1]));
    write_partials(l, c.chunk, walk(c, Pass1<P>{{c.t}, e, mul}));
  });
}

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pass2(Launch l, lamb16::Hyper h) {
  const float mul = grad_multiplier(l, false);
  const lamb16::Consts consts = lamb16::consts(h);
  for_each_chunk<P>(l, [&](const BlockChunk& c) {
    const float* k = l.coeffs + c.tensor * kCoeffs;
    const Elem e(consts, k[kBeta1Scale], k[kBeta2Scale], k[kInvMScale], k[kInvVScale]);
    const uint32_t key = h.stochastic_rounding ? rounding::tensor_key(h.seed, *c.t.step) : 0u;  // (incremented)
    walk(c, Pass2<P>{{c.t}, e, mul, k[kStepSize], key, h.stochastic_rounding});
  });
}

struct Op {
  using Hyper = lamb16::Hyper;
  static constexpr int kReductions = lamb16::kReductions;
  static constexpr unsigned kMaxMask = lamb16::kMaxColumns;
  template <typename P>
  static constexpr auto pass1() { return cuda::pass1<P>; }
  template <typename P>
  static constexpr auto pass2() { return cuda::pass2<P>; }
  // ||p||^2, ||u||^2, amax |m|, amax v -> the step size, the old scales (times beta) and the
  // inverse new ones; the new scales are stored (pass 2 reads the old ones from the coefficients).
  static __device__ void coeffs(const Launch& l, const Hyper& h, int32_t i, const Totals<kReductions>& r) {
    const TensorMeta& t = l.tensors[i];
    float* k = l.coeffs + i * kCoeffs;
    k[kBeta1Scale] = lamb16::beta_scale(h.beta1, *t.scalars[0]);
    k[kBeta2Scale] = lamb16::beta_scale(h.beta2, *t.scalars[1]);
    k[kStepSize] = lamb16::step_size(h, *l.lr, r.r[0], r.r[1]);
    const float m_scale = lamb16::new_scale(r.r[2], lamb16::kE4M3Max);
    const float v_scale = lamb16::new_scale(r.r[3], lamb16::kE5M2Max);
    k[kInvMScale] = 1.f / m_scale;
    k[kInvVScale] = 1.f / v_scale;
    *t.scalars[0] = m_scale;
    *t.scalars[1] = v_scale;
  }
};

}  // namespace

extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, reduce) { return reduce_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, apply) { return apply_phase<Op>(*l, *h); }
extern "C" INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, step) { return one_call<Op>(*l, *h); }

}  // namespace inductor_lamb::cuda
