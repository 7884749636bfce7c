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

LayoutRow::LayoutRow(std::vector<at::Tensor> row, const std::vector<bool>& mutated) : row_(std::move(row)) {
  bool in_place = true;
  for (const auto& t : row_)
    in_place = in_place && t.is_non_overlapping_and_dense() && same_layout(t, row_[0]);
  if (in_place) return;  // (the usual case: nothing more to keep, which matters at thousands of tensors)
  originals_ = row_;
  mutated_ = mutated;
  for (auto& t : row_)
    if (!t.is_contiguous()) t = t.contiguous();
}

void LayoutRow::commit() {
  for (size_t k = 0; k < originals_.size(); ++k)
    if (mutated_[k]) commit(k);
}

void LayoutRow::commit(size_t k) {
  if (!originals_.empty() && !row_[k].is_same(originals_[k])) originals_[k].copy_(row_[k]);
}

TensorRows::TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& state_lists) {
  const size_t n = params.size();
  rows_.reserve(n);
  numels_.resize(n);
  dtypes_.resize(n);
  std::vector<bool> mutated{true, false};  // params, grads, then the state lists
  mutated.resize(2 + state_lists.size(), true);
  for (size_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> row;
    row.reserve(2 + state_lists.size());
    row.push_back(params[i]);
    row.push_back(grads[i]);
    for (const auto& l : state_lists) row.push_back(l.tensors[i]);
    rows_.emplace_back(std::move(row), mutated);
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
