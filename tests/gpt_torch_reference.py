"""The chapter 14 GPT written in PyTorch (as nanoGPT writes it), loaded with our weights.

Used by the gradient and AdamW parity tests (tests/test_gpt*.py) and by the training-step
benchmark (benchmarks/gpt_train_step_vs_torch.py). PyTorch stores a Linear's weight as
(d_out, d_in); ours are (d_in, d_out), so every matrix is transposed on the way in and the
gradients on the way out.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class TorchBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, activation: str = "gelu"):
        super().__init__()
        self.num_heads = num_heads
        # GPT-2's tanh approximation is F.gelu(approximate="tanh"); "gelu" is the exact form.
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def attention(self, x):
        B, T, C = x.shape
        H = self.num_heads
        q, k, v = (proj(x).view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d_head)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d_head)
        return self.o(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x)), approximate=self.approximate))


class TorchGPT(nn.Module):
    def __init__(self, vocab_size, context_len, d_model, num_heads, d_ff, num_layers,
                 activation="gelu"):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Parameter(torch.zeros(context_len, d_model))
        self.blocks = nn.ModuleList(TorchBlock(d_model, num_heads, d_ff, activation)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):
        x = self.embedding(ids) + self.positions[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def torch_names(num_layers: int) -> dict[str, tuple[str, bool]]:
    """Our parameter name -> (PyTorch parameter name, transposed?)."""
    names = {"embedding": ("embedding.weight", False), "positions": ("positions", False),
             "norm.gamma": ("norm.weight", False), "norm.beta": ("norm.bias", False),
             "W_out": ("head.weight", True)}
    for i in range(num_layers):
        ours, theirs = f"blocks.{i}.", f"blocks.{i}."
        for part in "qkvo":
            names[f"{ours}self_attn.W_{part}"] = (f"{theirs}{part}.weight", True)
            names[f"{ours}self_attn.b_{part}"] = (f"{theirs}{part}.bias", False)
        for n in "12":
            names[f"{ours}ff.W{n}"] = (f"{theirs}ff{n}.weight", True)
            names[f"{ours}ff.b{n}"] = (f"{theirs}ff{n}.bias", False)
            names[f"{ours}norm{n}.gamma"] = (f"{theirs}norm{n}.weight", False)
            names[f"{ours}norm{n}.beta"] = (f"{theirs}norm{n}.bias", False)
    return names


def torch_gpt_from(model) -> tuple[TorchGPT, dict[str, tuple[str, bool]]]:
    """A TorchGPT with a copy of ``model``'s weights (in ``model``'s dtype), and the name map."""
    config = model.config()
    dtype = torch.float64 if model.embedding.dtype == np.float64 else torch.float32
    reference = TorchGPT(config["vocab_size"], config["context_len"], config["d_model"],
                         config["num_heads"], config["d_ff"], config["num_layers"],
                         config.get("activation", "gelu")).to(dtype)
    names = torch_names(config["num_layers"])
    theirs = dict(reference.named_parameters())
    ours = model.parameters()
    assert set(names) == set(ours) and {n for n, _ in names.values()} == set(theirs)
    with torch.no_grad():
        for name, (torch_name, transposed) in names.items():
            value = ours[name].T if transposed else ours[name]
            theirs[torch_name].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return reference, names


def torch_grads(reference, names) -> dict[str, np.ndarray]:
    """The reference's .grad of every parameter, under our names and in our layout."""
    theirs = dict(reference.named_parameters())
    grads = {}
    for name, (torch_name, transposed) in names.items():
        grad = theirs[torch_name].grad.numpy()
        grads[name] = grad.T if transposed else grad
    return grads
