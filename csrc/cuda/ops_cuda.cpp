// TORCH_LIBRARY_IMPL(lamb, CUDA): argument checks and layouts (device-neutral:
// csrc/common/), the tensor table (cuda/tensor_table.h), workspaces, and the extern "C"
// launchers of the .cu files. Built only when torch has CUDA.
//
// No step syncs the host: lr, steps, grad_scale and found_inf are read by the kernels, and
// the tensor table (pointers, sizes, alignment, chunks) goes up asynchronously from pinned
// memory ahead of the kernels (a call captured into a CUDA graph: a table the graph owns).
#include <ATen/ops/empty.h>
#include <ATen/ops/reciprocal.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/op_args.h"
#include "cuda/chunk_layout.h"
#include "cuda/launch.h"
#include "cuda/tensor_table.h"

namespace inductor_lamb::cuda {
namespace {

// Fills the chunk fields of `tensors`, uploads (or finds) the table, allocates the
// workspace and returns the launch description on the current stream.
struct PreparedLaunch {
  Launch launch;
  at::Tensor table, workspace, inv_grad_scale;  // (what the call's kernels read, kept until they are enqueued)
};

PreparedLaunch prepare(std::vector<TensorMeta>& tensors, const at::Device& device, const at::Tensor& lr,
                       const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                       const char* op) {
  std::vector<ChunkMeta> chunks;
  uint32_t variants = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = (tensors[t].numel + kChunk - 1) / kChunk;
    TORCH_CHECK(n <= INT32_MAX, op, ": params[", t, "] has too many elements");
    tensors[t].first_chunk = static_cast<int64_t>(chunks.size());
    tensors[t].num_chunks = static_cast<int32_t>(n);
    for (int32_t k = 0; k < n; ++k) chunks.push_back({static_cast<int32_t>(t), k});
    if (n > 0) variants |= 1u << param_variant(tensors[t]);
  }
  TORCH_CHECK(chunks.size() <= INT32_MAX, op, ": too many elements in one call");
  std::string bytes(tensors.size() * sizeof(TensorMeta) + chunks.size() * sizeof(ChunkMeta), '\0');
  std::memcpy(bytes.data(), tensors.data(), tensors.size() * sizeof(TensorMeta));
  std::memcpy(bytes.data() + tensors.size() * sizeof(TensorMeta), chunks.data(), chunks.size() * sizeof(ChunkMeta));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  DeviceTable uploaded = upload_table(bytes, device, op);
  const uint8_t* table = uploaded.data;

  PreparedLaunch out;
  out.table = std::move(uploaded.owner);
  const int64_t nt = static_cast<int64_t>(tensors.size()), nc = static_cast<int64_t>(chunks.size());
  out.workspace = at::empty({nc * kPartials + nt * kCoeffs + kPartials}, at::TensorOptions().dtype(at::kFloat).device(device));
  float* ws = out.workspace.data_ptr<float>();
  Launch& l = out.launch;
  l = Launch{};
  l.tensors = reinterpret_cast<const TensorMeta*>(table);
  l.chunks = reinterpret_cast<const ChunkMeta*>(table + nt * sizeof(TensorMeta));
  l.num_tensors = static_cast<int32_t>(nt);
  l.num_chunks = static_cast<int32_t>(nc);
  l.variants = variants;
  l.partials = ws;
  l.coeffs = ws + nc * kPartials;
  l.global = ws + nc * kPartials + nt * kCoeffs;
  l.lr = lr.data_ptr<float>();
  if (grad_scale.has_value() && grad_scale->defined()) {
    // (1 / x rounded once, as the CPU kernels' 1.f / grad_scale)
    out.inv_grad_scale = at::reciprocal(*grad_scale);
    l.inv_grad_scale = out.inv_grad_scale.data_ptr<float>();
  }
  l.found_inf = found_inf.has_value() && found_inf->defined() ? found_inf->data_ptr<float>() : nullptr;
  l.stream = stream;
  l.device = device.index();
  return out;
}

// Bytes of one element of a list's storage.
int element_size(at::ScalarType t) { return static_cast<int>(c10::elementSize(t)); }

void check_launch(int err, const char* op) {
  TORCH_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// A family's launchers: its two phases and their one-call form, or (reduce and apply null) the one
// launcher of an element-wise op.
template <typename Hyper>
struct Launchers {
  using Fn = int (*)(const Launch*, const Hyper*);
  Fn reduce, apply, step;
};

// Whether a Hyper clips grads by their global norm (LAMB's max_grad_norm): its launchers then
// launch the clip's kernels too.
template <typename H, typename = void>
struct Clips : std::false_type {};
template <typename H>
struct Clips<H, std::void_t<decltype(std::declval<H&>().max_grad_norm)>> : std::true_type {};

// Everything an op does once its arguments are checked (check_call): device guard, layouts
// (TensorRows), the Hyper the launchers take, the tensor table, workspace, launches and
// write-back. The table's slots come from the op's contract (its state lists, steps, per-tensor
// scalar lists); `per_param` adds the op's per-param hyper-parameters, where it has any.
template <typename Hyper>
class CudaCall {
 public:
  using PerParam = void (*)(const OpArgs&, size_t, double*);
  // What each phase writes: bit k state list k (apply also writes the params).
  struct Writes {
    unsigned reduce, apply;
  };

  CudaCall(const OpArgs& a, Hyper (*hyper_of)(const OpArgs&), Launchers<Hyper> launchers, Writes writes = {},
           PerParam per_param = nullptr)
      : CudaCall(a, check_call(a, a.device()), hyper_of, launchers, writes, per_param) {}

  // Pass 1: the reductions (zeros on a skipped step, written by the launches).
  at::Tensor reduce() {
    const int64_t k = static_cast<int64_t>(a_contract_->reductions.size());
    at::Tensor r = at::empty({static_cast<int64_t>(rows_.size()), k}, at::TensorOptions().dtype(at::kFloat).device(device_));
    prepared_.launch.reductions = r.data_ptr<float>();
    run(launchers_.reduce);
    rows_.commit(false, writes_.reduce, master_);
    return r;
  }
  // Pass 2 from the reductions (check_call checked them).
  void apply(const at::Tensor& reductions) {
    const at::Tensor r = reductions.contiguous();
    prepared_.launch.reductions = r.data_ptr<float>();
    run(launchers_.apply);
    rows_.commit(true, writes_.apply, master_);
  }
  // The one call: of a two-phase op, the same kernels and bits as reduce then apply, the
  // per-tensor work of both in one launch; of an element-wise op, everything it wrote.
  void step() {
    run(launchers_.step);
    if (launchers_.reduce == nullptr) rows_.commit();
    else rows_.commit(true, writes_.reduce | writes_.apply, master_);
  }

 private:
  CudaCall(const OpArgs& a, std::vector<StateList> lists, Hyper (*hyper_of)(const OpArgs&), Launchers<Hyper> launchers,
           Writes writes, PerParam per_param)
      : op_(a.op()), device_(a.device()), guard_(device_), rows_(a.list("params"), a.list("grads"), lists),
        hyper_(hyper_of(a)), a_contract_(&a.contract()),
        master_(a.optional_list("master_params").has_value() ? static_cast<int>(a.contract().states.size()) : -1),
        launchers_(launchers), writes_(writes) {
    const at::TensorList params = a.list("params");
    const int num_states = static_cast<int>(a.contract().states.size());
    const bool has_master = master_ >= 0;
    if (params.empty()) return;
    // the contract's per-tensor scalar lists: its step counts, and the others in order
    std::optional<at::TensorList> steps;
    std::vector<at::TensorList> scalars;
    for (const char* name : a.contract().scalars) {
      if (std::string(name) == "steps") steps = a.list(name);
      else scalars.push_back(a.list(name));
    }
    TORCH_INTERNAL_ASSERT(num_states <= 2 && scalars.size() <= 2, op_, ": more lists than a TensorMeta holds");
    std::vector<TensorMeta> tensors(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      TensorMeta& t = tensors[i];
      t = TensorMeta{};
      t.param = rows_.param(i);
      t.grad = rows_.grad(i);
      for (int k = 0; k < num_states; ++k) t.state[k] = rows_.state(i, k);
      t.master = has_master ? rows_.floats(i, num_states) : nullptr;
      t.step = steps.has_value() ? (*steps)[i].data_ptr<float>() : nullptr;
      for (size_t k = 0; k < scalars.size(); ++k) t.scalars[k] = scalars[k][i].data_ptr<float>();
      if (per_param != nullptr) per_param(a, i, t.per_param);
      t.numel = rows_.numels()[i];
      t.dtype = rows_.dtypes()[i];
      // The first element at which every stream is 16-byte aligned (chunk_layout.h).
      uint64_t addrs[5] = {reinterpret_cast<uint64_t>(t.param), reinterpret_cast<uint64_t>(t.grad),
                           reinterpret_cast<uint64_t>(t.master)};
      int sizes[5] = {element_size(params[i].scalar_type()), element_size(params[i].scalar_type()), 4};
      for (int k = 0; k < num_states; ++k) {
        addrs[3 + k] = reinterpret_cast<uint64_t>(t.state[k]);
        sizes[3 + k] = element_size(lists[k].dtype);
      }
      t.head = tensor_head(addrs, sizes, 3 + num_states);
    }
    prepared_ = prepare(tensors, device_, a.tensor("lr"), a.optional_tensor("grad_scale"), a.optional_tensor("found_inf"), op_);
  }

  void run(typename Launchers<Hyper>::Fn fn) {
    if (rows_.size() > 0) check_launch(fn(&prepared_.launch, &hyper_), op_);
  }

  const char* op_;
  at::Device device_;
  c10::cuda::CUDAGuard guard_;
  TensorRows rows_;
  Hyper hyper_;
  const Contract* a_contract_;
  int master_;
  Launchers<Hyper> launchers_;
  Writes writes_;
  PreparedLaunch prepared_{};
};

// ---- the ops ---------------------------------------------------------------------------
// A family's call class: its CudaCall with its Hyper, launchers, what each phase writes and,
// for LARS, its per-param options. Each layer-wise op comes as one call and as its two phases
// (the same kernels: the one-call op is reduce then apply, bit for bit).

struct LambCall : CudaCall<lamb::Hyper> {
  static constexpr Launchers<lamb::Hyper> kLaunchers{inductor_lamb_cuda_lamb_reduce, inductor_lamb_cuda_lamb_apply,
                                                     inductor_lamb_cuda_lamb_step};
  explicit LambCall(const OpArgs& a) : CudaCall(a, &lamb::hyper_of<OpArgs>, kLaunchers, {0b11u, 0u}) {}
};

struct Lamb16Call : CudaCall<lamb16::Hyper> {
  static constexpr Launchers<lamb16::Hyper> kLaunchers{
      inductor_lamb_cuda_lamb16_reduce, inductor_lamb_cuda_lamb16_apply, inductor_lamb_cuda_lamb16_step};
  // reduce writes only the steps (never copied); apply the params, m8, v8 and scales
  explicit Lamb16Call(const OpArgs& a) : CudaCall(a, &lamb16::hyper_of<OpArgs>, kLaunchers, {0u, 0b11u}) {}
};

struct LarsCall : CudaCall<lars::Hyper> {
  static constexpr Launchers<lars::Hyper> kLaunchers{inductor_lamb_cuda_lars_reduce, inductor_lamb_cuda_lars_apply,
                                                     inductor_lamb_cuda_lars_step};
  static void per_param(const OpArgs& a, size_t i, double* out) {
    const lars::Options o = lars::options_of(a, i);
    out[0] = o.weight_decay;
    out[1] = o.layer_adaptation ? 1.0 : 0.0;
  }
  explicit LarsCall(const OpArgs& a) : CudaCall(a, &lars::hyper_of<OpArgs>, kLaunchers, {0u, 0b1u}, &per_param) {}
};

struct NovogradCall : CudaCall<novograd::Hyper> {
  static constexpr Launchers<novograd::Hyper> kLaunchers{
      inductor_lamb_cuda_novograd_reduce, inductor_lamb_cuda_novograd_apply, inductor_lamb_cuda_novograd_step};
  // reduce writes only the steps (never copied); apply the params, m (and v, v_max: 0-d, written in place)
  explicit NovogradCall(const OpArgs& a) : CudaCall(a, &novograd::hyper_of<OpArgs>, kLaunchers, {0u, 0b1u}) {}
};

struct AdagradCall : CudaCall<adagrad::Hyper> {
  static constexpr Launchers<adagrad::Hyper> kLaunchers{nullptr, nullptr, inductor_lamb_cuda_adagrad_step};
  explicit AdagradCall(const OpArgs& a) : CudaCall(a, &adagrad::hyper_of<OpArgs>, kLaunchers) {}
};

// ---- launch counts ---------------------------------------------------------------------
// The kernels one call of an op launches on a list of one float32 tensor (clipped: with
// max_grad_norm > 0, where its Hyper has one), counted by running its launcher with
// Launch::count set: nothing is launched and no device is needed. What torch.compile's launch
// model reads (_inductor/cost.py), for every op a family registers.

std::map<std::string, std::function<int64_t(bool)>>& launch_counters() {
  static std::map<std::string, std::function<int64_t(bool)>> counters;
  return counters;
}

template <typename Call, typename Hyper>
void register_cuda_family(torch::Library& m, const char* step_op) {
  register_family<Call>(m, step_op);
  const Contract& c = contract_of(step_op);
  const Launchers<Hyper> l = Call::kLaunchers;
  for (auto [op, fn] : {std::pair{c.step, l.step}, std::pair{c.reduce, l.reduce}, std::pair{c.apply, l.apply}}) {
    if (op == nullptr) continue;
    launch_counters()[op] = [fn = fn](bool clipped) -> int64_t {
      int n = 0;
      Launch launch{};
      launch.num_tensors = launch.num_chunks = 1;
      launch.variants = 1u << param_variant(Dtype::Float, false);
      launch.count = &n;
      Hyper h{};
      if constexpr (Clips<Hyper>::value) h.max_grad_norm = clipped ? 1.0 : 0.0;
      fn(&launch, &h);
      return n;
    };
  }
}

int64_t launch_count(const std::string& op, bool clipped) {
  auto it = launch_counters().find(op);
  TORCH_CHECK(it != launch_counters().end(), "_cuda_launches: unknown op '", op, "'");
  return it->second(clipped);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lamb, m) {
  m.def("_cuda_launches(str op, bool clipped=False) -> int", &launch_count);
}

TORCH_LIBRARY_IMPL(lamb, CUDA, m) {
  register_cuda_family<LambCall, lamb::Hyper>(m, "lamb_step_");
  register_cuda_family<Lamb16Call, lamb16::Hyper>(m, "lamb16_step_");
  register_cuda_family<LarsCall, lars::Hyper>(m, "lars_step_");
  register_cuda_family<AdagradCall, adagrad::Hyper>(m, "adagrad_step_");
  register_cuda_family<NovogradCall, novograd::Hyper>(m, "novograd_step_");
}

}  // namespace inductor_lamb::cuda
