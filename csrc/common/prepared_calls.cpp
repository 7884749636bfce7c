// torch.classes.lamb.PreparedCalls: the op calls of one param group's eager optimizer step, prepared
// once (inductor_lamb/optim/_plan.py) and run every step with that step's grads.
//
// An op call from Python converts every list argument, tensor by tensor, into the dispatcher's
// values: on many small params that conversion was a third of the step. A plan keeps each
// call's arguments as those values; per step only the grads (one list for the whole group) and
// the per-step scalars (GradScaler's scale and inf flag, the clip) cross from Python. The calls
// go through the dispatcher as any op call (the same kernels, argument checks, version counter
// bumps and grad-mode checks), in the order they were added.
//
// bind(grads) checks, before anything runs, what a plan cannot know in advance: every param has
// a grad where it had one when the plan was made (and no other), each grad is a plain dense
// tensor (a sparse grad, or a tensor subclass such as DTensor, takes another path in Python),
// and no param changed dtype or device in place. A false return leaves everything untouched.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

namespace inductor_lamb {
namespace {

struct Call {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // schema order; the per-step slots are filled by run()
  std::vector<int64_t> grads;     // per param of the call: its index among the group's params
  int64_t bucket;                 // which of run()'s per-bucket values it takes
  int64_t grads_slot, grad_scale_slot, found_inf_slot, max_grad_norm_slot;  // -1: the op has none
};

// A value inferred from Python as a generic list or an int where the schema wants a typed
// list or a float: the schema's type (an empty list's element type cannot be inferred).
c10::IValue as_schema_type(c10::IValue v, const c10::Argument& arg) {
  const c10::TypePtr& t = arg.type();
  if (t->kind() == c10::TypeKind::FloatType && v.isInt()) return c10::IValue(static_cast<double>(v.toInt()));
  if (t->kind() == c10::TypeKind::ListType && v.isList() && v.toListRef().empty()) {
    const auto elem = t->expectRef<c10::ListType>().getElementType();
    if (elem->kind() == c10::TypeKind::FloatType) return c10::IValue(c10::List<double>());
    if (elem->kind() == c10::TypeKind::BoolType) return c10::IValue(c10::List<bool>());
    if (elem->kind() == c10::TypeKind::TensorType) return c10::IValue(c10::List<at::Tensor>());
  }
  return v;
}

class PreparedCalls : public torch::CustomClassHolder {
 public:
  // The group's params (their dtype and device as they are now) and which of them have a grad.
  PreparedCalls(std::vector<at::Tensor> params, const c10::List<bool>& has_grad)
      : params_(std::move(params)), has_grad_(has_grad.begin(), has_grad.end()) {
    TORCH_CHECK(params_.size() == has_grad_.size(), "PreparedCalls: ", params_.size(), " params but ", has_grad_.size(),
                " grad flags");
    for (const auto& p : params_) {
      dtypes_.push_back(p.scalar_type());
      devices_.push_back(p.device());
    }
  }

  // One op call: `op` ("lamb::lamb_step_"), its arguments in schema order (the per-step ones
  // anything: run() fills them), the group index of each of its grads, its bucket, and the
  // positions of the per-step arguments (-1: absent).
  void add_call(const std::string& op, std::vector<c10::IValue> args, std::vector<int64_t> grads, int64_t bucket,
                int64_t grads_slot, int64_t grad_scale_slot, int64_t found_inf_slot, int64_t max_grad_norm_slot) {
    const auto sep = op.find("::");
    TORCH_CHECK(sep != std::string::npos, "PreparedCalls: op '", op, "' is not namespace::name");
    const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(op.c_str(), "");
    const auto& schema = handle.schema().arguments();
    TORCH_CHECK(args.size() == schema.size(), "PreparedCalls: ", op, " takes ", schema.size(), " arguments, got ",
                args.size());
    for (size_t i = 0; i < args.size(); ++i) args[i] = as_schema_type(std::move(args[i]), schema[i]);
    // (the per-step slots hold nothing between steps: no grad of the step that made the plan)
    const auto in_range = [&](int64_t slot) { return slot >= -1 && slot < int64_t(args.size()); };
    TORCH_CHECK(grads_slot >= 0 && in_range(grads_slot) && in_range(grad_scale_slot) && in_range(found_inf_slot) &&
                    in_range(max_grad_norm_slot),
                "PreparedCalls: a per-step argument position is out of range");
    args[grads_slot] = c10::IValue(c10::List<at::Tensor>());
    if (grad_scale_slot >= 0) args[grad_scale_slot] = c10::IValue();
    if (found_inf_slot >= 0) args[found_inf_slot] = c10::IValue();
    for (const int64_t g : grads)
      TORCH_CHECK(g >= 0 && g < int64_t(params_.size()) && has_grad_[g], "PreparedCalls: grad index ", g,
                  " is not that of a param with a grad");
    calls_.push_back(Call{handle, std::move(args), std::move(grads), bucket, grads_slot, grad_scale_slot,
                          found_inf_slot, max_grad_norm_slot});
  }

  // This step's grads (one per param of the group, None where it has none): true and kept for
  // run() when the plan holds for them (see the top), else false.
  bool bind(const c10::List<std::optional<at::Tensor>>& grads) {
    bound_.clear();
    if (grads.size() != params_.size()) return false;
    bound_.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::optional<at::Tensor> g = grads.get(i);
      const bool defined = g.has_value() && g->defined();
      if (defined != has_grad_[i] || params_[i].scalar_type() != dtypes_[i] || params_[i].device() != devices_[i]) {
        bound_.clear();
        return false;
      }
      if (defined && (g->layout() != at::kStrided || g->key_set().has(c10::DispatchKey::Python))) {
        bound_.clear();
        return false;
      }
      bound_.push_back(defined ? *g : at::Tensor());
    }
    return true;
  }

  // Every call, in order, with the bound grads and each bucket's grad_scale, found_inf and
  // max_grad_norm; the grads are released when it returns (or throws).
  void run(std::vector<std::optional<at::Tensor>> grad_scales, std::vector<std::optional<at::Tensor>> found_infs,
           std::vector<double> max_grad_norms) {
    TORCH_CHECK(bound_.size() == params_.size(), "PreparedCalls.run: no grads bound (bind() first)");
    struct Release {
      std::vector<at::Tensor>& bound;
      ~Release() { bound.clear(); }
    } release{bound_};
    for (const Call& c : calls_) {
      TORCH_CHECK(c.bucket >= 0 && size_t(c.bucket) < grad_scales.size() && size_t(c.bucket) < found_infs.size() &&
                      size_t(c.bucket) < max_grad_norms.size(),
                  "PreparedCalls.run: no per-step values for bucket ", c.bucket);
      torch::jit::Stack stack(c.args.begin(), c.args.end());
      c10::List<at::Tensor> grads;
      grads.reserve(c.grads.size());
      for (const int64_t g : c.grads) grads.push_back(bound_[g]);
      stack[c.grads_slot] = c10::IValue(std::move(grads));
      if (c.grad_scale_slot >= 0) stack[c.grad_scale_slot] = c10::IValue(grad_scales[c.bucket]);
      if (c.found_inf_slot >= 0) stack[c.found_inf_slot] = c10::IValue(found_infs[c.bucket]);
      if (c.max_grad_norm_slot >= 0) stack[c.max_grad_norm_slot] = c10::IValue(max_grad_norms[c.bucket]);
      c.op.callBoxed(stack);
    }
  }

  int64_t calls() const { return static_cast<int64_t>(calls_.size()); }

 private:
  std::vector<at::Tensor> params_;
  std::vector<bool> has_grad_;
  std::vector<at::ScalarType> dtypes_;
  std::vector<at::Device> devices_;
  std::vector<Call> calls_;
  std::vector<at::Tensor> bound_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(lamb, m) {
  m.class_<PreparedCalls>("PreparedCalls")
      .def(torch::init<std::vector<at::Tensor>, c10::List<bool>>())
      .def("add_call", &PreparedCalls::add_call)
      .def("bind", &PreparedCalls::bind)
      .def("run", &PreparedCalls::run)
      .def("calls", &PreparedCalls::calls);
}

}  // namespace inductor_lamb
