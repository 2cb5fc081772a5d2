// Two operators of the library (domain ai.specrt, version 1): SpecAttention (a decoder layer's
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
// Work is split over onnxruntime's intra-op threads by (key/value head, group of query heads), a task
// taking the window's rows in turn; a row's heads are computed by the same code whatever the split
// (attention_impl.inc), so the thread count never changes a bit. The instruction set is the best
// this CPU has (AVX-512, AVX2 + FMA, else portable scalar code), or the one named by
// SPECRT_KERNEL_ISA (scalar, avx2, avx512; avxvnni and avx512vnni run the avx2 and avx512
// attention); all three give the same bits (canonical.h).
#include <cstring>
#include <string>
#include <vector>

#include "ort_glue.h"

namespace specrt {

namespace {

constexpr const char* kOpName = "SpecAttention";
constexpr int64_t kMaxHeadDim = 1024;

OrtStatus* fail(const std::string& message) { return specrt::fail(kOpName, message); }

OrtStatus* expect_shape(const Tensor& tensor, const char* name, const std::vector<int64_t>& want) {
  if (tensor.shape != want)
    return fail(std::string(name) + " has shape " + shape_text(tensor.shape) + ", expected " + shape_text(want));
  return nullptr;
}

const float* floats(const Tensor& tensor) { return static_cast<const float*>(tensor.data); }

struct Task {
  int64_t kv, head_begin, head_end;  // every row of the pass, one after another
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
  for (int64_t row = 0; row < pass.s; ++row)
    work.attend(pass, row, task.kv, task.head_begin, task.head_end, Workspace{visible.data(), scores.data(), query.data()});
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
      if (OrtStatus* status = read_input(context, i, kOpName, names[i], ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                         tensors[i], i == 1 || i == 2))
        return status;
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
    const float* key_rows = packed ? floats(query) + heads * d : floats(key);
    const float* value_rows = packed ? floats(query) + (heads + kv_heads) * d : floats(value);

    AttentionPass pass;
    pass.s = s;
    pass.past = past;
    pass.heads = heads;
    pass.kv_heads = kv_heads;
    pass.head_dim = d;
    pass.scale = scale;
    pass.query_stride = width * d;
    pass.query = floats(query);
    pass.cos = floats(cos);
    pass.sin = floats(sin);
    pass.bias = floats(bias);
    pass.past_key = floats(past_key);
    pass.past_value = floats(past_value);
    float *out = nullptr, *new_key = nullptr, *new_value = nullptr;
    if ((status = output(context, 0, {1, s, heads * d}, &out))) return status;
    if ((status = output(context, 1, {1, s, kv_heads, d}, &new_key))) return status;
    if ((status = output(context, 2, {1, s, kv_heads, d}, &new_value))) return status;
    for (int64_t i = 0; i < s; ++i)  // the window's keys, rotated, and values, into the cache slots
      for (int64_t k = 0; k < kv_heads; ++k) {
        const int64_t at = (i * kv_heads + k) * d, from = i * row_stride + k * d;
        rotate_half(key_rows + from, floats(cos) + i * d, floats(sin) + i * d, d, new_key + at);
        std::memcpy(new_value + at, value_rows + from, static_cast<size_t>(d) * sizeof(float));
      }
    pass.new_key = new_key;
    pass.new_value = new_value;
    pass.out = out;

    // tasks: (key/value head, group of its query heads), each over every row of the window in turn.
    // A task streams its key/value head's cache once for all rows (the rows after the first find it
    // in cache), and a group is split only when there would be a single task. Qwen2.5-Coder-0.5B
    // int4 after 1,500 cached positions, 2 threads (scripts/window_cost.py --past 1500 --sizes 1 2 4 8):
    // a task per (row, key/value head, quarter of a group) streamed the cache up to four times a
    // row, a task per (row, key/value head) once a row; see docs/kernels.md for the figures
    const int64_t group = heads / kv_heads;
    const int64_t split = kv_heads >= 2 ? 1 : (group >= 2 ? 2 : 1);
    std::vector<Task> tasks;
    tasks.reserve(static_cast<size_t>(kv_heads * split));
    for (int64_t k = 0; k < kv_heads; ++k)
      for (int64_t part = 0; part < split; ++part) {
        const int64_t h0 = k * group + group * part / split, h1 = k * group + group * (part + 1) / split;
        if (h1 > h0) tasks.push_back({k, h0, h1});
      }
    Work work{&pass, isa->attend, &tasks};
    return api().KernelContext_ParallelFor(context, run_task, tasks.size(), 0, &work);
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
    return finish_kernel(kOpName, status, made, kernel);
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
    if (OrtStatus* status = read_input(context, 0, kSwiGLUName, "x", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &x))
      return status;
    if (x.shape.empty() || x.shape.back() % 32)
      return specrt::fail(kSwiGLUName, "x has shape " + shape_text(x.shape) + ", expected a last dimension 2 * inner with inner a multiple of 16");
    std::vector<int64_t> shape = x.shape;
    const int64_t inner = shape.back() / 2;
    shape.back() = inner;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    float* out = nullptr;
    if (OrtStatus* status = output(context, 0, shape, &out)) return status;
    SwiGLURows work{floats(x), out, inner, isa->swiglu};
    if (rows == 1) {
      swiglu_row(&work, 0);
      return nullptr;
    }
    return api().KernelContext_ParallelFor(context, swiglu_row, static_cast<size_t>(rows), 0, &work);
  }
};

struct SwiGLUOp : Ort::CustomOpBase<SwiGLUOp, SwiGLUKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo*, void** kernel) const {
    return finish_kernel(kSwiGLUName, nullptr, new SwiGLUKernel(), kernel);
  }
  const char* GetName() const { return kSwiGLUName; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

const OrtCustomOp* spec_attention_op() {
  static SpecAttentionOp op;
  return &op;
}

const OrtCustomOp* swiglu_op() {
  static SwiGLUOp op;
  return &op;
}

}  // namespace specrt
