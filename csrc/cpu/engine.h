#pragma once
// The multi-tensor engine, glue side (compiled with normal flags): argument
// checking, layout normalization, chunking, deterministic per-tensor reduction,
// and run-time selection of the per-ISA kernel tables.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "cpu/types.h"

namespace inductor_lamb::cpu {

// ---- run-time ISA dispatch -------------------------------------------------

Capability cpu_capability();                 // the active one
Capability max_cpu_capability();             // the best this CPU and build support
void set_cpu_capability(Capability c);       // force (errors above max_cpu_capability)

// Picks the table for the active capability. Tables are named name_DEFAULT,
// name_AVX2, name_AVX512 by the per-ISA objects (INDUCTOR_LAMB_ISA_SYMBOL).
template <typename K>
const K& select_kernels(const K& generic, const K* avx2, const K* avx512) {
  switch (cpu_capability()) {
    case Capability::AVX512: if (avx512) return *avx512; [[fallthrough]];
    case Capability::AVX2: if (avx2) return *avx2; [[fallthrough]];
    default: return generic;
  }
}

#ifdef INDUCTOR_LAMB_HAVE_AVX2
#define INDUCTOR_LAMB_DECL_AVX2(T, name) extern const T name##_AVX2;
#define INDUCTOR_LAMB_PTR_AVX2(name) &name##_AVX2
#else
#define INDUCTOR_LAMB_DECL_AVX2(T, name)
#define INDUCTOR_LAMB_PTR_AVX2(name) nullptr
#endif
#ifdef INDUCTOR_LAMB_HAVE_AVX512
#define INDUCTOR_LAMB_DECL_AVX512(T, name) extern const T name##_AVX512;
#define INDUCTOR_LAMB_PTR_AVX512(name) &name##_AVX512
#else
#define INDUCTOR_LAMB_DECL_AVX512(T, name)
#define INDUCTOR_LAMB_PTR_AVX512(name) nullptr
#endif

// Declares the per-ISA tables of a kernel family (at namespace inductor_lamb::cpu).
#define INDUCTOR_LAMB_DECLARE_KERNELS(T, name) \
  extern const T name##_DEFAULT;               \
  INDUCTOR_LAMB_DECL_AVX2(T, name)             \
  INDUCTOR_LAMB_DECL_AVX512(T, name)
// The table of the active ISA.
#define INDUCTOR_LAMB_KERNELS(name) \
  ::inductor_lamb::cpu::select_kernels(name##_DEFAULT, INDUCTOR_LAMB_PTR_AVX2(name), INDUCTOR_LAMB_PTR_AVX512(name))

INDUCTOR_LAMB_DECLARE_KERNELS(EngineKernels, engine_kernels)

// ---- argument checking -------------------------------------------------------

// Checks with messages like "lamb_step_: grads[3] has shape [2, 3] but params[3] has shape [3, 2]".
// Every check runs before any tensor is touched, so a failing call modifies nothing.
class ArgChecker {
 public:
  explicit ArgChecker(const char* op) : op_(op) {}
  const char* op() const { return op_; }

  void same_length(const char* name, at::TensorList list, const char* ref_name, size_t n) const;
  // `t` (list entry `name`[i]) must be defined, dense (strided), on `device`.
  void dense_on(const at::Tensor& t, const char* name, size_t i, const at::Device& device) const;
  void same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name, size_t i) const;
  void dtype_is(const at::Tensor& t, const char* name, size_t i, at::ScalarType expected) const;
  void param_dtype(const at::Tensor& t, const char* name, size_t i) const;  // float32 / bfloat16 / float16
  // A 0-d float32 tensor (lr, steps[i]); i < 0 for a non-list argument.
  void scalar_tensor(const at::Tensor& t, const char* name, int64_t i, const at::Device& device) const;
  // grad_scale / found_inf: one float32 element on `device`.
  void optional_scalar(const std::optional<at::Tensor>& t, const char* name, const at::Device& device) const;
  void in_range(double v, const char* name, double lo, double hi, bool hi_open) const;
  // The scalar tensors every step op takes: lr (0-d float32) and the optional grad_scale / found_inf.
  void step_scalars(const at::Tensor& lr, const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf, const at::Device& device) const {
    scalar_tensor(lr, "lr", -1, device);
    optional_scalar(grad_scale, "grad_scale", device);
    optional_scalar(found_inf, "found_inf", device);
  }

  // The usual per-index rows: a gradient matches its param's device, shape and dtype;
    void grad_like(const at::Tensor& g, const char* name, size_t i, const at::Tensor& p) const {
    dense_on(g, name, i, p.device());
    same_shape(g, name, p, "params", i);
    dtype_is(g, name, i, p.scalar_type());
  }

 private:
  const char* op_;
};

Dtype to_dtype(at::ScalarType s);

// ---- layout normalization --------------------------------------------------

// Gives one raw pointer per tensor of a list index (param, grad, states, ...) such
// that element k of each is the same logical element. Tensors whose layouts agree
// (any strides, dense, identical for all of them) are used in place with no copy;
// otherwise each non-contiguous one is replaced by a contiguous copy, written
// back by commit() if the op mutates it.
class LayoutRow {
 public:
  // `row` holds the defined tensors of one index; mutated[k] says whether row[k] is written.
  LayoutRow(std::vector<at::Tensor> row, std::vector<bool> mutated);
  void* ptr(size_t k) const { return row_[k].numel() ? row_[k].data_ptr() : nullptr; }
  void commit();
  void commit(size_t k);  // row[k] only (the lists one phase of a two-phase op writes)

 private:
  std::vector<at::Tensor> originals_;
  std::vector<at::Tensor> row_;
  std::vector<bool> mutated_;
};

// ---- the per-index rows of an op ---------------------------------------------

// A per-element list of an op (optimizer state or master params), shaped like
// the params and mutated in place; float32 unless `dtype` says otherwise (LAMB16's fp8 moments).
struct StateList {
  const char* name;
  at::TensorList tensors;
  at::ScalarType dtype = at::kFloat;
};

// Checks params (float32/bf16/f16 on `device`), grads (like their param) and the
// state lists (like their param, in their dtype): lengths, devices, shapes, dtypes.
void check_lists(const ArgChecker& chk, at::TensorList params, at::TensorList grads,
                 const std::vector<StateList>& state_lists, const at::Device& device);
// Checks a per-param list of 0-d float32 tensors (steps, LAMB16's scales).
void check_scalars(const ArgChecker& chk, const char* name, at::TensorList list, size_t n, const at::Device& device);
inline void check_steps(const ArgChecker& chk, at::TensorList steps, size_t n, const at::Device& device) {
  check_scalars(chk, "steps", steps, n, device);
}

// Raw pointers of (param, grad, float lists...) per index, in one layout (LayoutRow).
class TensorRows {
 public:
  TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& state_lists);
  size_t size() const { return rows_.size(); }
  void* param(size_t i) const { return rows_[i].ptr(0); }
  const void* grad(size_t i) const { return rows_[i].ptr(1); }
  float* floats(size_t i, size_t k) const { return static_cast<float*>(rows_[i].ptr(2 + k)); }
  void* state(size_t i, size_t k) const { return rows_[i].ptr(2 + k); }  // state list k, any dtype
  const std::vector<int64_t>& numels() const { return numels_; }
  const std::vector<Dtype>& dtypes() const { return dtypes_; }
  void commit();  // write back the copies made for mismatched layouts
  // Only what one phase writes: the params (and master params, state list
  // `master`, when >= 0) and the state lists `states`.
  void commit(bool params, std::initializer_list<int> states, int master = -1);

 private:
  std::vector<LayoutRow> rows_;
  std::vector<int64_t> numels_;
  std::vector<Dtype> dtypes_;
};

// ---- chunking and reduction ------------------------------------------------

constexpr int64_t kChunkElems = 16384;

// Cuts every tensor into ranges of at most kChunkElems elements, in list order.
std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels);

// out[t * k + j] = sum over the chunks of tensor t (in chunk order) of partials[c * k + j].
std::vector<double> reduce_per_tensor(const std::vector<Chunk>& chunks, const std::vector<double>& partials,
                                      int64_t k, int64_t num_tensors);

// out[t * k + j] = max over the chunks of tensor t of partials[c * k + j] (NaN wins;
// 0 for a tensor without chunks): per-tensor amax, e.g. LAMB16's scales.
std::vector<double> max_per_tensor(const std::vector<Chunk>& chunks, const std::vector<double>& partials,
                                   int64_t k, int64_t num_tensors);

// Per tensor of a list, the sum of (scale * x)^2 (deterministic): layer norms.
std::vector<double> per_tensor_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                                     const std::vector<int64_t>& numels, float scale);
// Over a whole list: global grad-norm clipping.
double global_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                    const std::vector<int64_t>& numels, float scale);
// The gradient multiplier 1 / (grad_scale * clip), clip = max(1, ||grads / grad_scale|| / max_grad_norm)
// (no clipping when max_grad_norm <= 0).
double grad_multiplier(const TensorRows& rows, float inv_scale, double max_grad_norm);

// ---- two-phase ops ----------------------------------------------------------------

// The reduce phase's result: per-tensor values (n rows of k, double) as a float32
// [n, k] tensor on `device`. The apply phase reads it back with read_reductions.
at::Tensor reductions_tensor(const std::vector<double>& values, int64_t n, int64_t k, const at::Device& device);
std::vector<double> read_reductions(const at::Tensor& reductions);
// `reductions` of an apply op: float32 [n, k] on `device` (checked after the op's other arguments).
void check_reductions(const ArgChecker& chk, const at::Tensor& reductions, int64_t n, int64_t k,
                      const at::Device& device);

// steps[i] += 1 for every i; returns the new values (the t of bias corrections and lr decays).
std::vector<double> increment_steps(at::TensorList steps);

// Reads grad_scale / found_inf (CPU): 1 / grad_scale, and whether found_inf is set.
float inv_grad_scale(const std::optional<at::Tensor>& grad_scale);
bool found_inf_set(const std::optional<at::Tensor>& found_inf);

}  // namespace inductor_lamb::cpu
