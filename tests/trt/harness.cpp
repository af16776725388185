// Drives kernel_lens TensorRT plugin libraries the way TensorRT does, without TensorRT or a GPU:
// dlopen, the exported creator table, plugin creation from fields (V3) or from a serialized
// blob (V2), output dtypes, output shapes through an evaluating IExprBuilder (eval_builder.h),
// format support, workspace size, serialization round trips and clone.
//
//   harness v3|v2 LIBRARY < cases
// A case line: plugin_name launch nb_in nb_out, then per input: dtype rank dims..., then per
// output: dtype. For each case it prints one line:
//   ok <launch> <workspace bytes> <output dims as rank d0 d1 ...>...
// or `error <message>`.
//
// With KERNEL_LENS_TEST_CUDA_DRIVER naming the fake driver (tests/fake_cuda/fake_cuda.c), each
// case is then also enqueued on host buffers (the fake's device memory), the way TensorRT calls
// it, and a second line follows:
//   enqueue <status 0|-1> <launches> <grid x y z of the last launch> <copies> <fnv of each input> / <fnv of each output>
// (inputs hold a byte pattern, outputs start zeroed: the fake runs no kernel, so an output
// equals an input exactly when the launch copied it there, as in-place kernels must).
//
// On a GPU host, with KERNEL_LENS_TRT_GPU_IO naming a folder, each case instead runs on the real
// CUDA driver (libcuda.so.1): case K's input I is read from K.inI (raw bytes) into a device
// buffer of exactly its size, outputs are device buffers of exactly their size filled with 0xA5
// (so bytes a kernel fails to write show), the workspace is allocated from getWorkspaceSize, the
// plugin is enqueued on a stream of its own, and output J is written to K.<kind>.outJ. The second
// line is then `gpu <status>`. Buffers are exact so that compute-sanitizer sees any overrun.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "NvInferRuntime.h"
#include "eval_builder.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // IPluginV2* (deprecated in TensorRT 10)

using namespace nvinfer1;

namespace {

struct Case {
  std::string name;
  int32_t launch = 0;
  std::vector<DataType> in_types, out_types;
  std::vector<Dims> in_dims;
};

bool read_case(std::istream& in, Case* c) {
  int nb_in = 0, nb_out = 0;
  if (!(in >> c->name >> c->launch >> nb_in >> nb_out)) return false;
  for (int i = 0; i < nb_in; ++i) {
    int t = 0;
    Dims d{};
    in >> t >> d.nbDims;
    for (int k = 0; k < d.nbDims; ++k) in >> d.d[k];
    c->in_types.push_back(static_cast<DataType>(t));
    c->in_dims.push_back(d);
  }
  for (int i = 0; i < nb_out; ++i) {
    int t = 0;
    in >> t;
    c->out_types.push_back(static_cast<DataType>(t));
  }
  return static_cast<bool>(in);
}

DataType other_type(DataType t) { return t == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT; }

// ---- enqueue through the fake driver -------------------------------------------------------------
struct Fake {
  void (*set_context)(void*, unsigned long long) = nullptr;
  int (*launch_count)() = nullptr;
  int (*launch_info)(int, unsigned*) = nullptr;
  int (*copy_count)() = nullptr;
};

Fake* fake() {
  static Fake f;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    const char* path = std::getenv("KERNEL_LENS_TEST_CUDA_DRIVER");
    void* lib = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (lib != nullptr) {
      f.set_context = reinterpret_cast<void (*)(void*, unsigned long long)>(dlsym(lib, "fake_set_context"));
      f.launch_count = reinterpret_cast<int (*)()>(dlsym(lib, "fake_launch_count"));
      f.launch_info = reinterpret_cast<int (*)(int, unsigned*)>(dlsym(lib, "fake_launch_info"));
      f.copy_count = reinterpret_cast<int (*)()>(dlsym(lib, "fake_copy_count"));
      static int context = 0;
      f.set_context(&context, 1);  // every stream's context
    }
  }
  return f.set_context != nullptr ? &f : nullptr;
}

size_t itemsize(DataType t) {
  switch (t) {
    case DataType::kFLOAT: case DataType::kINT32: return 4;
    case DataType::kHALF: case DataType::kBF16: return 2;
    case DataType::kINT64: return 8;
    default: return 1;
  }
}

size_t nbytes(const PluginTensorDesc& d) {
  size_t n = itemsize(d.type);
  for (int k = 0; k < d.dims.nbDims; ++k) n *= static_cast<size_t>(d.dims.d[k]);
  return n;
}

std::string fnv(const std::vector<unsigned char>& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return std::to_string(h);
}

// Calls `enqueue(in, out, inputs, outputs, workspace, stream)` on host buffers; the result line.
template <typename Enqueue>
std::string enqueue_line(const std::vector<PluginTensorDesc>& io, int nb_in, size_t workspace, Enqueue enqueue) {
  Fake* f = fake();
  std::vector<std::vector<unsigned char>> buffers;
  for (size_t i = 0; i < io.size(); ++i) {
    std::vector<unsigned char> b(nbytes(io[i]) + 16);
    if (static_cast<int>(i) < nb_in)
      for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<unsigned char>(k * 7 + 3 + i * 31);
    buffers.push_back(b);
  }
  std::vector<void const*> inputs;
  std::vector<void*> outputs;
  for (size_t i = 0; i < io.size(); ++i) {
    if (static_cast<int>(i) < nb_in) inputs.push_back(buffers[i].data());
    else outputs.push_back(buffers[i].data());
  }
  std::vector<unsigned char> ws(workspace + 1);
  static int stream_object = 0;
  const int before = f->launch_count(), copies = f->copy_count();
  const int32_t status = enqueue(io.data(), io.data() + nb_in, inputs.data(), outputs.data(), ws.data(),
                                 reinterpret_cast<cudaStream_t>(&stream_object));
  const int launches = f->launch_count() - before;
  unsigned info[7] = {0, 0, 0, 0, 0, 0, 0};
  if (launches > 0) f->launch_info(f->launch_count() - 1, info);
  std::string line = "enqueue " + std::to_string(status) + " " + std::to_string(launches) + " " +
                     std::to_string(info[0]) + " " + std::to_string(info[1]) + " " + std::to_string(info[2]) + " " +
                     std::to_string(f->copy_count() - copies);
  for (size_t i = 0; i < io.size(); ++i) {
    if (static_cast<int>(i) == nb_in) line += " /";
    std::vector<unsigned char> used(buffers[i].begin(), buffers[i].begin() + static_cast<long>(nbytes(io[i])));
    line += " " + fnv(used);
  }
  return line;
}

// ---- enqueue on a GPU through the real driver -------------------------------------------------
struct Gpu {
  std::string dir;
  int (*cuInit)(unsigned) = nullptr;
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDevicePrimaryCtxRetain)(void**, int) = nullptr;
  int (*cuCtxSetCurrent)(void*) = nullptr;
  int (*cuStreamCreate)(void**, unsigned) = nullptr;
  int (*cuStreamSynchronize)(void*) = nullptr;
  int (*cuMemAlloc)(unsigned long long*, size_t) = nullptr;
  int (*cuMemFree)(unsigned long long) = nullptr;
  int (*cuMemcpyHtoD)(unsigned long long, const void*, size_t) = nullptr;
  int (*cuMemcpyDtoH)(void*, unsigned long long, size_t) = nullptr;
  int (*cuMemsetD8)(unsigned long long, unsigned char, size_t) = nullptr;
  void* stream = nullptr;
};

template <typename F>
void load(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) {
    std::cerr << "libcuda.so.1 has no " << name << "\n";
    std::exit(2);
  }
}

void check(int status, const char* what) {
  if (status != 0) {
    std::cerr << what << " failed: CUDA error " << status << "\n";
    std::exit(2);
  }
}

Gpu* gpu() {
  static Gpu g;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    const char* dir = std::getenv("KERNEL_LENS_TRT_GPU_IO");
    if (dir == nullptr) return nullptr;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::cerr << "KERNEL_LENS_TRT_GPU_IO is set but libcuda.so.1 does not load: " << dlerror() << "\n";
      std::exit(2);
    }
    g.dir = dir;
    load(lib, "cuInit", &g.cuInit);
    load(lib, "cuDeviceGet", &g.cuDeviceGet);
    load(lib, "cuDevicePrimaryCtxRetain", &g.cuDevicePrimaryCtxRetain);
    load(lib, "cuCtxSetCurrent", &g.cuCtxSetCurrent);
    load(lib, "cuStreamCreate", &g.cuStreamCreate);
    load(lib, "cuStreamSynchronize", &g.cuStreamSynchronize);
    load(lib, "cuMemAlloc_v2", &g.cuMemAlloc);
    load(lib, "cuMemFree_v2", &g.cuMemFree);
    load(lib, "cuMemcpyHtoD_v2", &g.cuMemcpyHtoD);
    load(lib, "cuMemcpyDtoH_v2", &g.cuMemcpyDtoH);
    load(lib, "cuMemsetD8_v2", &g.cuMemsetD8);
    int device = 0;
    void* context = nullptr;
    check(g.cuInit(0), "cuInit");
    check(g.cuDeviceGet(&device, 0), "cuDeviceGet");
    check(g.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    check(g.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    check(g.cuStreamCreate(&g.stream, 1 /* CU_STREAM_NON_BLOCKING: not the legacy stream */), "cuStreamCreate");
  }
  return g.dir.empty() ? nullptr : &g;
}

int g_case = 0;  // the case being run (names its files)

// A device buffer of exactly `bytes` bytes (none for 0 bytes).
unsigned long long device_alloc(Gpu* g, size_t bytes) {
  unsigned long long p = 0;
  if (bytes > 0) check(g->cuMemAlloc(&p, bytes), "cuMemAlloc");
  return p;
}

// Runs `enqueue(in, out, inputs, outputs, workspace, stream)` on device buffers; the result line.
template <typename Enqueue>
std::string gpu_line(const std::vector<PluginTensorDesc>& io, int nb_in, size_t workspace, const std::string& kind,
                     Enqueue enqueue) {
  Gpu* g = gpu();
  std::vector<unsigned long long> buffers;
  for (size_t i = 0; i < io.size(); ++i) {
    const size_t n = nbytes(io[i]);
    buffers.push_back(device_alloc(g, n));
    if (static_cast<int>(i) < nb_in) {
      const std::string path = g->dir + "/" + std::to_string(g_case) + ".in" + std::to_string(i);
      std::FILE* f = std::fopen(path.c_str(), "rb");
      std::vector<unsigned char> data(n);
      if (f == nullptr || std::fread(data.data(), 1, n, f) != n) {
        std::cerr << "cannot read " << n << " bytes from " << path << "\n";
        std::exit(2);
      }
      std::fclose(f);
      if (n > 0) check(g->cuMemcpyHtoD(buffers.back(), data.data(), n), "cuMemcpyHtoD");
    } else if (n > 0) {
      check(g->cuMemsetD8(buffers.back(), 0xA5, n), "cuMemsetD8");
    }
  }
  const unsigned long long ws = device_alloc(g, workspace);
  std::vector<void const*> inputs;
  std::vector<void*> outputs;
  for (size_t i = 0; i < io.size(); ++i) {
    void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(buffers[i]));
    if (static_cast<int>(i) < nb_in) inputs.push_back(p);
    else outputs.push_back(p);
  }
  const int32_t status = enqueue(io.data(), io.data() + nb_in, inputs.data(), outputs.data(),
                                 reinterpret_cast<void*>(static_cast<uintptr_t>(ws)),
                                 static_cast<cudaStream_t>(g->stream));
  check(g->cuStreamSynchronize(g->stream), "cuStreamSynchronize");
  for (size_t i = static_cast<size_t>(nb_in); i < io.size(); ++i) {
    const size_t n = nbytes(io[i]);
    std::vector<unsigned char> data(n);
    if (n > 0) check(g->cuMemcpyDtoH(data.data(), buffers[i], n), "cuMemcpyDtoH");
    const std::string path = g->dir + "/" + std::to_string(g_case) + "." + kind + ".out" +
                             std::to_string(i - static_cast<size_t>(nb_in));
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(data.data(), 1, n, f) != n) {
      std::cerr << "cannot write " << path << "\n";
      std::exit(2);
    }
    std::fclose(f);
  }
  for (unsigned long long p : buffers)
    if (p != 0) check(g->cuMemFree(p), "cuMemFree");
  if (ws != 0) check(g->cuMemFree(ws), "cuMemFree");
  return "gpu " + std::to_string(status);
}

std::string dims_text(const std::vector<std::vector<int64_t>>& outs) {
  std::ostringstream s;
  for (const auto& o : outs) {
    s << " " << o.size();
    for (int64_t v : o) s << " " << v;
  }
  return s.str();
}

std::vector<DimsExprs> input_exprs(const Case& c, IExprBuilder& b) {
  std::vector<DimsExprs> exprs(c.in_dims.size());
  for (size_t i = 0; i < c.in_dims.size(); ++i) {
    exprs[i].nbDims = c.in_dims[i].nbDims;
    for (int k = 0; k < c.in_dims[i].nbDims; ++k) exprs[i].d[k] = b.constant(c.in_dims[i].d[k]);
  }
  return exprs;
}

// V3 ---------------------------------------------------------------------------------------------
struct V3 {
  IPluginV3* plugin;
  IPluginV3OneCore* core;
  IPluginV3OneBuild* build;
  IPluginV3OneRuntime* runtime;
};

bool unpack(IPluginV3* p, V3* out) {
  if (p == nullptr) return false;
  out->plugin = p;
  out->core = static_cast<IPluginV3OneCore*>(p->getCapabilityInterface(PluginCapabilityType::kCORE));
  out->build = static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
  out->runtime = static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
  return out->core && out->build && out->runtime;
}

std::string shapes_v3(V3& v, const Case& c, std::vector<std::vector<int64_t>>* outs) {
  kl_test::ExprBuilder b;
  std::vector<DimsExprs> in = input_exprs(c, b);
  const int32_t nb_out = v.build->getNbOutputs();
  std::vector<DimsExprs> out(static_cast<size_t>(nb_out));
  if (v.build->getOutputShapes(in.data(), static_cast<int32_t>(in.size()), nullptr, 0, out.data(), nb_out, b) != 0)
    return "getOutputShapes failed";
  outs->clear();
  for (const DimsExprs& e : out) {
    std::vector<int64_t> dims;
    for (int k = 0; k < e.nbDims; ++k) dims.push_back(e.d[k]->getConstantValue());
    outs->push_back(dims);
  }
  return {};
}

std::string run_v3(IPluginCreatorInterface* const* creators, int32_t n, const Case& c, std::string* line) {
  IPluginCreatorV3One* creator = nullptr;
  for (int32_t i = 0; i < n; ++i) {
    if (std::string(creators[i]->getInterfaceInfo().kind) != "PLUGIN CREATOR_V3ONE") return "creator is not V3One";
    auto* cr = static_cast<IPluginCreatorV3One*>(creators[i]);
    if (c.name == cr->getPluginName()) creator = cr;
  }
  if (creator == nullptr) return "no creator named " + c.name;
  if (std::string(creator->getPluginNamespace()) != "kernel_lens" || std::string(creator->getPluginVersion()) != "1")
    return "creator namespace/version";
  const int64_t launch64 = c.launch;  // as the ONNX parser may hand it: INT64
  PluginField f("launch", &launch64, PluginFieldType::kINT64, 1);
  PluginFieldCollection fc{1, &f};
  V3 v{};
  if (!unpack(creator->createPlugin(c.name.c_str(), &fc, TensorRTPhase::kBUILD), &v)) return "createPlugin failed";
  if (c.name != v.core->getPluginName()) return "plugin name";
  const int32_t nb_in = static_cast<int32_t>(c.in_types.size()), nb_out = v.build->getNbOutputs();
  if (nb_out != static_cast<int32_t>(c.out_types.size())) return "getNbOutputs";
  std::vector<DataType> types(static_cast<size_t>(nb_out));
  if (v.build->getOutputDataTypes(types.data(), nb_out, c.in_types.data(), nb_in) != 0) return "getOutputDataTypes";
  for (int32_t i = 0; i < nb_out; ++i)
    if (types[i] != c.out_types[i]) return "output dtype " + std::to_string(i);
  std::vector<DataType> wrong = c.in_types;
  wrong[0] = other_type(wrong[0]);
  if (v.build->getOutputDataTypes(types.data(), nb_out, wrong.data(), nb_in) == 0) return "accepted a wrong input dtype";
  std::vector<std::vector<int64_t>> outs;
  std::string e = shapes_v3(v, c, &outs);
  if (!e.empty()) return e;
  std::vector<DynamicPluginTensorDesc> io(static_cast<size_t>(nb_in + nb_out));
  for (int32_t i = 0; i < nb_in + nb_out; ++i) {
    PluginTensorDesc& d = io[static_cast<size_t>(i)].desc;
    d.format = TensorFormat::kLINEAR;
    d.type = i < nb_in ? c.in_types[i] : c.out_types[i - nb_in];
    if (i < nb_in) {
      d.dims = c.in_dims[i];
      io[static_cast<size_t>(i)].min = io[static_cast<size_t>(i)].max = io[static_cast<size_t>(i)].opt = c.in_dims[i];
    } else {
      d.dims.nbDims = static_cast<int32_t>(outs[i - nb_in].size());
      for (int k = 0; k < d.dims.nbDims; ++k) d.dims.d[k] = outs[i - nb_in][k];
      io[static_cast<size_t>(i)].min = io[static_cast<size_t>(i)].max = io[static_cast<size_t>(i)].opt = d.dims;
    }
  }
  for (int32_t pos = 0; pos < nb_in + nb_out; ++pos) {
    if (!v.build->supportsFormatCombination(pos, io.data(), nb_in, nb_out)) return "format refused at " + std::to_string(pos);
    DynamicPluginTensorDesc keep = io[static_cast<size_t>(pos)];
    io[static_cast<size_t>(pos)].desc.type = other_type(keep.desc.type);
    const bool wrong_ok = v.build->supportsFormatCombination(pos, io.data(), nb_in, nb_out);
    io[static_cast<size_t>(pos)].desc.format = TensorFormat::kHWC8;
    io[static_cast<size_t>(pos)].desc.type = keep.desc.type;
    const bool format_ok = v.build->supportsFormatCombination(pos, io.data(), nb_in, nb_out);
    io[static_cast<size_t>(pos)] = keep;
    if (wrong_ok || format_ok) return "format accepted a wrong dtype or layout at " + std::to_string(pos);
  }
  if (v.build->configurePlugin(io.data(), nb_in, io.data() + nb_in, nb_out) != 0) return "configurePlugin";
  const size_t ws = v.build->getWorkspaceSize(io.data(), nb_in, io.data() + nb_in, nb_out);
  std::vector<PluginTensorDesc> plain;
  for (auto& d : io) plain.push_back(d.desc);
  if (v.runtime->onShapeChange(plain.data(), nb_in, plain.data() + nb_in, nb_out) != 0) return "onShapeChange";
  // serialization: fields -> a new plugin (runtime phase) with the same behaviour
  const PluginFieldCollection* saved = v.runtime->getFieldsToSerialize();
  V3 again{};
  if (!unpack(creator->createPlugin(c.name.c_str(), saved, TensorRTPhase::kRUNTIME), &again)) return "recreate from fields";
  std::vector<std::vector<int64_t>> outs2;
  e = shapes_v3(again, c, &outs2);
  if (!e.empty() || outs2 != outs) return "fields round trip changed the plugin";
  // What TensorRT runs after deserializing an engine: the plugin made from the serialized fields,
  // attached to its execution context, told the shapes, then enqueued.
  V3 running{};
  if (!unpack(again.runtime->attachToContext(nullptr), &running)) return "attachToContext";
  if (running.runtime->onShapeChange(plain.data(), nb_in, plain.data() + nb_in, nb_out) != 0) return "onShapeChange";
  auto enqueue = [&](auto... a) { return running.runtime->enqueue(a...); };
  std::string enqueued;
  if (gpu() != nullptr) enqueued = "\n" + gpu_line(plain, nb_in, ws, "v3", enqueue);
  else if (fake() != nullptr) enqueued = "\n" + enqueue_line(plain, nb_in, ws, enqueue);
  delete running.plugin;
  V3 copy{};
  if (!unpack(v.plugin->clone(), &copy)) return "clone";
  delete v.plugin;  // clone is deep: the copy works after the original is gone
  e = shapes_v3(copy, c, &outs2);
  if (!e.empty() || outs2 != outs) return "clone differs";
  V3 attached{};
  if (!unpack(copy.runtime->attachToContext(nullptr), &attached)) return "attachToContext";
  delete copy.plugin;
  delete again.plugin;
  delete attached.plugin;
  *line = "ok " + std::to_string(c.launch) + " " + std::to_string(ws) + dims_text(outs) + enqueued;
  return {};
}

// V2 ---------------------------------------------------------------------------------------------
std::string shapes_v2(IPluginV2DynamicExt* p, const Case& c, std::vector<std::vector<int64_t>>* outs) {
  kl_test::ExprBuilder b;
  std::vector<DimsExprs> in = input_exprs(c, b);
  outs->clear();
  for (int32_t j = 0; j < p->getNbOutputs(); ++j) {
    DimsExprs e = p->getOutputDimensions(j, in.data(), static_cast<int32_t>(in.size()), b);
    std::vector<int64_t> dims;
    for (int k = 0; k < e.nbDims; ++k) {
      if (e.d[k] == nullptr) return "getOutputDimensions gave no expression";
      dims.push_back(e.d[k]->getConstantValue());
    }
    outs->push_back(dims);
  }
  return {};
}

std::string run_v2(IPluginCreator* const* creators, int32_t n, const Case& c, std::string* line) {
  IPluginCreator* creator = nullptr;
  for (int32_t i = 0; i < n; ++i)
    if (c.name == creators[i]->getPluginName()) creator = creators[i];
  if (creator == nullptr) return "no creator named " + c.name;
  const int32_t launch = c.launch;
  PluginField f("launch", &launch, PluginFieldType::kINT32, 1);
  PluginFieldCollection fc{1, &f};
  auto* p = static_cast<IPluginV2DynamicExt*>(creator->createPlugin(c.name.c_str(), &fc));
  if (p == nullptr) return "createPlugin failed";
  if (c.name != p->getPluginType() || std::string(p->getPluginNamespace()) != "kernel_lens") return "type/namespace";
  const int32_t nb_in = static_cast<int32_t>(c.in_types.size()), nb_out = p->getNbOutputs();
  if (nb_out != static_cast<int32_t>(c.out_types.size())) return "getNbOutputs";
  for (int32_t i = 0; i < nb_out; ++i)
    if (p->getOutputDataType(i, c.in_types.data(), nb_in) != c.out_types[i]) return "output dtype";
  std::vector<std::vector<int64_t>> outs;
  std::string e = shapes_v2(p, c, &outs);
  if (!e.empty()) return e;
  std::vector<PluginTensorDesc> io(static_cast<size_t>(nb_in + nb_out));
  for (int32_t i = 0; i < nb_in + nb_out; ++i) {
    PluginTensorDesc& d = io[static_cast<size_t>(i)];
    d.format = TensorFormat::kLINEAR;
    d.type = i < nb_in ? c.in_types[i] : c.out_types[i - nb_in];
    if (i < nb_in) {
      d.dims = c.in_dims[i];
    } else {
      d.dims.nbDims = static_cast<int32_t>(outs[i - nb_in].size());
      for (int k = 0; k < d.dims.nbDims; ++k) d.dims.d[k] = outs[i - nb_in][k];
    }
  }
  for (int32_t pos = 0; pos < nb_in + nb_out; ++pos) {
    if (!p->supportsFormatCombination(pos, io.data(), nb_in, nb_out)) return "format refused";
    PluginTensorDesc keep = io[static_cast<size_t>(pos)];
    io[static_cast<size_t>(pos)].type = other_type(keep.type);
    const bool wrong_ok = p->supportsFormatCombination(pos, io.data(), nb_in, nb_out);
    io[static_cast<size_t>(pos)] = keep;
    if (wrong_ok) return "format accepted a wrong dtype";
  }
  const size_t ws = p->getWorkspaceSize(io.data(), nb_in, io.data() + nb_in, nb_out);
  std::vector<char> blob(p->getSerializationSize());
  p->serialize(blob.data());
  auto* again = static_cast<IPluginV2DynamicExt*>(creator->deserializePlugin(c.name.c_str(), blob.data(), blob.size()));
  if (again == nullptr) return "deserializePlugin failed";
  std::vector<std::vector<int64_t>> outs2;
  e = shapes_v2(again, c, &outs2);
  if (!e.empty() || outs2 != outs) return "serialize round trip changed the plugin";
  if (creator->deserializePlugin(c.name.c_str(), blob.data(), blob.size() + 1) != nullptr) return "accepted a bad blob";
  IPluginV2DynamicExt* copy = p->clone();
  p->destroy();
  e = shapes_v2(copy, c, &outs2);
  if (copy == nullptr || !e.empty() || outs2 != outs) return "clone differs";
  *line = "ok " + std::to_string(c.launch) + " " + std::to_string(ws) + dims_text(outs);
  // What TensorRT runs after deserializing an engine: the deserialized plugin, configured, enqueued.
  std::vector<DynamicPluginTensorDesc> dyn(io.size());
  for (size_t i = 0; i < io.size(); ++i) dyn[i].desc = io[i], dyn[i].min = dyn[i].opt = dyn[i].max = io[i].dims;
  again->configurePlugin(dyn.data(), nb_in, dyn.data() + nb_in, nb_out);
  if (again->initialize() != 0) return "initialize";
  auto enqueue = [&](auto... a) { return again->enqueue(a...); };
  if (gpu() != nullptr) *line += "\n" + gpu_line(io, nb_in, ws, "v2", enqueue);
  else if (fake() != nullptr) *line += "\n" + enqueue_line(io, nb_in, ws, enqueue);
  again->terminate();
  copy->destroy();
  again->destroy();
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: harness v3|v2 LIBRARY < cases\n";
    return 2;
  }
  const std::string kind = argv[1];
  void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::cerr << dlerror() << "\n";
    return 2;
  }
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  using GetPluginCreators = IPluginCreator* const* (*)(int32_t&);
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  auto get_v2 = reinterpret_cast<GetPluginCreators>(dlsym(lib, "getPluginCreators"));
  if (get_creators == nullptr || dlsym(lib, "setLoggerFinder") == nullptr || (kind == "v2" && get_v2 == nullptr)) {
    std::cerr << "missing exports\n";
    return 2;
  }
  int32_t n = 0;
  IPluginCreatorInterface* const* creators = get_creators(n);
  std::cout << "creators " << n << "\n";
  Case c;
  while (read_case(std::cin, &c)) {
    std::string line;
    std::string error;
    if (kind == "v3") {
      error = run_v3(creators, n, c, &line);
    } else {
      int32_t n2 = 0;
      IPluginCreator* const* v2 = get_v2(n2);
      error = n2 != n ? "getPluginCreators and getCreators disagree" : run_v2(v2, n2, c, &line);
    }
    std::cout << (error.empty() ? line : "error " + error) << "\n";
    c = Case{};
    ++g_case;
  }
  return 0;
}
