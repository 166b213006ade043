// The exact backward of softmax(scale * q k^T + mask) v for a mask that needs its gradient (the T5 bias of
// TUPE Eq. 5 / 8, Ke, He, Liu, arXiv 2006.15595), on the CPU, fused by blocks of query rows.
//
// For a block of rows of one (batch row, head): the logits are recomputed (one GEMM), P = exp(logits - lse)
// with lse the row's log-sum-exp from the forward, dP = dO v^T (one GEMM), dS = P * (dP - rowsum(dO * O)),
// and in the same pass over the block dS is added to the mask's gradient; dq = scale dS k, dk += scale dS^T q,
// dv += P^T dO (three GEMMs). The block's logits stay in cache from the first GEMM to the last; no
// (B, H, T, T) tensor is made. A mask shared by the batch (size 1 in its first dimension) gets its gradient
// summed over the batch: one task per head walks the batch rows in turn, so no two threads add to the same
// gradient. The gradient may go to a buffer the caller gives (grad_mask), written or added to: the one buffer
// of the mask that every layer reads (tupe_plugin/attention/shared_mask_gradient.py). The tasks run on
// torch's intra-op threads (at::parallel_for, which needs the library built with OpenMP); the GEMMs are the
// BLAS torch is built with (sgemm_ / dgemm_ of libtorch_cpu), one thread each inside a task.
//
// A bias of the offset j - i (T5, ALiBi, KERPLE, Sandwich, FIRE) comes as its Toeplitz rows (H, 2T - 1), with
// the edges (H, T) its [CLS] reset adds to row 0 and column 0, and key padding as a (B, T) additive row: row i
// of the bias is the contiguous stretch rows[h, T - 1 - i ..], so it is added to the block's logits row by row
// and dS is added back along the same stretch of the rows' gradient: no (H, T, T) tensor either way. The
// dense mask, when there is one (TUPE's untied product), is added as before.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
            const int*, const double*, const int*, const double*, double*, const int*);
}

// The loops below are inlined into each instruction-set version of the function that calls them (a template
// compiled once on its own would get the baseline's 16-byte vectors in every version).
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

// a[j] += b[j], j < n: a row of the bias added to a row of logits, a row of dS to a stretch of the rows' gradient
// (offset_rows.cpp calls it too). The float loop also in AVX-512 and AVX2 + FMA versions, one chosen when the
// library loads, by the CPU.
namespace tupe_plugin_kernels {

template <typename scalar_t>
ALWAYS_INLINE void add_row(scalar_t* a, const scalar_t* b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] += b[j];
}

#if defined(__x86_64__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void add_row_of(float* a, const float* b, int64_t n) { add_row<float>(a, b, n); }

void add_row_of(double* a, const double* b, int64_t n) { add_row<double>(a, b, n); }

}  // namespace tupe_plugin_kernels

namespace {

using tupe_plugin_kernels::add_row_of;

// Row-major c (m x n) = alpha op(a) op(b) + beta c, op(x) = x or x^T: the column-major BLAS call on the
// transposed problem c^T = op(b)^T op(a)^T.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  sgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

void gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
          int ldb, double beta, double* c, int ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  dgemm_(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// exp(x) for float, written so that the compiler vectorises the loop it is in: 2^n times a degree-6
// polynomial of the remainder r = x - n ln 2, |r| <= ln 2 / 2 (relative error below 2e-7); 0 below
// ln 2^-64 = -44.36: probabilities below 2^-64 are set to 0, as the Python kernels set them
// (cpu_kernels.NEGLIGIBLE_PROBABILITY), so that dS = P (dP - delta) holds no subnormal number for the GEMMs
// that read it (`bert_alibi_asym` at T = 512, medium size: its step 1.14 x BERT-A's with a cut-off at the
// subnormal range only, 1.03 x with this one, on an Intel Xeon).
inline float exp_approx(float x) {
  const float lower = -44.3614195558365f, upper = 88.7f;
  const float kept = x < lower ? 0.0f : 1.0f;
  x = x < lower ? lower : x;
  x = x > upper ? upper : x;
  // round to nearest by the 1.5 * 2^23 shift (SSE2 has no vector rounding instruction)
  const float shift = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shift) - shift;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale * kept;
}

inline double exp_approx(double x) { return std::exp(x); }

// One block of rows: probs holds the logits on entry, P on exit; grad holds dP on entry, dS on exit,
// which is added to (accumulate) or written into grad_mask, or kept in grad alone where grad_mask is null (a
// mask without a gradient: a fixed bias). Each branch is one loop the compiler vectorises.
template <typename scalar_t>
ALWAYS_INLINE void softmax_gradient(bool accumulate, int rows, int64_t keys, scalar_t* probs, scalar_t* grad,
                                    const scalar_t* mask, scalar_t* grad_mask, const scalar_t* lse,
                                    const scalar_t* delta) {
  for (int r = 0; r < rows; ++r) {
    scalar_t* p = probs + r * keys;
    scalar_t* g = grad + r * keys;
    const scalar_t* mk = mask + r * keys;
    scalar_t* gm = grad_mask == nullptr ? nullptr : grad_mask + r * keys;
    const scalar_t l = lse[r], dl = delta[r];
    const auto element = [&](int64_t j) {
      const scalar_t e = exp_approx(p[j] + mk[j] - l);
      p[j] = e;
      g[j] = e * (g[j] - dl);
      return g[j];
    };
    if (grad_mask == nullptr) {
      for (int64_t j = 0; j < keys; ++j) element(j);
    } else if (accumulate) {
      for (int64_t j = 0; j < keys; ++j) gm[j] += element(j);
    } else {
      for (int64_t j = 0; j < keys; ++j) gm[j] = element(j);
    }
  }
}

// The same without a dense mask (its logits complete on entry) and no mask gradient.
template <typename scalar_t>
ALWAYS_INLINE void softmax_gradient_unmasked(int rows, int64_t keys, scalar_t* probs, scalar_t* grad,
                                             const scalar_t* lse, const scalar_t* delta) {
  for (int r = 0; r < rows; ++r) {
    scalar_t* p = probs + r * keys;
    scalar_t* g = grad + r * keys;
    const scalar_t l = lse[r], dl = delta[r];
    for (int64_t j = 0; j < keys; ++j) {
      const scalar_t e = exp_approx(p[j] - l);
      p[j] = e;
      g[j] = e * (g[j] - dl);
    }
  }
}

// The float loop also in AVX-512 and AVX2 + FMA versions, one chosen when the library loads, by the CPU.
#if defined(__x86_64__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void softmax_gradient_of(bool accumulate, int rows, int64_t keys, float* probs, float* grad, const float* mask,
                         float* grad_mask, const float* lse, const float* delta) {
  softmax_gradient<float>(accumulate, rows, keys, probs, grad, mask, grad_mask, lse, delta);
}

void softmax_gradient_of(bool accumulate, int rows, int64_t keys, double* probs, double* grad, const double* mask,
                         double* grad_mask, const double* lse, const double* delta) {
  softmax_gradient<double>(accumulate, rows, keys, probs, grad, mask, grad_mask, lse, delta);
}

#if defined(__x86_64__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void softmax_gradient_of(int rows, int64_t keys, float* probs, float* grad, const float* lse, const float* delta) {
  softmax_gradient_unmasked<float>(rows, keys, probs, grad, lse, delta);
}

void softmax_gradient_of(int rows, int64_t keys, double* probs, double* grad, const double* lse,
                         const double* delta) {
  softmax_gradient_unmasked<double>(rows, keys, probs, grad, lse, delta);
}

// The dot product of two rows, in LANES partial sums: the loop vectorises (one running sum would be a
// chain of dependent additions, ~0.8 ms of a 35 ms backward at B = 4, H = 8, T = 512, d_h = 64).
template <typename scalar_t>
inline scalar_t dot(const scalar_t* a, const scalar_t* b, int n) {
  constexpr int LANES = 16;
  scalar_t partial[LANES] = {};
  int j = 0;
  for (; j + LANES <= n; j += LANES) {
    for (int u = 0; u < LANES; ++u) partial[u] += a[j + u] * b[j + u];
  }
  scalar_t sum = 0;
  for (; j < n; ++j) sum += a[j] * b[j];
  for (int u = 0; u < LANES; ++u) sum += partial[u];
  return sum;
}

// Rows of the heads of a (B, H, T, D) tensor whose rows are contiguous (any strides over B, H and T): the
// (B, T, H, D) layout of a projection viewed as heads, too.
template <typename scalar_t>
struct Heads {
  scalar_t* data;
  int64_t batch_stride, head_stride;
  int row_stride;

  explicit Heads(const at::Tensor& t)
      : data(t.data_ptr<scalar_t>()), batch_stride(t.stride(0)), head_stride(t.stride(1)),
        row_stride(static_cast<int>(t.stride(2))) {}

  scalar_t* row(int64_t b, int64_t h, int64_t i) const {
    return data + b * batch_stride + h * head_stride + i * row_stride;
  }
};

// The bias of the offset and the key padding of a backward, and the gradients of the former: rows (H, 2T - 1),
// edges (H, T) or null, key padding (B, T) or null; the gradients (1 or B, H, .) as the tasks go (per head, or
// per batch row and head with a mask per batch row), summed over their first dimension by the caller.
template <typename scalar_t>
struct OffsetBias {
  const scalar_t *rows = nullptr, *edge_row = nullptr, *edge_col = nullptr, *key_bias = nullptr;
  scalar_t *grad_rows = nullptr, *grad_edge_row = nullptr, *grad_edge_col = nullptr;
};

template <typename scalar_t>
void backward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                     const at::Tensor& grad_out, const at::Tensor& lse, const at::Tensor& mask, double scale_,
                     int64_t block, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dmask,
                     bool dmask_add, const OffsetBias<scalar_t>& offset) {
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
  const bool has_mask = mask.defined();
  const bool shared = !has_mask || mask.size(0) == 1;
  const scalar_t scale = static_cast<scalar_t>(scale_);
  const Heads<scalar_t> Q(q), K(k), V(v), O(out), dO(grad_out), dQ(dq), dK(dk), dV(dv);
  const scalar_t* L = lse.data_ptr<scalar_t>();
  const scalar_t* M = has_mask ? mask.data_ptr<scalar_t>() : nullptr;
  scalar_t* dM = has_mask && dmask.numel() > 0 ? dmask.data_ptr<scalar_t>() : nullptr;
  const int t = static_cast<int>(length), d = static_cast<int>(q.size(3)), dv_dim = static_cast<int>(v.size(3));
  const int64_t period = 2 * length - 1;
  at::parallel_for(0, shared ? heads : batch * heads, 1, [&](int64_t begin, int64_t end) {
    // kept by the thread from call to call: no allocation (and no page faults) per layer
    thread_local std::vector<scalar_t> buffer;
    buffer.resize(2 * block * length + block);
    scalar_t *P = buffer.data(), *G = P + block * length, *delta = G + block * length;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = shared ? task : task % heads;
      const int64_t first = shared ? 0 : task / heads, last = shared ? batch : first + 1;
      // this task's share of the offset's gradients: row `task` of (1 or B) x H
      const int64_t own = shared ? h : task;
      const scalar_t* rows = offset.rows ? offset.rows + h * period : nullptr;
      scalar_t* grad_rows = offset.grad_rows ? offset.grad_rows + own * period : nullptr;
      for (int64_t i0 = 0; i0 < length; i0 += block) {
        const int m = static_cast<int>(std::min(block, length - i0));
        const int64_t mask_block = (first * heads + h) * length * length + i0 * length;
        // the first block of a head writes dk and dv, later ones add to them: no zero-filled outputs
        const scalar_t keys_beta = i0 == 0 ? scalar_t(0) : scalar_t(1);
        for (int64_t b = first; b < last; ++b) {
          const scalar_t *q_rows = Q.row(b, h, i0), *k_all = K.row(b, h, 0), *v_all = V.row(b, h, 0),
                         *grad_rows_out = dO.row(b, h, i0);
          for (int r = 0; r < m; ++r) {  // rowsum(dO * O)
            delta[r] = dot(grad_rows_out + r * dO.row_stride, O.row(b, h, i0 + r), dv_dim);
          }
          gemm(false, true, m, t, d, scale, q_rows, Q.row_stride, k_all, K.row_stride, scalar_t(0), P, t);
          gemm(false, true, m, t, dv_dim, scalar_t(1), grad_rows_out, dO.row_stride, v_all, V.row_stride,
               scalar_t(0), G, t);
          if (rows) {
            for (int r = 0; r < m; ++r) {
              const int64_t i = i0 + r;
              scalar_t* p = P + r * length;
              add_row_of(p, rows + (length - 1 - i), length);
              if (offset.key_bias) add_row_of(p, offset.key_bias + b * length, length);
              if (offset.edge_row) {
                if (i == 0) add_row_of(p, offset.edge_row + h * length, length);
                p[0] += offset.edge_col[h * length + i];
              }
            }
          }
          const scalar_t* row_lse = L + (b * heads + h) * length + i0;
          if (has_mask) {
            softmax_gradient_of(dmask_add || b > first, m, length, P, G, M + mask_block,
                                dM ? dM + mask_block : nullptr, row_lse, delta);
          } else {
            softmax_gradient_of(m, length, P, G, row_lse, delta);
          }
          if (grad_rows) {
            for (int r = 0; r < m; ++r) {
              const int64_t i = i0 + r;
              const scalar_t* g = G + r * length;
              add_row_of(grad_rows + (length - 1 - i), g, length);
              if (offset.grad_edge_row) {
                if (i == 0) add_row_of(offset.grad_edge_row + own * length, g, length);
                offset.grad_edge_col[own * length + i] += g[0];
              }
            }
          }
          gemm(true, false, t, dv_dim, m, scalar_t(1), P, t, grad_rows_out, dO.row_stride, keys_beta,
               dV.row(b, h, 0), dV.row_stride);
          gemm(false, false, m, d, t, scale, G, t, k_all, K.row_stride, scalar_t(0), dQ.row(b, h, i0),
               dQ.row_stride);
          gemm(true, false, t, d, m, scale, G, t, q_rows, Q.row_stride, keys_beta, dK.row(b, h, 0), dK.row_stride);
        }
      }
    }
  });
}

// q, k: (B, H, T, D), v, out, grad_out: (B, H, T, Dv), each with contiguous rows; lse: (B, H, T) from the
// forward, contiguous; mask: (1 or B, H, T, T) contiguous, the additive mask of the forward, or none; rows:
// (H, 2T - 1), the bias of the offset, or none, with its reset's edge_row and edge_col (H, T) or none and the
// key padding key_bias (B, T) or none (only with rows). Returns dq, dk, dv (B, H, T, D), the mask's gradient
// (the mask's shape; empty without a mask or mask_grad, or where grad_mask takes it), the rows' and the edges'
// gradients ((1 or B, H, .): per batch row with a mask per batch row; empty without rows, edges or rows_grad).
// grad_mask, a contiguous tensor of the mask's shape and dtype, or none: the mask's gradient is added to it
// (grad_mask_add) or written into it, in place (one buffer for the layers that read one mask).
std::vector<at::Tensor> biased_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& out, const at::Tensor& grad_out,
                                                  const at::Tensor& lse, const c10::optional<at::Tensor>& mask_,
                                                  double scale, int64_t block,
                                                  const c10::optional<at::Tensor>& rows_,
                                                  const c10::optional<at::Tensor>& edge_row_,
                                                  const c10::optional<at::Tensor>& edge_col_,
                                                  const c10::optional<at::Tensor>& key_bias_, bool rows_grad,
                                                  bool mask_grad, const c10::optional<at::Tensor>& grad_mask_,
                                                  bool grad_mask_add) {
  const at::Tensor mask = mask_.value_or(at::Tensor()), rows = rows_.value_or(at::Tensor()),
                   edge_row = edge_row_.value_or(at::Tensor()), edge_col = edge_col_.value_or(at::Tensor()),
                   key_bias = key_bias_.value_or(at::Tensor());
  TORCH_CHECK(mask.defined() || rows.defined(), "biased_attention_backward: a mask or rows");
  for (const at::Tensor* t : {&q, &k, &v, &out, &grad_out, &lse, &mask, &rows, &edge_row, &edge_col, &key_bias}) {
    TORCH_CHECK(!t->defined() || (t->device().is_cpu() && t->scalar_type() == q.scalar_type()),
                "biased_attention_backward: CPU tensors of one dtype");
  }
  for (const at::Tensor* t : {&q, &k, &v, &out, &grad_out}) {
    TORCH_CHECK(t->dim() == 4 && t->stride(3) == 1 && (t->size(2) == 1 || t->stride(2) >= t->size(3)),
                "biased_attention_backward: q, k, v, out, grad_out of 4 dimensions with contiguous rows");
  }
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes().slice(0, 3) == q.sizes().slice(0, 3) &&
                  out.sizes() == v.sizes() && grad_out.sizes() == v.sizes(),
              "biased_attention_backward: q, k of (B, H, T, D), v, out, grad_out of (B, H, T, Dv)");
  TORCH_CHECK(lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2),
              "biased_attention_backward: lse of (B, H, T), contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2);
  TORCH_CHECK(!mask.defined() || (mask.is_contiguous() && mask.dim() == 4 &&
                                  (mask.size(0) == 1 || mask.size(0) == batch) && mask.size(1) == heads &&
                                  mask.size(2) == length && mask.size(3) == length),
              "biased_attention_backward: mask of (1 or B, H, T, T), contiguous");
  TORCH_CHECK(!rows.defined() || (rows.is_contiguous() && rows.dim() == 2 && rows.size(0) == heads &&
                                  rows.size(1) == 2 * length - 1),
              "biased_attention_backward: rows of (H, 2T - 1), contiguous");
  TORCH_CHECK(edge_row.defined() == edge_col.defined() && (!edge_row.defined() || rows.defined()),
              "biased_attention_backward: both edges or neither, with rows");
  for (const at::Tensor* t : {&edge_row, &edge_col}) {
    TORCH_CHECK(!t->defined() || (t->is_contiguous() && t->dim() == 2 && t->size(0) == heads &&
                                  t->size(1) == length),
                "biased_attention_backward: edges of (H, T), contiguous");
  }
  TORCH_CHECK(!key_bias.defined() || (rows.defined() && key_bias.is_contiguous() && key_bias.dim() == 2 &&
                                      key_bias.size(0) == batch && key_bias.size(1) == length),
              "biased_attention_backward: key padding of (B, T), contiguous, with rows");
  const at::Tensor grad_mask = grad_mask_.value_or(at::Tensor());
  TORCH_CHECK(!grad_mask.defined() || (mask.defined() && mask_grad && grad_mask.is_contiguous() &&
                                       grad_mask.sizes() == mask.sizes() && grad_mask.device().is_cpu() &&
                                       grad_mask.scalar_type() == q.scalar_type()),
              "biased_attention_backward: grad_mask of the mask's shape and dtype, contiguous, with mask_grad");
  TORCH_CHECK(block > 0, "biased_attention_backward: block > 0");
  // dq, dk, dv in the (B, T, H, D) layout viewed as (B, H, T, D), as the flash backward returns them: the
  // projection's gradient (B, T, 3, H, D) is then stacked from them by contiguous rows
  const auto heads_of = [](const at::Tensor& t) {
    return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
  };
  auto dq = heads_of(q), dk = heads_of(k), dv = heads_of(v);
  auto dmask = grad_mask.defined()            ? grad_mask
               : mask.defined() && mask_grad ? at::empty_like(mask)
                                             : at::empty({0}, q.options());
  const int64_t tasks_first = mask.defined() && mask.size(0) == batch && batch > 1 ? batch : 1;
  const bool offset_grads = rows.defined() && rows_grad;
  const bool edge_grads = offset_grads && edge_row.defined();
  const auto zeros_if = [&](bool wanted, int64_t width) {
    return wanted ? at::zeros({tasks_first, heads, width}, q.options()) : at::empty({0}, q.options());
  };
  auto drows = zeros_if(offset_grads, 2 * length - 1), dedge_row = zeros_if(edge_grads, length),
       dedge_col = zeros_if(edge_grads, length);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "biased_attention_backward", [&] {
    OffsetBias<scalar_t> offset;
    if (rows.defined()) {
      offset.rows = rows.data_ptr<scalar_t>();
      if (edge_row.defined()) {
        offset.edge_row = edge_row.data_ptr<scalar_t>();
        offset.edge_col = edge_col.data_ptr<scalar_t>();
      }
      if (key_bias.defined()) offset.key_bias = key_bias.data_ptr<scalar_t>();
    }
    if (offset_grads) offset.grad_rows = drows.data_ptr<scalar_t>();
    if (edge_grads) {
      offset.grad_edge_row = dedge_row.data_ptr<scalar_t>();
      offset.grad_edge_col = dedge_col.data_ptr<scalar_t>();
    }
    backward_kernel<scalar_t>(q, k, v, out, grad_out, lse, mask, scale, block, dq, dk, dv, dmask,
                              grad_mask.defined() && grad_mask_add, offset);
  });
  if (grad_mask.defined()) dmask = at::empty({0}, q.options());  // the gradient is in grad_mask
  return {dq, dk, dv, dmask, drows, dedge_row, dedge_col};
}

// The threads at::parallel_for splits a loop of this library over: torch's intra-op threads when it was
// built with OpenMP, else 1 (the template then runs every loop on the calling thread).
int64_t parallel_threads() {
  std::atomic<int64_t> chunks{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) { ++chunks; });
  return chunks.load();
}

}  // namespace

TORCH_LIBRARY(tupe_plugin, m) {
  m.def(
      "biased_attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor grad_out, Tensor lse, "
      "Tensor? mask, float scale, int block, Tensor? rows=None, Tensor? edge_row=None, Tensor? edge_col=None, "
      "Tensor? key_bias=None, bool rows_grad=False, bool mask_grad=True, Tensor(a!)? grad_mask=None, "
      "bool grad_mask_add=False) -> Tensor[]");
  m.def("parallel_threads() -> int", &parallel_threads);
}

TORCH_LIBRARY_IMPL(tupe_plugin, CPU, m) { m.impl("biased_attention_backward", &biased_attention_backward); }
