#include "common/rows.h"

namespace inductor_lamb {

Dtype to_dtype(at::ScalarType s) {
  switch (s) {
    case at::kBFloat16: return Dtype::BFloat16;
    case at::kHalf: return Dtype::Half;
    default: return Dtype::Float;
  }
}

// Same logical-to-memory mapping: equal sizes and equal strides on every dim of size > 1.
static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

static void* data_of(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

LayoutRow::LayoutRow(const at::Tensor* const* row, size_t n, const std::vector<bool>& mutated) {
  TORCH_INTERNAL_ASSERT(n <= kMaxTensors, "a row of ", n, " tensors");
  bool in_place = true;
  for (size_t k = 0; k < n && in_place; ++k)
    in_place = row[k]->is_non_overlapping_and_dense() && same_layout(*row[k], *row[0]);
  if (in_place) {  // (the usual case)
    for (size_t k = 0; k < n; ++k) ptrs_[k] = data_of(*row[k]);
    return;
  }
  copies_ = std::make_unique<Copies>();
  copies_->mutated = mutated;
  for (size_t k = 0; k < n; ++k) {
    copies_->originals.push_back(*row[k]);
    copies_->row.push_back(row[k]->is_contiguous() ? *row[k] : row[k]->contiguous());
    ptrs_[k] = data_of(copies_->row.back());
  }
}

void LayoutRow::commit() {
  if (!copies_) return;
  for (size_t k = 0; k < copies_->originals.size(); ++k)
    if (copies_->mutated[k]) commit(k);
}

void LayoutRow::commit(size_t k) {
  if (copies_ && !copies_->row[k].is_same(copies_->originals[k])) copies_->originals[k].copy_(copies_->row[k]);
}

TensorRows::TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& state_lists) {
  const size_t n = params.size();
  rows_.reserve(n);
  numels_.resize(n);
  dtypes_.resize(n);
  std::vector<bool> mutated{true, false};  // params, grads, then the state lists
  mutated.resize(2 + state_lists.size(), true);
  const at::Tensor* row[LayoutRow::kMaxTensors];
  for (size_t i = 0; i < n; ++i) {
    row[0] = &params[i];
    row[1] = &grads[i];
    for (size_t k = 0; k < state_lists.size(); ++k) row[2 + k] = &state_lists[k].tensors[i];
    rows_.emplace_back(row, 2 + state_lists.size(), mutated);
    numels_[i] = params[i].numel();
    dtypes_[i] = to_dtype(params[i].scalar_type());
  }
}

void TensorRows::commit() {
  for (auto& r : rows_) r.commit();
}

void TensorRows::commit(bool params, unsigned states, int master) {
  for (auto& r : rows_) {
    if (params) r.commit(0);
    if (params && master >= 0) r.commit(2 + master);
    for (int k = 0; states >> k; ++k)
      if ((states >> k) & 1u) r.commit(2 + k);
  }
}

}  // namespace inductor_lamb
