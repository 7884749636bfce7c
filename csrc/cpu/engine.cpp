#include "cpu/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include <unistd.h>

namespace inductor_lamb::cpu {

// ---- run-time ISA dispatch -------------------------------------------------

Capability max_cpu_capability() {
  static const Capability best = [] {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
#ifdef INDUCTOR_LAMB_HAVE_AVX512
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Capability::AVX512;
#endif
#ifdef INDUCTOR_LAMB_HAVE_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return Capability::AVX2;
#endif
#endif
    return Capability::Default;
  }();
  return best;
}

static Capability initial_capability() {
  // INDUCTOR_LAMB_CPU_CAPABILITY=default|avx2|avx512 lowers the choice, like ATen's ATEN_CPU_CAPABILITY.
  Capability c = max_cpu_capability();
  if (const char* env = std::getenv("INDUCTOR_LAMB_CPU_CAPABILITY")) {
    Capability want = c;
    if (!std::strcmp(env, "default")) want = Capability::Default;
    else if (!std::strcmp(env, "avx2")) want = Capability::AVX2;
    else if (!std::strcmp(env, "avx512")) want = Capability::AVX512;
    if (want < c) c = want;
  }
  return c;
}

static std::atomic<int>& active_capability() {
  static std::atomic<int> c{static_cast<int>(initial_capability())};
  return c;
}

Capability cpu_capability() { return static_cast<Capability>(active_capability().load(std::memory_order_relaxed)); }

void set_cpu_capability(Capability c) {
  TORCH_CHECK(c >= Capability::Default && c <= max_cpu_capability(), "CPU capability ", static_cast<int>(c),
              " is not supported by this CPU/build (best: ", static_cast<int>(max_cpu_capability()), ")");
  active_capability().store(static_cast<int>(c));
}

// ---- chunking and reduction ------------------------------------------------

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (auto n : numels) total += (n + kChunkElems - 1) / kChunkElems;
  chunks.reserve(total);
  for (int64_t t = 0; t < static_cast<int64_t>(numels.size()); ++t)
    for (int64_t b = 0; b < numels[t]; b += kChunkElems) chunks.push_back({t, b, std::min(numels[t], b + kChunkElems)});
  return chunks;
}

std::vector<Block> make_blocks(const std::vector<Chunk>& chunks, int64_t num_tensors, int64_t max_elems) {
  std::vector<Block> blocks;
  Block b{0, 0, 0, 0};
  int64_t elems = 0, c = 0;
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  for (int64_t t = 0; t < num_tensors; ++t) {
    int64_t c_end = c, n = 0;
    for (; c_end < num_chunks && chunks[c_end].tensor == t; ++c_end) n += chunks[c_end].end - chunks[c_end].begin;
    if (elems > 0 && elems + n > max_elems) {
      blocks.push_back(b);
      b = {t, t, c, c};
      elems = 0;
    }
    b.t1 = t + 1;
    b.c1 = c_end;
    elems += n;
    c = c_end;
  }
  if (num_tensors > 0) blocks.push_back(b);
  return blocks;
}

namespace {
std::atomic<int64_t>& cache_bytes_override() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}
}  // namespace

// The size of the outermost cache core 0 shares, from Linux's sysfs: the cache a thread's
// blocks stay in. glibc's sysconf reports a whole socket's L3 on AMD EPYC (384 MiB where a
// core complex has 32 MiB), so a stash past 32 MiB would never stream there.
static int64_t sysfs_last_level_cache_bytes() {
  int64_t best_level = 0, bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int64_t level = 0, size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;  // "32768K": sysfs gives K (M, G on some kernels)
    const int64_t mul = unit == "K" ? 1 << 10 : unit == "M" ? 1 << 20 : unit == "G" ? 1 << 30 : 1;
    if (level > best_level && size > 0) best_level = level, bytes = size * mul;
  }
  return bytes;
}

int64_t last_level_cache_bytes() {
  static const int64_t system = [] {
    if (const int64_t b = sysfs_last_level_cache_bytes(); b > 0) return b;
    for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
      const long v = sysconf(name);
      if (v > 0) return int64_t(v);
    }
    return int64_t(32) << 20;
  }();
  const int64_t forced = cache_bytes_override().load();
  return forced > 0 ? forced : system;
}

void set_last_level_cache_bytes(int64_t bytes) { cache_bytes_override().store(std::max<int64_t>(bytes, 0)); }

namespace {
std::atomic<int64_t>& block_bytes_override() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}
}  // namespace

int64_t block_bytes(int64_t threads) {
  if (const int64_t forced = block_bytes_override().load(); forced > 0) return forced;
  constexpr int64_t kBlockBytes = int64_t(8) << 20;
  return std::max<int64_t>(1 << 16, std::min(kBlockBytes, last_level_cache_bytes() / std::max<int64_t>(threads, 1)));
}

void set_block_bytes(int64_t bytes) { block_bytes_override().store(std::max<int64_t>(bytes, 0)); }

namespace {
// The calling thread's stash buffer, grown to the largest block it has stashed and kept: a
// fresh allocation of that size each step would cost its page faults, more than the stash saves.
float* stash_buffer(int64_t elems) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    int64_t size = 0;
  };
  thread_local Buffer buf;
  if (buf.size < elems) {
    buf.data.reset();
    const size_t bytes = (size_t(elems) * sizeof(float) + 63) / 64 * 64;
    buf.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!buf.data) return nullptr;  // (out of memory: pass 2 recomputes, as without a stash)
    buf.size = elems;
  }
  return buf.data.get();
}
}  // namespace

UpdateStash stash_for(const std::vector<TensorPtrs>& tensors, const std::vector<int64_t>& numels, const Block& b,
                      int64_t cached_bytes, int64_t planes, std::vector<int64_t>& offset) {
  int64_t total = 0;
  for (int64_t t = b.t0; t < b.t1; ++t) {
    // A param rounded stochastically recomputes: its pass 2 reads m anyway (its rounding hashes the new m).
    offset[t] = tensors[t].round_param ? -1 : total;
    if (offset[t] >= 0) total += (numels[t] + 15) / 16 * 16;  // (64-byte aligned starts: streaming stores)
  }
  if (total == 0 || total * planes > kStashMaxElems) return {};
  const bool stream = total * cached_bytes > last_level_cache_bytes();
  // A stash of several planes pays only where it stays well inside the cache (which a core's
  // neighbours share): LAMB16's (u, m, v) streamed out and read back moves 24 bytes an element
  // more where recomputing decodes two bytes (1.22x the two phases' time on tensors of 2.4M
  // elements, an AMD EPYC), and a block filling the cache spills it (tensors of 1.3M: no gain).
  if (planes > 1 && total * cached_bytes > last_level_cache_bytes() / 2) return {};
  float* const data = stash_buffer(total * planes);
  if (data == nullptr) return {};
  return {data, offset.data(), stream, total};
}

void reduce_per_tensor(const std::vector<Chunk>& chunks, const Block& b, const double* partials, int64_t k,
                       double* out) {
  std::fill(out, out + (b.t1 - b.t0) * k, 0.0);
  for (int64_t c = b.c0; c < b.c1; ++c)
    for (int64_t j = 0; j < k; ++j) out[(chunks[c].tensor - b.t0) * k + j] += partials[(c - b.c0) * k + j];
}

void max_per_tensor(const std::vector<Chunk>& chunks, const Block& b, const double* partials, int64_t k,
                    double* out) {
  std::fill(out, out + (b.t1 - b.t0) * k, 0.0);
  for (int64_t c = b.c0; c < b.c1; ++c)
    for (int64_t j = 0; j < k; ++j) {
      double& o = out[(chunks[c].tensor - b.t0) * k + j];
      const double x = partials[(c - b.c0) * k + j];
      if (std::isnan(x) || x > o) o = x;
    }
}

std::vector<double> per_tensor_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                                     const std::vector<int64_t>& numels, float scale) {
  const auto chunks = make_chunks(numels);
  std::vector<double> partials(chunks.size());
  SumSqArgs args{ptrs.data(), dtypes.data(), {chunks.data(), static_cast<int64_t>(chunks.size())}, scale,
                 partials.data()};
  INDUCTOR_LAMB_KERNELS(engine_kernels).sumsq(args);
  const int64_t n = static_cast<int64_t>(numels.size());
  std::vector<double> out(n);
  reduce_per_tensor(chunks, Block{0, n, 0, static_cast<int64_t>(chunks.size())}, partials.data(), 1, out.data());
  return out;
}

double global_sumsq(const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                    const std::vector<int64_t>& numels, float scale) {
  double s = 0.0;
  for (double t : per_tensor_sumsq(ptrs, dtypes, numels, scale)) s += t;
  return s;
}

double grad_multiplier(const TensorRows& rows, float inv_scale, double max_grad_norm) {
  if (max_grad_norm <= 0) return inv_scale;
  std::vector<const void*> grads(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) grads[i] = rows.grad(i);
  const double norm = std::sqrt(global_sumsq(grads, rows.dtypes(), rows.numels(), inv_scale));
  return inv_scale / clip_divisor(norm, max_grad_norm);
}

at::Tensor reductions_tensor(const std::vector<double>& values, int64_t n, int64_t k, const at::Device& device) {
  at::Tensor out = at::empty({n, k}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n * k; ++i) o[i] = float(values[i]);
  return device.is_cpu() ? out : out.to(device);
}

std::vector<double> read_reductions(const at::Tensor& reductions) {
  const at::Tensor r = reductions.contiguous();
  const float* x = r.data_ptr<float>();
  return std::vector<double>(x, x + r.numel());
}

std::vector<double> increment_steps(at::TensorList steps) {
  std::vector<double> t(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    float* step = steps[i].data_ptr<float>();
    *step += 1.f;
    t[i] = *step;
  }
  return t;
}

float inv_grad_scale(const std::optional<at::Tensor>& grad_scale) {
  if (!grad_scale.has_value() || !grad_scale->defined()) return 1.f;
  return 1.f / grad_scale->item<float>();
}

bool found_inf_set(const std::optional<at::Tensor>& found_inf) {
  return found_inf.has_value() && found_inf->defined() && found_inf->item<float>() != 0.f;
}

}  // namespace inductor_lamb::cpu
