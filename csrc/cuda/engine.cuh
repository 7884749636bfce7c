#pragma once
// The CUDA multi-tensor engine, device side (CUDA headers only). A launch covers every chunk of
// every tensor of a list: block b takes chunks b, b + gridDim.x, ... (the grid is sized from the
// device's SMs, see ops_cuda.cpp), each chunk's tensor found in the chunk table (device memory:
// no limit on the number of tensors, no per-launch argument packing).
//
// Bandwidth: in a chunk's body (cuda/chunk_layout.h) every stream is read and written with 16-byte
// global accesses, a thread's loads of all its streams issued before the math (E elements a
// thread: two or more vectors per float32 stream); grads through the read-only (non-coherent)
// path; streaming cache hints on the last pass over the data. The scalar head and tail of a
// chunk (< 16 elements each) and tensors whose streams cannot be aligned together run the same
// element math one element at a time, in a function of their own.
//
// Determinism: each chunk's reductions are one partial per chunk (fixed tree order inside the
// block); per-tensor totals are summed over the tensor's chunks in a fixed order by one warp:
// the same bits on every run. No atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "common/rounding.h"
#include "cuda/launch.h"
#include "cuda/chunk_layout.h"

namespace inductor_lamb::cuda {

// ---- global accesses -----------------------------------------------------------------------
// How a stream is read: grads through the read-only path; data that a later launch of the
// step reads or writes again stays cached (Keep); the last pass over it streams (Stream).
enum class Access { ReadOnly, Keep, Stream };

template <Access A, typename T>
__device__ __forceinline__ T ld(const T* p) {
  if constexpr (A == Access::ReadOnly) return __ldg(p);
  else if constexpr (A == Access::Keep) return __ldcg(p);
  else return __ldcs(p);
}
template <Access A, typename T>
__device__ __forceinline__ void st(T* p, T x) {
  if constexpr (A == Access::Stream) __stcs(p, x);
  else __stcg(p, x);
}

// A pack of W elements of a float stream stored as T (float, __nv_bfloat16, __half), as
// float32: W == 1 one element, else W * sizeof(T) / 16 vectors of 16 bytes.
template <typename T>
constexpr int kPerVector = kVecBytes / int(sizeof(T));
// Elements of a pack whose widest stream is float32 and whose param is stored as T: one 16-byte
// vector of the param (bf16 / fp16: two of each float32 stream), four loads or more in flight.
template <typename T>
constexpr int kPackElems = kPerVector<T> > 4 ? kPerVector<T> : 4;

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float* x) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (std::is_same_v<T, float>) {
    for (int k = 0; k < 4; ++k) x[k] = __uint_as_float(w[k]);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    for (int k = 0; k < 4; ++k) {  // (bfloat16 is the top half of a float32: exact)
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
      x[2 * k] = f.x;
      x[2 * k + 1] = f.y;
    }
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float* x) {
  uint32_t w[4];
  if constexpr (std::is_same_v<T, float>) {
    for (int k = 0; k < 4; ++k) w[k] = __float_as_uint(x[k]);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // round to nearest even, two at a time
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
  } else {
    for (int k = 0; k < 4; ++k) {
      const __half2 h = __floats2half2_rn(x[2 * k], x[2 * k + 1]);
      w[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 16-bit storage of T (bfloat16 / float16), for one-element accesses.
template <typename T>
using Bits = std::conditional_t<std::is_same_v<T, float>, float, unsigned short>;

template <typename T>
__device__ __forceinline__ float to_float(Bits<T> b) {
  if constexpr (std::is_same_v<T, float>) return b;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(uint32_t(b) << 16);
  else return __half2float(__ushort_as_half(b));
}
template <typename T>
__device__ __forceinline__ Bits<T> from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}

template <int W, Access A, typename T>
__device__ __forceinline__ void load(const void* base, int64_t i, float (&x)[W]) {
  const T* p = static_cast<const T*>(base) + i;
  if constexpr (W == 1) {
    x[0] = to_float<T>(ld<A>(reinterpret_cast<const Bits<T>*>(p)));
  } else {
    static_assert(W % kPerVector<T> == 0, "a pack is whole 16-byte vectors");
    constexpr int kVectors = W / kPerVector<T>;
    uint4 v[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) v[k] = ld<A>(reinterpret_cast<const uint4*>(p) + k);  // all in flight
#pragma unroll
    for (int k = 0; k < kVectors; ++k) unpack<T>(v[k], x + k * kPerVector<T>);
  }
}

template <int W, Access A, typename T>
__device__ __forceinline__ void store(void* base, int64_t i, const float (&x)[W]) {
  T* p = static_cast<T*>(base) + i;
  if constexpr (W == 1) {
    st<A>(reinterpret_cast<Bits<T>*>(p), from_float<T>(x[0]));
  } else {
    constexpr int kVectors = W / kPerVector<T>;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) st<A>(reinterpret_cast<uint4*>(p) + k, pack<T>(x + k * kPerVector<T>));
  }
}

// A pack of W float8 codes (LAMB16's moments), kept as stored: 4 codes a word.
template <int W>
struct Codes {
  static constexpr int kWords = (W + 3) / 4;
  uint32_t w[kWords] = {};
  // Codes j .. j + n - 1 (n = 1 or 2, j a multiple of n), and their replacement in a pack built
  // from zeros.
  __device__ __forceinline__ uint32_t get(int j, int n) const { return (w[j / 4] >> (8 * (j % 4))) & ((1u << 8 * n) - 1u); }
  __device__ __forceinline__ void put(int j, uint32_t bits) { w[j / 4] |= bits << (8 * (j % 4)); }
};

template <int W, Access A>
__device__ __forceinline__ Codes<W> load_codes(const void* base, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(base) + i;
  Codes<W> c;
  if constexpr (W == 1) {
    c.w[0] = ld<A>(p);
  } else {
    static_assert(W % kVecBytes == 0, "a pack is whole 16-byte vectors");
#pragma unroll
    for (int k = 0; k < W / kVecBytes; ++k) {
      const uint4 v = ld<A>(reinterpret_cast<const uint4*>(p) + k);
      c.w[4 * k] = v.x, c.w[4 * k + 1] = v.y, c.w[4 * k + 2] = v.z, c.w[4 * k + 3] = v.w;
    }
  }
  return c;
}

template <int W, Access A>
__device__ __forceinline__ void store_codes(void* base, int64_t i, const Codes<W>& c) {
  uint8_t* p = static_cast<uint8_t*>(base) + i;
  if constexpr (W == 1) {
    st<A>(p, static_cast<uint8_t>(c.w[0]));
  } else {
#pragma unroll
    for (int k = 0; k < W / kVecBytes; ++k)
      st<A>(reinterpret_cast<uint4*>(p) + k, make_uint4(c.w[4 * k], c.w[4 * k + 1], c.w[4 * k + 2], c.w[4 * k + 3]));
  }
}

// float8 codes <-> float32, exactly (decode) and rounding to nearest even (encode, after
// saturating: __NV_SATFINITE keeps NaN); N = 2 codes at a time with the paired hardware
// conversions (sm_89 and up; cuda_fp8.h falls back to software below), N = 1 one.
template <__nv_fp8_interpretation_t K, int N>
__device__ __forceinline__ void decode(uint32_t codes, float (&x)[N]) {
  if constexpr (N == 1) {
    x[0] = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(codes), K)));
  } else {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), K)));
    x[0] = f.x;
    x[1] = f.y;
  }
}
template <__nv_fp8_interpretation_t K, int N>
__device__ __forceinline__ uint32_t encode(const float (&x)[N]) {
  if constexpr (N == 1) return __nv_cvt_float_to_fp8(x[0], __NV_SATFINITE, K);
  else return __nv_cvt_float2_to_fp8x2(make_float2(x[0], x[1]), __NV_SATFINITE, K);
}

// ---- the param stream ----------------------------------------------------------------------
// A tensor's param as the math sees it: its float32 master copy when it has one (the param then
// only written), else the param itself (stored as T). Chunk kernels are instantiated per
// (T, master), a variant; a launch runs the variant of each kind of tensor its list holds
// (Launch::variants: one, unless a call mixes dtypes), each on the chunks of its own tensors.
template <typename T, bool kMaster>
struct Param {
  using Storage = T;
  static constexpr bool master = kMaster;
  // bf16 / fp16 params written rounded stochastically (without a master copy).
  static constexpr bool low_precision = !kMaster && !std::is_same_v<T, float>;
  static constexpr Dtype dtype = std::is_same_v<T, float> ? Dtype::Float
                                 : std::is_same_v<T, __nv_bfloat16> ? Dtype::BFloat16 : Dtype::Half;
  static constexpr int variant = param_variant(dtype, kMaster);
  template <int W, Access A>
  static __device__ __forceinline__ void load(const TensorMeta& t, int64_t i, float (&x)[W]) {
    if constexpr (kMaster) cuda::load<W, A, float>(t.master, i, x);
    else cuda::load<W, A, T>(t.param, i, x);
  }
  template <int W, Access A>
  static __device__ __forceinline__ void store(const TensorMeta& t, int64_t i, const float (&x)[W]) {
    if constexpr (kMaster) cuda::store<W, A, float>(t.master, i, x);
    cuda::store<W, A, T>(t.param, i, x);
  }
};

// f(Param<...>{}) for each variant of l.variants (host: which kernels to launch).
template <typename F>
void for_each_variant(const Launch& l, F&& f) {
  const auto one = [&](auto p) {
    if ((l.variants >> decltype(p)::variant) & 1u) f(p);
  };
  one(Param<float, false>{});
  one(Param<__nv_bfloat16, false>{});
  one(Param<__half, false>{});
  one(Param<float, true>{});
  one(Param<__nv_bfloat16, true>{});
  one(Param<__half, true>{});
}

// The grad stream of a tensor (stored like the param).
template <int W, typename P>
__device__ __forceinline__ void load_grad(const TensorMeta& t, int64_t i, float (&g)[W]) {
  load<W, Access::ReadOnly, typename P::Storage>(t.grad, i, g);
}
// A pack of the param (as the math sees it) and of its grad, all loads issued together.
template <int W, Access A, typename P>
__device__ __forceinline__ void load_param_and_grad(const TensorMeta& t, int64_t i, float (&p)[W], float (&g)[W]) {
  P::template load<W, A>(t, i, p);
  load_grad<W, P>(t, i, g);
}

// What an element body of variant P holds first: its tensor, and its pack (kElems elements: one
// 16-byte vector of the param, see kPackElems; LAMB16 sets its own).
template <typename P>
struct Body {
  static constexpr int kElems = kPackElems<typename P::Storage>;
  TensorMeta t;
};
// A float32 state list of a tensor.
__device__ __forceinline__ float* state_f32(const TensorMeta& t, int k) { return static_cast<float*>(t.state[k]); }

// Stochastic rounding of a bf16 / fp16 param without a master copy (common/rounding.h): whether
// a param of type P is rounded so, and the tensor's key, from the op's stochastic_rounding and
// seed and the step as the op counts it (LARS: 0).
struct ParamRound {
  uint32_t key;
  bool on;
  // x as stored: rounded onto P's grid with the hash of (key, hash_in, p0: the param before the
  // step) where `on`, else as it is (the store rounds to nearest).
  template <typename P>
  __device__ __forceinline__ float apply(float x, float hash_in, float p0) const;
};
template <typename P>
__device__ __forceinline__ ParamRound param_round(bool stochastic, int64_t seed, float step) {
  const bool on = P::low_precision && stochastic;
  return {on ? rounding::tensor_key(seed, step) : 0u, on};
}
// x rounded onto P's grid with the element's hash.
template <typename P>
__device__ __forceinline__ float round_param(float x, uint32_t hash) {
  using rounding::ScalarLanes;
  if constexpr (std::is_same_v<typename P::Storage, __nv_bfloat16>)
    return rounding::round_param<rounding::BF16, ScalarLanes>(x, hash);
  else
    return rounding::round_param<rounding::F16, ScalarLanes>(x, hash);
}
template <typename P>
__device__ __forceinline__ float ParamRound::apply(float x, float hash_in, float p0) const {
  using rounding::ScalarLanes;
  if (!on) return x;
  return round_param<P>(x, rounding::param_hash(rounding::param_base(key, ScalarLanes::as_bits(hash_in)),
                                                 ScalarLanes::as_bits(p0)));
}

// ---- launches and chunks -------------------------------------------------------------------

__device__ __forceinline__ bool skip_step(const Launch& l) { return l.found_inf && *l.found_inf != 0.f; }

// 1 / grad_scale (1 without one), times the clip factor in l.global[0] when `clipped`.
__device__ __forceinline__ float grad_multiplier(const Launch& l, bool clipped) {
  float m = l.inv_grad_scale ? *l.inv_grad_scale : 1.f;
  return clipped ? m * l.global[0] : m;
}

// max that propagates NaN (fmaxf would drop it).
template <typename T>
__device__ __forceinline__ T nan_max(T a, T b) { return (a != a || a > b) ? a : b; }

struct SumOp {
  template <typename T>
  __device__ static T apply(T a, T b) { return a + b; }
};
struct MaxOp {  // of values >= 0 (or NaN): |m|, v
  template <typename T>
  __device__ static T apply(T a, T b) { return nan_max(a, b); }
};

// A warp's reduction of one value per lane (fixed butterfly order); every lane gets it.
template <typename Op, typename T>
__device__ __forceinline__ T warp_reduce(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction of one value per thread (fixed order: warp butterflies, then warp 0
// over the warp results), so the same inputs give the same bits. Valid in thread 0. Identity
// 0 serves both ops (max of values >= 0).
template <typename Op, typename T = float>
__device__ __forceinline__ T block_reduce(T v) {
  __shared__ T warp_vals[kThreads / 32];
  v = warp_reduce<Op>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warp_vals may still be read by a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_reduce<Op>(lane < kThreads / 32 ? warp_vals[lane] : T(0));
  return v;
}

// A thread's partial reductions over its elements of a chunk: N sums, then M maxima.
template <int N, int M = 0>
struct Partials {
  float v[N + M > 0 ? N + M : 1] = {};
  __device__ __forceinline__ void add(const Partials& o) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += o.v[j];
#pragma unroll
    for (int j = N; j < N + M; ++j) v[j] = nan_max(v[j], o.v[j]);
  }
};
using NoPartials = Partials<0>;

// The chunk a block works on: its tensor (a copy in registers: the element loops' stores could
// alias the table, so a reference would reload its pointers after every store) and range.
struct BlockChunk {
  TensorMeta t;
  int32_t chunk, tensor;
  int64_t begin, end;
  __device__ __forceinline__ BlockChunk(const Launch& l, int32_t c)
      : t(l.tensors[l.chunks[c].tensor]),
        chunk(c),
        tensor(l.chunks[c].tensor),
        begin(int64_t(l.chunks[c].index) * kChunk),
        end(min(t.numel, begin + kChunk)) {}
};

// Writes this chunk's partials (block reductions of every thread's) into slots first, first + 1,
// ... of its row.
template <int N, int M>
__device__ __forceinline__ void write_partials(const Launch& l, int32_t chunk, const Partials<N, M>& p, int first = 0) {
#pragma unroll
  for (int j = 0; j < N + M; ++j) {
    const float r = j < N ? block_reduce<SumOp>(p.v[j]) : block_reduce<MaxOp>(p.v[j]);
    if (threadIdx.x == 0) l.partials[chunk * kPartials + first + j] = r;
  }
}

template <int W>
using Width = std::integral_constant<int, W>;

// The scalar ranges of a chunk: the same body, one element at a time, in a function of its own
// (the vector loop of the caller keeps only 16-byte accesses).
template <typename Body>
__device__ __forceinline__ auto scalar_range(const Body body, int64_t start, int64_t stop) {
  decltype(body(Width<1>{}, int64_t(0))) acc{};
  walk_scalar(start, stop, threadIdx.x, kThreads, [&](int64_t i) { acc.add(body(Width<1>{}, i)); });
  return acc;
}

// Runs body(Width<W>, i) over the chunk: on packs of E = Body::kElems elements at i (W = E),
// and on single elements (W = 1) in the scalar head and tail; returns the sum of what it
// returned (Partials).
template <typename Body>
__device__ __forceinline__ auto walk(const BlockChunk& c, const Body& body) {
  constexpr int E = Body::kElems;
  decltype(body(Width<E>{}, int64_t(0))) acc{};
  walk_chunk(plan_chunk(c.begin, c.end, c.t.head, E), E, threadIdx.x, kThreads,
             [&](int64_t i) { acc.add(body(Width<E>{}, i)); },
             [&](int64_t start, int64_t stop) { acc.add(scalar_range(body, start, stop)); });
  return acc;
}

// The element loop of a one-pass update with one float32 state list (LARS, Adagrad):
// p = e.step(g, p, s), s updated in place; a rounded param hashes the grad as stored.
template <typename P, typename Elem>
struct OneStateUpdate : Body<P> {
  Elem e;
  ParamRound round;
  template <int W>
  __device__ __forceinline__ NoPartials operator()(Width<W>, int64_t i) const {
    const TensorMeta& t = this->t;
    float p[W], g[W], s[W];
    load_param_and_grad<W, Access::Stream, P>(t, i, p, g);
    load<W, Access::Stream, float>(t.state[0], i, s);
#pragma unroll
    for (int j = 0; j < W; ++j) p[j] = round.apply<P>(e.step(g[j], p[j], s[j]), g[j], p[j]);
    store<W, Access::Stream, float>(t.state[0], i, s);
    P::template store<W, Access::Stream>(t, i, p);
    return {};
  }
};

// The sums of squares of a pack's params (when kParams) and scaled grads (LARS's norms; the
// global grad norm of clipping).
template <typename P, bool kParams>
struct SumsOfSquares : Body<P> {
  float mul;  // of the grads
  template <int W>
  __device__ __forceinline__ Partials<kParams ? 2 : 1> operator()(Width<W>, int64_t i) const {
    float p[W], g[W];
    if constexpr (kParams) load_param_and_grad<W, Access::Keep, P>(this->t, i, p, g);
    else load_grad<W, P>(this->t, i, g);
    Partials<kParams ? 2 : 1> s;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if constexpr (kParams) s.v[0] += p[j] * p[j];
      s.v[kParams] += (g[j] * mul) * (g[j] * mul);
    }
    return s;
  }
};

// LAMB's and LAMB16's pass-1 element: the new moments (m, v in place), its update u, and the
// partials ||p||^2, ||u||^2 (g already scaled).
template <typename Elem, int N, int M>
__device__ __forceinline__ void moments_and_norms(const Elem& e, float g, float p, float& m, float& v,
                                                  Partials<N, M>& s) {
  e.moments(g, m, v);
  const float u = e.update(p, m, v);
  s.v[0] += p * p;
  s.v[1] += u * u;
}

// Per tensor t, the sum (or max) over its chunks of partial j, by one warp: lane k takes chunks
// k, k + 32, ... in order, then a fixed butterfly; every lane gets it.
__device__ __forceinline__ double tensor_sum(const Launch& l, const TensorMeta& t, int j, int lane) {
  double s = 0.0;
#pragma unroll 4
  for (int32_t c = lane; c < t.num_chunks; c += 32) s += l.partials[(t.first_chunk + c) * kPartials + j];
  return warp_reduce<SumOp>(s);
}
__device__ __forceinline__ float tensor_max(const Launch& l, const TensorMeta& t, int j, int lane) {
  float m = 0.f;
  for (int32_t c = lane; c < t.num_chunks; c += 32) m = nan_max(m, l.partials[(t.first_chunk + c) * kPartials + j]);
  return warp_reduce<MaxOp>(m);
}

// Per tensor: column j < k of its reductions, the total of partial j (max where bit j of
// max_mask is set), rounded to float32 (what a reduce op returns); zeros on a skipped step.
template <int K>
struct Totals {
  float r[K];
};
template <int K>
__device__ __forceinline__ Totals<K> tensor_totals(const Launch& l, const TensorMeta& t, unsigned max_mask, int lane) {
  Totals<K> out;
#pragma unroll
  for (int j = 0; j < K; ++j) out.r[j] = (max_mask >> j) & 1u ? tensor_max(l, t, j, lane) : float(tensor_sum(l, t, j, lane));
  return out;
}

// ---- launching -----------------------------------------------------------------------------

// Chunk kernels keep at least kMinBlocks blocks on an SM (half of its 2048 threads on sm_80 to
// sm_100): registers are capped for it (__launch_bounds__), so loads in flight are never cut by
// occupancy.
constexpr int kMinBlocks = 4;

// The per-tensor kernels take one warp a tensor: this warp's tensor, or -1 past the last one.
__device__ __forceinline__ int32_t warp_tensor(const Launch& l) {
  const int32_t i = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  return i < l.num_tensors ? i : -1;
}

// Launches on the launch's stream (ops_cuda.cpp sizes the grid of a chunk kernel: at most what
// the device's SMs hold at once, each block taking several chunks); one warp per tensor for
// the per-tensor kernels; nothing where there is nothing (a grid of 0 blocks is an error).
// When l.count is set nothing is launched: the launches are counted (launch_count).
int chunk_grid(const void* kernel, const Launch& l);

template <typename... P, typename... A>
void on_chunks(void (*kernel)(Launch, P...), const Launch& l, const A&... args) {
  if (l.count) {
    ++*l.count;
  } else if (l.num_chunks > 0) {
    kernel<<<dim3(static_cast<unsigned>(chunk_grid(reinterpret_cast<const void*>(kernel), l))), kThreads, 0,
             l.stream>>>(l, args...);
  }
}
template <typename... P, typename... A>
void on_tensors(void (*kernel)(Launch, P...), const Launch& l, const A&... args) {
  constexpr int kPerBlock = kThreads / 32;
  const auto blocks = static_cast<unsigned>((l.num_tensors + kPerBlock - 1) / kPerBlock);
  if (l.count) ++*l.count;
  else if (l.num_tensors > 0) kernel<<<dim3(blocks), kThreads, 0, l.stream>>>(l, args...);
}
// The status of the launches so far (0 when counting).
inline int launched(const Launch& l) { return l.count ? 0 : cudaGetLastError(); }

// Global grad-norm clipping (engine.cu), two launches: l.global[0] = clip factor
// 1 / max(1, ||grads / grad_scale|| / max_norm); kernels then read grad_multiplier(l, true).
int launch_grad_clip(const Launch& l, double max_norm);

// ---- the phases of a layer-wise op ---------------------------------------------------------
// An op Op gives its kernels and per-tensor math:
//   Op::Hyper, Op::kReductions (columns), Op::kMaxMask (which are maxima);
//   pass1<P>(): (Launch, Hyper, bool clipped) chunk kernels (one per variant P) writing partials
//                                          0..kReductions-1;
//   pass2<P>(): (Launch, Hyper) chunk kernels     reading l.coeffs;
//   coeffs(l, h, i, totals)             per tensor i (one thread): l.coeffs from its reductions;
//                                       runs after the steps are incremented.
// reduce = pass1 + totals (steps += 1); apply = coeffs + pass2; a one-call step = pass1 +
// totals and coeffs together + pass2: three launches, the same bits as reduce then apply.

template <typename Op>
__global__ void __launch_bounds__(kThreads) finish_reduce(Launch l) {
  const int32_t i = warp_tensor(l);
  if (i < 0) return;
  const int lane = threadIdx.x % 32;
  const TensorMeta& t = l.tensors[i];
  const bool skip = skip_step(l);
  const Totals<Op::kReductions> r = skip ? Totals<Op::kReductions>{} : tensor_totals<Op::kReductions>(l, t, Op::kMaxMask, lane);
  if (lane != 0) return;
  for (int j = 0; j < Op::kReductions; ++j) l.reductions[i * Op::kReductions + j] = skip ? 0.f : r.r[j];
  if (t.step && !skip) *t.step += 1.f;
}

template <typename Op>
__global__ void __launch_bounds__(kThreads) apply_coeffs(Launch l, typename Op::Hyper h) {
  const int32_t i = warp_tensor(l);
  if (i < 0 || skip_step(l) || threadIdx.x % 32 != 0) return;
  Totals<Op::kReductions> r;
  for (int j = 0; j < Op::kReductions; ++j) r.r[j] = l.reductions[i * Op::kReductions + j];
  Op::coeffs(l, h, i, r);
}

template <typename Op>
__global__ void __launch_bounds__(kThreads) finish_and_coeffs(Launch l, typename Op::Hyper h) {
  const int32_t i = warp_tensor(l);
  if (i < 0 || skip_step(l)) return;
  const TensorMeta& t = l.tensors[i];
  const Totals<Op::kReductions> r = tensor_totals<Op::kReductions>(l, t, Op::kMaxMask, threadIdx.x % 32);
  if (threadIdx.x % 32 != 0) return;
  if (t.step) *t.step += 1.f;
  Op::coeffs(l, h, i, r);
}

// Pass 1 or 2 of every variant of the list (Op::pass1<P>, Op::pass2<P>).
template <typename Op>
void launch_pass1(const Launch& l, const typename Op::Hyper& h, bool clipped) {
  for_each_variant(l, [&](auto p) { on_chunks(Op::template pass1<decltype(p)>(), l, h, clipped); });
}
template <typename Op>
void launch_pass2(const Launch& l, const typename Op::Hyper& h) {
  for_each_variant(l, [&](auto p) { on_chunks(Op::template pass2<decltype(p)>(), l, h); });
}

template <typename Op>
int reduce_phase(const Launch& l, const typename Op::Hyper& h, double max_grad_norm = 0.0) {
  if (max_grad_norm > 0) {
    if (int e = launch_grad_clip(l, max_grad_norm)) return e;
  }
  launch_pass1<Op>(l, h, max_grad_norm > 0);
  on_tensors(finish_reduce<Op>, l);
  return launched(l);
}
template <typename Op>
int apply_phase(const Launch& l, const typename Op::Hyper& h) {
  on_tensors(apply_coeffs<Op>, l, h);
  launch_pass2<Op>(l, h);
  return launched(l);
}
template <typename Op>
int one_call(const Launch& l, const typename Op::Hyper& h, double max_grad_norm = 0.0) {
  if (max_grad_norm > 0) {
    if (int e = launch_grad_clip(l, max_grad_norm)) return e;
  }
  launch_pass1<Op>(l, h, max_grad_norm > 0);
  on_tensors(finish_and_coeffs<Op>, l, h);
  launch_pass2<Op>(l, h);
  return launched(l);
}

// A chunk kernel's loop for variant P: f(chunk) for each of this block's chunks whose tensor is of
// that variant; nothing on a step that GradScaler skips.
template <typename P, typename F>
__device__ __forceinline__ void for_each_chunk(const Launch& l, F&& f) {
  if (skip_step(l)) return;
  const bool mixed = l.variants != 1u << P::variant;
  for (int32_t c = blockIdx.x; c < l.num_chunks; c += gridDim.x) {
    if (mixed && param_variant(l.tensors[l.chunks[c].tensor]) != P::variant) continue;
    f(BlockChunk(l, c));
  }
}

}  // namespace inductor_lamb::cuda
