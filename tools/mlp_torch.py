"""The MLP in PyTorch, the twin of towerlab's models::mlp() (models/mlp.cpp).

Flatten, then per hidden layer Linear + ReLU + Dropout, then Linear to the logits:
784-512-256-10 with dropout 0.2 by default. Its state_dict converts to a towerlab
checkpoint and back with tools/torch_convert.py --model mlp (fc1.weight is
fc1/weight, ...). Dropout draws other masks than towerlab's (counter-based, keyed by
the sample), so the two train alike only in distribution; with dropout 0 (or in
eval mode) they compute the same function. The weights start from PyTorch's default
initialization (uniform in +-1/sqrt(fan_in)), not towerlab's He normal. Input
[N,1,28,28] standardized as towerlab's loader does, output logits [N,10].
"""

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, inputs=784, hidden=(512, 256), classes=10, dropout=0.2):
        super().__init__()
        sizes = [inputs, *hidden]
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
            self.add_module(f"fc{i}", nn.Linear(n_in, n_out))
        self.add_module(f"fc{len(hidden) + 1}", nn.Linear(sizes[-1], classes))
        self.hidden = len(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = torch.flatten(x, 1)
        for i in range(1, self.hidden + 1):
            x = self.dropout(torch.relu(getattr(self, f"fc{i}")(x)))
        return getattr(self, f"fc{self.hidden + 1}")(x)
