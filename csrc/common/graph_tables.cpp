// GraphTables (graph_tables.h), and torch.classes.lamb._GraphTablesProbe: a store of its own
// over a scripted runtime, which the tests drive without a GPU (tests/test_graph_tables.py).
#include "common/graph_tables.h"

#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace inductor_lamb {

GraphTables::Table* GraphTables::take(TableRuntime& rt, size_t size) {
  Table* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // the smallest spare table on this device that holds `size` bytes
    const int device = rt.device();
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if ((*it)->device_index == device && (*it)->capacity >= size &&
          (best == spare_.end() || (*it)->capacity < (*best)->capacity))
        best = it;
    if (best != spare_.end()) {
      t = *best;
      spare_.erase(best);
    } else {
      // A new one, rounded up to a power of two (at least 4 KiB) so that later lists of other
      // sizes find a spare one; its memory is allocated below, outside the lock.
      size_t capacity = 4096;
      while (capacity < size) capacity *= 2;
      t = new Table{this, device, nullptr, nullptr, capacity};
      ++allocated_;
      bytes_ += static_cast<int64_t>(capacity);
    }
  }
  // (a table whose allocation failed before is spare without its memory: completed here)
  try {
    if (t->device == nullptr) t->device = rt.alloc_device(t->capacity);
    if (t->host == nullptr) t->host = rt.alloc_host(t->capacity);
  } catch (...) {
    put_back(t);
    throw;
  }
  return t;
}

void GraphTables::put_back(Table* t) {
  std::lock_guard<std::mutex> lock(mu_);
  spare_.push_back(t);
}

void GraphTables::on_graph_gone(void* table) {
  auto* t = static_cast<Table*>(table);
  GraphTables* owner = t->owner;
  {
    std::lock_guard<std::mutex> lock(owner->mu_);
    --owner->held_;
  }
  owner->put_back(t);
}

const void* GraphTables::capture(TableRuntime& rt, const void* bytes, size_t size) {
  Table* t = take(rt, size);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++held_;  // (before the graph holds it: its release may come at once)
  }
  try {
    rt.give_to_graph(&GraphTables::on_graph_gone, t);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --held_;
    }
    put_back(t);  // no graph holds it: a later capture may take it
    throw;
  }
  // The graph holds the table from here: a failed copy leaves it there (the capture is broken, and
  // the graph gives the table back when it is destroyed), never to another capture.
  std::memcpy(t->host, bytes, size);
  rt.copy_to_device(t->device, t->host, size);
  return t->device;
}

GraphTables::Counts GraphTables::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {held_, static_cast<int64_t>(spare_.size()), allocated_, bytes_};
}

GraphTables& graph_tables() {
  static GraphTables* tables = new GraphTables();  // (never destroyed: graphs may outlive static destruction)
  return *tables;
}

namespace {

// A runtime whose device is host memory and whose graphs are numbered; the test says when a
// stream captures, which call fails next, and when a graph is destroyed.
class ScriptedRuntime : public TableRuntime {
 public:
  bool capturing() override { return capturing_; }
  int device() override { return device_; }
  void* alloc_device(size_t bytes) override { return alloc("alloc_device", bytes); }
  void* alloc_host(size_t bytes) override { return alloc("alloc_host", bytes); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    fail_if("copy_to_device");
    std::memcpy(dst, src, bytes);
    ++copies_;
  }
  void give_to_graph(void (*release)(void*), void* arg) override {
    fail_if("give_to_graph");
    TORCH_CHECK(capturing_, "give_to_graph outside a capture");
    graphs_[graph_].push_back({release, arg});
  }

  bool capturing_ = false;
  int device_ = 0;
  int64_t graph_ = 0;  // the graph being captured
  std::string fail_next_;
  int64_t copies_ = 0;
  std::map<int64_t, std::vector<std::pair<void (*)(void*), void*>>> graphs_;
  std::vector<std::unique_ptr<char[]>> memory_;

 private:
  void fail_if(const char* what) {
    if (fail_next_ == what) {
      fail_next_.clear();
      TORCH_CHECK(false, "scripted failure of ", what);
    }
  }
  void* alloc(const char* what, size_t bytes) {
    fail_if(what);
    memory_.emplace_back(new char[bytes]);
    return memory_.back().get();
  }
};

class GraphTablesProbe : public torch::CustomClassHolder {
 public:
  // Starts capturing graph `graph` (or stops: -1).
  void capture_graph(int64_t graph) {
    rt_.capturing_ = graph >= 0;
    rt_.graph_ = graph;
  }
  void fail_next(const std::string& what) { rt_.fail_next_ = what; }
  void set_device(int64_t device) { rt_.device_ = static_cast<int>(device); }
  // A captured call's table of `size` bytes, all `fill`: its device address.
  int64_t table(int64_t size, int64_t fill) {
    TORCH_CHECK(rt_.capturing(), "_GraphTablesProbe.table: no graph is being captured");
    std::vector<uint8_t> bytes(static_cast<size_t>(size), static_cast<uint8_t>(fill));
    return reinterpret_cast<int64_t>(tables_.capture(rt_, bytes.data(), bytes.size()));
  }
  // The first `size` device bytes at `address`, as a graph's replay would read them.
  std::vector<int64_t> read(int64_t address, int64_t size) {
    const auto* p = reinterpret_cast<const uint8_t*>(address);
    return std::vector<int64_t>(p, p + size);
  }
  // Destroys graph `graph`: its tables come back (what CUDA does once its executions are done).
  void destroy_graph(int64_t graph) {
    auto it = rt_.graphs_.find(graph);
    if (it == rt_.graphs_.end()) return;
    for (auto [release, arg] : it->second) release(arg);
    rt_.graphs_.erase(it);
  }
  // held, spare, allocated, bytes, copies
  std::vector<int64_t> counts() {
    const GraphTables::Counts c = tables_.counts();
    return {c.held, c.spare, c.allocated, c.bytes, rt_.copies_};
  }

 private:
  ScriptedRuntime rt_;
  GraphTables tables_;  // (declared after rt_: destroyed first)
};

}  // namespace

std::vector<int64_t> graph_table_counts() {
  const GraphTables::Counts c = graph_tables().counts();
  return {c.held, c.spare, c.allocated, c.bytes};
}

TORCH_LIBRARY_FRAGMENT(lamb, m) {
  // The process's graph-owned CUDA tables: held, spare, allocated, bytes (tests/test_cuda.py).
  m.def("_graph_table_counts() -> int[]", &graph_table_counts);
  m.class_<GraphTablesProbe>("_GraphTablesProbe")
      .def(torch::init<>())
      .def("capture_graph", &GraphTablesProbe::capture_graph)
      .def("fail_next", &GraphTablesProbe::fail_next)
      .def("set_device", &GraphTablesProbe::set_device)
      .def("table", &GraphTablesProbe::table)
      .def("read", &GraphTablesProbe::read)
      .def("destroy_graph", &GraphTablesProbe::destroy_graph)
      .def("counts", &GraphTablesProbe::counts);
}

}  // namespace inductor_lamb
