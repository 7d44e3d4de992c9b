"""FashionNet in PyTorch, the twin of towerlab's models::fashion_net() (models/fashion_net.cpp).

A state_dict of this module converts to a towerlab checkpoint and back with
tools/torch_convert.py. Batch norm uses towerlab's constants, which are
TensorFlow's: eps=1e-3 (PyTorch's default is 1e-5, and a model trained with
another eps predicts differently in towerlab) and momentum=0.01 (PyTorch's
momentum is the weight of the NEW value; towerlab's 0.99 is the weight of the
old one). Input [N,1,28,28] standardized as towerlab's loader does
((x/255 - 0.2860) / 0.3530), output logits [N,10].
"""

import torch
from torch import nn

BN_EPS = 1e-3
BN_MOMENTUM = 0.01


class FashionNet(nn.Module):
    # conv_bias=True gives the convolutions PyTorch's usual bias; the converter folds
    # it into the following batch norm's moving mean (towerlab's convolutions have none).
    def __init__(self, conv_bias=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=conv_bias)
        self.bn1 = nn.BatchNorm2d(32, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=conv_bias)
        self.bn2 = nn.BatchNorm2d(64, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))  # [N,64,7,7] -> [N,3136], C,H,W order
        return self.fc2(x)
