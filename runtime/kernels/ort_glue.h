// What every operator of the library shares: onnxruntime's C API table, the instruction set the
// kernels run with, input and output access with clear errors. ort_glue.cc defines them.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attention.h"
#include "matmul_q4.h"
#include "matmul_w8a8.h"

namespace specrt {

// onnxruntime's C API table, set once by RegisterCustomOps before any kernel is made
const OrtApi& api();
void set_api(const OrtApi* table);

// One instruction set's kernels; every entry computes the same bits (canonical.h, matmul_q4.h,
// matmul_w8a8.h).
struct Isa {
  const char* name;
  AttendFn attend;
  SwiGLUFn swiglu;
  QuantizeRowsFn quantize_rows;
  MatMulQ4Fn matmul_q4;
  QuantizeTokensFn quantize_tokens;
  MatMulW8A8Fn matmul_w8a8;
};

// The instruction set to run: SPECRT_KERNEL_ISA if set (an error if unknown or missing on this
// CPU), else the best this CPU has. Returns "" and sets *chosen, or the error.
std::string choose_isa(const Isa** chosen);

OrtStatus* fail(const char* op, const std::string& message);

// The end of an operator's CreateKernelV2: after `status` (its attribute checks), the instruction
// set chosen into made->isa, then *kernel = made; on the first error, `made` is deleted and the
// error returned.
template <class Kernel>
OrtStatus* finish_kernel(const char* op, OrtStatus* status, Kernel* made, void** kernel) {
  if (!status) {
    const std::string error = choose_isa(&made->isa);
    if (!error.empty()) status = fail(op, error);
  }
  if (status) {
    delete made;
    return status;
  }
  *kernel = made;
  return nullptr;
}
std::string shape_text(const std::vector<int64_t>& shape);

struct Tensor {
  const OrtValue* value = nullptr;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t elements() const;
};

// Input `index` named `name` of element type `type`; an absent optional input leaves `tensor`
// empty (value == nullptr).
OrtStatus* read_input(OrtKernelContext* context, size_t index, const char* op, const char* name,
                      ONNXTensorElementDataType type, Tensor* tensor, bool optional = false);

OrtStatus* output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape, float** data);

// A weight product's two passes over onnxruntime's intra-op pool (MatMulQ4, MatMulW8A8): the
// activation quantization of x [m, k] into `rows` (a task per row from 4 rows up, else on the
// calling thread), then the output tiles [0, tiles) of y (a task per tile, every row in each).
template <class Quantized, class Weights>
OrtStatus* run_weight_product(OrtKernelContext* context, const float* x, int64_t k, int64_t m,
                              void (*quantize)(const float*, int64_t, int64_t, int64_t, const Quantized&),
                              const Quantized& rows,
                              void (*product)(const Weights&, const Quantized&, int64_t, int64_t, int64_t, float*),
                              const Weights& w, int64_t tiles, float* y) {
  struct RowTask {
    const float* x;
    int64_t k;
    const Quantized* rows;
    void (*quantize)(const float*, int64_t, int64_t, int64_t, const Quantized&);
  } row_task{x, k, &rows, quantize};
  auto one_row = [](void* user, size_t row) {
    const RowTask& task = *static_cast<const RowTask*>(user);
    const auto r = static_cast<int64_t>(row);
    task.quantize(task.x, task.k, r, r + 1, *task.rows);
  };
  if (m < 4) {
    quantize(x, k, 0, m, rows);
  } else if (OrtStatus* status = api().KernelContext_ParallelFor(context, one_row, static_cast<size_t>(m), 0, &row_task)) {
    return status;
  }
  struct TileTask {
    const Weights* w;
    const Quantized* rows;
    int64_t m;
    float* y;
    void (*product)(const Weights&, const Quantized&, int64_t, int64_t, int64_t, float*);
  } tile_task{&w, &rows, m, y, product};
  auto one_tile = [](void* user, size_t tile) {
    const TileTask& task = *static_cast<const TileTask*>(user);
    const auto t = static_cast<int64_t>(tile);
    task.product(*task.w, *task.rows, task.m, t, t + 1, task.y);
  };
  return api().KernelContext_ParallelFor(context, one_tile, static_cast<size_t>(tiles), 0, &tile_task);
}

// The library's operators, made once for the process (sessions keep pointers to them).
const OrtCustomOp* spec_attention_op();
const OrtCustomOp* swiglu_op();
const OrtCustomOp* matmul_q4_op();
const OrtCustomOp* matmul_w8a8_op();

}  // namespace specrt
