#!/usr/bin/python3
"""Writes the tensors examples: TorchScript models and the torch.save'd tensors they train on.

    /usr/bin/python3 tools/make_tensor_examples.py [OUT_DIR]     # default deploy/examples/tensors

fitrun-worker trains them in C++ (spec.model.torchscript on spec.data.kind: tensors); see
deploy/examples/tensors/*.yaml. Everything is written from a fixed seed, so the files are the same on
every run (and are not committed: run this first).

protein/   A masked-residue protein language model (BERT-style) on the 630 real globin sequences
           shipped with the protein script example (deploy/examples/scripts/protein/globins630.fa,
           GPL-2.0-or-later, see its README). tokens [N, 128] int64 and target [N, 128] int64: 15% of
           each sequence's residues chosen once (80% [MASK], 10% a random residue, 10% unchanged),
           -100 everywhere else, so loss: {kind: cross_entropy, ignore_index: -100}. Every 10th
           sequence is the test file. The model returns logits [N, 128, 23], the classes last.
regression/ A regression with loss: mse on synthetic data: 8 features, y = sum(w * x) + sin(3 x0)
           + 0.1 noise; 4096 samples, the last tenth the test split (test_fraction).
"""
import os
import sys
import warnings

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASTA = os.path.join(ROOT, "deploy", "examples", "scripts", "protein", "globins630.fa")

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PAD, MASK, UNKNOWN = 0, 1, 2
FIRST_RESIDUE = 3
VOCAB = FIRST_RESIDUE + len(AMINO_ACIDS)
IGNORE = -100
MAX_LEN = 128


def read_fasta(path):
    sequences, current = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                if current:
                    sequences.append("".join(current))
                current = []
            elif line:
                current.append(line.upper())
    if current:
        sequences.append("".join(current))
    return sequences


def encode(sequence):
    return [FIRST_RESIDUE + AMINO_ACIDS.index(c) if c in AMINO_ACIDS else UNKNOWN for c in sequence[:MAX_LEN]]


def masked(sequences, generator):
    """tokens with 15% of residues chosen (80/10/10), and the originals at the chosen positions."""
    tokens = torch.full((len(sequences), MAX_LEN), PAD, dtype=torch.long)
    for i, s in enumerate(sequences):
        codes = encode(s)
        tokens[i, :len(codes)] = torch.tensor(codes)
    residues = tokens != PAD
    chosen = (torch.rand(tokens.shape, generator=generator) < 0.15) & residues
    target = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE))
    inputs = tokens.clone()
    roll = torch.rand(tokens.shape, generator=generator)
    inputs[chosen & (roll < 0.8)] = MASK
    replace = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[replace] = torch.randint(FIRST_RESIDUE, VOCAB, (int(replace.sum()),), generator=generator)
    return inputs, target


class ProteinEncoder(nn.Module):
    """A small transformer encoder over residues: embeddings and learned positions, 2 pre-LayerNorm
    layers (width 64, 4 heads), a linear head to the residue vocabulary. No dropout, so a seed gives
    one run."""

    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.positions = nn.Embedding(MAX_LEN, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0)
        x = self.tokens(tokens) + self.positions(positions)
        x = self.encoder(x, src_key_padding_mask=tokens == 0)  # PAD (TorchScript takes no globals)
        return self.head(self.norm(x))


class Regressor(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def write_protein(out):
    os.makedirs(out, exist_ok=True)
    sequences = read_fasta(FASTA)
    generator = torch.Generator().manual_seed(7)
    train = [s for i, s in enumerate(sequences) if i % 10 != 0]
    test = [s for i, s in enumerate(sequences) if i % 10 == 0]
    for name, split in (("train.pt", train), ("test.pt", test)):
        tokens, target = masked(split, generator)
        torch.save({"tokens": tokens, "target": target}, os.path.join(out, name))
    torch.manual_seed(0)
    torch.jit.script(ProteinEncoder()).save(os.path.join(out, "model.pt"))
    return len(train), len(test)


def write_regression(out):
    os.makedirs(out, exist_ok=True)
    generator = torch.Generator().manual_seed(11)
    n, features = 4096, 8
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, generator=generator)
    y = x @ w + torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(n, generator=generator)
    torch.save({"features": x, "target": y}, os.path.join(out, "data.pt"))
    torch.manual_seed(0)
    torch.jit.script(Regressor(features)).save(os.path.join(out, "model.pt"))
    return n


def main():
    # torch 1.13 warns about an unused constant of nn.TransformerEncoderLayer when scripting it.
    warnings.filterwarnings("ignore", message="'batch_first' was found in ScriptModule constants")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "deploy", "examples", "tensors")
    train, test = write_protein(os.path.join(out, "protein"))
    samples = write_regression(os.path.join(out, "regression"))
    print(f"make_tensor_examples: {out}/protein ({train} training and {test} test sequences), "
          f"{out}/regression ({samples} samples)")


if __name__ == "__main__":
    main()
