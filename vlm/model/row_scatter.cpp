// Row placement with an index-only backward (see row_scatter.h).
#include "vlm/model/row_scatter.h"

#include "vlm/runtime/check.h"

namespace vlm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class RowScatter : public torch::autograd::Function<RowScatter> {
 public:
  // base [N, d], rows [M], src [M, d] -> [N, d]
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& base, const torch::Tensor& rows,
                               const torch::Tensor& src, bool add) {
    ctx->save_for_backward({rows});
    ctx->saved_data["add"] = add;
    return add ? base.index_add(0, rows, src) : base.index_copy(0, rows, src);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const torch::Tensor rows = ctx->get_saved_variables()[0];
    const torch::Tensor& g = grad_out[0];
    const bool add = ctx->saved_data["add"].toBool();
    torch::Tensor g_base = add ? g : g.index_fill(0, rows, 0);
    return {g_base, torch::Tensor(), g.index_select(0, rows), torch::Tensor()};
  }
};

void check_rows(const torch::Tensor& base, const torch::Tensor& rows, const torch::Tensor& src) {
  VLM_CHECK(base.dim() == 2 && src.dim() == 2 && rows.dim() == 1 && src.size(0) == rows.size(0) &&
                src.size(1) == base.size(1),
            "row scatter: expected base [N, d], rows [M], src [M, d], got ", base.sizes(), ", ", rows.sizes(), ", ",
            src.sizes());
}

}  // namespace

torch::Tensor replace_rows(const torch::Tensor& base, const torch::Tensor& rows, const torch::Tensor& src) {
  check_rows(base, rows, src);
  return RowScatter::apply(base, rows, src.to(base.scalar_type()), false);
}

torch::Tensor add_rows(const torch::Tensor& base, const torch::Tensor& rows, const torch::Tensor& src) {
  check_rows(base, rows, src);
  return RowScatter::apply(base, rows, src.to(base.scalar_type()), true);
}

}  // namespace vlm
