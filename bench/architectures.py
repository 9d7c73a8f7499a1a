"""Real-size image classifiers in plain torch (no torchvision here), for the benchmarks.

ResNet-50, MobileNetV2, SqueezeNet 1.1, ShuffleNetV2 x1.0 and VGG-19 with the
layer shapes of their torchvision namesakes, random weights (a fixed seed) and
batch norm in eval mode, for 3x224x224 images. `export_onnx(name, path)` writes
one as ONNX (opset 17, dynamic batch) for dabuild's ONNX frontend and
onnxruntime to read the same file.

Usage: python bench/architectures.py   (prints each model's parameter count)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

IMAGE = (3, 224, 224)


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True,
            activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, activation()) if relu else nn.Sequential(*layers)


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(c_in, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, width * 4, 1, relu=False))
        self.skip = (nn.Identity() if stride == 1 and c_in == width * 4
                     else conv_bn(c_in, width * 4, 1, stride, relu=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            layers.append(Bottleneck(channels, width, stride if block == 0 else 1))
            channels = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        layers = [conv_bn(c_in, hidden, 1, activation=nn.ReLU6)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden, activation=nn.ReLU6),
                   conv_bn(hidden, c_out, 1, relu=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_v2(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, activation=nn.ReLU6)]
    channels = 32
    for expand, width, repeats, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for index in range(repeats):
            layers.append(InvertedResidual(channels, width, stride if index == 0 else 1, expand))
            channels = width
    return nn.Sequential(*layers, conv_bn(channels, 1280, 1, activation=nn.ReLU6), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(1280, classes))


class Fire(nn.Module):
    def __init__(self, c_in: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(c_in, squeeze, 1), nn.ReLU())
        self.left = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.right = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.left(x), self.right(x)], 1)


def squeezenet(classes: int = 1000) -> nn.Module:
    pool = nn.MaxPool2d(3, 2, ceil_mode=True)
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool, Fire(64, 16, 64), Fire(128, 16, 64), pool,
        Fire(128, 32, 128), Fire(256, 32, 128), pool, Fire(256, 48, 192), Fire(384, 48, 192),
        Fire(384, 64, 256), Fire(512, 64, 256), nn.Conv2d(512, classes, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())


def channel_shuffle(x: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        half = c_out // 2
        self.stride = stride
        if stride > 1:
            self.left = nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in, relu=False),
                                      conv_bn(c_in, half, 1))
        right_in = c_in if stride > 1 else half
        self.right = nn.Sequential(conv_bn(right_in, half, 1), conv_bn(half, half, 3, stride, groups=half, relu=False),
                                   conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            left, right = x.chunk(2, dim=1)
            out = torch.cat([left, self.right(right)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        return channel_shuffle(out)


def shufflenet_v2(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
    channels = 24
    for width, repeats in ((116, 4), (232, 8), (464, 4)):
        for index in range(repeats):
            layers.append(ShuffleUnit(channels, width, 2 if index == 0 else 1))
            channels = width
    return nn.Sequential(*layers, conv_bn(channels, 1024, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(1024, classes))


def vgg19(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for width, repeats in ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)):
        for _ in range(repeats):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
        layers.append(nn.MaxPool2d(2, 2))
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                         nn.ReLU(), nn.Linear(4096, classes))


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "squeezenet": squeezenet,
    "shufflenet_v2": shufflenet_v2, "vgg19": vgg19,
}


def build(name: str, seed: int = 0) -> nn.Module:
    """The named model with seeded random weights and non-trivial batch-norm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = ARCHITECTURES[name]()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.0)
                module.bias.uniform_(-0.1, 0.1)
    return model.eval()


def export_onnx(name: str, path: Path, seed: int = 0) -> Path:
    """The named model as an ONNX file (opset 17, input "x" of shape (N, 3, 224, 224), output "logits")."""
    model = build(name, seed)
    torch.onnx.export(model, (torch.zeros(1, *IMAGE),), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, opset_version=17, dynamo=False)
    return path


if __name__ == "__main__":
    for name in ARCHITECTURES:
        print(f"{name:<14} {sum(p.numel() for p in build(name).parameters()) / 1e6:6.2f} M parameters")
