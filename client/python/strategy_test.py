"""Run.apply_strategy with Debian's real torch: recomputed blocks give the same gradients while
keeping less for backward, a sharded optimizer trains two Gloo ranks to the same weights as a whole one
and saves the same checkpoint, autocast changes the forward's precision, and nothing changes when the
plan asks for nothing."""

import os
import socket
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from fitrun import contract
from fitrun.run import Run
import junit_main


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x, scale=1.0):
        return x + scale * self.down(torch.nn.functional.gelu(self.up(x)))


class Tower(torch.nn.Module):
    def __init__(self, width=16, depth=4):
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, scale=0.5)
        return self.head(h)


def plan(**strategy):
    env = {contract.ACTIVATION_CHECKPOINTING: "0", contract.ZERO_STAGE: "0", contract.PRECISION: "fp32"}
    env.update(strategy)
    return Run(env)


def saved_bytes_for_backward(model, x):
    """What autograd keeps from the forward for the backward, in bytes, and the loss."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().mean()
    return sum(saved), loss


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_two_ranks(rank, port, zero, out_dir):
    """One of two Gloo ranks: 3 AdamW steps (two parameter groups) on its own data; writes its
    weights, its share of the optimizer states and (rank 0) the checkpointed optimizer state."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(Tower())
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=0.01,
                                  weight_decay=0.1)
    run = plan(**{contract.ZERO_STAGE: "1" if zero else "0"})
    model, optimizer = run.apply_strategy(model, optimizer)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 8, generator=generator)).square().mean().backward()
        optimizer.step()
    local_states = sum(t.numel() for s in optimizer.optim.state.values() for t in s.values()
                       if torch.is_tensor(t) and t.dim() > 0) if zero else None
    state = run.optimizer_state_dict(optimizer)
    torch.save({"weights": model.module.state_dict(), "kind": type(optimizer).__name__,
                "local_states": local_states, "checkpoint": state}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


class ApplyStrategyTest(unittest.TestCase):
    def test_nothing_asked_changes_nothing(self):
        model, optimizer = Tower(), None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        got_model, got_optimizer = plan().apply_strategy(model, optimizer)
        self.assertIs(got_model, model)
        self.assertIs(got_optimizer, optimizer)
        self.assertNotIn("forward", vars(model.layers[0]))
        outside = Run({})
        self.assertEqual((outside.activation_checkpointing, outside.zero_stage, outside.precision), (False, 0, "fp32"))

    def test_recomputed_blocks_give_the_same_gradients_and_keep_less_for_backward(self):
        torch.manual_seed(0)
        kept = Tower(width=32, depth=6)
        recomputed = Tower(width=32, depth=6)
        recomputed.load_state_dict(kept.state_dict())
        optimizer = torch.optim.SGD(recomputed.parameters(), lr=0.1)
        run = plan(**{contract.ACTIVATION_CHECKPOINTING: "1"})
        self.assertTrue(run.activation_checkpointing)
        run.apply_strategy(recomputed, optimizer)  # the blocks found: model.layers
        x = torch.randn(64, 8)
        kept_bytes, kept_loss = saved_bytes_for_backward(kept, x)
        recomputed_bytes, recomputed_loss = saved_bytes_for_backward(recomputed, x)
        kept_loss.backward()
        recomputed_loss.backward()
        self.assertEqual(kept_loss.item(), recomputed_loss.item())
        for (name, a), (_, b) in zip(kept.named_parameters(), recomputed.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=name)
        # Each block kept its input only (64 x 32 floats), not its 4x-wide hidden activations.
        self.assertLess(recomputed_bytes, kept_bytes / 3, (recomputed_bytes, kept_bytes))
        # Without gradients (evaluation), a block runs as before.
        with torch.no_grad():
            torch.testing.assert_close(kept(x), recomputed(x), rtol=0, atol=0)

    def test_a_model_without_blocks_is_told_to_name_them(self):
        model = torch.nn.Linear(4, 4)
        run = plan(**{contract.ACTIVATION_CHECKPOINTING: "1"})
        with self.assertRaises(ValueError) as raised:
            run.apply_strategy(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.assertIn("blocks=", str(raised.exception))
        # Named, they are recomputed.
        tower = Tower()
        run.apply_strategy(tower, torch.optim.SGD(tower.parameters(), lr=0.1), blocks=[tower.embed, tower.head])
        self.assertIn("forward", vars(tower.embed))
        self.assertNotIn("forward", vars(tower.layers[0]))

    def test_bf16_autocasts_the_forward(self):
        model = Tower()
        run = plan(**{contract.PRECISION: "bf16"})
        run.apply_strategy(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.assertEqual(model(torch.randn(2, 8)).dtype, torch.bfloat16)
        self.assertEqual(Tower()(torch.randn(2, 8)).dtype, torch.float32)

    def test_sharded_states_train_two_ranks_to_the_same_weights_and_checkpoint_as_whole_ones(self):
        results = {}
        for zero in (False, True):
            out = tempfile.mkdtemp()
            mp.start_processes(train_two_ranks, args=(free_port(), zero, out), nprocs=2, start_method="spawn")
            results[zero] = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in (0, 1)]
        whole, sharded = results[False], results[True]
        self.assertEqual(sharded[0]["kind"], "ZeroRedundancyOptimizer")
        self.assertEqual(whole[0]["kind"], "AdamW")
        for r in (0, 1):
            for name, tensor in whole[r]["weights"].items():
                torch.testing.assert_close(sharded[r]["weights"][name], tensor, rtol=1e-6, atol=1e-7, msg=name)
        # Each rank holds a share of the two moments, together all of them.
        parameters = sum(t.numel() for t in whole[0]["weights"].values())
        shares = [sharded[r]["local_states"] for r in (0, 1)]
        self.assertEqual(sum(shares), 2 * parameters)
        self.assertTrue(all(0 < s < 2 * parameters for s in shares), shares)
        # Rank 0's checkpoint holds every state, as the whole optimizer's does; rank 1 saves nothing.
        self.assertIsNone(sharded[1]["checkpoint"])
        gathered, plain = sharded[0]["checkpoint"], whole[0]["checkpoint"]
        self.assertEqual(len(gathered["state"]), len(plain["state"]))
        self.assertEqual([g["weight_decay"] for g in gathered["param_groups"]], [0.1, 0.0])
        for index, state in plain["state"].items():
            torch.testing.assert_close(gathered["state"][index]["exp_avg"], state["exp_avg"], rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
    junit_main.main()
