// kernel_lens: what both TensorRT plugin kinds (IPluginV3, IPluginV2DynamicExt) share. The
// launch code itself is the targets' common kl_launches.cpp; this header adapts TensorRT's
// tensor descriptors, workspace and stream to kl::LaunchContext, and declares the per-model
// facts printed from the launch plan (kl_trt_plan.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "NvInfer.h"
#include "kl_model.h"

namespace kl_trt {

constexpr const char* kNamespace = "kernel_lens";
constexpr const char* kVersion = "1";

struct LaunchInfo {
  const char* kernel;               // the kernel id (the ONNX node's kernel)
  int nb_inputs, nb_outputs;
  const nvinfer1::DataType* input_types;
  const nvinfer1::DataType* output_types;
  const int* output_ranks;
};

int launch_count();
// The launch's node facts, or nullptr for an index outside the model.
const LaunchInfo* launch_info(int launch);
// Dim `d` of output `out` as a TensorRT dimension expression over the inputs' dims.
nvinfer1::IDimensionExpr const* output_dim(int launch, int out, int d, nvinfer1::DimsExprs const* inputs,
                                           nvinfer1::IExprBuilder& exprBuilder);
// The scratch bytes the launch needs at these input dims (an upper bound for larger grids is
// the caller's business: TensorRT asks at the profile's max dims). False (and `error`) when a
// dim is missing or the size does not fit.
bool workspace(int launch, const nvinfer1::Dims* dims, int nb_inputs, size_t* bytes, std::string* error);

// kl::LaunchContext over a plugin's enqueue arguments: TensorRT allocated the outputs (their
// shapes must be the ones the launch computes), scratch comes from the workspace.
class Context final : public kl::LaunchContext {
 public:
  Context(nvinfer1::PluginTensorDesc const* in, int nb_in, nvinfer1::PluginTensorDesc const* out, int nb_out,
          void const* const* inputs, void* const* outputs, void* workspace, size_t workspace_size,
          cudaStream_t stream)
      : in_(in), out_(out), nb_in_(nb_in), nb_out_(nb_out), inputs_(inputs), outputs_(outputs),
        workspace_(static_cast<char*>(workspace)), workspace_size_(workspace_size), stream_(stream) {}

  int64_t dim(int input, int d) const override {
    if (input < 0 || input >= nb_in_)
      throw kl::RankError("input " + std::to_string(input) + " does not exist: the node has " +
                          std::to_string(nb_in_) + " inputs");
    if (d < 0 || d >= in_[input].dims.nbDims)
      throw kl::RankError("input " + std::to_string(input) + " has rank " + std::to_string(in_[input].dims.nbDims) +
                          ", but the model reads its dim " + std::to_string(d));
    return in_[input].dims.d[d];
  }
  char* input(int i) const override {
    if (i < 0 || i >= nb_in_) throw kl::RankError("input " + std::to_string(i) + " does not exist");
    return static_cast<char*>(const_cast<void*>(inputs_[i]));
  }
  int rank(int input) const override { return input >= 0 && input < nb_in_ ? in_[input].dims.nbDims : -1; }
  int input_count() const override { return nb_in_; }
  kl::Status output(int i, const std::vector<int64_t>& shape, char** data) override {
    if (i < 0 || i >= nb_out_) return "output " + std::to_string(i) + " does not exist";
    const nvinfer1::Dims& dims = out_[i].dims;
    bool same = dims.nbDims == static_cast<int32_t>(shape.size());
    for (int32_t k = 0; same && k < dims.nbDims; ++k) same = dims.d[k] == shape[static_cast<size_t>(k)];
    if (!same) return "output " + std::to_string(i) + ": TensorRT allocated a shape other than the one the launch computes";
    *data = static_cast<char*>(outputs_[i]);
    return {};
  }
  kl::Status scratch(size_t bytes, void** data) override {
    const size_t start = (used_ + 255) / 256 * 256;
    if (start > workspace_size_ || bytes > workspace_size_ - start)
      return "scratch of " + std::to_string(bytes) + " bytes does not fit the plugin workspace (" +
             std::to_string(workspace_size_) + " bytes)";
    *data = workspace_ + start;
    used_ = start + bytes;
    return {};
  }
  kl::CUstream stream() const override { return reinterpret_cast<kl::CUstream>(stream_); }

 private:
  nvinfer1::PluginTensorDesc const* in_;
  nvinfer1::PluginTensorDesc const* out_;
  int nb_in_, nb_out_;
  void const* const* inputs_;
  void* const* outputs_;
  char* workspace_;
  size_t workspace_size_;
  size_t used_ = 0;
  cudaStream_t stream_;
};

// Runs the launch; errors come back as text (empty: success).
inline std::string enqueue(int launch, nvinfer1::PluginTensorDesc const* in, int nb_in,
                           nvinfer1::PluginTensorDesc const* out, int nb_out, void const* const* inputs,
                           void* const* outputs, void* workspace, size_t workspace_size, cudaStream_t stream) {
  try {
    Context ctx(in, nb_in, out, nb_out, inputs, outputs, workspace, workspace_size, stream);
    return kl::run_launch(launch, ctx);
  } catch (const std::exception& e) {
    return std::string("kernel_lens launch ") + std::to_string(launch) + ": " + e.what();
  }
}

// The launch index a plugin was created with: field "launch", INT32 or INT64 (the ONNX parser
// turns the node's INT attribute into one of them). -1 when absent or malformed.
inline int launch_field(nvinfer1::PluginFieldCollection const* fc) {
  if (fc == nullptr) return -1;
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    const nvinfer1::PluginField& f = fc->fields[i];
    if (f.name == nullptr || std::strcmp(f.name, "launch") != 0 || f.data == nullptr || f.length != 1) continue;
    if (f.type == nvinfer1::PluginFieldType::kINT32) return *static_cast<const int32_t*>(f.data);
    if (f.type == nvinfer1::PluginFieldType::kINT64) {
      const int64_t v = *static_cast<const int64_t*>(f.data);
      return v >= 0 && v < launch_count() ? static_cast<int>(v) : -1;
    }
  }
  return -1;
}

// The logger TensorRT hands over through setLoggerFinder (may stay null: every use checks).
nvinfer1::ILogger* logger();
inline void log_error(const std::string& message) {
  if (nvinfer1::ILogger* l = logger()) l->log(nvinfer1::ILogger::Severity::kERROR, message.c_str());
}

// The workspace bytes of `launch` at these input dims, 0 (logged) when they cannot be computed.
inline size_t workspace_bytes(const char* plugin, int launch, const std::vector<nvinfer1::Dims>& dims) {
  size_t bytes = 0;
  std::string error;
  if (!workspace(launch, dims.data(), static_cast<int>(dims.size()), &bytes, &error)) {
    log_error(std::string(plugin) + ": workspace: " + error);
    return 0;
  }
  return bytes;
}

// A plugin's enqueue, shared by both plugin kinds: 0 on success, -1 (logged) on error.
inline int32_t enqueue_plugin(const char* plugin, int launch, nvinfer1::PluginTensorDesc const* inputDesc,
                              nvinfer1::PluginTensorDesc const* outputDesc, void const* const* inputs,
                              void* const* outputs, void* workspace_ptr, cudaStream_t stream) {
  const LaunchInfo* info = launch_info(launch);
  if (info == nullptr) return -1;
  std::vector<nvinfer1::Dims> dims;
  for (int i = 0; i < info->nb_inputs; ++i) dims.push_back(inputDesc[i].dims);
  size_t bytes = 0;
  std::string error;
  if (!workspace(launch, dims.data(), info->nb_inputs, &bytes, &error)) error = "workspace: " + error;
  if (error.empty())
    error = enqueue(launch, inputDesc, info->nb_inputs, outputDesc, info->nb_outputs, inputs, outputs, workspace_ptr,
                    bytes, stream);
  if (error.empty()) return 0;
  log_error(std::string(plugin) + ": " + error);
  return -1;
}

}  // namespace kl_trt
