// kernel_lens runtime shared by every target (ONNX Runtime custom ops, TensorRT plugins).
//
// What the targets have in common lives here once: loading the CUDA driver lazily with
// dlopen (so plugin libraries build and load on hosts without a GPU or driver), loading
// kernel modules once per CUDA context, choosing the binary for the running device,
// launching with Triton's ABI (hidden scratch pointers, dynamic shared memory), and error
// text that names the kernel and the CUresult. A target only adapts its host API to
// kl::LaunchContext.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kl_symbolic.h"

namespace kl {

// ---- CUDA driver API, declared here so no CUDA header or library is needed to build ----------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;

constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrMaxSharedOptin = 97;          // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kFuncAttrMaxDynamicShared = 8;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

// cuLaunchKernelEx's configuration, laid out as cuda.h (CUDA 12.0+) lays out CUlaunchConfig and
// CUlaunchAttribute (tests/test_runtime_cpp.py checks sizes and offsets against a real cuda.h).
constexpr int kLaunchAttrCooperative = 2;               // CU_LAUNCH_ATTRIBUTE_COOPERATIVE
constexpr int kLaunchAttrProgrammaticSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char bytes[64];
    int flag;  // cooperative / programmaticStreamSerializationAllowed: nonzero sets it
  } value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;  // CUDA 12.0+
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuCtxGetId)(CUcontext, unsigned long long*) = nullptr;  // CUDA 12.0+
  // Looked up but optional (the ORT target gives cuBLAS a workspace with them, kl_ort.cpp).
  CUresult (*cuStreamIsCapturing)(CUstream, int*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  // CUDA 12.0+, looked up but optional: only kernels that take TMA descriptors need it.
  CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                                     const unsigned*, const unsigned*, int, int, int, int) = nullptr;
};

// CUtensorMap: the 128-byte, 64-byte aligned TMA descriptor a kernel takes by value.
struct alignas(64) CUtensorMap {
  uint64_t opaque[16];
};

// Errors are plain strings; empty means success. Each target converts them to its own status.
using Status = std::string;

inline std::string result_name(const Driver& d, CUresult r) {
  const char* name = nullptr;
  if (d.cuGetErrorName != nullptr && d.cuGetErrorName(r, &name) == 0 && name != nullptr) return name;
  return "CUresult " + std::to_string(r);
}

template <typename F>
bool load_symbol(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

// TEST ONLY: names a shared library that driver() loads instead of libcuda.so.1, so the
// runtime can be exercised without a GPU against the fake driver of tests/fake_cuda
// (see docs/testing.md). Never set it outside tests.
constexpr const char* kTestDriverEnv = "KERNEL_LENS_TEST_CUDA_DRIVER";

// The driver, loaded on first use. On a host without libcuda.so.1 this returns an error
// (at run time only: building and loading the plugin library never needs the driver).
inline const Driver* driver(Status* error) {
  static Driver d;
  static Status load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* test_driver = std::getenv(kTestDriverEnv);  // test-only substitute, see above
    const std::string path = (test_driver != nullptr && *test_driver != '\0') ? test_driver : "libcuda.so.1";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      load_error = "kernel_lens: cannot load the CUDA driver " + path + " (" + (why ? why : "unknown reason") +
                   "); a GPU with an NVIDIA driver is required to run";
      return;
    }
    const char* missing = nullptr;
    auto need = [&](const char* name, auto* out) {
      if (missing == nullptr && !load_symbol(lib, name, out)) missing = name;
    };
    need("cuInit", &d.cuInit);
    need("cuGetErrorName", &d.cuGetErrorName);
    need("cuCtxGetCurrent", &d.cuCtxGetCurrent);
    need("cuCtxGetDevice", &d.cuCtxGetDevice);
    need("cuCtxPushCurrent_v2", &d.cuCtxPushCurrent);
    need("cuCtxPopCurrent_v2", &d.cuCtxPopCurrent);
    need("cuStreamGetCtx", &d.cuStreamGetCtx);
    need("cuDeviceGetAttribute", &d.cuDeviceGetAttribute);
    need("cuModuleLoadData", &d.cuModuleLoadData);
    need("cuModuleUnload", &d.cuModuleUnload);
    need("cuModuleGetFunction", &d.cuModuleGetFunction);
    need("cuFuncSetAttribute", &d.cuFuncSetAttribute);
    need("cuLaunchKernel", &d.cuLaunchKernel);
    need("cuLaunchKernelEx", &d.cuLaunchKernelEx);
    need("cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync);
    need("cuMemsetD8Async", &d.cuMemsetD8Async);
    need("cuCtxGetId", &d.cuCtxGetId);
    load_symbol(lib, "cuTensorMapEncodeTiled", &d.cuTensorMapEncodeTiled);  // optional, see above
    load_symbol(lib, "cuStreamIsCapturing", &d.cuStreamIsCapturing);         // optional, see above
    load_symbol(lib, "cuMemAlloc_v2", &d.cuMemAlloc);
    if (missing != nullptr) {
      load_error = "kernel_lens: the CUDA driver " + path + " lacks the entry point " + missing +
                   "; update the NVIDIA driver (CUDA 12.0 or newer is required)";
      return;
    }
    CUresult r = d.cuInit(0);
    if (r != 0) load_error = "kernel_lens: cuInit failed: " + result_name(d, r);
  });
  if (!load_error.empty()) {
    *error = load_error;
    return nullptr;
  }
  return &d;
}

#define KL_CHECK(drv, call, what)                                                      \
  do {                                                                                 \
    ::kl::CUresult kl_r_ = (call);                                                     \
    if (kl_r_ != 0) return std::string(what) + ": " + ::kl::result_name(drv, kl_r_);   \
  } while (0)

// ---- compiled binaries ----------------------------------------------------------------------
struct Binary {
  const char* kernel;          // kernel id, for error messages
  int arch;                    // compute capability the cubin is for (e.g. 90)
  bool arch_specific;          // PTX target with an 'a' suffix: runs on exactly `arch`
  const unsigned char* cubin;  // may be null
  size_t cubin_size;
  const char* ptx;             // NUL-terminated PTX, the fallback for other archs
  const char* entry;
  unsigned num_warps;
  unsigned num_ctas;
  unsigned shared;             // dynamic shared memory bytes
  size_t global_scratch_size;  // per program
  size_t global_scratch_align;
  size_t profile_scratch_size;
  const char* variant = "";    // "specialized" or "generic": which assumptions it was built under
  bool launch_pdl = false;     // Triton's launch_pdl: programmatic dependent launch (cuLaunchKernelEx)
  bool launch_cooperative_grid = false;  // Triton's launch_cooperative_grid: a cooperative launch
};

// The compute capability (major * 10 + minor) of the current context's device, read once per
// device.
inline Status device_cc(const Driver& d, int* cc) {
  static std::atomic<int> known[128] = {};  // by device ordinal; 0: not read yet
  CUdevice dev = 0;
  KL_CHECK(d, d.cuCtxGetDevice(&dev), "cuCtxGetDevice");
  const bool cached = dev >= 0 && dev < 128;
  if (cached && (*cc = known[dev].load(std::memory_order_relaxed)) != 0) return {};
  int major = 0, minor = 0;
  KL_CHECK(d, d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
  KL_CHECK(d, d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
  *cc = major * 10 + minor;
  if (cached) known[dev].store(*cc, std::memory_order_relaxed);
  return {};
}

// Which of a kernel's built archs a `cc` device runs (kernel_lens.archs.pick_arch is the same
// rule): the exact arch (its cubin), else the newest below `cc` whose PTX the driver can compile
// for it (not an 'a' target); -1 when none.
inline int pick_arch(std::initializer_list<const Binary*> binaries, int cc) {
  for (const Binary* b : binaries)
    if (b->arch == cc) return cc;
  int best = -1;
  for (const Binary* b : binaries) {
    if (b->arch >= cc || b->arch <= best) continue;
    bool portable = true;  // every binary of that arch has PTX the driver may compile for cc
    for (const Binary* o : binaries)
      if (o->arch == b->arch && (o->arch_specific || o->ptx == nullptr)) portable = false;
    if (portable) best = b->arch;
  }
  return best;
}

// KERNEL_LENS_LOG_LAUNCHES=1: one line per launch on stderr (kernel, binary variant, grid), to
// see which binary a call ran (e.g. the generic one for misaligned inputs). Read once.
inline bool log_launches() {
  static const bool on = [] {
    const char* v = std::getenv("KERNEL_LENS_LOG_LAUNCHES");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

// Loaded functions, one per (context, binary); loading is serialized, lookups are cheap.
// Keyed by the context's unique id (cuCtxGetId), never by its address: a context destroyed
// and recreated at the same address is a new context whose modules must be loaded again.
class ModuleCache {
 public:
  // `ctx` must be the current context (ContextGuard makes it so).
  Status function(const Driver& d, CUcontext ctx, const Binary& b, CUfunction* out) {
    unsigned long long ctx_id = 0;
    KL_CHECK(d, d.cuCtxGetId(ctx, &ctx_id), std::string("kernel ") + b.kernel + ": cuCtxGetId");
    std::lock_guard<std::mutex> lock(mutex_);
    auto key = std::make_pair(ctx_id, &b);
    auto it = functions_.find(key);
    if (it != functions_.end()) {
      *out = it->second;
      return {};
    }
    CUdevice dev = 0;
    KL_CHECK(d, d.cuCtxGetDevice(&dev), std::string("kernel ") + b.kernel + ": cuCtxGetDevice");
    int major = 0, minor = 0;
    KL_CHECK(d, d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
    KL_CHECK(d, d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
    const int cc = major * 10 + minor;
    const void* image = nullptr;
    if (b.cubin != nullptr && b.arch == cc) {
      image = b.cubin;
    } else if (b.ptx != nullptr && (b.arch_specific ? b.arch == cc : b.arch <= cc)) {
      image = b.ptx;  // JIT-compiled by the driver (PTX ISA clamped at build time if asked)
    } else {
      return std::string("kernel ") + b.kernel + ": compiled for sm_" + std::to_string(b.arch) +
             ", cannot run on this sm_" + std::to_string(cc) + " device; recompile with --arch sm_" +
             std::to_string(cc);
    }
    CUmodule module = nullptr;
    KL_CHECK(d, d.cuModuleLoadData(&module, image), std::string("kernel ") + b.kernel + ": cuModuleLoadData");
    CUfunction fn = nullptr;
    Status s = prepare(d, dev, module, b, &fn);
    if (!s.empty()) {
      d.cuModuleUnload(module);  // do not leak the module on a failed setup
      return s;
    }
    functions_[key] = fn;
    *out = fn;
    return {};
  }

 private:
  static Status prepare(const Driver& d, CUdevice dev, CUmodule module, const Binary& b, CUfunction* fn) {
    KL_CHECK(d, d.cuModuleGetFunction(fn, module, b.entry), std::string("kernel ") + b.kernel + ": cuModuleGetFunction");
    if (b.shared > 48 * 1024) {
      int optin = 0;
      KL_CHECK(d, d.cuDeviceGetAttribute(&optin, kAttrMaxSharedOptin, dev), "cuDeviceGetAttribute");
      if (static_cast<int>(b.shared) > optin)
        return std::string("kernel ") + b.kernel + ": needs " + std::to_string(b.shared) +
               " bytes of shared memory, the device allows " + std::to_string(optin);
      KL_CHECK(d, d.cuFuncSetAttribute(*fn, kFuncAttrMaxDynamicShared, static_cast<int>(b.shared)),
               std::string("kernel ") + b.kernel + ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
    return {};
  }

  std::mutex mutex_;
  std::map<std::pair<unsigned long long, const Binary*>, CUfunction> functions_;  // (context id, binary)
};

inline ModuleCache& module_cache() {
  static ModuleCache cache;
  return cache;
}

// ---- what a target provides to the generated launch code --------------------------------------
class LaunchContext {
 public:
  virtual ~LaunchContext() = default;
  virtual int64_t dim(int input, int d) const = 0;             // a node input's dimension
  virtual char* input(int i) const = 0;                        // a node input's device memory
  virtual Status output(int i, const std::vector<int64_t>& shape, char** data) = 0;
  virtual Status scratch(size_t bytes, void** data) = 0;       // temporary device memory
  virtual CUstream stream() const = 0;
  // A node input's rank, or -1 when the target does not know it (check_ranks then skips it).
  virtual int rank(int input) const { (void)input; return -1; }
  // The node's number of inputs, or -1 when unknown.
  virtual int input_count() const { return -1; }
};

// Thrown by a target's dim()/input() when generated code reads past what the node has; the
// target turns it into its error status (its message names the input and its actual rank).
class RankError : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

// Dimension `d` of input `input` from a table of input shapes, with a clear RankError (not
// vector::at's) when the input does not exist or has fewer dims than the model reads.
inline int64_t checked_dim(const std::vector<std::vector<int64_t>>& shapes, int input, int d) {
  if (input < 0 || static_cast<size_t>(input) >= shapes.size())
    throw RankError("input " + std::to_string(input) + " does not exist: the node has " +
                    std::to_string(shapes.size()) + " inputs");
  const std::vector<int64_t>& shape = shapes[static_cast<size_t>(input)];
  if (d < 0 || static_cast<size_t>(d) >= shape.size())
    throw RankError("input " + std::to_string(input) + " has rank " + std::to_string(shape.size()) +
                    ", but the model reads its dim " + std::to_string(d) +
                    " (the graph's input does not have the rank the model was compiled for)");
  return shape[static_cast<size_t>(d)];
}

// Input `i`'s data pointer from a table, with a clear RankError when the input does not exist.
inline char* checked_input(const std::vector<char*>& data, int i) {
  if (i < 0 || static_cast<size_t>(i) >= data.size())
    throw RankError("input " + std::to_string(i) + " does not exist: the node has " + std::to_string(data.size()) +
                    " inputs");
  return data[static_cast<size_t>(i)];
}

// Every input a launch reads has the rank the model was compiled for (inputs the context does
// not know the rank of are skipped). `expected[k]` is input k's rank.
inline Status check_ranks(const LaunchContext& ctx, int launch, const char* op, std::initializer_list<int> expected) {
  const std::string where = "kernel_lens launch " + std::to_string(launch) + " (" + op + "): ";
  const int n = ctx.input_count();
  if (n >= 0 && static_cast<size_t>(n) < expected.size())
    return where + "the node has " + std::to_string(n) + " inputs, the model was compiled for " +
           std::to_string(expected.size());
  int k = 0;
  for (int want : expected) {
    const int have = ctx.rank(k);
    if (have >= 0 && have != want)
      return where + "input " + std::to_string(k) + " has rank " + std::to_string(have) +
             ", the model was compiled for rank " + std::to_string(want);
    ++k;
  }
  return {};
}

// Makes the stream's context current for the guard's lifetime (and pops it afterwards).
// A guard that could not do so holds an error(): callers check it before any driver work.
// Guards nest: an inner guard finds the context already current and pushes nothing.
class ContextGuard {
 public:
  ContextGuard(const Driver& d, CUstream s) : d_(d) {
    const CUresult rs = d_.cuStreamGetCtx(s, &ctx_);
    if (rs != 0 || ctx_ == nullptr) {
      ctx_ = nullptr;
      const CUresult rc = d_.cuCtxGetCurrent(&ctx_);
      if (rc != 0 || ctx_ == nullptr) {
        ctx_ = nullptr;
        error_ = "no CUDA context to launch in: cuStreamGetCtx " +
                 (rs != 0 ? "failed with " + result_name(d_, rs) : std::string("returned no context")) +
                 " and cuCtxGetCurrent " +
                 (rc != 0 ? "failed with " + result_name(d_, rc) : std::string("found no current context")) +
                 "; the stream must belong to a CUDA context";
        return;
      }
    }
    CUcontext current = nullptr;
    if (d_.cuCtxGetCurrent(&current) != 0) current = nullptr;
    if (ctx_ != current) {
      const CUresult rp = d_.cuCtxPushCurrent(ctx_);
      if (rp != 0) {
        error_ = "cuCtxPushCurrent failed to make the stream's CUDA context current: " +
                 result_name(d_, rp);
        return;
      }
      pushed_ = true;
    }
  }
  ~ContextGuard() {
    if (pushed_) {
      CUcontext ignored = nullptr;
      d_.cuCtxPopCurrent(&ignored);
    }
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  // Empty when the stream's context is current; otherwise why it is not.
  const Status& error() const { return error_; }
  CUcontext context() const { return error_.empty() ? ctx_ : nullptr; }

 private:
  const Driver& d_;
  CUcontext ctx_ = nullptr;
  bool pushed_ = false;
  Status error_;
};

inline Status copy_device(const Driver& d, LaunchContext& ctx, char* dst, const char* src, size_t bytes) {
  if (bytes == 0 || dst == src) return {};
  ContextGuard guard(d, ctx.stream());
  if (!guard.error().empty()) return "kernel_lens: copying an in-place tensor: " + guard.error();
  KL_CHECK(d, d.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                                  bytes, ctx.stream()),
           "kernel_lens: copying an in-place tensor (cuMemcpyDtoDAsync)");
  return {};
}

// Encodes the TMA descriptor of a host tensor descriptor exactly as Triton's launcher does
// (triton/backends/nvidia/driver.c: fillTMADescriptor): dimensions innermost first, byte
// strides of every dimension but the innermost, unit element strides, no interleave, 128-byte
// L2 promotion, and NaN out-of-bounds fill for padding="nan".
inline Status encode_tma(const Driver& d, CUtensorMap* map, const char* kernel, const char* param,
                         int elem_type, int elem_size, int rank, const void* base, const int64_t* shape,
                         const int64_t* strides, std::initializer_list<int> block, int swizzle, bool nan,
                         bool fp4_padded) {
  const std::string where = std::string("kernel ") + kernel + ": tensor descriptor " + param;
  if (d.cuTensorMapEncodeTiled == nullptr)
    return where + ": the CUDA driver lacks cuTensorMapEncodeTiled (CUDA 12.0 or newer is required)";
  if (rank < 1 || rank > 5 || static_cast<int>(block.size()) != rank) return where + ": rank out of range";
  uint64_t dims[5] = {0, 0, 0, 0, 0}, byte_strides[5] = {0, 0, 0, 0, 0};
  unsigned box[5] = {0, 0, 0, 0, 0}, element_strides[5] = {1, 1, 1, 1, 1};
  int i = 0;
  for (int b : block) box[rank - i++ - 1] = static_cast<unsigned>(b);
  for (i = 0; i < rank; ++i) {
    int64_t extent = shape[i];
    if (fp4_padded && i == rank - 1) extent *= 2;
    if (extent < 0 || strides[i] < 0) return where + ": negative shape or stride";
    dims[rank - i - 1] = static_cast<uint64_t>(extent);
  }
  for (i = 0; i + 1 < rank; ++i) byte_strides[rank - i - 2] = static_cast<uint64_t>(elem_size) * static_cast<uint64_t>(strides[i]);
  if (strides[rank - 1] != 1)
    return where + ": its innermost stride is " + std::to_string(strides[rank - 1]) + ", TMA needs 1";
  const CUresult r = d.cuTensorMapEncodeTiled(map, elem_type, static_cast<unsigned>(rank), const_cast<void*>(base),
                                              dims, byte_strides, box, element_strides, /*interleave none*/ 0,
                                              swizzle, /*L2 promotion 128B*/ 2, nan ? 1 : 0);
  if (r != 0)
    return where + ": cuTensorMapEncodeTiled failed with " + result_name(d, r) +
           " (TMA needs a 16-byte aligned base and byte strides that are multiples of 16)";
  return {};
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// Scratch bytes for `programs` programs of `per_program` bytes each, false on size_t overflow.
inline bool scratch_bytes(size_t per_program, size_t programs, size_t* bytes) {
  return !__builtin_mul_overflow(per_program, programs, bytes);
}

// Launch one binary with Triton's ABI: `params` holds the visible arguments; the two hidden
// scratch pointers are appended here. A grid with a zero extent launches nothing, as in Triton.
inline Status launch(const Driver& d, LaunchContext& ctx, const Binary& b, int64_t gx, int64_t gy, int64_t gz,
                     std::vector<void*> params) {
  const std::string grid = "(" + std::to_string(gx) + ", " + std::to_string(gy) + ", " + std::to_string(gz) + ")";
  if (gx < 0 || gy < 0 || gz < 0) return std::string("kernel ") + b.kernel + ": negative grid " + grid;
  if (gx == 0 || gy == 0 || gz == 0) return {};
  if (b.num_ctas == 0) return std::string("kernel ") + b.kernel + ": binary has num_ctas = 0";
  int64_t blocks_x = 0;  // gx * num_ctas, the grid's x extent in blocks
  if (__builtin_mul_overflow(gx, static_cast<int64_t>(b.num_ctas), &blocks_x) || blocks_x > INT32_MAX ||
      gy > 65535 || gz > 65535)
    return std::string("kernel ") + b.kernel + ": grid " + grid + " with num_ctas " + std::to_string(b.num_ctas) +
           " exceeds CUDA's limits";
  size_t programs = 0;  // every block, each gets its own slice of the scratch buffers
  if (__builtin_mul_overflow(static_cast<size_t>(blocks_x), static_cast<size_t>(gy), &programs) ||
      __builtin_mul_overflow(programs, static_cast<size_t>(gz), &programs))
    return std::string("kernel ") + b.kernel + ": grid " + grid + ": the number of programs overflows size_t";
  size_t global_bytes = 0, profile_bytes = 0;
  if (!scratch_bytes(b.global_scratch_size, programs, &global_bytes))
    return std::string("kernel ") + b.kernel + ": global scratch of " + std::to_string(b.global_scratch_size) +
           " bytes per program for " + std::to_string(programs) + " programs (grid " + grid +
           ") overflows size_t";
  if (!scratch_bytes(b.profile_scratch_size, programs, &profile_bytes))
    return std::string("kernel ") + b.kernel + ": profile scratch of " + std::to_string(b.profile_scratch_size) +
           " bytes per program for " + std::to_string(programs) + " programs (grid " + grid +
           ") overflows size_t";
  ContextGuard guard(d, ctx.stream());
  if (!guard.error().empty()) return std::string("kernel ") + b.kernel + ": " + guard.error();
  CUfunction fn = nullptr;
  Status s = module_cache().function(d, guard.context(), b, &fn);
  if (!s.empty()) return s;
  void* global_scratch = nullptr;
  void* profile_scratch = nullptr;
  if (global_bytes > 0) {
    s = ctx.scratch(global_bytes, &global_scratch);
    if (!s.empty()) return s;
  }
  if (profile_bytes > 0) {
    s = ctx.scratch(profile_bytes, &profile_scratch);
    if (!s.empty()) return s;
  }
  params.push_back(&global_scratch);
  params.push_back(&profile_scratch);
  if (log_launches())
    std::fprintf(stderr, "kernel_lens: launch %s binary=%s arch=sm_%d grid=%s\n", b.kernel, b.variant, b.arch,
                 grid.c_str());
  if (!b.launch_pdl && !b.launch_cooperative_grid) {
    KL_CHECK(d, d.cuLaunchKernel(fn, static_cast<unsigned>(blocks_x), static_cast<unsigned>(gy),
                                 static_cast<unsigned>(gz), 32 * b.num_warps, 1, 1, b.shared, ctx.stream(),
                                 params.data(), nullptr),
             std::string("kernel ") + b.kernel + ": cuLaunchKernel");
    return {};
  }
  // As Triton's launcher does for the same options: cuLaunchKernelEx with one attribute each.
  CUlaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (b.launch_pdl) {
    attrs[n].id = kLaunchAttrProgrammaticSerialization;
    attrs[n++].value.flag = 1;
  }
  if (b.launch_cooperative_grid) {
    attrs[n].id = kLaunchAttrCooperative;
    attrs[n++].value.flag = 1;
  }
  CUlaunchConfig config = {static_cast<unsigned>(blocks_x), static_cast<unsigned>(gy), static_cast<unsigned>(gz),
                           32 * b.num_warps, 1, 1, b.shared, ctx.stream(), attrs, n};
  KL_CHECK(d, d.cuLaunchKernelEx(&config, fn, params.data(), nullptr),
           std::string("kernel ") + b.kernel + ": cuLaunchKernelEx");
  return {};
}

}  // namespace kl
