"""The small vision transformer in PyTorch, the twin of towerlab's models::vit()
(models/vit.h has the architecture).

Module names follow towerlab's variable names with '.' for '/', so the state_dict
converts with tools/torch_convert.py --model vit: block1.attn.q.weight is
block1/attn/q/weight, patch.position is patch/position; a layer norm's weight and
bias are towerlab's gamma and beta (block1.ln1.weight is block1/ln1/gamma). Each
step is the one towerlab takes, in its order: the patches' convolution, the learned
positions, pre-norm blocks whose attention scales q by 1/sqrt(E) before q k^T, GELU
(erf), a final layer norm, the mean over the tokens and the head. Dropout draws other
masks than towerlab's (counter-based, keyed by the sample): with dropout 0 (or in
eval mode) the two compute the same function. Input [N,1,28,28], output logits [N,10].
"""

import math

import torch
from torch import nn
import torch.nn.functional as F


class PatchEmbedding(nn.Module):
    def __init__(self, image, in_channels, patch, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, in_channels, patch, patch))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.position = nn.Parameter(torch.empty((image // patch) ** 2, dim))
        nn.init.kaiming_normal_(self.weight, nonlinearity="relu")  # towerlab's He normal
        nn.init.normal_(self.position, std=0.02)
        self.patch = patch

    def forward(self, x):
        x = F.conv2d(x, self.weight, self.bias, stride=self.patch)  # [N,D,I/P,I/P]
        return x.flatten(2).transpose(1, 2) + self.position  # [N,T,D]


class Attention(nn.Module):
    def __init__(self, dim, heads, attention_dropout):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.heads = heads
        self.dropout = nn.Dropout(attention_dropout)

    def split(self, x):  # [N,T,D] -> [N,H,T,E]
        n, t, d = x.shape
        return x.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x):
        n, t, d = x.shape
        q = self.split(self.q(x) * (1.0 / math.sqrt(d // self.heads)))
        p = self.dropout(torch.softmax(q @ self.split(self.k(x)).transpose(-1, -2), dim=-1))
        return self.out((p @ self.split(self.v(x))).transpose(1, 2).reshape(n, t, d))


class Mlp(nn.Module):
    def __init__(self, dim, hidden, dropout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio, dropout, attention_dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, attention_dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_ratio * dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.attn(self.ln1(x)))
        return x + self.dropout(self.mlp(self.ln2(x)))


class ViT(nn.Module):
    def __init__(self, image=28, in_channels=1, patch=4, dim=64, heads=4, blocks=4, mlp_ratio=2,
                 classes=10, dropout=0.1, attention_dropout=0.0):
        super().__init__()
        self.patch = PatchEmbedding(image, in_channels, patch, dim)
        self.blocks = []
        for b in range(1, blocks + 1):
            block = Block(dim, heads, mlp_ratio, dropout, attention_dropout)
            self.add_module(f"block{b}", block)
            self.blocks.append(block)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.dropout = nn.Dropout(dropout)
        for module in self.modules():  # towerlab's Linear: He normal weights, zero biases
            if isinstance(module, nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def forward(self, x):
        x = self.dropout(self.patch(x))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x).mean(1))
