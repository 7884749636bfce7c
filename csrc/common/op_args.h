#pragma once
// An op call's arguments on the C++ side, shared by the CPU glue (csrc/cpu/<opt>.cpp),
// the CUDA glue (csrc/cuda/ops_cuda.cpp) and the check kernels (csrc/ops.cpp, registered for
// PrivateUse3, a dispatch key no tensor has, which the fake implementations redispatch to):
//   * OpArgs reads a call's arguments by name from the dispatcher's stack, against
//     the op's schema (csrc/ops.cpp holds every schema as text), so no C++
//     parameter list repeats a schema: kernels are boxed;
//   * Contract says what a schema cannot (which lists are state and in which
//     dtype, the two-phase reductions), declared beside the schemas;
//   * check_call() is the one check of every op, run by the kernels and, at trace
//     time, by the check kernels (through the fake implementations of every compile path).
//
// check_call's order and messages: list lengths, then per index the param, grad
// and state rows, then the per-tensor scalar lists, the scheduled tensor
// hyper-parameters (lr, betas, momentum), grad_scale / found_inf, the float
// hyper-parameters and per-param lists in schema order, and last an apply op's
// reductions. Scheduled tensors are data: their values are not range-checked (a
// compiled step could not check them at trace time). Float hyper-parameters must
// be >= 0 unless the contract lists them as signed.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/rows.h"

namespace inductor_lamb {

enum class Phase { Step, Reduce, Apply };

// A per-element state list: shaped like the params, in a fixed dtype.
struct StateDecl {
  const char* name;
  at::ScalarType dtype;
};

struct Contract {
  const char* step;                 // the one-call op
  const char* reduce;               // its two phases (nullptr: a one-call op)
  const char* apply;
  std::vector<StateDecl> states;    // in schema order
  std::vector<const char*> scalars; // lists of one 0-d float32 tensor per param, in schema order
  // The columns of the reductions and how the partials of one tensor's shards
  // combine ("sum" or "max").
  std::vector<std::pair<const char*, const char*>> reductions;
  std::vector<const char*> signed_floats;  // float hyper-parameters that may be negative
};

// The contract of an op or of one of its phases (csrc/ops.cpp).
const Contract& contract_of(const std::string& op);

class OpArgs {
 public:
  OpArgs(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

  const char* op() const { return name_.c_str(); }  // "lamb_step_", without the namespace
  const Contract& contract() const { return *contract_; }
  Phase phase() const { return phase_; }
  const c10::FunctionSchema& schema() const { return *schema_; }
  size_t size() const { return list("params").size(); }
  at::Device device() const;  // the params' device (the lr's for an empty call)

  at::TensorList list(const char* name) const;
  std::optional<at::TensorList> optional_list(const char* name) const;
  const at::Tensor& tensor(const char* name) const;
  std::optional<at::Tensor> optional_tensor(const char* name) const;
  const float* scalar(const char* name) const { return tensor(name).data_ptr<float>(); }
  double real(const char* name) const;
  bool flag(const char* name) const;
  int64_t integer(const char* name) const;
  const std::vector<double>& reals(const char* name) const;
  const std::vector<bool>& flags(const char* name) const;

  const c10::IValue& at(size_t i) const { return values_[i]; }  // argument i in schema order

  // Replaces the arguments on `stack` by the op's result (a reduce op's reductions).
  void finish(torch::jit::Stack* stack, std::optional<at::Tensor> result) const;

 private:
  size_t index(const char* name) const;
  const c10::IValue& value(const char* name) const { return values_[index(name)]; }

  std::string name_;
  const c10::FunctionSchema* schema_;
  const Contract* contract_;
  Phase phase_;
  std::vector<c10::IValue> values_;
  // The tensors of a list argument, borrowed from values_ (no reference counting: a call of
  // thousands of tensors would spend more on it than on its checks).
  class BorrowedTensors {
   public:
    BorrowedTensors() = default;
    explicit BorrowedTensors(c10::ArrayRef<c10::IValue> items);
    ~BorrowedTensors();
    BorrowedTensors(BorrowedTensors&&) noexcept = default;  // (leaves the source empty)
    BorrowedTensors(const BorrowedTensors&) = delete;
    BorrowedTensors& operator=(const BorrowedTensors&) = delete;
    BorrowedTensors& operator=(BorrowedTensors&&) = delete;
    at::TensorList get() const { return tensors_; }

   private:
    std::vector<at::Tensor> tensors_;
  };
  std::vector<BorrowedTensors> lists_;  // per argument: its tensors, if a (present) tensor list
  std::vector<std::vector<double>> reals_;
  std::vector<std::vector<bool>> flags_;
};

// Every check of an op call on `device`, in the order above; returns the state
// lists (in contract order), then the master params if given, as the rows take them.
std::vector<StateList> check_call(const OpArgs& a, const at::Device& device);

// The boxed kernel of a family's ops over its call class `Call`: Call(const OpArgs&)
// checks everything; step() runs the one-call op and, for a two-phase family,
// reduce() -> reductions and apply(reductions) its phases.
template <typename C, typename = void>
struct HasPhases : std::false_type {};
template <typename C>
struct HasPhases<C, std::void_t<decltype(std::declval<C&>().reduce())>> : std::true_type {};

template <typename Call>
void run_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpArgs a(op, *stack);
  std::optional<at::Tensor> out;
  if constexpr (HasPhases<Call>::value) {
    switch (a.phase()) {
      case Phase::Step: Call(a).step(); break;
      case Phase::Reduce: out = Call(a).reduce(); break;
      case Phase::Apply: Call(a).apply(a.tensor("reductions")); break;
    }
  } else {
    Call(a).step();
  }
  a.finish(stack, std::move(out));
}

template <typename Call>
void register_family(torch::Library& m, const char* step_op) {
  const Contract& c = contract_of(step_op);
  for (const char* op : {c.step, c.reduce, c.apply})
    if (op != nullptr) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run_boxed<Call>>());
}

}  // namespace inductor_lamb
