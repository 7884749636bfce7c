#pragma once
// Which elements of a chunk each thread of a block visits, and with which accesses: host and
// device code with no CUDA header, so that tests/cpp/chunk_layout.cpp checks it on the CPU.
//
// A chunk [begin, end) of a tensor is split into a scalar head, a vector body and a scalar
// tail. In the body every stream of the tensor (param, grad, state, master) is read and written
// with 16-byte accesses: a thread takes `E` consecutive elements at a time (E elements of every
// stream are a whole number of 16-byte vectors, at 16-byte aligned addresses), its next pack
// kThreads * E elements further. The head is what must be skipped for every stream to reach a
// 16-byte boundary at the same element (tensor_head); chunks start at multiples of kChunk
// elements, so every chunk of a tensor has the same head. A tensor whose streams cannot be
// aligned together (views offset by different amounts) is walked with scalar accesses only.
#include <stdint.h>

#include "common/math.h"

namespace inductor_lamb::cuda {

constexpr int kVecBytes = 16;

// The first element at which every stream s (its address addrs[s], elements of sizes[s] bytes,
// each a power of two <= 16) is 16-byte aligned, or -1 when there is none (a stream not aligned
// to its own element size, or streams whose offsets disagree). Streams with a null address
// (absent, or an empty tensor's) do not count. The result is < 16.
INDUCTOR_LAMB_HD int tensor_head(const uint64_t* addrs, const int* sizes, int n) {
  int head = 0, period = 1;  // every element head + k * period is aligned for the streams so far
  for (int s = 0; s < n; ++s) {
    if (addrs[s] == 0) continue;
    const int size = sizes[s], per = kVecBytes / size;  // elements of one 16-byte vector
    if (addrs[s] % uint64_t(size) != 0) return -1;
    const int want = int((kVecBytes - addrs[s] % kVecBytes) % kVecBytes) / size;  // head mod per
    if (per <= period) {
      if (head % per != want) return -1;
      continue;
    }
    int k = 0;  // refine: the first head + k * period that is = want (mod per)
    while (k < per / period && (head + k * period) % per != want) ++k;
    if (k == per / period) return -1;
    head += k * period;
    period = per;
  }
  return head;
}

// The three parts of a chunk [begin, end): scalar [begin, vec_begin), packs of E elements
// [vec_begin, vec_end), scalar [vec_end, end).
struct ChunkPlan {
  int64_t begin, vec_begin, vec_end, end;
};

// `head`: the tensor's (tensor_head; -1: scalar accesses only). `begin` is a multiple of 16.
INDUCTOR_LAMB_HD ChunkPlan plan_chunk(int64_t begin, int64_t end, int head, int E) {
  if (head < 0) return {begin, end, end, end};
  const int64_t vec_begin = begin + head < end ? begin + head : end;
  return {begin, vec_begin, vec_begin + (end - vec_begin) / E * E, end};
}

// Thread `tid` of `threads`: its scalar elements of each scalar range, start + tid + k * threads
// (first: the vector loop then holds no more than its own bounds), then its packs, first
// elements vec_begin + (tid + k * threads) * E.
template <typename Pack, typename Scalar>
INDUCTOR_LAMB_HD void walk_chunk(const ChunkPlan& c, int E, int tid, int threads, Pack&& pack, Scalar&& scalar) {
  if (c.begin < c.vec_begin) scalar(c.begin, c.vec_begin);
  if (c.vec_end < c.end) scalar(c.vec_end, c.end);
  for (int64_t i = c.vec_begin + int64_t(tid) * E; i < c.vec_end; i += int64_t(threads) * E) pack(i);
}
template <typename F>
INDUCTOR_LAMB_HD void walk_scalar(int64_t start, int64_t stop, int tid, int threads, F&& f) {
  for (int64_t i = start + tid; i < stop; i += threads) f(i);
}

}  // namespace inductor_lamb::cuda
