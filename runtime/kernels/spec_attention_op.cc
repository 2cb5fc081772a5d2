// The onnxruntime custom-op library, domain ai.specrt, version 1: SpecAttention (a decoder layer's
// attention, below) and SwiGLU (an MLP's silu(gate) * up on the packed [gate | up] rows).
//
//   query [1, s, heads*d] ──┐       (or packed [1, s, (heads + 2 kv)*d] with key and value absent)
//   key   [1, s, kv*d]   ───┼─ rotary(cos, sin) ──► present_key   [1, s, kv, d]  (the window's keys)
//   value [1, s, kv*d]   ───┼──────────────────────► present_value [1, s, kv, d]
//   past_key, past_value [1, past, kv, d] ─┐
//   cos, sin [1, s, d] ────────────────────┼─► per query row and head: scores over the visible keys
//   bias [1, 1, s, past + s] ──────────────┘   of past + window, softmax, sum of values
//                                                      ──► output [1, s, heads*d]
//
// The keys and values are read where they lie: the past from the cache the runtime binds as the
// input, the window's from this operator's own outputs, which the runtime binds to the cache slots
// behind the past. Nothing is concatenated or copied per pass.
//
// Work is split over onnxruntime's intra-op threads by (row, key/value head, group of query heads);
// a task's heads are computed by the same code whatever the split (attention_impl.inc), so the
// thread count never changes a bit. The instruction set is the best this CPU has (AVX-512, AVX2 +
// FMA, else portable scalar code), or the one named by SPECRT_KERNEL_ISA (scalar, avx2, avx512); all
// three give the same bits (canonical.h).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention.h"

namespace specrt {

void rotate_half(const float* x, const float* cos, const float* sin, int64_t d, float* y) {
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) {
    const float a = x[c] * cos[c], b = x[c + half] * sin[c];
    y[c] = a - b;
  }
  for (int64_t c = half; c < d; ++c) {
    const float a = x[c] * cos[c], b = x[c - half] * sin[c];
    y[c] = a + b;
  }
}

namespace {

const OrtApi* g_api = nullptr;  // set once by RegisterCustomOps; onnxruntime's C API table

constexpr const char* kDomain = "ai.specrt";
constexpr const char* kOpName = "SpecAttention";
constexpr int64_t kMaxHeadDim = 1024;

struct Isa {
  const char* name;
  AttendFn attend;
  SwiGLUFn swiglu;
};

bool cpu_has(const char* isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (std::strcmp(isa, "avx512") == 0) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  if (std::strcmp(isa, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return std::strcmp(isa, "scalar") == 0;
}

const Isa kIsas[] = {
#if defined(__x86_64__) || defined(__i386__)
    {"avx512", avx512::attend, avx512::swiglu},
    {"avx2", avx2::attend, avx2::swiglu},
#endif
    {"scalar", scalar::attend, scalar::swiglu},
};

// The instruction set to run: SPECRT_KERNEL_ISA if set (an error if unknown or missing here), else the best.
std::string choose_isa(const Isa** chosen) {
  const char* wanted = std::getenv("SPECRT_KERNEL_ISA");
  for (const Isa& isa : kIsas) {
    if (wanted && *wanted && std::strcmp(wanted, isa.name) != 0) continue;
    if (!cpu_has(isa.name)) {
      if (wanted && *wanted) return std::string("SPECRT_KERNEL_ISA=") + wanted + ": this CPU lacks it";
      continue;
    }
    *chosen = &isa;
    return "";
  }
  return std::string("SPECRT_KERNEL_ISA=") + (wanted ? wanted : "") + ": expected scalar, avx2 or avx512";
}

OrtStatus* fail(const char* op, const std::string& message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(op) + ": " + message).c_str());
}

OrtStatus* fail(const std::string& message) { return fail(kOpName, message); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

struct Tensor {
  const OrtValue* value = nullptr;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// An input's shape and data; an absent optional input leaves `tensor` empty (value == nullptr).
OrtStatus* read_input(OrtKernelContext* context, size_t index, const char* name, Tensor* tensor,
                      bool optional = false, const char* op = kOpName) {
  size_t count = 0;
  if (OrtStatus* status = g_api->KernelContext_GetInputCount(context, &count)) return status;
  if (index < count)
    if (OrtStatus* status = g_api->KernelContext_GetInput(context, index, &tensor->value)) return status;
  if (!tensor->value) return optional ? nullptr : fail(op, std::string("input ") + name + " is missing");
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* status = g_api->GetTensorTypeAndShape(tensor->value, &info)) return status;
  size_t rank = 0;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  OrtStatus* status = g_api->GetDimensionsCount(info, &rank);
  if (!status) {
    tensor->shape.resize(rank);
    status = g_api->GetDimensions(info, tensor->shape.data(), rank);
  }
  if (!status) status = g_api->GetTensorElementType(info, &type);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (status) return status;
  if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return fail(op, std::string("input ") + name + " must be float32");
  void* data = nullptr;
  if (OrtStatus* s = g_api->GetTensorMutableData(const_cast<OrtValue*>(tensor->value), &data)) return s;
  tensor->data = static_cast<const float*>(data);
  return nullptr;
}

OrtStatus* expect_shape(const Tensor& tensor, const char* name, const std::vector<int64_t>& want) {
  if (tensor.shape != want)
    return fail(std::string(name) + " has shape " + shape_text(tensor.shape) + ", expected " + shape_text(want));
  return nullptr;
}

OrtStatus* output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape, float** data) {
  OrtValue* value = nullptr;
  if (OrtStatus* status = g_api->KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value))
    return status;
  void* raw = nullptr;
  if (OrtStatus* status = g_api->GetTensorMutableData(value, &raw)) return status;
  *data = static_cast<float*>(raw);
  return nullptr;
}

struct Task {
  int64_t row, kv, head_begin, head_end;
};

struct Work {
  const AttentionPass* pass;
  AttendFn attend;
  const std::vector<Task>* tasks;
};

void run_task(void* user, size_t index) {
  const Work& work = *static_cast<const Work*>(user);
  const Task& task = (*work.tasks)[index];
  const AttentionPass& pass = *work.pass;
  const int64_t t = pass.past + pass.s, nh = task.head_end - task.head_begin;
  thread_local std::vector<int64_t> visible;  // per worker thread; grows to the longest pass seen
  thread_local std::vector<float> scores, query;
  visible.resize(static_cast<size_t>(t));
  scores.resize(static_cast<size_t>(nh * ((t + 15) / 16 * 16)));
  query.resize(static_cast<size_t>(nh * pass.head_dim));
  work.attend(pass, task.row, task.kv, task.head_begin, task.head_end,
              Workspace{visible.data(), scores.data(), query.data()});
}

struct SpecAttentionKernel {
  int64_t heads = 0, kv_heads = 0;
  float scale = 1.0f;
  const Isa* isa = nullptr;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    Tensor query, key, value, past_key, past_value, cos, sin, bias;
    const char* names[] = {"query", "key", "value", "past_key", "past_value", "cos", "sin", "bias"};
    Tensor* tensors[] = {&query, &key, &value, &past_key, &past_value, &cos, &sin, &bias};
    for (size_t i = 0; i < 8; ++i)
      if (OrtStatus* status = read_input(context, i, names[i], tensors[i], i == 1 || i == 2)) return status;
    // packed: key and value absent, query holds each row's [q | k | v]
    const bool packed = !key.value && !value.value;
    if (!packed && (!key.value || !value.value)) return fail("key and value must both be given, or neither (packed query)");
    const int64_t width = packed ? heads + 2 * kv_heads : heads;  // head-sized slices per query row
    if (query.shape.size() != 3 || query.shape[0] != 1 || query.shape[2] % width)
      return fail("query has shape " + shape_text(query.shape) + ", expected [1, s, " +
                  (packed ? "(num_heads + 2 * kv_heads)" : "num_heads") + " * head_dim] with num_heads=" +
                  std::to_string(heads) + ", kv_heads=" + std::to_string(kv_heads));
    const int64_t s = query.shape[1], d = query.shape[2] / width;
    if (d % 16 || d > kMaxHeadDim)
      return fail("head_dim " + std::to_string(d) + " is not a multiple of 16 up to " + std::to_string(kMaxHeadDim));
    if (past_key.shape.size() != 4) return fail("past_key has shape " + shape_text(past_key.shape) + ", expected [1, past, kv_heads, head_dim]");
    const int64_t past = past_key.shape[1];
    OrtStatus* status = nullptr;
    if (!packed && !status) status = expect_shape(key, "key", {1, s, kv_heads * d});
    if (!packed && !status) status = expect_shape(value, "value", {1, s, kv_heads * d});
    if (!status) status = expect_shape(past_key, "past_key", {1, past, kv_heads, d});
    if (!status) status = expect_shape(past_value, "past_value", {1, past, kv_heads, d});
    if (!status) status = expect_shape(cos, "cos", {1, s, d});
    if (!status) status = expect_shape(sin, "sin", {1, s, d});
    if (!status) status = expect_shape(bias, "bias", {1, 1, s, past + s});
    if (status) return status;
    const int64_t row_stride = packed ? width * d : kv_heads * d;  // of the key and value rows read below
    const float* key_rows = packed ? query.data + heads * d : key.data;
    const float* value_rows = packed ? query.data + (heads + kv_heads) * d : value.data;

    AttentionPass pass;
    pass.s = s;
    pass.past = past;
    pass.heads = heads;
    pass.kv_heads = kv_heads;
    pass.head_dim = d;
    pass.scale = scale;
    pass.query_stride = width * d;
    pass.query = query.data;
    pass.cos = cos.data;
    pass.sin = sin.data;
    pass.bias = bias.data;
    pass.past_key = past_key.data;
    pass.past_value = past_value.data;
    float *out = nullptr, *new_key = nullptr, *new_value = nullptr;
    if ((status = output(context, 0, {1, s, heads * d}, &out))) return status;
    if ((status = output(context, 1, {1, s, kv_heads, d}, &new_key))) return status;
    if ((status = output(context, 2, {1, s, kv_heads, d}, &new_value))) return status;
    for (int64_t i = 0; i < s; ++i)  // the window's keys, rotated, and values, into the cache slots
      for (int64_t k = 0; k < kv_heads; ++k) {
        const int64_t at = (i * kv_heads + k) * d, from = i * row_stride + k * d;
        rotate_half(key_rows + from, cos.data + i * d, sin.data + i * d, d, new_key + at);
        std::memcpy(new_value + at, value_rows + from, static_cast<size_t>(d) * sizeof(float));
      }
    pass.new_key = new_key;
    pass.new_value = new_value;
    pass.out = out;

    // tasks: (row, kv head, group of its query heads); groups split only while there are few rows
    const int64_t group = heads / kv_heads;
    const int64_t split = s * kv_heads >= 8 ? 1 : (group >= 4 ? 4 : group);
    std::vector<Task> tasks;
    tasks.reserve(static_cast<size_t>(s * kv_heads * split));
    for (int64_t i = 0; i < s; ++i)
      for (int64_t k = 0; k < kv_heads; ++k)
        for (int64_t part = 0; part < split; ++part) {
          const int64_t h0 = k * group + group * part / split, h1 = k * group + group * (part + 1) / split;
          if (h1 > h0) tasks.push_back({i, k, h0, h1});
        }
    Work work{&pass, isa->attend, &tasks};
    return g_api->KernelContext_ParallelFor(context, run_task, tasks.size(), 0, &work);
  }
};

struct SpecAttentionOp : Ort::CustomOpBase<SpecAttentionOp, SpecAttentionKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    auto* made = new SpecAttentionKernel();
    OrtStatus* status = api.KernelInfoGetAttribute_int64(info, "num_heads", &made->heads);
    if (!status) status = api.KernelInfoGetAttribute_int64(info, "kv_heads", &made->kv_heads);
    if (!status) status = api.KernelInfoGetAttribute_float(info, "scale", &made->scale);
    if (!status && (made->heads < 1 || made->kv_heads < 1 || made->heads % made->kv_heads))
      status = fail("num_heads " + std::to_string(made->heads) + " must be a positive multiple of kv_heads " +
                    std::to_string(made->kv_heads));
    if (!status) {
      const std::string error = choose_isa(&made->isa);
      if (!error.empty()) status = fail(error);
    }
    if (status) {
      delete made;
      return status;
    }
    *kernel = made;
    return nullptr;
  }
  const char* GetName() const { return kOpName; }
  size_t GetInputTypeCount() const { return 8; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 1 || index == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

// SwiGLU: x [..., 2 * inner] -> [..., inner], silu of the first half times the second (attention.h)
constexpr const char* kSwiGLUName = "SwiGLU";

struct SwiGLURows {
  const float* x;
  float* out;
  int64_t inner;
  SwiGLUFn swiglu;
};

void swiglu_row(void* user, size_t row) {
  const SwiGLURows& rows = *static_cast<const SwiGLURows*>(user);
  rows.swiglu(rows.x + static_cast<int64_t>(row) * 2 * rows.inner, rows.inner,
              rows.out + static_cast<int64_t>(row) * rows.inner);
}

struct SwiGLUKernel {
  const Isa* isa = nullptr;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    Tensor x;
    if (OrtStatus* status = read_input(context, 0, "x", &x, false, kSwiGLUName)) return status;
    if (x.shape.empty() || x.shape.back() % 32)
      return fail(kSwiGLUName, "x has shape " + shape_text(x.shape) + ", expected a last dimension 2 * inner with inner a multiple of 16");
    std::vector<int64_t> shape = x.shape;
    const int64_t inner = shape.back() / 2;
    shape.back() = inner;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    float* out = nullptr;
    if (OrtStatus* status = output(context, 0, shape, &out)) return status;
    SwiGLURows work{x.data, out, inner, isa->swiglu};
    if (rows == 1) {
      swiglu_row(&work, 0);
      return nullptr;
    }
    return g_api->KernelContext_ParallelFor(context, swiglu_row, static_cast<size_t>(rows), 0, &work);
  }
};

struct SwiGLUOp : Ort::CustomOpBase<SwiGLUOp, SwiGLUKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo*, void** kernel) const {
    auto* made = new SwiGLUKernel();
    const std::string error = choose_isa(&made->isa);
    if (!error.empty()) {
      delete made;
      return fail(kSwiGLUName, error);
    }
    *kernel = made;
    return nullptr;
  }
  const char* GetName() const { return kSwiGLUName; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace
}  // namespace specrt

extern "C" {

// The onnxruntime C API version these headers declare: the runtime refuses to load the library
// into an onnxruntime older than it (specrt/kernels.py reads this first, to say so plainly).
int specrt_kernels_api_version() { return ORT_API_VERSION; }

// The instruction set SpecAttention runs with on this CPU (under SPECRT_KERNEL_ISA), or the error.
const char* specrt_kernels_isa() {
  thread_local std::string answer;
  const specrt::Isa* isa = nullptr;
  answer = specrt::choose_isa(&isa);
  return answer.empty() ? isa->name : answer.c_str();
}

OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) {  // an onnxruntime older than these headers: say so through the oldest API it has
    for (uint32_t version = ORT_API_VERSION - 1; version >= 1 && !api; --version) api = api_base->GetApi(version);
    if (!api) return nullptr;
    const std::string message = std::string("specrt kernels were built against onnxruntime API ") +
                                std::to_string(ORT_API_VERSION) + "; this onnxruntime is " +
                                api_base->GetVersionString() + ": upgrade onnxruntime";
    return api->CreateStatus(ORT_FAIL, message.c_str());
  }
  specrt::g_api = api;
  Ort::InitApi(api);
  // One operator and one domain for the process, shared by every session: sessions keep pointers
  // to both, so they live as long as the library.
  static specrt::SpecAttentionOp attention;
  static specrt::SwiGLUOp swiglu;
  static OrtCustomOpDomain* domain = nullptr;
  static OrtStatus* made = [&]() -> OrtStatus* {
    if (OrtStatus* status = api->CreateCustomOpDomain(specrt::kDomain, &domain)) return status;
    if (OrtStatus* status = api->CustomOpDomain_Add(domain, &attention)) return status;
    return api->CustomOpDomain_Add(domain, &swiglu);
  }();
  if (made) return api->CreateStatus(api->GetErrorCode(made), api->GetErrorMessage(made));
  return api->AddCustomOpDomain(options, domain);
}

}  // extern "C"
