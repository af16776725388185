// Drives kl_runtime.h (kl::launch, kl::ModuleCache, kl::ContextGuard, kl::copy_device, the
// rank checks) through the fake CUDA driver of fake_cuda.c. TEST ONLY.
//
// Usage: KERNEL_LENS_TEST_CUDA_DRIVER=/path/libfake_cuda.so harness <scenario>
// Prints `key=value` lines that tests/test_runtime_cpp.py asserts on; exits 2 on misuse.
// Built with -DKL_HARNESS_GENERATED and linked with a model's generated kl_launches.cpp, it
// also runs that model's kl::run_launch (the `gen_*` scenarios).
#include <dlfcn.h>
#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kl_runtime.h"
#ifdef KL_HARNESS_GENERATED
#include "kl_model.h"
#endif

namespace {

// ---- the fake driver's control functions, from the same library driver() loads ------------------
struct Fake {
  void (*fail)(const char*, int);
  void (*set_context)(void*, unsigned long long);
  void (*set_current)(void*);
  void* (*current)();
  int (*ctx_depth)();
  int (*push_count)();
  int (*pop_count)();
  void (*set_param_sizes)(const int*, int);
  int (*module_loads)();
  int (*module_unloads)();
  int (*live_modules)();
  int (*last_unloaded)();
  const unsigned char* (*module_image)(int);
  const void* (*module_image_ptr)(int);
  const char* (*last_function_name)();
  int (*func_attribute_value)();
  int (*launch_count)();
  int (*launch_info)(int, unsigned*);
  int (*launch_params)(int, unsigned char*, int);
  int (*launch_attrs)(int, int*, int);
  int (*copy_count)();
  void (*set_arch)(int, int, int);
};

template <typename F>
void sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) {
    std::fprintf(stderr, "harness: the fake driver lacks %s\n", name);
    std::exit(2);
  }
}

Fake load_fake() {
  const char* path = std::getenv(kl::kTestDriverEnv);
  void* lib = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (lib == nullptr) {
    std::fprintf(stderr, "harness: set %s to the fake driver\n", kl::kTestDriverEnv);
    std::exit(2);
  }
  Fake f{};
  sym(lib, "fake_fail", &f.fail);
  sym(lib, "fake_set_context", &f.set_context);
  sym(lib, "fake_set_current", &f.set_current);
  sym(lib, "fake_current", &f.current);
  sym(lib, "fake_ctx_depth", &f.ctx_depth);
  sym(lib, "fake_push_count", &f.push_count);
  sym(lib, "fake_pop_count", &f.pop_count);
  sym(lib, "fake_set_param_sizes", &f.set_param_sizes);
  sym(lib, "fake_module_loads", &f.module_loads);
  sym(lib, "fake_module_unloads", &f.module_unloads);
  sym(lib, "fake_live_modules", &f.live_modules);
  sym(lib, "fake_last_unloaded", &f.last_unloaded);
  sym(lib, "fake_module_image", &f.module_image);
  sym(lib, "fake_module_image_ptr", &f.module_image_ptr);
  sym(lib, "fake_last_function_name", &f.last_function_name);
  sym(lib, "fake_func_attribute_value", &f.func_attribute_value);
  sym(lib, "fake_launch_count", &f.launch_count);
  sym(lib, "fake_launch_info", &f.launch_info);
  sym(lib, "fake_launch_params", &f.launch_params);
  sym(lib, "fake_launch_attrs", &f.launch_attrs);
  sym(lib, "fake_copy_count", &f.copy_count);
  sym(lib, "fake_set_arch", &f.set_arch);
  return f;
}

// ---- a LaunchContext over host buffers (the fake's device memory is host memory) ---------------
// Node inputs from a table of shapes and data pointers (every context of this harness).
class TableContext : public kl::LaunchContext {
 public:
  std::vector<std::vector<int64_t>> shapes;
  std::vector<char*> data;

  int64_t dim(int input, int d) const override { return kl::checked_dim(shapes, input, d); }
  char* input(int i) const override { return kl::checked_input(data, i); }
  int rank(int input) const override {
    return input >= 0 && static_cast<size_t>(input) < shapes.size() ? static_cast<int>(shapes[input].size()) : -1;
  }
  int input_count() const override { return static_cast<int>(shapes.size()); }
  kl::CUstream stream() const override { return reinterpret_cast<kl::CUstream>(const_cast<int*>(&stream_)); }

 private:
  int stream_ = 0;
};

class HostContext final : public TableContext {
 public:
  std::vector<size_t> scratch_sizes;
  std::vector<void*> scratch_ptrs;
  std::vector<char*> outputs;

  kl::Status output(int i, const std::vector<int64_t>& shape, char** data) override {
    size_t numel = 1;
    for (int64_t s : shape) {
      if (s < 0 || s > (int64_t{1} << 24)) return "harness: output " + std::to_string(i) + " has a bad shape";
      numel *= static_cast<size_t>(s);
    }
    buffers_.emplace_back(numel * 8 + 1);  // 8: the widest element type
    *data = buffers_.back().data();
    outputs.push_back(*data);
    return {};
  }
  kl::Status scratch(size_t bytes, void** out) override {
    scratch_sizes.push_back(bytes);
    if (bytes > (size_t{1} << 20)) return "harness: refusing " + std::to_string(bytes) + " bytes of scratch";
    buffers_.emplace_back(bytes);
    *out = buffers_.back().data();
    scratch_ptrs.push_back(*out);
    return {};
  }

 private:
  std::vector<std::vector<char>> buffers_;
};

// ---- hand-written binaries ---------------------------------------------------------------------
const unsigned char kCubin[] = "KLCUBIN-sm90-fake-image";
const char kPtx[] = "//KLPTX fake\n.version 8.0\n.target sm_80\n.address_size 64\n";

constexpr kl::Binary binary(unsigned shared, size_t global_scratch, size_t profile_scratch, int arch = 90,
                            unsigned num_ctas = 1) {
  return kl::Binary{"add_kernel", arch, false, kCubin, sizeof(kCubin), kPtx, "add_kernel_entry", 4, num_ctas,
                    shared, global_scratch, 16, profile_scratch};
}

const kl::Binary kPlain = binary(1024, 64, 0);
const kl::Binary kBigShared = binary(100 * 1024, 0, 0);
const kl::Binary kTooMuchShared = binary(300 * 1024, 0, 0);
const kl::Binary kHugeGlobalScratch = binary(0, size_t{1} << 40, 0);
const kl::Binary kHugeProfileScratch = binary(0, 0, size_t{1} << 40);
const kl::Binary kFourCtas = binary(0, 0, 0, 90, 4);
const kl::Binary kSm80 = binary(0, 0, 0, 80);

constexpr kl::Binary launched_with(kl::Binary b, bool pdl, bool cooperative) {
  b.launch_pdl = pdl;
  b.launch_cooperative_grid = cooperative;
  return b;
}
const kl::Binary kPdl = launched_with(kPlain, true, false);
const kl::Binary kCooperative = launched_with(kPlain, false, true);
const kl::Binary kPdlCooperative = launched_with(kPlain, true, true);

int ctx_a_storage, ctx_b_storage;
void* const kCtxA = &ctx_a_storage;
void* const kCtxB = &ctx_b_storage;

void out(const char* key, const std::string& value) { std::printf("%s=%s\n", key, value.c_str()); }
void out(const char* key, long long value) { std::printf("%s=%lld\n", key, value); }

// The runtime's driver, or null after printing why as the status.
const kl::Driver* driver_or_status() {
  kl::Status err;
  const kl::Driver* d = kl::driver(&err);
  if (d == nullptr) out("status", err);
  return d;
}

std::string hex(const unsigned char* p, int n) {
  std::string s;
  char buf[3];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    s += buf;
  }
  return s;
}

std::string ptr_hex(const void* p) {  // the pointer's bytes as the kernel receives them
  return hex(reinterpret_cast<const unsigned char*>(&p), sizeof p);
}

// How launch i was made: "cuLaunchKernel", or "cuLaunchKernelEx" and each attribute as ":id=value".
std::string attrs_of(const Fake& f, int i) {
  int pairs[16] = {};
  const int n = f.launch_attrs(i, pairs, 16);
  if (n == -1) return "cuLaunchKernel";
  if (n < 0) return "none";
  std::string s = "cuLaunchKernelEx";
  for (int k = 0; k < n && k < 8; ++k) s += ":" + std::to_string(pairs[2 * k]) + "=" + std::to_string(pairs[2 * k + 1]);
  return s;
}

void counts(const Fake& f) {
  out("loads", f.module_loads());
  out("unloads", f.module_unloads());
  out("live_modules", f.live_modules());
  out("launches", f.launch_count());
  out("pushes", f.push_count());
  out("pops", f.pop_count());
  out("depth", f.ctx_depth());
}

kl::Status launch_plain(const kl::Driver& d, HostContext& ctx, const kl::Binary& b, int64_t gx = 1) {
  void* x = ctx.input(0);
  int32_t n = 1234;
  return kl::launch(d, ctx, b, gx, 1, 1, {&x, &n});
}

int run(const std::string& scenario) {
  if (scenario == "driver_only") {  // only loads the driver: the test sets the environment
    if (driver_or_status() != nullptr) out("status", std::string("ok"));
    return 0;
  }
  Fake f = load_fake();
  const kl::Driver* dp = driver_or_status();
  if (dp == nullptr) return 0;
  const kl::Driver& d = *dp;
  std::vector<char> x(256, 7);
  HostContext ctx;
  ctx.shapes = {{64}};
  ctx.data = {x.data()};
  f.set_context(kCtxA, 1);
  f.set_current(kCtxA);

  if (scenario == "cache") {
    kl::Status s1 = launch_plain(d, ctx, kPlain);
    kl::Status s2 = launch_plain(d, ctx, kPlain);
    out("loads_same_id", f.module_loads());
    f.set_context(kCtxA, 2);  // destroyed and recreated at the same address: a new id
    kl::Status s3 = launch_plain(d, ctx, kPlain);
    out("loads_new_id", f.module_loads());
    kl::Status s4 = launch_plain(d, ctx, kPlain);
    out("loads_new_id_again", f.module_loads());
    out("status", s1 + s2 + s3 + s4);
    f.fail("cuCtxGetId", 201);
    out("id_fail_status", launch_plain(d, ctx, kPlain));
  } else if (scenario == "push_pop") {
    f.set_context(kCtxB, 7);
    f.set_current(kCtxA);  // the stream's context B is not current: pushed, then popped
    out("status", launch_plain(d, ctx, kPlain));
    out("current_is_a", f.current() == kCtxA);
  } else if (scenario == "push_fail") {
    f.set_context(kCtxB, 7);
    f.set_current(kCtxA);
    f.fail("cuCtxPushCurrent_v2", 201);
    {
      kl::ContextGuard outer(d, ctx.stream());  // as run_launch does, without checking it
      out("guard_error", outer.error());
      out("status", launch_plain(d, ctx, kPlain));
      std::vector<char> y(256, 0);
      out("copy_status", kl::copy_device(d, ctx, y.data(), x.data(), y.size()));
      out("copies", f.copy_count());
      out("copied", y[0]);
    }
    out("scratch_calls", static_cast<long long>(ctx.scratch_sizes.size()));
  } else if (scenario == "no_context") {
    f.set_context(nullptr, 0);
    f.set_current(nullptr);
    out("status", launch_plain(d, ctx, kPlain));
  } else if (scenario == "overflow") {
    out("global_status", launch_plain(d, ctx, kHugeGlobalScratch, int64_t{1} << 24));
    out("profile_status", launch_plain(d, ctx, kHugeProfileScratch, int64_t{1} << 24));
    out("ctas_status", launch_plain(d, ctx, kFourCtas, INT64_MAX / 2));
    out("grid_status", launch_plain(d, ctx, kFourCtas, int64_t{1} << 30));
    out("scratch_calls", static_cast<long long>(ctx.scratch_sizes.size()));
    // Below the limits the same binaries launch: the checks are not blanket refusals.
    out("small_status", launch_plain(d, ctx, kHugeGlobalScratch, 2));
    out("small_scratch", ctx.scratch_sizes.empty() ? 0 : static_cast<long long>(ctx.scratch_sizes.back()));
  } else if (scenario == "rank") {
    ctx.shapes = {{4, 8}, {16}};
    ctx.data = {x.data(), x.data()};
    out("ok_status", kl::check_ranks(ctx, 3, "add_kernel", {2, 1}));
    out("rank_status", kl::check_ranks(ctx, 3, "add_kernel", {2, 2}));
    out("count_status", kl::check_ranks(ctx, 3, "add_kernel", {2, 1, 1}));
    try {
      out("dim", ctx.dim(1, 1));
    } catch (const kl::RankError& e) {
      out("dim_error", e.what());
    }
    try {
      out("dim", ctx.dim(2, 0));
    } catch (const kl::RankError& e) {
      out("dim_input_error", e.what());
    }
    try {
      out("input", ctx.input(5) != nullptr);
    } catch (const kl::RankError& e) {
      out("input_error", e.what());
    }
    out("dim_ok", ctx.dim(0, 1));
  } else if (scenario == "get_function_fail") {
    f.fail("cuModuleGetFunction", 500);
    out("status", launch_plain(d, ctx, kPlain));
    out("last_unloaded", f.last_unloaded());
  } else if (scenario == "shared") {
    out("too_much_status", launch_plain(d, ctx, kTooMuchShared));
    out("too_much_unloads", f.module_unloads());
    out("big_status", launch_plain(d, ctx, kBigShared));
    out("func_attribute", f.func_attribute_value());
  } else if (scenario == "normal") {
    const int sizes[] = {8, 4, 8, 8};  // x, n, then the hidden global and profile scratch pointers
    f.set_param_sizes(sizes, 4);
    void* xp = x.data();
    int32_t n = 1234;
    out("status", kl::launch(d, ctx, kPlain, 3, 2, 1, {&xp, &n}));
    unsigned info[7] = {};
    out("launch_module", f.launch_info(0, info));
    out("grid", std::to_string(info[0]) + "," + std::to_string(info[1]) + "," + std::to_string(info[2]));
    out("block", std::to_string(info[3]) + "," + std::to_string(info[4]) + "," + std::to_string(info[5]));
    out("shared", info[6]);
    unsigned char params[64];
    int nbytes = f.launch_params(0, params, sizeof params);
    out("params", hex(params, nbytes));
    out("x_ptr", ptr_hex(xp));
    out("scratch_sizes", ctx.scratch_sizes.size() == 1 ? static_cast<long long>(ctx.scratch_sizes[0]) : -1);
    out("scratch_ptr", ptr_hex(ctx.scratch_ptrs.empty() ? nullptr : ctx.scratch_ptrs[0]));
    out("image", std::string(reinterpret_cast<const char*>(f.module_image(0)), 16));
    out("image_is_cubin", f.module_image_ptr(0) == static_cast<const void*>(kCubin));
    out("function", f.last_function_name());
    out("attrs", attrs_of(f, 0));
    out("zero_grid_status", kl::launch(d, ctx, kPlain, 0, 2, 1, {&xp, &n}));
    out("negative_grid_status", kl::launch(d, ctx, kPlain, -1, 2, 1, {&xp, &n}));
  } else if (scenario == "launch_attrs") {  // Triton's launch_pdl / launch_cooperative_grid
    const int sizes[] = {8, 4, 8, 8};
    f.set_param_sizes(sizes, 4);
    void* xp = x.data();
    int32_t n = 1234;
    const kl::Binary* binaries[] = {&kPlain, &kPdl, &kCooperative, &kPdlCooperative};
    const char* names[] = {"plain", "pdl", "cooperative", "both"};
    for (int i = 0; i < 4; ++i) {
      out((std::string(names[i]) + "_status").c_str(), kl::launch(d, ctx, *binaries[i], 3, 2, 1, {&xp, &n}));
      out((std::string(names[i]) + "_attrs").c_str(), attrs_of(f, i));
      unsigned info[7] = {};
      f.launch_info(i, info);
      out((std::string(names[i]) + "_launch").c_str(),
          std::to_string(info[0]) + "," + std::to_string(info[1]) + "," + std::to_string(info[2]) + "/" +
              std::to_string(info[3]) + "," + std::to_string(info[4]) + "," + std::to_string(info[5]) + "/" +
              std::to_string(info[6]));
      unsigned char params[64];
      out((std::string(names[i]) + "_params").c_str(), hex(params, f.launch_params(i, params, sizeof params)));
    }
    out("zero_grid_status", kl::launch(d, ctx, kPdl, 0, 2, 1, {&xp, &n}));
    f.fail("cuLaunchKernelEx", 719);
    out("failed_status", kl::launch(d, ctx, kPdl, 3, 2, 1, {&xp, &n}));
  } else if (scenario == "ptx_fallback") {
    out("status", launch_plain(d, ctx, kSm80));
    out("image_is_ptx", f.module_image_ptr(0) == static_cast<const void*>(kPtx));
  } else if (scenario == "copy") {
    std::vector<char> y(256, 0);
    out("status", kl::copy_device(d, ctx, y.data(), x.data(), y.size()));
    out("copied", y[255]);
#ifdef KL_HARNESS_GENERATED
  } else if (scenario.rfind("gen_", 0) == 0) {  // launch 0 of the generated model, inputs x, y
    std::vector<char> y(8192, 1), big_x(8192, 2);
    ctx.shapes = {{1000}, {1000}};
    ctx.data = {big_x.data(), y.data()};
    if (scenario == "gen_push_fail") {
      f.set_context(kCtxB, 7);
      f.fail("cuCtxPushCurrent_v2", 201);
    } else if (scenario == "gen_rank") {
      ctx.shapes = {{}, {1000}};  // x is a scalar: the model reads its dim 0
    } else if (scenario != "gen_ok") {
      std::fprintf(stderr, "harness: unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    const int sizes[] = {8, 8, 8};  // x_ptr, y_ptr, out_ptr
    f.set_param_sizes(sizes, 3);
    out("launch_count", kl::launch_count());
    try {
      out("status", kl::run_launch(0, ctx));
    } catch (const std::exception& e) {
      out("exception", e.what());
    }
    unsigned info[7] = {};
    if (f.launch_info(0, info) >= 0) {
      out("grid", std::to_string(info[0]) + "," + std::to_string(info[1]) + "," + std::to_string(info[2]));
      unsigned char params[64];
      out("params", hex(params, f.launch_params(0, params, sizeof params)));
      out("expected_params", ptr_hex(big_x.data()) + ptr_hex(y.data()) +
                                 ptr_hex(ctx.outputs.empty() ? nullptr : ctx.outputs[0]));
    }
#endif
  } else {
    std::fprintf(stderr, "harness: unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  counts(f);
  return 0;
}

#ifdef KL_HARNESS_GENERATED
// ---- `spec FILE`: one launch of the generated model with any input shapes -------------------------
// FILE lines: `launch K`, `arch MAJOR MINOR`, `param_sizes N s1 .. sN` (the ABI the test expects),
// `input ELEM_SIZE OFFSET RANK d0 .. d{RANK-1}` per node input. Buffers are reserved, not touched
// (mmap MAP_NORESERVE), so element counts past 2^31 cost nothing unless the launch copies them;
// an input's data pointer is the buffer's start + OFFSET bytes.
void* reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "harness: cannot reserve %zu bytes\n", bytes);
    std::exit(2);
  }
  return p;
}

class SpecContext final : public TableContext {
 public:
  std::vector<std::vector<int64_t>> output_shapes;
  std::vector<char*> outputs;
  kl::Status output(int, const std::vector<int64_t>& shape, char** out) override {
    size_t numel = 1;
    for (int64_t s : shape) {
      if (s < 0) return "harness: negative output dim";
      numel *= static_cast<size_t>(s);
    }
    *out = static_cast<char*>(reserve(numel * 8));
    output_shapes.push_back(shape);
    outputs.push_back(*out);
    return {};
  }
  kl::Status scratch(size_t bytes, void** out) override {
    *out = reserve(bytes);
    return {};
  }
};

uint64_t fnv1a(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The loaded image's identity: FNV-1a of a NUL-terminated PTX text, or of an ELF cubin up to the
// end of its section headers (e_shoff + e_shnum * e_shentsize), as the test computes it.
std::string image_id(const unsigned char* image) {
  if (image == nullptr) return "none";
  uint64_t h;
  if (std::memcmp(image, "\x7f" "ELF", 4) == 0) {
    uint64_t shoff;
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, image + 0x28, 8);
    std::memcpy(&shentsize, image + 0x3A, 2);
    std::memcpy(&shnum, image + 0x3C, 2);
    h = fnv1a(image, shoff + static_cast<uint64_t>(shnum) * shentsize);
  } else {
    h = fnv1a(image, std::strlen(reinterpret_cast<const char*>(image)));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

int run_spec(const char* path) {
  Fake f = load_fake();
  const kl::Driver* dp = driver_or_status();
  if (dp == nullptr) return 0;
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) {
    std::fprintf(stderr, "harness: cannot open %s\n", path);
    return 2;
  }
  SpecContext ctx;
  int launch = 0;
  std::vector<int> sizes;
  char word[32];
  while (std::fscanf(file, "%31s", word) == 1) {
    std::string w = word;
    if (w == "launch") {
      if (std::fscanf(file, "%d", &launch) != 1) return 2;
    } else if (w == "arch") {
      int major, minor;
      if (std::fscanf(file, "%d %d", &major, &minor) != 2) return 2;
      f.set_arch(major, minor, 227 * 1024);
    } else if (w == "param_sizes") {
      int n;
      if (std::fscanf(file, "%d", &n) != 1) return 2;
      sizes.resize(static_cast<size_t>(n));
      for (int& v : sizes)
        if (std::fscanf(file, "%d", &v) != 1) return 2;
    } else if (w == "input") {
      long long elem, offset;
      int rank;
      if (std::fscanf(file, "%lld %lld %d", &elem, &offset, &rank) != 3) return 2;
      std::vector<int64_t> shape(static_cast<size_t>(rank));
      size_t numel = 1;
      for (int64_t& v : shape) {
        long long d;
        if (std::fscanf(file, "%lld", &d) != 1) return 2;
        v = d;
        numel *= static_cast<size_t>(d < 0 ? 0 : d);
      }
      ctx.shapes.push_back(shape);
      ctx.data.push_back(static_cast<char*>(reserve(numel * static_cast<size_t>(elem) + 64)) + offset);
    } else {
      std::fprintf(stderr, "harness: bad spec word %s\n", word);
      return 2;
    }
  }
  std::fclose(file);
  f.set_context(kCtxA, 1);
  f.set_current(kCtxA);
  f.set_param_sizes(sizes.data(), static_cast<int>(sizes.size()));
  try {
    out("status", kl::run_launch(launch, ctx));
  } catch (const std::exception& e) {
    out("exception", e.what());
  }
  unsigned info[7] = {};
  if (f.launch_info(0, info) >= 0) {
    out("grid", std::to_string(info[0]) + "," + std::to_string(info[1]) + "," + std::to_string(info[2]));
    out("block", info[3]);
    out("shared", info[6]);
    out("attrs", attrs_of(f, 0));
    std::vector<unsigned char> params(4096);
    out("params", hex(params.data(), f.launch_params(0, params.data(), static_cast<int>(params.size()))));
  }
  out("image", image_id(f.module_loads() > 0
                            ? static_cast<const unsigned char*>(f.module_image_ptr(f.module_loads() - 1))
                            : nullptr));
  std::string ins, outs;
  for (char* p : ctx.data) ins += ptr_hex(p) + ",";
  for (char* p : ctx.outputs) outs += ptr_hex(p) + ",";
  out("inputs", ins);
  out("outputs", outs);
  counts(f);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
#ifdef KL_HARNESS_GENERATED
  if (argc == 3 && std::string(argv[1]) == "spec") return run_spec(argv[2]);
#endif
  if (argc != 2) {
    std::fprintf(stderr, "usage: harness <scenario> | harness spec FILE\n");
    return 2;
  }
  return run(argv[1]);
}
