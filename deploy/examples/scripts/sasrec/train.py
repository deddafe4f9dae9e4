#!/usr/bin/env python3
"""SASRec (Kang & McAuley 2018): next-item prediction with causal self-attention, trained with DDP.

Reads a MovieLens-1M ratings.dat (user::item::rating::timestamp; every rating counts as an
interaction), orders each user's items by time and holds the last one out (leave-one-out): the model
trains on the rest, at each position scoring the next item against one sampled unseen item (binary
cross-entropy, as the paper). At the end each user's held-out item is ranked against 100 sampled items
the user never rated: HR@10 and NDCG@10.

    python3 tools/make_movielens_sample.py deploy/examples/data/ratings.dat     # or ML-1M's own ratings.dat
    torchrun --nproc_per_node=2 train.py --ratings ../../data/ratings.dat --num_epochs 20 --batch_size 64
    fitrun submit deploy/examples/scripts/sasrec/sasrec.yaml --watch     # from the repository root

The flags follow SASRec.pytorch's (--maxlen, --hidden_units, --num_blocks, --num_heads, --dropout_rate,
--num_epochs, --lr, --batch_size per process, --use_amp). On a GPU each process takes LOCAL_RANK's, as
torchrun scripts do, and the ranks all-reduce over NCCL (over Gloo when ranks share a GPU). Under fitrun the per-device batch, gradient accumulation,
learning rate, step limit and checkpoint directory come from the plan; rank 0 checkpoints every
--checkpoint_every steps and a restarted job resumes from the latest checkpoint.
"""
import argparse
import contextlib
import gc
import math
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import fitrun
from fitrun.contract import EXIT_BAD_CONFIGURATION, EXIT_STOPPED  # the exit codes fitrun reads

HERE = os.path.dirname(os.path.abspath(__file__))

NEGATIVE_REDRAWS = 5
TEST_NEGATIVES = 100


def parse_args(run):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratings", default=os.path.join(HERE, "..", "..", "data", "ratings.dat"), help="user::item::rating::timestamp lines")
    p.add_argument("--num_epochs", "--epochs", dest="epochs", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=run.per_device_batch or 64, help="users per process")
    p.add_argument("--grad_accum_steps", type=int, default=run.grad_accum_steps or 1)
    p.add_argument("--lr", type=float, default=0.001, help="used unless fitrun sets the learning rate")
    p.add_argument("--max_steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--maxlen", "--max_len", dest="maxlen", type=int, default=50)
    p.add_argument("--hidden_units", type=int, default=64)
    p.add_argument("--num_blocks", type=int, default=2)
    p.add_argument("--num_heads", type=int, default=1)
    p.add_argument("--dropout_rate", type=float, default=0.2)
    p.add_argument("--use_amp", action="store_true",
                   help="automatic mixed precision: float16 with loss scaling on a GPU, bfloat16 on the CPU")
    p.add_argument("--l2_emb", type=float, default=0.0, help="L2 penalty on the item embeddings")
    p.add_argument("--log_every", type=int, default=10, help="optimizer steps between progress reports")
    p.add_argument("--checkpoint_every", type=int, default=100, help="optimizer steps between checkpoints (0: end only)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def fail(message):
    print(f"sasrec: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_CONFIGURATION)


def pick_device():
    """LOCAL_RANK's GPU when there is one (ranks sharing one GPU take it in turn), else the CPU; a rank on
    one of fitrun's virtual CPU devices (FITRUN_DEVICE_KIND=cpu) stays on the CPU."""
    if os.environ.get("FITRUN_DEVICE_KIND") == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def init_distributed(device):
    """torchrun's env:// rendezvous; a single process of its own when started without a launcher. NCCL
    between GPUs, Gloo on CPUs and between ranks that share a GPU (NCCL refuses two ranks on one)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = "nccl" if device.type == "cuda" and local_world <= torch.cuda.device_count() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = os.path.join(tempfile.mkdtemp(prefix="sasrec-"), "store")
        dist.init_process_group(backend, init_method="file://" + store, rank=0, world_size=1)


def read_sequences(path):
    """Each user's items in time order (ties keep file order), items renumbered 1..N (0 pads)."""
    if not os.path.exists(path):
        fail(f"no ratings file {path}; write a synthetic one with "
             f"`python3 tools/make_movielens_sample.py {path}` or use ML-1M's ratings.dat")
    events = defaultdict(list)
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            fields = line.strip().split("::")
            if len(fields) != 4:
                fail(f"{path}:{number}: expected user::item::rating::timestamp, got {line.strip()!r}")
            user, item, _, timestamp = fields
            events[user].append((int(timestamp), number, item))
    item_ids = {}
    sequences = []
    for user in sorted(events, key=lambda u: int(u) if u.isdigit() else u):
        items = [item_ids.setdefault(item, len(item_ids) + 1) for _, _, item in sorted(events[user])]
        if len(items) >= 3:  # at least two to train on and one held out
            sequences.append(items)
    return sequences, len(item_ids)


def left_padded(seq, length):
    """The last `length` items of seq, padded with 0 at the front (SASRec's layout)."""
    seq = seq[-length:]
    return [0] * (length - len(seq)) + seq


class PointWiseFeedForward(nn.Module):
    def __init__(self, hidden, dropout):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.Dropout(dropout), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.Dropout(dropout))

    def forward(self, x):
        return x + self.net(x)


class SASRec(nn.Module):
    def __init__(self, num_items, maxlen, hidden, blocks, heads, dropout):
        super().__init__()
        self.item_emb = nn.Embedding(num_items + 1, hidden, padding_idx=0)
        self.pos_emb = nn.Embedding(maxlen, hidden)
        self.emb_dropout = nn.Dropout(dropout)
        self.attention_norms = nn.ModuleList(nn.LayerNorm(hidden, eps=1e-8) for _ in range(blocks))
        self.attentions = nn.ModuleList(nn.MultiheadAttention(hidden, heads, dropout=dropout, batch_first=True)
                                        for _ in range(blocks))
        self.forward_norms = nn.ModuleList(nn.LayerNorm(hidden, eps=1e-8) for _ in range(blocks))
        self.forwards = nn.ModuleList(PointWiseFeedForward(hidden, dropout) for _ in range(blocks))
        self.last_norm = nn.LayerNorm(hidden, eps=1e-8)
        for parameter in self.parameters():  # SASRec.pytorch's initialisation
            if parameter.dim() > 1:
                nn.init.xavier_normal_(parameter)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()

    def features(self, history):
        """[B, L] item ids (0 pads on the left) -> [B, L, H]: position t has seen items up to t."""
        length = history.shape[1]
        x = self.item_emb(history) * math.sqrt(self.item_emb.embedding_dim)
        x = self.emb_dropout(x + self.pos_emb(torch.arange(length, device=history.device)))
        keep = (history != 0).unsqueeze(-1)
        x = x * keep
        # True above the diagonal: position t may not attend to later items. (Not a registered buffer:
        # DDP broadcasts buffers at start-up and Gloo cannot broadcast bool tensors.)
        causal = torch.ones(length, length, dtype=torch.bool, device=history.device).triu(1)
        for attn_norm, attn, ffn_norm, ffn in zip(self.attention_norms, self.attentions, self.forward_norms,
                                                  self.forwards):
            query = attn_norm(x)
            out, _ = attn(query, x, x, attn_mask=causal, need_weights=False)
            x = ffn(ffn_norm(query + out)) * keep
        return self.last_norm(x)

    def forward(self, history, positives, negatives):
        """Logits of the true next items and of the sampled negatives, [B, L] each."""
        h = self.features(history)
        return (h * self.item_emb(positives)).sum(-1), (h * self.item_emb(negatives)).sum(-1)

    def score(self, history, candidates):
        """[B, L] histories, [B, C] candidate items -> [B, C] scores from the last position."""
        return torch.einsum("bh,bch->bc", self.features(history)[:, -1, :], self.item_emb(candidates))


def sample_negatives(positives, history, num_items, generator):
    """One unseen item per position: redraws the few that hit the row's own items."""
    negatives = torch.randint(1, num_items + 1, positives.shape, generator=generator)
    for _ in range(NEGATIVE_REDRAWS):
        collides = (negatives.unsqueeze(2) == history.unsqueeze(1)).any(2) | (negatives == positives)
        if not collides.any():
            break
        redraw = torch.randint(1, num_items + 1, positives.shape, generator=generator)
        negatives = torch.where(collides, redraw, negatives)
    return negatives


@torch.no_grad()
def evaluate(model, sequences, num_items, maxlen, rank, world, seed, batch, device, limit=None):
    """HR@10 and NDCG@10 of each user's held-out last item among 100 sampled unrated items; the users
    are split between the ranks and the sums all-reduced. `batch` users at a time (the training batch,
    so that the whole run's memory follows the plan's batch), the first `limit` of this rank's users."""
    model.eval()
    generator = torch.Generator()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # hits, ndcg, users
    mine = list(range(rank, len(sequences), world))[:limit]
    for start in range(0, len(mine), batch):
        users = mine[start:start + batch]
        histories, candidates = [], []
        for u in users:
            seq = sequences[u]
            generator.manual_seed(seed * 1_000_003 + u)  # the same negatives whatever the world size
            rated = set(seq)
            negatives = []
            while len(negatives) < TEST_NEGATIVES:
                for item in torch.randint(1, num_items + 1, (2 * TEST_NEGATIVES,), generator=generator).tolist():
                    if item not in rated and len(negatives) < TEST_NEGATIVES:
                        negatives.append(item)
                if len(rated) >= num_items:  # nothing unrated: rank against what there is
                    negatives += [seq[0]] * (TEST_NEGATIVES - len(negatives))
            histories.append(left_padded(seq[:-1], maxlen))
            candidates.append([seq[-1]] + negatives)
        scores = model.score(torch.tensor(histories, device=device), torch.tensor(candidates, device=device))
        rank_of_true = (scores[:, 1:] > scores[:, :1]).sum(1)  # 0 = ranked first
        hit = rank_of_true < 10
        totals[0] += hit.sum().item()
        totals[1] += (hit.double() / torch.log2(rank_of_true.double() + 2)).sum().item()
        totals[2] += len(users)
    model.train()
    dist.all_reduce(totals)
    return totals[0].item() / totals[2].item(), totals[1].item() / totals[2].item()


def train(run, args, device):
    """Trains (or resumes) to the end or to a stop request; returns the exit code."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    loaded = time.time()
    sequences, num_items = read_sequences(args.ratings)
    if len(sequences) == 0 or num_items < TEST_NEGATIVES + 1:
        fail(f"{args.ratings}: {len(sequences)} users with 3+ ratings of {num_items} items; "
             f"need some users and more than {TEST_NEGATIVES} items")
    # Training rows: everything but the held-out last item; input t predicts item t+1.
    histories = torch.tensor([left_padded(seq[:-2], args.maxlen) for seq in sequences])
    targets = torch.tensor([left_padded(seq[1:-1], args.maxlen) for seq in sequences])
    loaded = time.time() - loaded

    batch, accum = args.batch_size, max(1, args.grad_accum_steps)
    lr = run.lr if run.lr is not None else args.lr
    max_steps = run.max_steps or args.max_steps or None
    global_batch = batch * accum * world
    steps_per_epoch = len(sequences) // global_batch
    if steps_per_epoch == 0:
        fail(f"{len(sequences)} users are fewer than one global batch of {global_batch}")
    total_steps = steps_per_epoch * args.epochs
    if max_steps:
        total_steps = max_steps if run.probe else min(total_steps, max_steps)

    sampler = DistributedSampler(range(len(sequences)), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(range(len(sequences)), batch_size=batch, sampler=sampler)
    model = SASRec(num_items, args.maxlen, args.hidden_units, args.num_blocks, args.num_heads, args.dropout_rate)
    model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=lr, betas=(0.9, 0.98))
    # --use_amp as SASRec.pytorch's: float16 and a loss scaler on a GPU; bfloat16, which needs none, on
    # the CPU. The spec's precision (FITRUN_PRECISION) asks the same.
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)
    if args.use_amp:
        amp = torch.float16 if device.type == "cuda" else torch.bfloat16
    if amp is torch.float16 and device.type != "cuda":
        fail("float16 autocast needs a GPU; use bf16 on the CPU")
    scaler = None
    if amp is torch.float16:
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    amp_note = {torch.float16: " (float16 autocast)", torch.bfloat16: " (bfloat16 autocast)"}.get(amp, "")

    step, epoch, samples_in_epoch = 0, 0, 0
    if not run.probe:
        state, saved_step = run.load_latest_checkpoint()
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            for group in optimizer.param_groups:
                group["lr"] = lr  # this attempt's plan may scale it differently
            step, epoch, samples_in_epoch = saved_step, state["epoch"], state["samples_in_epoch"]

    def save(at_step, at_epoch, at_samples):
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": at_epoch,
                             "samples_in_epoch": at_samples, "num_items": num_items, "args": vars(args)}, at_step)

    if rank == 0:
        print(f"sasrec: {len(sequences)} users, {num_items} items, {sum(map(len, sequences))} ratings from "
              f"{args.ratings} in {loaded:.1f}s; {world} rank(s) x batch {batch} x {accum} accumulation = "
              f"{global_batch} users per step, lr {lr:g}, {total_steps} steps on {device}{amp_note}"
              f"{f' (resuming at step {step})' if step else ''}{' [memory probe]' if run.probe else ''}", flush=True)

    negatives_rng = torch.Generator()
    epoch_samples = steps_per_epoch * global_batch
    step_epoch = epoch + 1 if samples_in_epoch else max(epoch, 1)
    running = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, micro-batches since the last report
    samples_since_report, started = 0, time.time()
    loss_value = None  # the training loss last reported
    while step < total_steps:
        sampler.set_epoch(epoch)
        negatives_rng.manual_seed(args.seed * 1_000_003 + epoch * 1009 + rank)
        users = iter(loader)
        # Resuming mid-epoch: the global batch is the plan's invariant, so the users already trained on
        # are the first samples_in_epoch of this epoch's order whatever the number of ranks now.
        for _ in range(samples_in_epoch // (batch * world)):
            next(users)
        while samples_in_epoch + global_batch <= epoch_samples and step < total_steps:
            for micro in range(accum):
                rows = next(users)
                history, positives = histories[rows], targets[rows]
                negatives = sample_negatives(positives, history, num_items, negatives_rng)
                history, positives, negatives = (t.to(device) for t in (history, positives, negatives))
                sync = contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync()
                with sync:
                    with torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext():
                        pos_logits, neg_logits = ddp(history, positives, negatives)
                        real = positives != 0
                        loss = (F.binary_cross_entropy_with_logits(pos_logits[real], torch.ones_like(pos_logits[real]))
                                + F.binary_cross_entropy_with_logits(neg_logits[real], torch.zeros_like(neg_logits[real])))
                        if args.l2_emb:
                            loss = loss + args.l2_emb * model.item_emb.weight.pow(2).sum()
                    objective = loss / accum
                    (scaler.scale(objective) if scaler else objective).backward()
                running += torch.tensor([loss.item(), 1.0], dtype=torch.float64, device=device)
                samples_since_report += len(rows)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            samples_in_epoch += global_batch
            step_epoch = epoch + 1

            if step % args.log_every == 0 or step == total_steps:
                dist.all_reduce(running)  # every rank's mean loss since the last report
                loss_value = running[0].item() / running[1].item()
                run.report(step, loss=loss_value, samples=samples_since_report, total_steps=total_steps,
                           epoch=step_epoch)
                if rank == 0:
                    print(f"step {step}/{total_steps} epoch {step_epoch} loss {loss_value:.4f}", flush=True)
                running.zero_()
                samples_since_report = 0
            if not run.probe and args.checkpoint_every and step % args.checkpoint_every == 0 and step < total_steps:
                save(step, epoch, samples_in_epoch)

            # A stop request reaches each rank on its own; they agree on it so none waits in a collective.
            stop = torch.tensor([1.0 if run.should_stop() else 0.0], device=device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                save(step, epoch, samples_in_epoch)
                if rank == 0:
                    print(f"stopping at step {step} as asked; checkpoint saved", flush=True)
                return EXIT_STOPPED
        if samples_in_epoch + global_batch > epoch_samples:  # the epoch is done
            epoch, samples_in_epoch = epoch + 1, 0

    if run.probe:
        # One evaluation batch, so that fitrund's memory probe measures what a real run does.
        evaluate(model, sequences, num_items, args.maxlen, rank, world, args.seed, batch, device, limit=batch)
    else:
        save(step, epoch, samples_in_epoch)
        hr, ndcg = evaluate(model, sequences, num_items, args.maxlen, rank, world, args.seed, batch, device)
        if rank == 0:
            run.report(step, loss=loss_value, total_steps=total_steps, epoch=step_epoch,
                       metrics={"hr@10": hr, "ndcg@10": ndcg})
            print(f"done: {step} steps in {time.time() - started:.1f}s; held-out last items: "
                  f"HR@10 {hr:.4f}, NDCG@10 {ndcg:.4f} ({TEST_NEGATIVES} sampled negatives each)", flush=True)
    return 0


def main():
    run = fitrun.init()
    args = parse_args(run)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = pick_device()
    init_distributed(device)
    code = train(run, args, device)
    # train's DistributedDataParallel is gone by now, so the process group is torn down here, with the
    # GIL released. Left to DDP's reducer (when it holds the last reference) torch 1.13 tears the group
    # down holding the GIL, which can deadlock with a Gloo thread freeing a collective's tensor.
    gc.collect()
    dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
