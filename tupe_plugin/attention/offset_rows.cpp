// A bias of the offset j - i read from its Toeplitz rows (H, 2T - 1) by blocks of query rows, and its gradient
// summed back by offset (the T5 bias of TUPE Eq. 5 / 8, Ke, He, Liu, arXiv 2006.15595; ALiBi, KERPLE,
// Sandwich, FIRE): row i of the bias is the contiguous stretch rows[h, T - 1 - i .. 2T - 2 - i], so a block's
// bias is added to its logits row by row, and a row of dS is added to the same stretch of the rows' gradient
// (the sum of dS along its diagonals). The (2T - 1) values of a head stay in the L1 cache: torch's strided
// views of the periodic layout (offset_rows.PeriodicRows, the fallback) read a block's bias as (m, T) values
// spread over m (2T - 1), from memory.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

// a[j] += b[j], j < n, vectorised for the CPU it runs on (biased_attention_backward.cpp)
namespace tupe_plugin_kernels {
void add_row_of(float* a, const float* b, int64_t n);
void add_row_of(double* a, const double* b, int64_t n);
}  // namespace tupe_plugin_kernels

namespace {

using tupe_plugin_kernels::add_row_of;

void check_block(const char* op, const at::Tensor& block, const at::Tensor& rows, int64_t head, int64_t first) {
  TORCH_CHECK(block.dim() == 3 && block.stride(2) == 1, op, ": a block (heads, m, T) with contiguous rows");
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && rows.size(1) == 2 * block.size(2) - 1, op,
              ": rows (H, 2T - 1), contiguous, for the block's T keys");
  TORCH_CHECK(rows.scalar_type() == block.scalar_type(), op, ": rows and block of one dtype");
  TORCH_CHECK(head >= 0 && head + block.size(0) <= rows.size(0), op, ": the block's heads within the rows'");
  TORCH_CHECK(first >= 0 && first + block.size(1) <= block.size(2), op, ": the block's query rows within T");
}

// logits[h, r, j] += rows[head + h, j - (first + r) + T - 1]
void add_offset_rows_(at::Tensor logits, const at::Tensor& rows, int64_t head, int64_t first) {
  check_block("add_offset_rows_", logits, rows, head, first);
  const int64_t heads = logits.size(0), m = logits.size(1), length = logits.size(2), period = rows.size(1);
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "add_offset_rows_", [&] {
    scalar_t* out = logits.data_ptr<scalar_t>();
    const scalar_t* values = rows.data_ptr<scalar_t>();
    const int64_t head_stride = logits.stride(0), row_stride = logits.stride(1);
    at::parallel_for(0, heads * m, 16, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        const int64_t h = x / m, r = x % m;
        add_row_of(out + h * head_stride + r * row_stride,
                       values + (head + h) * period + (length - 1 - first - r), length);
      }
    });
  });
}

// grad_rows[head + h, j - (first + r) + T - 1] += grad[h, r, j]: a head's rows in one task (they overlap)
void add_offset_gradient_(at::Tensor grad_rows, const at::Tensor& grad, int64_t head, int64_t first) {
  check_block("add_offset_gradient_", grad, grad_rows, head, first);
  const int64_t heads = grad.size(0), m = grad.size(1), length = grad.size(2), period = grad_rows.size(1);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "add_offset_gradient_", [&] {
    scalar_t* sums = grad_rows.data_ptr<scalar_t>();
    const scalar_t* cells = grad.data_ptr<scalar_t>();
    const int64_t head_stride = grad.stride(0), row_stride = grad.stride(1);
    at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) {
        for (int64_t r = 0; r < m; ++r) {
          add_row_of(sums + (head + h) * period + (length - 1 - first - r),
                         cells + h * head_stride + r * row_stride, length);
        }
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tupe_plugin, m) {
  m.def("add_offset_rows_(Tensor(a!) logits, Tensor rows, int head, int first) -> ()");
  m.def("add_offset_gradient_(Tensor(a!) grad_rows, Tensor grad, int head, int first) -> ()");
}

TORCH_LIBRARY_IMPL(tupe_plugin, CPU, m) {
  m.impl("add_offset_rows_", &add_offset_rows_);
  m.impl("add_offset_gradient_", &add_offset_gradient_);
}
