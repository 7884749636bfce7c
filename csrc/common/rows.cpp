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

TensorRows::TensorRows(at::TensorList params, at::TensorList grads, const std::vector<StateList>& state_lists) {
  const size_t n = params.size();
  rows_.reserve(n);
  numels_.resize(n);
  dtypes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> row{params[i], grads[i]};
    std::vector<bool> mutated{true, false};
    for (const auto& l : state_lists) {
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

void TensorRows::commit(bool params, unsigned states, int master) {
  for (auto& r : rows_) {
    if (params) r.commit(0);
    if (params && master >= 0) r.commit(2 + master);
    for (int k = 0; states >> k; ++k)
      if ((states >> k) & 1u) r.commit(2 + k);
  }
}

}  // namespace inductor_lamb
