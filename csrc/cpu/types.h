#pragma once
// Plain data passed from the glue (normal flags) to the per-ISA kernels.
// Nothing here may depend on ISA flags: these types cross that boundary.
#include <cstdint>

#include "common/math.h"  // Dtype, kChunkElems

namespace inductor_lamb::cpu {

// A contiguous element range [begin, end) of tensor `tensor` of a list.
struct Chunk {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

struct ChunkSpan {
  const Chunk* data;
  int64_t size;
  // Each thread takes its share of the chunks last to first: the pass 2 of a one-call step
  // (TwoPhaseStep) so that it starts on the chunks the same thread's pass 1 read last, still in
  // its caches. Only for loops whose chunks are independent (no reduction across them).
  bool backward = false;
};

// One list index of an op, as the kernels see it (the CPU tensor table).
struct TensorPtrs {
  void* param;         // Dtype `dtype`
  const void* grad;    // Dtype `dtype`, read only
  void* state[2];      // optimizer state (float32, or float8 for LAMB16), null if unused
  float* master;       // float32 master copy of param, or null
  Dtype dtype;
  bool round_param = false;  // a bf16/fp16 param without master copy, written rounded stochastically
  uint32_t param_key = 0;    // its rounding's per-tensor key (common/rounding.h tensor_key)
};

// Where pass 1 of a one-call step leaves every element's update u for pass 2 to read back instead
// of recomputing it from p, m and v (LAMB; TwoPhaseStep in engine.h): pass 2 then reads two
// streams instead of three and takes no square root or division. The same float32 values either
// way, so the same bits as the two-phase form, which recomputes.
struct UpdateStash {
  float* data = nullptr;            // null: no stash, pass 2 recomputes u
  const int64_t* offset = nullptr;  // per tensor of the list: where its elements start in data (64-byte
                                    // aligned), or -1: it recomputes
  bool stream = false;              // non-temporal stores: a block larger than the last-level cache
  int64_t plane = 0;                // floats from one plane to the next: a step that stashes more than u
                                    // (LAMB16: u, then the new m, then the new v, each at offset + k plane)
};

// Sum of squares of one list of tensors, one double per chunk (engine kernel).
struct SumSqArgs {
  const void* const* ptrs;  // one per tensor (may be null for empty tensors)
  const Dtype* dtypes;
  ChunkSpan chunks;
  float scale;  // values are multiplied by `scale` before squaring
  double* partials;  // [chunks.size]
};

struct EngineKernels {
  void (*sumsq)(const SumSqArgs&);
};

// Runtime ISA selection (engine.cpp). Values are ordered: a higher one implies the lower ones.
enum class Capability : int { Default = 0, AVX2 = 1, AVX512 = 2 };

}  // namespace inductor_lamb::cpu

// Name of a per-ISA symbol: ISA_SYMBOL(lamb_kernels) -> lamb_kernels_AVX512 in the AVX512 build.
#define INDUCTOR_LAMB_CAT_(a, b) a##_##b
#define INDUCTOR_LAMB_CAT(a, b) INDUCTOR_LAMB_CAT_(a, b)
#define INDUCTOR_LAMB_ISA_SYMBOL(name) INDUCTOR_LAMB_CAT(name, CPU_CAPABILITY)
