#include "cpu/engine.h"

#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstring>

namespace inductor_lamb::cpu {

// ---- run-time ISA dispatch -------------------------------------------------

Capability max_cpu_capability() {
  static const Capability best = [] {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
#ifdef INDUCTOR_LAMB_HAVE_AVX512
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Capability::AVX512;
#endif
#ifdef INDUCTOR_LAMB_HAVE_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Capability::AVX2;
#endif
#endif
    return Capability::Default;
  }();
  return best;
}

static Capability initial_capability() {
  // INDUCTOR_LAMB_CPU_CAPABILITY=default|avx2|avx512 lowers the choice, like ATen's ATEN_CPU_CAPABILITY.
  Capability c = max_cpu_capability();
  if (const char* env = std::getenv("INDUCTOR_LAMB_CPU_CAPABILITY")) {
    Capability want = c;
    if (!std::strcmp(env, "default")) want = Capability::Default;
    else if (!std::strcmp(env, "avx2")) want = Capability::AVX2;
    else if (!std::strcmp(env, "avx512")) want = Capability::AVX512;
    if (want < c) c = want;
  }
  return c;
}

static std::atomic<int>& active_capability() {
  static std::atomic<int> c{static_cast<int>(initial_capability())};
  return c;
}

Capability cpu_capability() { return static_cast<Capability>(active_capability().load(std::memory_order_relaxed)); }

void set_cpu_capability(Capability c) {
  TORCH_CHECK(c >= Capability::Default && c <= max_cpu_capability(), "CPU capability ", static_cast<int>(c),
              " is not supported by this CPU/build (best: ", static_cast<int>(max_cpu_capability()), ")");
  active_capability().store(static_cast<int>(c));
}

// ---- chunking and reduction ------------------------------------------------

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (auto n : numels) total += (n + kChunkElems - 1) / kChunkElems;
  chunks.reserve(total);
  for (int64_t t = 0; t < static_cast<int64_t>(numels.size()); ++t)
    for (int64_t b = 0; b < numels[t]; b += kChunkElems) chunks.push_back({t, b, std::min(numels[t], b + kChunkElems)});
  return chunks;
}

std::vector<double> reduce_per_tensor(const std::vector<Chunk>& chunks, const std::vector<double>& partials,
                                      int64_t k, int64_t num_tensors) {
  std::vector<double> out(num_tensors * k, 0.0);
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int64_t j = 0; j < k; ++j) out[chunks[c].tensor * k + j] += partials[c * k + j];
  return out;
}

std::vector<double> max_per_tensor(const std::vector<Chunk>& chunks, const std::vector<double>& partials,
                                   int64_t k, int64_t num_tensors) {
  std::vector<double> out(num_tensors * k, 0.0);
  for (size_t c = 0; c < chunks.size(); ++c)
    for (int64_t j = 0; j < k; ++j) {
      double& o = out[chunks[c].tensor * k + j];
      const double x = partials[c * k + j];
      if (std::isnan(x) || x > o) o = x;
    }
  return out;
}

std::vector<double> per_tensor_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                                     const std::vector<int64_t>& numels, float scale) {
  const auto chunks = make_chunks(numels);
  std::vector<double> partials(chunks.size());
  SumSqArgs args{ptrs.data(), dtypes.data(), {chunks.data(), static_cast<int64_t>(chunks.size())}, scale,
                 partials.data()};
  INDUCTOR_LAMB_KERNELS(engine_kernels).sumsq(args);
  return reduce_per_tensor(chunks, partials, 1, static_cast<int64_t>(numels.size()));
}

double global_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                    const std::vector<int64_t>& numels, float scale) {
  double s = 0.0;
  for (double t : per_tensor_sumsq(ptrs, dtypes, numels, scale)) s += t;
  return s;
}

double grad_multiplier(const TensorRows& rows, float inv_scale, double max_grad_norm) {
  if (max_grad_norm <= 0) return inv_scale;
  std::vector<const void*> grads(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) grads[i] = rows.grad(i);
  const double norm = std::sqrt(global_sumsq(grads, rows.dtypes(), rows.numels(), inv_scale));
  return inv_scale / clip_divisor(norm, max_grad_norm);
}

at::Tensor reductions_tensor(const std::vector<double>& values, int64_t n, int64_t k, const at::Device& device) {
  at::Tensor out = at::empty({n, k}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n * k; ++i) o[i] = float(values[i]);
  return device.is_cpu() ? out : out.to(device);
}

std::vector<double> read_reductions(const at::Tensor& reductions) {
  const at::Tensor r = reductions.contiguous();
  const float* x = r.data_ptr<float>();
  return std::vector<double>(x, x + r.numel());
}

std::vector<double> increment_steps(at::TensorList steps) {
  std::vector<double> t(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    float* step = steps[i].data_ptr<float>();
    *step += 1.f;
    t[i] = *step;
  }
  return t;
}

float inv_grad_scale(const std::optional<at::Tensor>& grad_scale) {
  if (!grad_scale.has_value() || !grad_scale->defined()) return 1.f;
  return 1.f / grad_scale->item<float>();
}

bool found_inf_set(const std::optional<at::Tensor>& found_inf) {
  return found_inf.has_value() && found_inf->defined() && found_inf->item<float>() != 0.f;
}

}  // namespace inductor_lamb::cpu
