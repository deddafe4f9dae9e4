"""The plan's strategy applied to a script's model and optimizer, the torchrun way.

fitrun tells every script rank how its plan has it train beyond the batch (contract.py):
FITRUN_ACTIVATION_CHECKPOINTING ("1": recompute each block's activations in backward, with
torch.utils.checkpoint), FITRUN_ZERO_STAGE ("1": each rank keeps its share of the optimizer states,
with torch's ZeroRedundancyOptimizer) and FITRUN_PRECISION ("bf16" or "fp16": the forward under
torch.autocast). A script whose spec sets `script.applies_strategy: true` takes them with one call,
Run.apply_strategy, after building its model (wrapped in DDP or not) and optimizer as usual and
before its first step. fitrund's memory probe runs the script with the same variables, so what a plan
weighs is what the script does.
"""

import functools


def apply(model, optimizer, *, activation_checkpointing=False, zero_stage=0, precision="fp32", blocks=None):
    """(model, optimizer) trained as asked: `model` itself, its blocks recomputing in backward and its
    forward autocast where asked; `optimizer` itself, or a ZeroRedundancyOptimizer over the same
    parameter groups, class and settings when zero_stage is 1 and the process group has several ranks."""
    import torch

    if activation_checkpointing:
        found = list(blocks) if blocks is not None else find_blocks(model)
        if not found:
            raise ValueError(
                "fitrun: FITRUN_ACTIVATION_CHECKPOINTING=1 but the model has no blocks to recompute (no "
                "torch.nn.ModuleList or Sequential of two or more modules of one type); pass them: "
                "run.apply_strategy(model, optimizer, blocks=model.layers)")
        for block in found:
            _recompute_in_backward(block)
    if precision in ("bf16", "fp16"):
        _autocast_forward(model, torch.bfloat16 if precision == "bf16" else torch.float16)
    if zero_stage == 1:
        optimizer = _sharded(optimizer)
    return model, optimizer


def find_blocks(model):
    """The model's repeated blocks: the largest ModuleList or Sequential whose two or more children
    are all of one type (a transformer's layers), searched through a DDP wrapper; [] if none."""
    import torch

    best = []
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) >= 2 and len({type(c) for c in children}) == 1 and len(children) > len(best):
            best = children
    return best


def _recompute_in_backward(block):
    """The block keeps only its inputs through the forward and recomputes the rest in backward (under
    no_grad, as in evaluation, it runs as before). Non-reentrant checkpointing: gradients reach the
    parameters through DDP's hooks as without it."""
    from torch.utils.checkpoint import checkpoint
    import torch

    forward = block.forward

    @functools.wraps(forward)
    def recomputed(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False)

    block.forward = recomputed


def _autocast_forward(model, dtype):
    import torch

    forward = model.forward
    device = "cuda" if any(p.is_cuda for p in model.parameters()) else "cpu"

    @functools.wraps(forward)
    def autocast(*args, **kwargs):
        with torch.autocast(device_type=device, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast


def _sharded(optimizer):
    """The optimizer's states split over the ranks: each steps its share and broadcasts the result."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer) or not dist.is_initialized() or dist.get_world_size() < 2:
        return optimizer
    if any(optimizer.state.values()):
        raise ValueError("fitrun: run.apply_strategy must come before the optimizer's first step "
                         "(its states are sharded from the start)")
    # Each group with its own settings (a weight-decay-free group stays one); the rest are the class's.
    groups = [dict(group) for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **optimizer.defaults)


def optimizer_state_dict(optimizer):
    """The optimizer's whole state for a checkpoint, on rank 0 (None on the others, which must call
    this too when the states are sharded: it gathers them to rank 0)."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if dist.get_rank() == 0 else None
    return optimizer.state_dict() if not dist.is_initialized() or dist.get_rank() == 0 else None
