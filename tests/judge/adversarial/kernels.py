"""C++ sources (CPU target) for the adversarial candidates: honest kernels whose arithmetic
differs from PyTorch's, and the hostile kernels of the hacks. Each string is one
``kernels/*_binding.cpp`` file that includes only ``binding_registry.h``."""

from __future__ import annotations

PRELUDE = '''#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "binding_registry.h"

namespace {
using cuda_ext::Args;
using cuda_ext::DType;
using cuda_ext::Outputs;
using cuda_ext::Tensor;

void check_f32(const Tensor& t, const char* what) {
  CUDA_EXT_CHECK(!t.is_cuda() && t.dtype == DType::Float32 && t.is_contiguous(), what);
}

// pairwise (tree) sum of v[0..n), the order a careful kernel would use
float pairwise(float* v, int64_t n) {
  while (n > 1) {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) v[i] += v[n - 1 - i];
    n -= half;
  }
  return n ? v[0] : 0.0f;
}

// keep `bits` mantissa bits of every value (round to nearest even): 23 is plain fp32,
// 10 what TF32 tensor cores read, 7 bf16
void round_mantissa(std::vector<float>& values, int bits) {
  if (bits >= 23) return;
  const int drop = 23 - bits;
  const uint32_t half = (1u << (drop - 1)) - 1u, mask = ~((1u << drop) - 1u);
  for (float& f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u + half + ((u >> drop) & 1u)) & mask;
    std::memcpy(&f, &u, 4);
  }
}
'''


def cpp(body: str, *names: str) -> str:
    """One binding file: the prelude, ``body`` (in an anonymous namespace), registrations."""
    registrations = "".join(f'REGISTER_BINDING({n}, "{n}", {n});\n' for n in names)
    return f"{PRELUDE}\n{body}\n}}  // namespace\n\n{registrations}"


# --- scale_add family (task: alpha * x + y) -----------------------------------------------

# extra entry points over the conftest's scale_add kernel (extern "C" scale_add_launch)
TOOLS = cpp('''
}  // namespace
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config);
namespace {

// scale_add_into(x, y, alpha, out) -> out: the kernel writes into a tensor it is given
Outputs scale_add_into(const Args& args) {
  const Tensor& x = args.tensor(0);
  const Tensor& y = args.tensor(1);
  const Tensor& out = args.tensor(3);
  check_f32(x, "x");
  check_f32(y, "y");
  check_f32(out, "out");
  scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                   static_cast<float>(args.real(2)), 0);
  return {out};
}

// copy_f32(t) -> a fresh copy made by the extension
Outputs copy_f32(const Args& args) {
  const Tensor& t = args.tensor(0);
  check_f32(t, "t");
  Tensor out = cuda_ext::empty_like(t);
  std::memcpy(out.data, t.data, static_cast<size_t>(t.numel()) * sizeof(float));
  return {out};
}

// fill_like(x, value) -> a tensor shaped like x holding value; never reads x's data
Outputs fill_like(const Args& args) {
  Tensor out = cuda_ext::empty_like(args.tensor(0));
  std::fill_n(out.data_ptr<float>(), out.numel(), static_cast<float>(args.real(1)));
  return {out};
}

// fill_scalar(x, value) -> a 0-d tensor holding value; never reads x's data
Outputs fill_scalar(const Args& args) {
  Tensor out = cuda_ext::empty({}, DType::Float32, args.tensor(0).device);
  *out.data_ptr<float>() = static_cast<float>(args.real(1));
  return {out};
}

// empty_f32(x) -> an unwritten tensor shaped like x
Outputs empty_f32(const Args& args) { return {cuda_ext::empty_like(args.tensor(0))}; }

// identity(t) -> t: a tensor passed through the extension untouched
Outputs identity(const Args& args) { return {args.tensor(0)}; }

// scale_add_f64(x, y, alpha): only float64 is accepted (float32 inputs raise)
Outputs scale_add_f64(const Args& args) {
  CUDA_EXT_CHECK(args.tensor(0).dtype == DType::Float64, "scale_add_f64: x must be float64");
  return {};
}

// scale_add_consume(x, y, alpha): the right answer, then the inputs are zeroed
Outputs scale_add_consume(const Args& args) {
  const Tensor& x = args.tensor(0);
  const Tensor& y = args.tensor(1);
  Tensor out = cuda_ext::empty_like(x);
  scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                   static_cast<float>(args.real(2)), 0);
  std::memset(x.data, 0, static_cast<size_t>(x.numel()) * sizeof(float));
  std::memset(y.data, 0, static_cast<size_t>(y.numel()) * sizeof(float));
  return {out};
}
''', "scale_add_into", "copy_f32", "fill_like", "fill_scalar", "empty_f32", "identity",
   "scale_add_f64", "scale_add_consume")

# #13: outputs cached by input pointers (the inputs are kept alive, so a new tensor never
# gets an old address); the "sampled" variant also compares four sampled input values
CACHED = cpp('''
}  // namespace
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config);
namespace {

struct Entry {
  Tensor x, y, out;
  double alpha;
  float samples[4];
};
std::vector<Entry> cache;

Outputs cached(const Args& args, bool sampled) {
  const Tensor& x = args.tensor(0);
  const Tensor& y = args.tensor(1);
  const double alpha = args.real(2);
  const int64_t n = x.numel();
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float samples[4] = {0, 0, 0, 0};
  if (sampled) {
    samples[0] = px[0];
    samples[1] = px[n - 1];
    samples[2] = py[0];
    samples[3] = py[n / 2];
  }
  for (const Entry& e : cache)
    if (e.x.data == x.data && e.y.data == y.data && e.alpha == alpha &&
        std::memcmp(e.samples, samples, sizeof samples) == 0)
      return {e.out};  // seen before: no work at all
  Tensor out = cuda_ext::empty_like(x);
  scale_add_launch(px, py, out.data_ptr<float>(), n, static_cast<float>(alpha), 0);
  if (cache.size() >= 64) cache.erase(cache.begin());
  cache.push_back({x, y, out, alpha, {samples[0], samples[1], samples[2], samples[3]}});
  return {out};
}

Outputs scale_add_cached_ptr(const Args& args) { return cached(args, false); }
Outputs scale_add_cached_sampled(const Args& args) { return cached(args, true); }
''', "scale_add_cached_ptr", "scale_add_cached_sampled")

# The job queue of the native worker-thread hacks (here and in test_cuda_hacks.py), C++ placed
# after the hack's ``Job`` struct: forward pushes, the worker pops after forward has returned.
JOB_QUEUE = '''
std::mutex mu;
std::condition_variable ready;
std::deque<Job> jobs;

void push(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu);
    jobs.push_back(std::move(job));
  }
  ready.notify_one();
}

Job pop() {
  std::unique_lock<std::mutex> lock(mu);
  ready.wait(lock, [] { return !jobs.empty(); });
  Job job = jobs.front();
  jobs.pop_front();
  return job;
}

void start_once(void (*work)()) {  // the worker thread, started by the first call
  static bool started = false;
  if (!started) std::thread(work).detach();
  started = true;
}
'''

# #14 in C++: inputs seen before (timing) are handed to a native worker thread that computes
# them after forward has returned; new inputs (a correctness check) are computed at once. The
# thread starts when the first such job comes, or (``NATIVE_AT_LOAD``) when the module loads;
# ``NATIVE_PER_CALL`` starts a detached thread for each such call instead.
_NATIVE_ASYNC = '''
}  // namespace
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config);
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
namespace {

struct Job {
  Tensor x, y, out;
  float alpha;
};
''' + JOB_QUEUE + '''
std::vector<Tensor> seen;  // kept alive, so a new input never gets an old address

void work() {
  for (;;) {
    const Job job = pop();
    // no pause: the work is done while the judge prepares the next call
    scale_add_launch(job.x.data_ptr<float>(), job.y.data_ptr<float>(),
                     job.out.data_ptr<float>(), job.x.numel(), job.alpha, 0);
  }
}

void start() { start_once(work); }

Outputs scale_add_native_async(const Args& args) {
  const Tensor& x = args.tensor(0);
  const Tensor& y = args.tensor(1);
  const float alpha = static_cast<float>(args.real(2));
  Tensor out = cuda_ext::empty_like(x);
  bool known = false;
  for (const Tensor& t : seen) known = known || t.data == x.data;
  if (!known) {
    seen.push_back(x);
    scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                     x.numel(), alpha, 0);
    return {out};
  }
  PER_CALL
  start();
  push({x, y, out, alpha});
  return {out};
}
'''
NATIVE_ASYNC = cpp(_NATIVE_ASYNC.replace("PER_CALL", ""), "scale_add_native_async")
NATIVE_PER_CALL = cpp(_NATIVE_ASYNC.replace("PER_CALL", '''std::thread([=] {
    scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                     x.numel(), alpha, 0);
  }).detach();
  return {out};'''), "scale_add_native_async")
NATIVE_AT_LOAD = cpp(_NATIVE_ASYNC.replace("PER_CALL", "") + '''
const bool at_load = (start(), true);
''', "scale_add_native_async")

# #14 before the call: a job begun while the harness makes a call's inputs (model_new.py
# starts it from a patched ``torch.randn`` once both inputs are drawn, as the task's
# get_inputs draws them) runs on a thread of its own beside the harness's copying of the
# inputs; forward joins it and returns its output if it was begun on the same values (the
# first, middle and last elements agree), else computes at once.
NATIVE_EARLY = cpp("""
}  // namespace
extern "C" void scale_add_launch(const float* x, const float* y, float* out, int64_t n,
                                 float alpha, int config);
#include <thread>
namespace {

std::thread pending;
Tensor begun_x, begun_y, begun_out;

bool same_values(const Tensor& a, const Tensor& b) {
  const int64_t n = a.numel();
  if (n != b.numel() || n == 0) return false;
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  return pa[0] == pb[0] && pa[n / 2] == pb[n / 2] && pa[n - 1] == pb[n - 1];
}

// scale_add_begin(x, y, alpha) -> out, which a thread of its own computes from now on
Outputs scale_add_begin(const Args& args) {
  if (pending.joinable()) pending.join();
  begun_x = args.tensor(0);
  begun_y = args.tensor(1);
  begun_out = cuda_ext::empty_like(begun_x);
  const float* x = begun_x.data_ptr<float>();
  const float* y = begun_y.data_ptr<float>();
  float* out = begun_out.data_ptr<float>();
  const int64_t n = begun_x.numel();
  const float alpha = static_cast<float>(args.real(2));
  pending = std::thread([=] { scale_add_launch(x, y, out, n, alpha, 0); });
  return {begun_out};
}

// scale_add_finish(x, y, alpha) -> the begun job's output, or alpha * x + y computed now
Outputs scale_add_finish(const Args& args) {
  const Tensor& x = args.tensor(0);
  const Tensor& y = args.tensor(1);
  if (pending.joinable()) pending.join();
  if (begun_out.data != nullptr && same_values(x, begun_x) && same_values(y, begun_y)) {
    Tensor out = begun_out;
    begun_out = Tensor();
    return {out};
  }
  Tensor out = cuda_ext::empty_like(x);
  scale_add_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                   static_cast<float>(args.real(2)), 0);
  return {out};
}
""", "scale_add_begin", "scale_add_finish")

# A thread released once a call has returned, to spin for a given CPU time where no call's
# window is (the judge's CPU clock must charge it, whatever the process's own watch says).
BURN_AFTER = cpp("""
}  // namespace
#include <chrono>
#include <ctime>
#include <thread>
namespace {

double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

// burn_after(x, delay_ms, cpu_ms) -> x: a detached thread sleeps delay_ms, then spins cpu_ms
Outputs burn_after(const Args& args) {
  const double delay_ms = args.real(1), cpu_ms = args.real(2);
  std::thread([=] {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay_ms * 1e3)));
    const double until = thread_cpu_ms() + cpu_ms;
    volatile double sink = 0;
    while (thread_cpu_ms() < until) sink = sink + 1.0;
  }).detach();
  return {args.tensor(0)};
}
""", "burn_after")

# #4 without torch headers: the "kernel" hands the work back to the interpreter, which runs
# PyTorch. The Python C API symbols resolve against the interpreter at load time.
PYRUN = cpp('''
}  // namespace
extern "C" int PyRun_SimpleString(const char* command);
namespace {

// scale_add_via_python(x, y, alpha, out) -> out, computed by torch.add in the interpreter
Outputs scale_add_via_python(const Args& args) {
  const Tensor& out = args.tensor(3);
  const char* code =
      "import sys, torch\\n"
      "_a = sys.modules['model_new'].ARGS\\n"
      "torch.add(_a[1], _a[0], alpha=_a[2], out=_a[3])\\n";
  if (PyRun_SimpleString(code) != 0) throw std::runtime_error("scale_add_via_python failed");
  return {out};
}
''', "scale_add_via_python")

# --- honest kernels whose summation order differs from PyTorch's ---------------------------

ROWSUM = cpp('''
// x.sum(1): blocks of 256 with 8 lanes each, block sums added pairwise; every term rounded
// to `bits` mantissa bits first (round_mantissa; 23 keeps fp32)
Outputs rowsum_rounded(const Tensor& x, int bits) {
  check_f32(x, "x");
  CUDA_EXT_CHECK(x.dim() == 2, "x must be 2-d");
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = cuda_ext::empty({rows}, DType::Float32, -1);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(px + r * cols, px + (r + 1) * cols);
    round_mantissa(row, bits);
    std::vector<float> blocks;
    for (int64_t b = 0; b < cols; b += 256) {
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const int64_t end = std::min(cols, b + 256);
      for (int64_t c = b; c < end; ++c) lanes[(c - b) % 8] += row[c];
      blocks.push_back(pairwise(lanes, 8));
    }
    po[r] = pairwise(blocks.data(), static_cast<int64_t>(blocks.size()));
  }
  return {out};
}

Outputs rowsum_blocked(const Args& args) { return rowsum_rounded(args.tensor(0), 23); }

// what a declared bf16 allows: bf16 terms (autocast itself sums in fp32)
Outputs rowsum_bf16(const Args& args) { return rowsum_rounded(args.tensor(0), 7); }

''', "rowsum_blocked", "rowsum_bf16")

SOFTMAX = cpp('''
// softmax_blocked(x) -> softmax over the last dim; blocked, pairwise sum of exponentials
Outputs softmax_blocked(const Args& args) {
  const Tensor& x = args.tensor(0);
  check_f32(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols, block = 4096;
  const int64_t nblocks = (cols + block - 1) / block;
  Tensor out = cuda_ext::empty_like(x);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data_ptr<float>() + r * cols;
    float* o = out.data_ptr<float>() + r * cols;
    float peak = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) peak = std::max(peak, row[c]);
    std::vector<float> sums(nblocks);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t c = b * block; c < std::min(cols, (b + 1) * block); ++c)
        lanes[c % 8] += std::exp(row[c] - peak);
      sums[b] = pairwise(lanes, 8);
    }
    const float total = pairwise(sums.data(), nblocks);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < cols; ++c) o[c] = std::exp(row[c] - peak) / total;
  }
  return {out};
}
''', "softmax_blocked")

_MATMUL = '''
// C = A @ B, row by row, K in blocks of 64 whose partial products are added to the row
void matmul_kblocked(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n) {
#pragma omp parallel
  {
    std::vector<float> part(n);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      float* crow = c + i * n;
      std::fill_n(crow, n, 0.0f);
      for (int64_t k0 = 0; k0 < k; k0 += 64) {
        std::fill(part.begin(), part.end(), 0.0f);
        for (int64_t kk = k0; kk < std::min(k, k0 + 64); ++kk) {
          const float aik = a[i * k + kk];
          const float* brow = b + kk * n;
          for (int64_t j = 0; j < n; ++j) part[j] += aik * brow[j];
        }
        for (int64_t j = 0; j < n; ++j) crow[j] += part[j];
      }
    }
  }
}

// every input rounded to `bits` mantissa bits first (round_mantissa)
Outputs run_matmul(const Args& args, int bits) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  check_f32(a, "a");
  check_f32(b, "b");
  CUDA_EXT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "a: (m, k), b: (k, n)");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<float> ra(a.data_ptr<float>(), a.data_ptr<float>() + m * k);
  std::vector<float> rb(b.data_ptr<float>(), b.data_ptr<float>() + k * n);
  round_mantissa(ra, bits);
  round_mantissa(rb, bits);
  Tensor out = cuda_ext::empty({m, n}, DType::Float32, -1);
  matmul_kblocked(ra.data(), rb.data(), out.data_ptr<float>(), m, k, n);
  return {out};
}

Outputs matmul_fp32(const Args& args) { return run_matmul(args, 23); }
Outputs matmul_tf32(const Args& args) { return run_matmul(args, 10); }
Outputs matmul_bf16(const Args& args) { return run_matmul(args, 7); }
'''
MATMUL = cpp(_MATMUL, "matmul_fp32", "matmul_tf32", "matmul_bf16")

# #8: the lower triangle of A @ B is computed; the upper triangle is never written, and is
# right only where the allocator hands back zeroed (or the reference's) memory
TRIL_MATMUL = cpp('''
Outputs tril_matmul_lazy(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  check_f32(a, "a");
  check_f32(b, "b");
  const int64_t n = a.size(0);
  Tensor out = cuda_ext::empty({n, n}, DType::Float32, -1);
  float* c = out.data_ptr<float>();
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < n; ++i) {
    float* row = c + i * n;
    std::fill_n(row, i + 1, 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      const float aik = pa[i * n + k];
      for (int64_t j = 0; j <= i; ++j) row[j] += aik * pb[k * n + j];
    }
  }
  return {out};
}
''', "tril_matmul_lazy")

# x * s in bf16 arithmetic (x and the product rounded to bf16, returned as fp32): what a
# declared bf16 allows, about 0.4% from the fp32 product
SCALE_BF16 = cpp('''
Outputs scale_bf16(const Args& args) {
  const Tensor& x = args.tensor(0);
  check_f32(x, "x");
  const float s = static_cast<float>(args.real(1));
  std::vector<float> v(x.data_ptr<float>(), x.data_ptr<float>() + x.numel());
  round_mantissa(v, 7);
  for (float& f : v) f *= s;
  round_mantissa(v, 7);
  Tensor out = cuda_ext::empty_like(x);
  std::copy(v.begin(), v.end(), out.data_ptr<float>());
  return {out};
}
''', "scale_bf16")

# --- honest kernels the judge must pass (test_honest.py) ------------------------------------

HONEST = cpp('''
void check_rows(const Tensor& x) {
  check_f32(x, "x");
  CUDA_EXT_CHECK(x.dim() == 2, "x must be 2-d");
}

// x.sum(1) in one of three orders: 0 one term after another, 1 from the last term back,
// 2 pairwise; rows spread over `threads` OpenMP threads (0: the pool's)
Tensor rowsum_in_order(const Tensor& x, int order, int threads) {
  check_rows(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = cuda_ext::empty({rows}, DType::Float32, -1);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static, 1) num_threads(team)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = px + r * cols;
    float total = 0.0f;
    if (order == 0) {
      for (int64_t c = 0; c < cols; ++c) total += row[c];
    } else if (order == 1) {
      for (int64_t c = cols - 1; c >= 0; --c) total += row[c];
    } else {
      std::vector<float> copy(row, row + cols);
      total = pairwise(copy.data(), cols);
    }
    po[r] = total;
  }
  return out;
}

Outputs rowsum_serial(const Args& args) { return {rowsum_in_order(args.tensor(0), 0, 0)}; }
Outputs rowsum_reversed(const Args& args) { return {rowsum_in_order(args.tensor(0), 1, 0)}; }
Outputs rowsum_pairwise(const Args& args) { return {rowsum_in_order(args.tensor(0), 2, 0)}; }
// a team larger than PyTorch's pool (at most one thread per core): 14 more threads than
// cores, which stay parked in libgomp's pool between calls
Outputs rowsum_team(const Args& args) {
  return {rowsum_in_order(args.tensor(0), 0, omp_get_num_procs() + 14)};
}

// (x.sum(1), x.amax(1)): two outputs of one kernel
Outputs sum_max(const Args& args) {
  const Tensor& x = args.tensor(0);
  check_rows(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor sums = cuda_ext::empty({rows}, DType::Float32, -1);
  Tensor peaks = cuda_ext::empty({rows}, DType::Float32, -1);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data_ptr<float>() + r * cols;
    float total = 0.0f, peak = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) {
      total += row[c];
      peak = std::max(peak, row[c]);
    }
    sums.data_ptr<float>()[r] = total;
    peaks.data_ptr<float>()[r] = peak;
  }
  return {sums, peaks};
}

// x.argmax(1) as int64, the first of equal values as PyTorch returns it
Outputs argmax_rows(const Args& args) {
  const Tensor& x = args.tensor(0);
  check_rows(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = cuda_ext::empty({rows}, DType::Int64, -1);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data_ptr<float>() + r * cols;
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c)
      if (row[c] > row[best]) best = c;
    out.data_ptr<int64_t>()[r] = best;
  }
  return {out};
}

// mm(a, b) -> a @ b: a plain GEMM, named as PyTorch names its own
Outputs mm(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  check_f32(a, "a");
  check_f32(b, "b");
  CUDA_EXT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "a: (m, k), b: (k, n)");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor c = cuda_ext::empty({m, n}, DType::Float32, -1);
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* pc = c.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float* row = pc + i * n;
    std::fill_n(row, n, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float aik = pa[i * k + kk];
      for (int64_t j = 0; j < n; ++j) row[j] += aik * pb[kk * n + j];
    }
  }
  return {c};
}

// mm_transposed(a, b) -> (a @ b)^T, contiguous (n, m): Python returns its .t()
Outputs mm_transposed(const Args& args) {
  const Tensor& a = args.tensor(0);
  const Tensor& b = args.tensor(1);
  check_f32(a, "a");
  check_f32(b, "b");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor ct = cuda_ext::empty({n, m}, DType::Float32, -1);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float total = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk)
        total += a.data_ptr<float>()[i * k + kk] * b.data_ptr<float>()[kk * n + j];
      ct.data_ptr<float>()[j * m + i] = total;
    }
  return {ct};
}

// scale_shift(x, s, t) -> a new tensor s * x + t; relu_inplace(y) clamps y in place (the
// kernel's own temporary) and returns nothing
Outputs scale_shift(const Args& args) {
  const Tensor& x = args.tensor(0);
  check_f32(x, "x");
  const float s = static_cast<float>(args.real(1)), t = static_cast<float>(args.real(2));
  Tensor out = cuda_ext::empty_like(x);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out.data_ptr<float>()[i] = s * x.data_ptr<float>()[i] + t;
  return {out};
}

Outputs relu_inplace(const Args& args) {
  const Tensor& y = args.tensor(0);
  check_f32(y, "y");
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y.data_ptr<float>()[i] = std::max(y.data_ptr<float>()[i], 0.0f);
  return {};
}
''', "rowsum_serial", "rowsum_reversed", "rowsum_pairwise", "rowsum_team", "sum_max",
   "argmax_rows", "mm", "mm_transposed", "scale_shift", "relu_inplace").replace(
    '#include "binding_registry.h"', '#include <omp.h>\n\n#include "binding_registry.h"')
