#pragma once
// The CPU multi-tensor engine, glue side (compiled with normal flags): run-time
// selection of the per-ISA kernel tables, chunking, deterministic per-tensor
// reductions, and CpuCall, what every CPU op call does around its kernels.
// (Argument checks and layouts are device-neutral: csrc/common/.)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "common/op_args.h"
#include "common/rounding.h"
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
#define INDUCTOR_LAMB_PTR_AVX2(name) static_cast<decltype(&name##_DEFAULT)>(nullptr)  // (K deduced)
#endif
#ifdef INDUCTOR_LAMB_HAVE_AVX512
#define INDUCTOR_LAMB_DECL_AVX512(T, name) extern const T name##_AVX512;
#define INDUCTOR_LAMB_PTR_AVX512(name) &name##_AVX512
#else
#define INDUCTOR_LAMB_DECL_AVX512(T, name)
#define INDUCTOR_LAMB_PTR_AVX512(name) static_cast<decltype(&name##_DEFAULT)>(nullptr)
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

// ---- chunking and reduction ------------------------------------------------

// Cuts every tensor into ranges of at most kChunkElems elements, in list order.
std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels);

// Whole consecutive tensors [t0, t1) of a list and their chunks [c0, c1): the
// unit of work of a two-phase op's passes (see TwoPhaseStep).
struct Block {
  int64_t t0, t1, c0, c1;
};

// Cuts a list (its chunks, from make_chunks) into blocks of whole tensors of at
// most `max_elems` elements each, unless one tensor alone is larger. Every tensor,
// empty ones included, is in exactly one block.
std::vector<Block> make_blocks(const std::vector<Chunk>& chunks, int64_t num_tensors, int64_t max_elems);

// The stash of block b's updates (UpdateStash): `planes` float planes (1: u; LAMB16's 3: u, m,
// v), each with every tensor's elements (but those of a param rounded stochastically, which
// recomputes: offset -1) at a 64-byte aligned offset (written to offset[t] for t in the block),
// in a buffer this thread keeps between calls, streamed when the block's cached_bytes an element
// (pass 1's reads and the stash) exceed the last-level cache. None (data null: pass 2
// recomputes) for a block whose planes hold more than kStashMaxElems floats, or one of several
// planes that would stream.
constexpr int64_t kStashMaxElems = int64_t(16) << 20;  // a 64 MiB buffer at most
UpdateStash stash_for(const std::vector<TensorPtrs>& tensors, const std::vector<int64_t>& numels, const Block& b,
                      int64_t cached_bytes, int64_t planes, std::vector<int64_t>& offset);

// What pass 1 of a one-call step's block may read and stash for pass 2 to find in cache, with
// `threads` threads each keeping a block of its own in the cache (TwoPhaseStep::step): 8 MiB,
// well under the last-level cache of one core complex (32 MiB on AMD EPYC, 30+ on Xeons), and at
// most the cache's share of a thread, unless set (tests cut lists into many small blocks).
int64_t block_bytes(int64_t threads);
void set_block_bytes(int64_t bytes);  // 0: the above again

// The size of this CPU's last-level cache (L3, else L2; 32 MiB if the system does not say),
// unless set: tests and benchmarks take the streaming path of the stash with a smaller one.
int64_t last_level_cache_bytes();
void set_last_level_cache_bytes(int64_t bytes);  // 0: the system's again

// For the chunks c of block b, in chunk order:
// out[(t - b.t0) * k + j] = sum over the chunks of tensor t of partials[(c - b.c0) * k + j].
void reduce_per_tensor(const std::vector<Chunk>& chunks, const Block& b, const double* partials, int64_t k,
                       double* out);
// Same with max instead of sum (NaN wins; 0 for a tensor without chunks): per-tensor
// amax, e.g. LAMB16's scales.
void max_per_tensor(const std::vector<Chunk>& chunks, const Block& b, const double* partials, int64_t k,
                    double* out);

// Per tensor of a list, the sum of (scale * x)^2 (deterministic): layer norms.
std::vector<double> per_tensor_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                                     const std::vector<int64_t>& numels, float scale);
// Over a whole list: global grad-norm clipping.
double global_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                    const std::vector<int64_t>& numels, float scale);
// The gradient multiplier 1 / (grad_scale * clip), clip = clip_divisor(||grads / grad_scale||, max_grad_norm).
double grad_multiplier(const TensorRows& rows, float inv_scale, double max_grad_norm);

// ---- two-phase ops ----------------------------------------------------------------

// The reduce phase's result: per-tensor values (n rows of k, double) as a float32
// [n, k] tensor on `device`. The apply phase reads it back with read_reductions.
at::Tensor reductions_tensor(const std::vector<double>& values, int64_t n, int64_t k, const at::Device& device);
std::vector<double> read_reductions(const at::Tensor& reductions);

// steps[i] += 1 for every i; returns the new values (the t of bias corrections and lr decays).
std::vector<double> increment_steps(at::TensorList steps);

// Reads grad_scale / found_inf (CPU): 1 / grad_scale, and whether found_inf is set.
float inv_grad_scale(const std::optional<at::Tensor>& grad_scale);
bool found_inf_set(const std::optional<at::Tensor>& found_inf);

// ---- one op call ----------------------------------------------------------------

// What every CPU op call does around its kernels once its arguments are checked
// (check_call, common/op_args.h): layouts (TensorRows), the tensor table and
// chunks, found_inf (skip the whole step, like torch's fused optimizers under
// GradScaler), the reductions a reduce phase returns and an apply phase reads.
template <typename Hyper>
struct CpuCall {
  // `num_states` state lists come first in the checked lists, then the master params if given.
  CpuCall(const OpArgs& a, int num_states, Hyper (*hyper_of)(const OpArgs&))
      : op(a.op()), rows(a.list("params"), a.list("grads"), check_call(a, at::kCPU)), hyper(hyper_of(a)),
        skip(found_inf_set(a.optional_tensor("found_inf"))), n(a.size()), lr_t(a.tensor("lr")),
        grad_scale_t(a.optional_tensor("grad_scale")),
        master(a.optional_list("master_params").has_value() ? num_states : -1), tensors(n),
        chunks(make_chunks(rows.numels())) {
    for (size_t i = 0; i < n; ++i) {
      TensorPtrs& t = tensors[i];
      t = TensorPtrs{rows.param(i), rows.grad(i), {nullptr, nullptr}, nullptr, rows.dtypes()[i]};
      for (int k = 0; k < num_states; ++k) t.state[k] = rows.state(i, k);
      if (master >= 0) t.master = rows.floats(i, num_states);
    }
  }

  // With stochastic_rounding, a bf16/fp16 param without a master copy is written rounded
  // stochastically, keyed by (seed, its step count): `steps` as this step counts them (after
  // the increment), or none (LARS, which counts no steps: 0).
  void param_keys(const at::TensorList* steps) {
    if (!hyper.stochastic_rounding || master >= 0) return;
    for (size_t i = 0; i < n; ++i) {
      TensorPtrs& t = tensors[i];
      if (t.dtype == Dtype::Float) continue;
      t.round_param = true;
      t.param_key = rounding::tensor_key(hyper.seed, steps ? *(*steps)[i].data_ptr<float>() : 0.f);
    }
  }

  ChunkSpan chunk_span() const { return {chunks.data(), static_cast<int64_t>(chunks.size())}; }
  Block whole() const { return {0, int64_t(n), 0, int64_t(chunks.size())}; }
  ChunkSpan chunk_span(const Block& b, bool backward = false) const {
    return {chunks.data() + b.c0, b.c1 - b.c0, backward};
  }
  int64_t elems(const Block& b) const {
    int64_t e = 0;
    for (int64_t c = b.c0; c < b.c1; ++c) e += chunks[c].end - chunks[c].begin;
    return e;
  }
  double lr() const { return lr_t.item<float>(); }
  float inv_grad_scale() const { return cpu::inv_grad_scale(grad_scale_t); }

  // A reduce phase's output: per-tensor values (n rows of k), zeros for a skipped step.
  at::Tensor reductions_out(const std::vector<double>& values, int64_t k) const {
    return skip ? at::zeros({int64_t(n), k}, at::kFloat) : reductions_tensor(values, n, k, at::kCPU);
  }
  // An apply phase's input (check_call checked it).
  std::vector<double> reductions_in(const at::Tensor& reductions) const { return read_reductions(reductions); }
  // Writes back what a phase wrote (see TensorRows::commit); master params go with params.
  void commit(bool params, unsigned states) { rows.commit(params, states, master); }
  void commit() { rows.commit(); }

  const char* op;
  TensorRows rows;
  const Hyper hyper;
  const bool skip;
  const size_t n;
  at::Tensor lr_t;
  std::optional<at::Tensor> grad_scale_t;
  int master;  // index of the master params among the state lists, or -1
  std::vector<TensorPtrs> tensors;
  std::vector<Chunk> chunks;
};

// What a block's passes share in a one-call step: the stash pass 1 leaves for pass 2 (none in
// the two-phase form), and whether pass 2 takes each thread's chunks last to first
// (ChunkSpan::backward: it starts where pass 1 ended).
struct BlockPass {
  UpdateStash stash;
  bool backward = false;
};

// The entry points of a two-phase op (reduce, apply, and the one-call step) from
// its stages, which Derived provides:
//   void begin(bool reduce, bool apply);  per-list work before the phases (steps, lr, ...)
//   void reduce_block(const Block&, double* out, const BlockPass&);     pass 1; out: kReductions per tensor
//   void apply_block(const Block&, const double* r, const BlockPass&);  pass 2 from those values
//   void end(bool reduce, bool apply);    writes back what the phases wrote
// The one-call step runs both passes a block of tensors at a time, so that pass 2
// finds in the caches what pass 1 of the same block just read instead of reading
// it again from memory (docs/decisions.md, "The CPU one-call op works a block of tensors at a
// time"), and, for an op that
// stashes its updates, gives pass 1 a place to leave them (BlockPass::stash). With several
// threads, in the ops that ask (per_thread_blocks), each takes whole blocks of its own
// (owned_blocks): no thread waits for another between the passes of a block, and pass 2 reads
// what its own core's pass 1 left in its caches.
// Between the passes the values go through float32, as through the reductions
// tensor of the two-phase form, so both forms give the same bits.
template <typename Derived, typename Hyper>
class TwoPhaseStep {
 public:
  at::Tensor reduce() {
    if (c_.skip) return c_.reductions_out({}, k_);
    self().begin(true, false);
    std::vector<double> out(k_ * c_.n);
    self().reduce_block(c_.whole(), out.data(), BlockPass{});
    self().end(true, false);
    return c_.reductions_out(out, k_);
  }

  void apply(const at::Tensor& reductions) {
    const std::vector<double> r = c_.reductions_in(reductions);
    if (c_.skip) return;
    self().begin(false, true);
    self().apply_block(c_.whole(), r.data(), BlockPass{});
    self().end(false, true);
  }

  void step() {
    if (c_.skip) return;
    self().begin(true, true);
    // (a block's pass-1 bytes and its stash: what pass 2 must find in cache)
    const int64_t cached_bytes = pass1_bytes_ + 4 * stash_planes_;
    // (threads stepping blocks of their own each keep one in the shared cache)
    const int64_t sharing = per_thread_blocks_ ? at::get_num_threads() : 1;
    const std::vector<Block> blocks = make_blocks(c_.chunks, c_.n, block_bytes(sharing) / cached_bytes);
    // Both passes of blocks[i] (the offsets of its tensors in the stash: one vector a thread).
    const auto run = [&](const Block& b, std::vector<int64_t>& offset) {
      std::vector<double> r(k_ * (b.t1 - b.t0), 0.0);
      BlockPass pass;
      if (stash_planes_) pass.stash = stash_for(c_.tensors, c_.rows.numels(), b, cached_bytes, stash_planes_, offset);
      self().reduce_block(b, r.data(), pass);
      for (double& x : r) x = float(x);
      pass.backward = true;
      self().apply_block(b, r.data(), pass);
    };
    const std::vector<std::vector<int64_t>> owned = owned_blocks(blocks);
    std::vector<int64_t> offset(stash_planes_ ? c_.n : 0);
    for (size_t i = 0; i < blocks.size(); ++i)  // (the blocks no thread owns: every thread works on each)
      if (owned.empty() || owned_by_none_[i]) run(blocks[i], offset);
    if (!owned.empty()) {
      // (at::parallel_for inside runs inline on the calling thread: its blocks, its caches)
      at::parallel_for(0, int64_t(owned.size()), 1, [&](int64_t t0, int64_t t1) {
        std::vector<int64_t> mine(stash_planes_ ? c_.n : 0);
        for (int64_t t = t0; t < t1; ++t)
          for (const int64_t i : owned[t]) run(blocks[i], mine);
      });
    }
    self().end(true, true);
  }

 protected:
  // k: reductions per tensor; pass1_bytes: bytes per element pass 1 reads; stash_planes: the
  // floats an element the one-call step's pass 1 leaves for pass 2 (BlockPass::stash; 0: none);
  // per_thread_blocks: whether threads step blocks of their own (owned_blocks).
  TwoPhaseStep(CpuCall<Hyper> call, int64_t k, int64_t pass1_bytes, int64_t stash_planes = 0,
               bool per_thread_blocks = false)
      : c_(std::move(call)), k_(k), pass1_bytes_(pass1_bytes), stash_planes_(stash_planes),
        per_thread_blocks_(per_thread_blocks) {}

  CpuCall<Hyper> c_;

 private:
  Derived& self() { return static_cast<Derived&>(*this); }

  // With several threads, which blocks each thread steps alone (both passes): the largest first,
  // for the ops that ask (LAMB, LAMB16: their pass 2 reads the stash, or recomputes, from the
  // caches of the core that ran pass 1; LARS and NovoGrad lost 2-10% with it where memory is slow),
  // each to the least loaded thread. A block larger than a quarter of a thread's share is left
  // to all threads together (owned_by_none_), so that one tensor cannot hold the others back.
  // Empty (every block on every thread) with one thread, fewer than two blocks to own, or when
  // called inside a parallel region.
  std::vector<std::vector<int64_t>> owned_blocks(const std::vector<Block>& blocks) {
    const int64_t nt = at::get_num_threads();
    owned_by_none_.assign(blocks.size(), false);
    if (!per_thread_blocks_ || nt < 2 || blocks.size() < 2 || at::in_parallel_region()) return {};
    std::vector<int64_t> size(blocks.size()), order;
    int64_t total = 0;
    for (size_t i = 0; i < blocks.size(); ++i) total += size[i] = c_.elems(blocks[i]);
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (size[i] * 4 * nt > total) owned_by_none_[i] = true;
      else order.push_back(int64_t(i));
    }
    if (order.size() < 2) {
      owned_by_none_.assign(blocks.size(), true);
      return {};
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return size[a] > size[b]; });
    std::vector<std::vector<int64_t>> owned(nt);
    std::vector<int64_t> load(nt, 0);
    for (const int64_t i : order) {
      const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
      owned[t].push_back(i);
      load[t] += size[i];
    }
    return owned;
  }

  const int64_t k_, pass1_bytes_;
  const int64_t stash_planes_;
  const bool per_thread_blocks_;
  std::vector<bool> owned_by_none_;  // per block of the step (owned_blocks)
};

// The CPU registrations of a family's ops over its call class (CPU, and SparseCPU
// so that a sparse grad reaches the check that names it).
#define INDUCTOR_LAMB_CPU_OPS(Call, step_op)                                                   \
  TORCH_LIBRARY_IMPL(lamb, CPU, m) { register_family<Call>(m, step_op); }                     \
  TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { register_family<Call>(m, step_op); }

}  // namespace inductor_lamb::cpu
