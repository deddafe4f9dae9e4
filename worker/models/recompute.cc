#include "worker/models/recompute.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <utility>

namespace fitrun::worker {
namespace {

// The block, carried to backward in the context's saved data (which holds IValues).
struct BlockHolder : torch::CustomClassHolder {
  explicit BlockHolder(std::function<at::Tensor(const at::Tensor&)> f) : block(std::move(f)) {}
  std::function<at::Tensor(const at::Tensor&)> block;
};

class Recompute : public torch::autograd::Function<Recompute> {
 public:
  // Runs with gradients off (Function::apply turns them off), so the block records nothing.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            std::function<at::Tensor(const at::Tensor&)> block) {
    ctx->save_for_backward({input});
    auto holder = c10::make_intrusive<BlockHolder>(std::move(block));
    const at::Tensor output = holder->block(input);
    ctx->saved_data["block"] = c10::IValue::make_capsule(std::move(holder));
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    const auto holder = c10::static_intrusive_pointer_cast<BlockHolder>(ctx->saved_data["block"].toCapsule());
    at::Tensor output;
    {
      at::AutoGradMode with_gradients(true);
      output = holder->block(input);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {input.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor RecomputedInBackward(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input) {
  // Autograd only calls a function's backward for outputs that need gradients, which it decides from
  // the inputs: with an input that needs none, the block's parameters would silently get none.
  if (!input.requires_grad() || !at::GradMode::is_enabled()) return block(input);
  return Recompute::apply(input, std::move(block));
}

}  // namespace fitrun::worker
