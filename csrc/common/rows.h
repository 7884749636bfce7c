#pragma once
// Device-neutral host code shared by the CPU and CUDA glue: the per-index rows
// of an op's tensor lists, as raw pointers in one memory layout.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "common/math.h"

namespace inductor_lamb {

Dtype to_dtype(at::ScalarType s);

// A per-element list of an op (optimizer state or master params), shaped like
// the params and mutated in place; float32 unless `dtype` says otherwise (LAMB16's fp8 moments).
struct StateList {
  const char* name;
  at::TensorList tensors;
  at::ScalarType dtype = at::kFloat;
};

// Gives one raw pointer per tensor of a list index (param, grad, states, ...) such
// that element k of each is the same logical element. Tensors whose layouts agree
// (any strides, dense, identical for all of them) are used in place with no copy (the usual
// case: only their pointers are kept, no tensor and no allocation, which matters at thousands
// of tensors a call); otherwise each non-contiguous one is replaced by a contiguous copy,
// written back by commit() if the op mutates it.
class LayoutRow {
 public:
  static constexpr size_t kMaxTensors = 6;  // param, grad, up to three state lists, master
  // `row` holds the defined tensors of one index; mutated[k] says whether row[k] is written.
  LayoutRow(const at::Tensor* const* row, size_t n, const std::vector<bool>& mutated);
  void* ptr(size_t k) const { return ptrs_[k]; }
  void commit();
  void commit(size_t k);  // row[k] only (the lists one phase of a two-phase op writes)

 private:
  void* ptrs_[kMaxTensors] = {};
  // Only for a row whose layouts differ: the contiguous copies and the originals.
  struct Copies {
    std::vector<at::Tensor> row, originals;
    std::vector<bool> mutated;
  };
  std::unique_ptr<Copies> copies_;
};

// Raw pointers of (param, grad, state lists...) per index, in one layout (LayoutRow).
class TensorRows {
 public:
  TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& state_lists);
  size_t size() const { return rows_.size(); }
  void* param(size_t i) const { return rows_[i].ptr(0); }
  const void* grad(size_t i) const { return rows_[i].ptr(1); }
  void* state(size_t i, size_t k) const { return rows_[i].ptr(2 + k); }  // state list k, any dtype
  float* floats(size_t i, size_t k) const { return static_cast<float*>(state(i, k)); }
  const std::vector<int64_t>& numels() const { return numels_; }
  const std::vector<Dtype>& dtypes() const { return dtypes_; }
  void commit();  // write back the copies made for mismatched layouts
  // Only what one phase writes: the params (and master params, state list
  // `master`, when >= 0) and the state lists whose bit is set in `states`.
  void commit(bool params, unsigned states, int master = -1);

 private:
  std::vector<LayoutRow> rows_;
  std::vector<int64_t> numels_;
  std::vector<Dtype> dtypes_;
};

}  // namespace inductor_lamb
