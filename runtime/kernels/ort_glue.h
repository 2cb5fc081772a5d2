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

// The library's operators, made once for the process (sessions keep pointers to them).
const OrtCustomOp* spec_attention_op();
const OrtCustomOp* swiglu_op();
const OrtCustomOp* matmul_q4_op();
const OrtCustomOp* matmul_w8a8_op();

}  // namespace specrt
