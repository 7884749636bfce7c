#include "common/op_args.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/MaybeOwned.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace inductor_lamb {

namespace {

constexpr double kInf = INFINITY;

// An argument's name in a message: `name`, or `name[i]` for a list entry (i >= 0).
// (Printed only when a check fails: TORCH_CHECK formats its message lazily.)
struct Where {
  const char* name;
  int64_t i;
};
std::ostream& operator<<(std::ostream& out, const Where& w) {
  out << w.name;
  if (w.i >= 0) out << "[" << w.i << "]";
  return out;
}

// Checks with messages like "lamb_step_: grads[3] has shape [2, 3] but params[3] has shape [3, 2]".
// Shapes are read as symbolic sizes: the check kernels (PrivateUse3) see fake tensors of dynamic shape.
class ArgChecker {
 public:
  explicit ArgChecker(const char* op) : op_(op) {}

  void same_length(const char* name, size_t size, const char* ref_name, size_t n) const {
    TORCH_CHECK(size == n, op_, ": ", name, " has ", size, " tensors but ", ref_name, " has ", n);
  }
  // `t` (list entry `name`[i]) must be defined, dense (strided), on `device`.
  void dense_on(const at::Tensor& t, const char* name, size_t i, const at::Device& device) const {
    TORCH_CHECK(t.defined(), op_, ": ", name, "[", i, "] is undefined");
    TORCH_CHECK(t.layout() == at::kStrided, op_, ": ", name, "[", i, "] has layout ", t.layout(),
                "; only dense (strided) tensors are supported (sparse gradients are not)");
    TORCH_CHECK(t.device() == device, op_, ": ", name, "[", i, "] is on ", t.device(), " but expected ", device);
  }
  void same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, size_t i) const {
    TORCH_CHECK(t.sym_sizes() == ref.sym_sizes(), op_, ": ", name, "[", i, "] has shape ", t.sym_sizes(),
                " but params[", i, "] has shape ", ref.sym_sizes());
  }
  void dtype_is(const at::Tensor& t, const char* name, size_t i, at::ScalarType expected) const {
    TORCH_CHECK(t.scalar_type() == expected, op_, ": ", name, "[", i, "] has dtype ", t.scalar_type(), ", expected ",
                expected);
  }
  void param_dtype(const at::Tensor& t, size_t i) const {
    const auto s = t.scalar_type();
    TORCH_CHECK(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, op_, ": params[", i, "] has dtype ", s,
                "; supported: float32, bfloat16, float16");
  }
  // A 0-d float32 tensor: `name`, or `name`[i] for i >= 0 (steps[i]).
  void scalar_tensor(const at::Tensor& t, const char* name, int64_t i, const at::Device& device) const {
    TORCH_CHECK(t.defined(), op_, ": ", Where{name, i}, " is undefined");
    TORCH_CHECK(t.dim() == 0, op_, ": ", Where{name, i}, " must be a 0-d tensor, got shape ", t.sym_sizes());
    float32_on(t, Where{name, i}, device);
  }
  // grad_scale / found_inf: one float32 element on `device`.
  void optional_scalar(const std::optional<at::Tensor>& t, const char* name, const at::Device& device) const {
    if (!t.has_value() || !t->defined()) return;
    TORCH_CHECK(t->sym_numel() == 1, op_, ": ", name, " must have one element, got shape ", t->sym_sizes());
    float32_on(*t, Where{name, -1}, device);
  }
  void in_range(double v, const Where& name, double lo, double hi) const {
    TORCH_CHECK(v >= lo && v <= hi, op_, ": invalid ", name, " ", v, ", expected a value in [", lo, ", ", hi, "]");
  }
  void reductions(const at::Tensor& r, size_t n, size_t k, const at::Device& device) const {
    TORCH_CHECK(r.defined(), op_, ": reductions is undefined");
    TORCH_CHECK(r.layout() == at::kStrided && r.dim() == 2 && r.sym_size(0) == int64_t(n) &&
                    r.sym_size(1) == int64_t(k),
                op_, ": reductions must have shape [", n, ", ", k, "] (params x partial reductions), got ",
                r.sym_sizes());
    float32_on(r, Where{"reductions", -1}, device);
  }

 private:
  void float32_on(const at::Tensor& t, const Where& where, const at::Device& device) const {
    TORCH_CHECK(t.scalar_type() == at::kFloat, op_, ": ", where, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.device() == device, op_, ": ", where, " is on ", t.device(), " but expected ", device);
  }

  const char* op_;
};

// ---- what an op writes ----
//
// Every tensor an op writes must be writable in place, as torch's own in-place ops require:
// not an inference tensor outside inference mode, and no memory shared with anything else
// of the call: the kernels read and write each tensor as if it were alone (a param given
// twice would be updated twice, a param that is its own state would be read after it was
// written). One tensor's memory is the byte range from its first to its last element: an
// absolute address range for tensors with data, a range of its storage for those without
// (the fake tensors of a trace, which keep the aliasing of the real ones). Ranges are
// sorted, so a call of n tensors costs n log n. Two ranges that meet overlap for sure when
// both tensors are non-overlapping and dense (their elements fill their ranges) or are the
// same view; other meeting ranges (interleaved strided views, such as the columns of one
// matrix) are accepted, as torch's own in-place ops accept what at::get_overlap_status
// cannot decide.
struct Span {
  uintptr_t end;
  const at::Tensor* t;
  bool written;
  bool dense;
  const char* name;
  int64_t i;  // list index, or -1
};

// Where a span starts, and its index (= its position in schema order). Tensors with data
// (storage 0: absolute addresses) sort on 16 bytes, fake ones also on their storage.
struct Start {
  uintptr_t storage, begin;
  uint32_t span;
  bool operator<(const Start& o) const { return storage != o.storage ? storage < o.storage : begin < o.begin; }
};

bool same_view(const Start& x, const Start& y, const Span& sx, const Span& sy) {
  return x.begin == y.begin && sx.t->sizes() == sy.t->sizes() && sx.t->strides() == sy.t->strides();
}

void check_writable(const OpArgs& a) {
  const auto& args = a.schema().arguments();
  const bool inference_mode = c10::InferenceMode::is_enabled();
  std::vector<Span> spans;  // in schema order
  std::vector<Start> starts;
  size_t count = 0;
  for (size_t k = 0; k < args.size(); ++k) count += a.at(k).isTensorList() ? a.list(args[k].name().c_str()).size() : 1;
  spans.reserve(count);
  starts.reserve(count);
  auto add = [&](const at::Tensor& t, const char* name, int64_t i, bool written) {
    if (!t.defined() || t.layout() != at::kStrided) return;
    if (written)
      TORCH_CHECK(inference_mode || !t.is_inference(), a.op(), ": ", Where{name, i},
                  " is an inference tensor: inplace update to inference tensor outside InferenceMode is not "
                  "allowed (make it a normal tensor with .clone() outside inference mode, or step inside "
                  "torch.inference_mode())");
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->has_symbolic_sizes_strides() || !t.has_storage() || t.numel() == 0) return;  // (dynamic traces)
    const bool dense = t.is_non_overlapping_and_dense();
    if (written && !dense)
      TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, a.op(), ": ", Where{name, i},
                  " has elements that share memory (an expanded or stride-0 view) and the op writes it; give it "
                  "memory of its own (.clone())");
    const int64_t item = int64_t(t.element_size());
    int64_t last = t.numel() - 1;  // (a contiguous tensor's last element)
    if (!t.is_contiguous()) {
      const auto sizes = t.sizes(), strides = t.strides();
      last = 0;
      for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * strides[d];
    }
    const void* data = t.storage().data();
    const uintptr_t begin =
        (data != nullptr ? reinterpret_cast<uintptr_t>(data) : 0) + uintptr_t(t.storage_offset() * item);
    starts.push_back({data != nullptr ? 0 : reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl()), begin,
                      uint32_t(spans.size())});
    spans.push_back({begin + uintptr_t((last + 1) * item), &t, written, dense, name, i});
  };
  for (size_t k = 0; k < args.size(); ++k) {
    const bool written = a.schema().is_mutable({c10::SchemaArgType::input, k});
    const c10::IValue& v = a.at(k);
    const char* name = args[k].name().c_str();
    if (v.isTensor()) {
      add(v.toTensor(), name, -1, written);
    } else if (v.isTensorList()) {
      const at::TensorList list = a.list(name);
      for (size_t i = 0; i < list.size(); ++i) add(list[i], name, int64_t(i), written);
    }
  }
  std::sort(starts.begin(), starts.end());
  // Every overlapping pair is seen; the one first in schema order is reported, so the error
  // does not depend on addresses (eager and traced calls name the same pair).
  std::vector<size_t> open;  // earlier starts of this storage whose span reaches past the current begin
  std::pair<uint32_t, uint32_t> first{UINT32_MAX, UINT32_MAX};
  for (size_t s = 0; s < starts.size(); ++s) {
    const Start& cur = starts[s];
    const Span& c = spans[cur.span];
    if (s > 0 && starts[s - 1].storage != cur.storage) open.clear();
    open.erase(std::remove_if(open.begin(), open.end(), [&](size_t o) { return spans[starts[o].span].end <= cur.begin; }),
               open.end());
    for (const size_t o : open) {
      const Span& other = spans[starts[o].span];
      if (!(other.written || c.written) || !((other.dense && c.dense) || same_view(starts[o], cur, other, c))) continue;
      first = std::min(first, std::make_pair(std::min(starts[o].span, cur.span), std::max(starts[o].span, cur.span)));
    }
    open.push_back(s);
  }
  if (first.first != UINT32_MAX) {
    const Span &x = spans[first.first], &y = spans[first.second];
    TORCH_CHECK(false, a.op(), ": ", Where{x.name, x.i}, " and ", Where{y.name, y.i},
                " share memory; every tensor the op writes needs memory of its own");
  }
}

bool is_signed(const Contract& c, const std::string& name) {
  for (const char* s : c.signed_floats)
    if (name == s) return true;
  return false;
}

}  // namespace

// ---- OpArgs -------------------------------------------------------------------------------

OpArgs::OpArgs(const c10::OperatorHandle& op, const torch::jit::Stack& stack) : schema_(&op.schema()) {
  const std::string& full = schema_->name();
  name_ = full.substr(full.find("::") + 2);
  contract_ = &contract_of(name_);
  phase_ = name_ == contract_->step ? Phase::Step : name_ == contract_->reduce ? Phase::Reduce : Phase::Apply;
  const auto& args = schema_->arguments();
  const size_t n = args.size();
  values_.assign(stack.end() - n, stack.end());
  lists_.reserve(n);
  reals_.resize(n);
  flags_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = values_[i];
    lists_.push_back(v.isTensorList() ? BorrowedTensors(v.toListRef()) : BorrowedTensors());
    if (v.isDoubleList()) reals_[i] = v.toDoubleVector();
    else if (v.isBoolList()) for (bool b : v.toBoolList()) flags_[i].push_back(b);
  }
}

OpArgs::BorrowedTensors::BorrowedTensors(c10::ArrayRef<c10::IValue> items) {
  tensors_.reserve(items.size());  // (the only allocation: nothing below throws)
  for (const c10::IValue& t : items) tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t.toTensor()));
}

OpArgs::BorrowedTensors::~BorrowedTensors() {
  for (at::Tensor& t : tensors_) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
}

size_t OpArgs::index(const char* name) const {
  const auto i = schema_->argumentIndexWithName(name);
  TORCH_INTERNAL_ASSERT(i.has_value(), name_, " has no argument ", name);
  return *i;
}

at::Device OpArgs::device() const {
  const at::TensorList params = list("params");
  return params.empty() ? tensor("lr").device() : params[0].device();
}

at::TensorList OpArgs::list(const char* name) const {
  if (std::strcmp(name, "params") == 0) return lists_[0].get();  // (the most read; every schema starts with it)
  return lists_[index(name)].get();
}

std::optional<at::TensorList> OpArgs::optional_list(const char* name) const {
  const size_t i = index(name);
  if (values_[i].isNone()) return std::nullopt;
  return lists_[i].get();
}

const at::Tensor& OpArgs::tensor(const char* name) const { return value(name).toTensor(); }

std::optional<at::Tensor> OpArgs::optional_tensor(const char* name) const {
  const c10::IValue& v = value(name);
  if (v.isNone()) return std::nullopt;
  return v.toTensor();
}

double OpArgs::real(const char* name) const { return value(name).toDouble(); }
bool OpArgs::flag(const char* name) const { return value(name).toBool(); }
int64_t OpArgs::integer(const char* name) const { return value(name).toInt(); }
const std::vector<double>& OpArgs::reals(const char* name) const { return reals_[index(name)]; }
const std::vector<bool>& OpArgs::flags(const char* name) const { return flags_[index(name)]; }

void OpArgs::finish(torch::jit::Stack* stack, std::optional<at::Tensor> result) const {
  torch::jit::drop(*stack, schema_->arguments().size());
  if (result.has_value()) torch::jit::push(*stack, std::move(*result));
}

// ---- the check ----------------------------------------------------------------------------

std::vector<StateList> check_call(const OpArgs& a, const at::Device& device) {
  const ArgChecker chk(a.op());
  const Contract& c = a.contract();
  const at::TensorList params = a.list("params"), grads = a.list("grads");
  const size_t n = params.size();

  // lengths, then per index: param, grad, state rows (and master params)
  std::vector<StateList> lists;
  for (const StateDecl& s : c.states) lists.push_back({s.name, a.list(s.name), s.dtype});
  if (const auto master = a.optional_list("master_params")) lists.push_back({"master_params", *master});
  chk.same_length("grads", grads.size(), "params", n);
  for (const auto& l : lists) chk.same_length(l.name, l.tensors.size(), "params", n);
  for (size_t i = 0; i < n; ++i) {
    chk.dense_on(params[i], "params", i, device);
    chk.param_dtype(params[i], i);
    chk.dense_on(grads[i], "grads", i, params[i].device());
    chk.same_shape(grads[i], "grads", params[i], i);
    chk.dtype_is(grads[i], "grads", i, params[i].scalar_type());
    for (const auto& l : lists) {
      chk.dense_on(l.tensors[i], l.name, i, params[i].device());
      chk.same_shape(l.tensors[i], l.name, params[i], i);
      chk.dtype_is(l.tensors[i], l.name, i, l.dtype);
    }
  }
  // per-tensor scalars
  for (const char* name : c.scalars) {
    const at::TensorList list = a.list(name);
    chk.same_length(name, list.size(), "params", n);
    for (size_t i = 0; i < n; ++i) chk.scalar_tensor(list[i], name, int64_t(i), device);
  }
  // then the rest by type, in schema order: scheduled tensors, optional tensors, floats and per-param lists
  const auto& args = a.schema().arguments();
  for (size_t k = 0; k < args.size(); ++k)
    if (args[k].type()->kind() == c10::TypeKind::TensorType && args[k].name() != "reductions")
      chk.scalar_tensor(a.at(k).toTensor(), args[k].name().c_str(), -1, device);
  for (size_t k = 0; k < args.size(); ++k)
    if (args[k].type()->kind() == c10::TypeKind::OptionalType &&
        args[k].type()->containedType(0)->kind() == c10::TypeKind::TensorType && !a.at(k).isNone())
      chk.optional_scalar(a.at(k).toTensor(), args[k].name().c_str(), device);
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string& name = args[k].name();
    const c10::IValue& v = a.at(k);
    const double lo = is_signed(c, name) ? -kInf : 0.0;
    if (v.isDouble()) {
      chk.in_range(v.toDouble(), Where{name.c_str(), -1}, lo, kInf);
    } else if (v.isDoubleList()) {
      const auto& x = a.reals(name.c_str());
      TORCH_CHECK(x.size() == 1 || x.size() == n, a.op(), ": ", name, " has ", x.size(),
                  " values; expected 1 or one per param (", n, ")");
      for (size_t i = 0; i < x.size(); ++i) chk.in_range(x[i], Where{name.c_str(), int64_t(i)}, lo, kInf);
    } else if (v.isBoolList()) {
      const auto& x = a.flags(name.c_str());
      TORCH_CHECK(x.size() <= 1 || x.size() == n, a.op(), ": ", name, " has ", x.size(),
                  " values; expected 0, 1 or one per param (", n, ")");
    }
  }
  if (a.phase() == Phase::Apply) chk.reductions(a.tensor("reductions"), n, c.reductions.size(), device);
  check_writable(a);
  return lists;
}

}  // namespace inductor_lamb
