// Rotary position embedding (HF's rotate_half convention), forward and backward (see ops.h).
#include <cmath>
#include <string>

#include "concord/model/ops.h"

namespace concord::model {
namespace {

void check_rope(const char* op, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                const RopeTable& table) {
  if (D <= 0 || D % 2 != 0) {
    throw InputError(std::string("[") + op + "] head_dim must be even and positive, got " +
                     std::to_string(D));
  }
  if (D != table.head_dim) {
    throw InputError(std::string("[") + op + "] head_dim " + std::to_string(D) +
                     " does not match the RoPE table's " + std::to_string(table.head_dim) +
                     "; build the table with the model's head_dim");
  }
  if (T < 0 || H <= 0) {
    throw InputError(std::string("[") + op + "] needs T >= 0 and H > 0, got T=" +
                     std::to_string(T) + ", H=" + std::to_string(H));
  }
  for (int64_t t = 0; t < T; ++t) {
    if (positions[t] < 0 || positions[t] >= table.max_positions) {
      throw InputError(std::string("[") + op + "] position " + std::to_string(positions[t]) +
                       " at row " + std::to_string(t) + " is outside [0, " +
                       std::to_string(table.max_positions) +
                       "); build the RoPE table for more positions (max_position_embeddings)");
    }
  }
}

// Rotates every head of every row: (a, b) <- (a·cos − sign·b·sin, b·cos + sign·a·sin) with
// sign = +1 forward and −1 backward (the transpose of a rotation is its inverse). Each element
// is computed in double from the double table and rounded once to F.
template <class F>
void rope_apply(F* x, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                const RopeTable& table, double sign) {
  const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (T * H * D >= kOpParallelMinElements)
  for (int64_t t = 0; t < T; ++t) {
    const double* cos_row = table.cos.data() + static_cast<int64_t>(positions[t]) * half;
    const double* sin_row = table.sin.data() + static_cast<int64_t>(positions[t]) * half;
    for (int64_t h = 0; h < H; ++h) {
      F* lo = x + (t * H + h) * D;
      F* hi = lo + half;
      for (int64_t i = 0; i < half; ++i) {
        const double a = lo[i], b = hi[i];
        const double s = sign * sin_row[i];
        lo[i] = static_cast<F>(a * cos_row[i] - b * s);
        hi[i] = static_cast<F>(b * cos_row[i] + a * s);
      }
    }
  }
}

}  // namespace

RopeTable RopeTable::build(int64_t max_positions, int64_t head_dim, double theta) {
  if (max_positions <= 0 || head_dim <= 0 || head_dim % 2 != 0 || !(theta > 0.0)) {
    throw InputError("[rope] table needs max_positions > 0, an even head_dim > 0 and theta > 0, "
                     "got max_positions=" + std::to_string(max_positions) +
                     ", head_dim=" + std::to_string(head_dim) + ", theta=" +
                     std::to_string(theta) + "; check rope_theta and head_dim in config.json");
  }
  RopeTable table;
  table.max_positions = max_positions;
  table.head_dim = head_dim;
  table.theta = theta;
  const int64_t half = head_dim / 2;
  table.cos.resize(static_cast<size_t>(max_positions * half));
  table.sin.resize(static_cast<size_t>(max_positions * half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (int64_t p = 0; p < max_positions; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      table.cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
      table.sin[static_cast<size_t>(p * half + i)] = std::sin(angle);
    }
  }
  return table;
}

template <class F>
void rope_forward(F* x, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                  const RopeTable& table) {
  check_rope("rope_forward", positions, T, H, D, table);
  rope_apply(x, positions, T, H, D, table, +1.0);
}

template <class F>
void rope_backward(F* dx, const int32_t* positions, int64_t T, int64_t H, int64_t D,
                   const RopeTable& table) {
  check_rope("rope_backward", positions, T, H, D, table);
  rope_apply(dx, positions, T, H, D, table, -1.0);
}

template void rope_forward<float>(float*, const int32_t*, int64_t, int64_t, int64_t,
                                  const RopeTable&);
template void rope_backward<float>(float*, const int32_t*, int64_t, int64_t, int64_t,
                                   const RopeTable&);
template void rope_forward<double>(double*, const int32_t*, int64_t, int64_t, int64_t,
                                   const RopeTable&);
template void rope_backward<double>(double*, const int32_t*, int64_t, int64_t, int64_t,
                                    const RopeTable&);

}  // namespace concord::model
