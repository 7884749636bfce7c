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

// ---- argument checking -------------------------------------------------------

void ArgChecker::same_length(const char* name, at::TensorList list, const char* ref_name, size_t n) const {
  TORCH_CHECK(list.size() == n, op_, ": ", name, " has ", list.size(), " tensors but ", ref_name, " has ", n);
}

void ArgChecker::dense_on(const at::Tensor& t, const char* name, size_t i, const at::Device& device) const {
  TORCH_CHECK(t.defined(), op_, ": ", name, "[", i, "] is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, op_, ": ", name, "[", i, "] has layout ", t.layout(),
              "; only dense (strided) tensors are supported (sparse gradients are not)");
  TORCH_CHECK(t.device() == device, op_, ": ", name, "[", i, "] is on ", t.device(), " but expected ", device);
}

void ArgChecker::same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                            size_t i) const {
  TORCH_CHECK(t.sizes() == ref.sizes(), op_, ": ", name, "[", i, "] has shape ", t.sizes(), " but ", ref_name, "[",
              i, "] has shape ", ref.sizes());
}

void ArgChecker::dtype_is(const at::Tensor& t, const char* name, size_t i, at::ScalarType expected) const {
  TORCH_CHECK(t.scalar_type() == expected, op_, ": ", name, "[", i, "] has dtype ", t.scalar_type(), ", expected ",
              expected);
}

void ArgChecker::param_dtype(const at::Tensor& t, const char* name, size_t i) const {
  auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, op_, ": ", name, "[", i, "] has dtype ", s,
              "; supported: float32, bfloat16, float16");
}

void ArgChecker::scalar_tensor(const at::Tensor& t, const char* name, int64_t i, const at::Device& device) const {
  std::string where = i < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(i) + "]";
  TORCH_CHECK(t.defined(), op_, ": ", where, " is undefined");
  TORCH_CHECK(t.dim() == 0, op_, ": ", where, " must be a 0-d tensor, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, op_, ": ", where, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, op_, ": ", where, " is on ", t.device(), " but expected ", device);
}

void ArgChecker::optional_scalar(const std::optional<at::Tensor>& t, const char* name,
                                 const at::Device& device) const {
  if (!t.has_value() || !t->defined()) return;
  TORCH_CHECK(t->numel() == 1, op_, ": ", name, " must have one element, got shape ", t->sizes());
  TORCH_CHECK(t->scalar_type() == at::kFloat, op_, ": ", name, " must be float32, got ", t->scalar_type());
  TORCH_CHECK(t->device() == device, op_, ": ", name, " is on ", t->device(), " but expected ", device);
}

void ArgChecker::in_range(double v, const char* name, double lo, double hi, bool hi_open) const {
  bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
  TORCH_CHECK(ok, op_, ": invalid ", name, " ", v, ", expected a value in [", lo, ", ", hi, hi_open ? ")" : "]");
}

Dtype to_dtype(at::ScalarType s) {
  switch (s) {
    case at::kBFloat16: return Dtype::BFloat16;
    case at::kHalf: return Dtype::Half;
    default: return Dtype::Float;
  }
}

// ---- layout normalization --------------------------------------------------

// Same logical-to-memory mapping: equal sizes and equal strides on every dim of size > 1.
static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

LayoutRow::LayoutRow(std::vector<at::Tensor> row, std::vector<bool> mutated)
    : originals_(row), row_(std::move(row)), mutated_(std::move(mutated)) {
  bool in_place = true;
  for (const auto& t : row_)
    in_place = in_place && t.is_non_overlapping_and_dense() && same_layout(t, row_[0]);
  if (in_place) return;
  for (auto& t : row_)
    if (!t.is_contiguous()) t = t.contiguous();
}

void LayoutRow::commit() {
  for (size_t k = 0; k < row_.size(); ++k)
    if (mutated_[k]) commit(k);
}

void LayoutRow::commit(size_t k) {
  if (!row_[k].is_same(originals_[k])) originals_[k].copy_(row_[k]);
}

// ---- the per-index rows of an op ---------------------------------------------

void check_lists(const ArgChecker& chk, at::TensorList params, at::TensorList grads,
                 const std::vector<StateList>& state_lists, const at::Device& device) {
  const size_t n = params.size();
  chk.same_length("grads", grads, "params", n);
  for (const auto& l : state_lists) chk.same_length(l.name, l.tensors, "params", n);
  for (size_t i = 0; i < n; ++i) {
    chk.dense_on(params[i], "params", i, device);
    chk.param_dtype(params[i], "params", i);
    chk.grad_like(grads[i], "grads", i, params[i]);
    for (const auto& l : state_lists) {
      chk.dense_on(l.tensors[i], l.name, i, params[i].device());
      chk.same_shape(l.tensors[i], l.name, params[i], "params", i);
      chk.dtype_is(l.tensors[i], l.name, i, l.dtype);
    }
  }
}

void check_scalars(const ArgChecker& chk, const char* name, at::TensorList list, size_t n, const at::Device& device) {
  chk.same_length(name, list, "params", n);
  for (size_t i = 0; i < n; ++i) chk.scalar_tensor(list[i], name, i, device);
}

TensorRows::TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& float_lists) {
  const size_t n = params.size();
  rows_.reserve(n);
  numels_.resize(n);
  dtypes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> row{params[i], grads[i]};
    std::vector<bool> mutated{true, false};
    for (const auto& l : float_lists) {
      row.push_back(l.tensors[i]);
      mutated.push_back(true);
    }
    rows_.emplace_back(std::move(row), std::move(mutated));
    numels_[i] = params[i].numel();
    dtypes_[i] = to_dtype(params[i].scalar_type());
  }
}

void TensorRows::commit() {
  for (auto& r : rows_) r.commit();
}

void TensorRows::commit(bool params, std::initializer_list<int> states, int master) {
  for (auto& r : rows_) {
    if (params) r.commit(0);
    if (params && master >= 0) r.commit(2 + master);
    for (int k : states) r.commit(2 + k);
  }
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
  return norm > max_grad_norm ? inv_scale / (norm / max_grad_norm) : inv_scale;
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

void check_reductions(const ArgChecker& chk, const at::Tensor& reductions, int64_t n, int64_t k,
                      const at::Device& device) {
  TORCH_CHECK(reductions.defined(), chk.op(), ": reductions is undefined");
  TORCH_CHECK(reductions.layout() == at::kStrided && reductions.dim() == 2 && reductions.size(0) == n &&
                  reductions.size(1) == k,
              chk.op(), ": reductions must have shape [", n, ", ", k, "] (params x partial reductions), got ",
              reductions.sizes());
  TORCH_CHECK(reductions.scalar_type() == at::kFloat, chk.op(), ": reductions must be float32, got ",
              reductions.scalar_type());
  TORCH_CHECK(reductions.device() == device, chk.op(), ": reductions is on ", reductions.device(), " but expected ",
              device);
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
