"""ResNet-20 for 28x28 images in PyTorch, the twin of towerlab's models::resnet()
(models/resnet.h has the architecture).

Module names follow towerlab's variable names with '.' for '/', so the state_dict
converts with tools/torch_convert.py --model resnet: stage2.block1.conv1.weight is
stage2/block1/conv1/weight, stage2.block1.shortcut.bn.running_mean is
stage2/block1/shortcut/bn/moving_mean. Batch norm uses towerlab's constants, as
tools/fashion_net_torch.py does (eps=1e-3; momentum=0.01 is towerlab's 0.99).
Convolutions and the linear layer start from PyTorch's default initialization (uniform
in +-1/sqrt(fan_in), the linear bias too), not towerlab's He normal, whose weights are
about 2.4 times wider: with batch norm and Adam the narrower start trains to a higher
accuracy in the same recipe (docs/models.md); bench/models_accuracy.py --init twin
starts towerlab from these weights.
Input [N,1,28,28], output logits [N,10].
"""

from torch import nn

from fashion_net_torch import BN_EPS, BN_MOMENTUM


def batch_norm(channels):
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class ConvBn(nn.Module):
    """conv (no bias) then batch norm: the stem and a projection shortcut."""

    def __init__(self, n_in, n_out, kernel, stride):
        super().__init__()
        self.conv = nn.Conv2d(n_in, n_out, kernel, stride, kernel // 2, bias=False)
        self.bn = batch_norm(n_out)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, n_in, n_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(n_in, n_out, 3, stride, 1, bias=False)
        self.bn1 = batch_norm(n_out)
        self.conv2 = nn.Conv2d(n_out, n_out, 3, 1, 1, bias=False)
        self.bn2 = batch_norm(n_out)
        self.shortcut = ConvBn(n_in, n_out, 1, stride) if stride != 1 or n_in != n_out else None

    def forward(self, x):
        y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (y + (self.shortcut(x) if self.shortcut is not None else x)).relu()


class ResNet(nn.Module):
    def __init__(self, in_channels=1, width=16, blocks_per_stage=3, classes=10):
        super().__init__()
        self.stem = ConvBn(in_channels, width, 3, 1)
        self.stages = []
        channels = width
        for s in range(1, 4):
            stage = nn.Module()
            out = width << (s - 1)
            for b in range(1, blocks_per_stage + 1):
                stride = 2 if s > 1 and b == 1 else 1
                stage.add_module(f"block{b}", BasicBlock(channels, out, stride))
                channels = out
            self.add_module(f"stage{s}", stage)
            self.stages.append(stage)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x).relu()
        for stage in self.stages:
            for block in stage.children():
                x = block(x)
        return self.fc(x.mean((2, 3)))
