"""The classic architecture families, written in torch with a size knob (the tests build them small, the benchmarks
at their published size): each builder returns an eval-mode nn.Module with random weights and random batch-norm
statistics, so a frontend that drops or misplaces a normalisation shows.

Every family keeps the ops that make it what it is: Inception's LRN and branch concat, ResNet's residual sums,
DenseNet's growing concat, ShuffleNet's channel shuffle (reshape, transpose, reshape), SqueezeNet's fire modules,
MobileNetV2's inverted residuals with relu6, MobileNetV3's hard-swish and squeeze-excite, EfficientNet-B0's
SiLU MBConv blocks, and a vision transformer block (LayerNorm, multi-head attention, GELU MLP).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

IMAGE = (3, 224, 224)  # the published input size of every family


def _randomize(model: nn.Module, seed: int) -> nn.Module:
    """Random weights and batch-norm statistics, in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
    return model.eval()


def conv_bn(c_in: int, c_out: int, kernel: int = 3, stride: int = 1, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(c_out)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# ---------------------------------------------------------------- VGG


def vgg(width: int = 8, blocks: tuple[int, ...] = (1, 1, 2), classes: int = 10, hidden: int = 32,
        pooled: int = 2) -> nn.Module:
    layers: list[nn.Module] = []
    c_in = 3
    for index, count in enumerate(blocks):
        c_out = width * 2 ** index
        for _ in range(count):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
            c_in = c_out
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(pooled), nn.Flatten(),
                         nn.Linear(c_in * pooled * pooled, hidden), nn.ReLU(), nn.Dropout(),
                         nn.Linear(hidden, classes))


# ---------------------------------------------------------------- Inception (v1: LRN and four-branch concat)


class _LocalResponseNorm(torch.autograd.Function):
    """F.local_response_norm that torch.onnx writes as one LRN node, as the published Inception files have it
    (its own export spells LRN out in Pow, a 3-D AveragePool and Div)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, size: int, alpha: float, beta: float, k: float) -> torch.Tensor:
        return nn.functional.local_response_norm(x, size, alpha, beta, k)

    @staticmethod
    def symbolic(g: object, x: object, size: int, alpha: float, beta: float, k: float) -> object:
        return g.op("LRN", x, size_i=size, alpha_f=alpha, beta_f=beta, bias_f=k)  # type: ignore[attr-defined]


class LocalResponseNorm(nn.LocalResponseNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return _LocalResponseNorm.apply(x, self.size, self.alpha, self.beta, self.k)
        return super().forward(x)


class InceptionBlock(nn.Module):
    def __init__(self, c_in: int, c1: int, c3: int, c5: int, pool: int):
        super().__init__()
        self.b1 = nn.Sequential(nn.Conv2d(c_in, c1, 1), nn.ReLU())
        self.b3 = nn.Sequential(nn.Conv2d(c_in, c3, 1), nn.ReLU(), nn.Conv2d(c3, c3, 3, padding=1), nn.ReLU())
        self.b5 = nn.Sequential(nn.Conv2d(c_in, c5, 1), nn.ReLU(), nn.Conv2d(c5, c5, 5, padding=2), nn.ReLU())
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c_in, pool, 1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)


def inception(width: int = 8, blocks: int = 2, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1, ceil_mode=True),
                               LocalResponseNorm(5, 1e-4, 0.75, 1.0)]
    c_in = width
    for _ in range(blocks):
        layers.append(InceptionBlock(c_in, width, width, width // 2, width // 2))
        c_in = width * 3
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(c_in, classes))


# ---------------------------------------------------------------- ResNet


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int, expansion: int = 4):
        super().__init__()
        c_out = width * expansion
        self.body = nn.Sequential(conv_bn(c_in, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, c_out, 1, act=None))
        self.shortcut = (nn.Identity() if stride == 1 and c_in == c_out
                         else conv_bn(c_in, c_out, 1, stride, act=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(width: int = 8, stages: tuple[int, ...] = (1, 1, 1), classes: int = 10) -> nn.Module:
    """ResNet with bottlenecks; width=64, stages=(3, 4, 6, 3) is ResNet-50."""
    layers: list[nn.Module] = [conv_bn(3, width, 7, 2), nn.MaxPool2d(3, 2, 1)]
    c_in = width
    for index, count in enumerate(stages):
        planes = width * 2 ** index
        for block in range(count):
            layers.append(Bottleneck(c_in, planes, 2 if block == 0 and index > 0 else 1))
            c_in = planes * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))


# ---------------------------------------------------------------- DenseNet


class DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                  nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


def densenet(growth: int = 4, blocks: tuple[int, ...] = (2, 2), classes: int = 10) -> nn.Module:
    """DenseNet-BC; growth=32, blocks=(6, 12, 24, 16) is DenseNet-121."""
    c = 2 * growth
    layers: list[nn.Module] = [conv_bn(3, c, 7, 2), nn.MaxPool2d(3, 2, 1)]
    for index, count in enumerate(blocks):
        for _ in range(count):
            layers.append(DenseLayer(c, growth))
            c += growth
        if index < len(blocks) - 1:
            layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
            c //= 2
    return nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(c, classes))


# ---------------------------------------------------------------- ShuffleNet v2


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch, channels, height, width = x.shape
    x = x.view(batch, groups, channels // groups, height, width).transpose(1, 2).contiguous()
    return x.view(batch, channels, height, width)


class ShuffleUnit(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.stride = stride
        half = c_out // 2
        if stride > 1:
            self.left = nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in, act=None), conv_bn(c_in, half, 1))
        right_in = c_in if stride > 1 else half
        self.right = nn.Sequential(conv_bn(right_in, half, 1), conv_bn(half, half, 3, stride, groups=half, act=None),
                                   conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            left, right = x.chunk(2, dim=1)
            out = torch.cat([left, self.right(right)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        return channel_shuffle(out, 2)


def shufflenet(width: int = 8, stages: tuple[int, ...] = (2, 2), classes: int = 10, stem: int = 8,
               head: int | None = None) -> nn.Module:
    """ShuffleNet v2; width=116, stages=(4, 8, 4), stem=24, head=1024 is the 1.0x model (head None: 4x the last
    stage's width)."""
    layers: list[nn.Module] = [conv_bn(3, stem, 3, 2), nn.MaxPool2d(3, 2, 1)]
    c_in = stem
    for index, count in enumerate(stages):
        c_out = width * 2 ** index
        for unit in range(count):
            layers.append(ShuffleUnit(c_in, c_out, 2 if unit == 0 else 1))
            c_in = c_out
    head = head or 4 * c_in
    return nn.Sequential(*layers, conv_bn(c_in, head, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(head, classes))


# ---------------------------------------------------------------- SqueezeNet


class Fire(nn.Module):
    def __init__(self, c_in: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(c_in, squeeze, 1), nn.ReLU())
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.expand1(x), self.expand3(x)], 1)


def squeezenet(width: int = 8, fires: int = 2, classes: int = 10) -> nn.Module:
    """SqueezeNet 1.1; width=16, fires=8 is the published model (squeeze widths grow every two fires, a pool
    after the second and the fourth)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 4 * width, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True)]
    c_in = 4 * width
    for index in range(fires):
        squeeze = width * (1 + index // 2)
        layers.append(Fire(c_in, squeeze, 4 * squeeze))
        c_in = 8 * squeeze
        if index in (1, 3) and index < fires - 1:
            layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
    return nn.Sequential(*layers, nn.Dropout(0.5), nn.Conv2d(c_in, classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten())


# ---------------------------------------------------------------- MobileNetV2 / V3, EfficientNet-B0


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, gate: type[nn.Module], act: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.body = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, squeezed, 1), act(),
                                  nn.Conv2d(squeezed, channels, 1), gate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.body(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block; with `se` and hard-swish, MobileNetV3's; with SiLU and sigmoid SE, EfficientNet's MBConv."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int, kernel: int = 3,
                 act: type[nn.Module] = nn.ReLU6, se: SqueezeExcite | None = None):
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = [] if expand == 1 else [conv_bn(c_in, hidden, 1, act=act)]
        layers += [conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act)]
        if se is not None:
            layers.append(se)
        layers.append(conv_bn(hidden, c_out, 1, act=None))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


# (expand, c_out, repeats, stride, kernel) per stage
MOBILENET_V2 = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 32, 3, 2, 3), (6, 64, 4, 2, 3), (6, 96, 3, 1, 3),
                (6, 160, 3, 2, 3), (6, 320, 1, 1, 3))
EFFICIENTNET_B0 = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
                   (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))
SMALL = ((1, 8, 1, 1, 3), (4, 12, 2, 2, 3), (4, 16, 2, 2, 5))


def _inverted_net(stages: tuple[tuple[int, ...], ...], stem: int, head: int, classes: int, act: type[nn.Module],
                  se: Callable[[int], SqueezeExcite] | None) -> nn.Module:
    layers: list[nn.Module] = [conv_bn(3, stem, 3, 2, act=act)]
    c_in = stem
    for expand, c_out, repeats, stride, kernel in stages:
        for index in range(repeats):
            hidden = c_in * expand
            layers.append(InvertedResidual(c_in, c_out, stride if index == 0 else 1, expand, kernel, act,
                                           se(hidden) if se is not None else None))
            c_in = c_out
    return nn.Sequential(*layers, conv_bn(c_in, head, 1, act=act), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Dropout(0.2), nn.Linear(head, classes))


def mobilenet_v2(stages: tuple[tuple[int, ...], ...] = SMALL, stem: int = 8, head: int = 32,
                 classes: int = 10) -> nn.Module:
    return _inverted_net(stages, stem, head, classes, nn.ReLU6, None)


def mobilenet_v3(stages: tuple[tuple[int, ...], ...] = SMALL, stem: int = 8, head: int = 32,
                 classes: int = 10) -> nn.Module:
    """Hard-swish activations and hard-sigmoid squeeze-excite in every block (V3-Large's later stages)."""
    return _inverted_net(stages, stem, head, classes, nn.Hardswish,
                         lambda c: SqueezeExcite(c, max(8, c // 4), nn.Hardsigmoid))


def efficientnet_b0(stages: tuple[tuple[int, ...], ...] = SMALL, stem: int = 8, head: int = 32,
                    classes: int = 10) -> nn.Module:
    """SiLU (x * sigmoid(x)) MBConv blocks with sigmoid squeeze-excite; EFFICIENTNET_B0, 32, 1280 is B0."""
    return _inverted_net(stages, stem, head, classes, nn.SiLU,
                         lambda c: SqueezeExcite(c, max(4, c // 24), nn.Sigmoid, nn.SiLU))


# ---------------------------------------------------------------- a vision transformer block


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch embedding (a strided conv), transformer blocks, mean over tokens, a linear head."""

    def __init__(self, dim: int = 16, patch: int = 4, depth: int = 1, heads: int = 2, classes: int = 10):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads, 2 * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(tokens)).mean(1))


def vit(dim: int = 16, patch: int = 4, depth: int = 1, heads: int = 2, classes: int = 10) -> nn.Module:
    return ViT(dim, patch, depth, heads, classes)


# ---------------------------------------------------------------- the families


@dataclass(frozen=True)
class Family:
    name: str
    small: Callable[[], nn.Module]  # the tests' size
    full: Callable[[], nn.Module]   # the published size (bench/models.py)
    side: int                       # the tests' input side (the published one is 224)


FAMILIES = (
    Family("vgg", lambda: vgg(), lambda: vgg(64, (2, 2, 4, 4, 4), 1000, 4096, 7), 16),  # VGG-19
    Family("inception", lambda: inception(), lambda: inception(64, 9, 1000), 16),
    Family("resnet", lambda: resnet(), lambda: resnet(64, (3, 4, 6, 3), 1000), 32),  # ResNet-50
    Family("densenet", lambda: densenet(), lambda: densenet(32, (6, 12, 24, 16), 1000), 16),  # DenseNet-121
    Family("shufflenet", lambda: shufflenet(), lambda: shufflenet(116, (4, 8, 4), 1000, 24, 1024), 32),
    Family("squeezenet", lambda: squeezenet(), lambda: squeezenet(16, 8, 1000), 32),
    Family("mobilenet_v2", lambda: mobilenet_v2(), lambda: mobilenet_v2(MOBILENET_V2, 32, 1280, 1000), 16),
    Family("mobilenet_v3", lambda: mobilenet_v3(), lambda: mobilenet_v3(MOBILENET_V2, 16, 1280, 1000), 16),
    Family("efficientnet_b0", lambda: efficientnet_b0(),
           lambda: efficientnet_b0(EFFICIENTNET_B0, 32, 1280, 1000), 16),
    Family("vit", lambda: vit(), lambda: vit(192, 16, 12, 3, 1000), 16),  # ViT-Ti/16
)


def build(family: Family, full: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return _randomize((family.full if full else family.small)(), seed)


def family(name: str) -> Family:
    return next(family for family in FAMILIES if family.name == name)


def export_onnx(name: str, path: Path, seed: int = 0, fixed_batch: bool = False, opset: int = 17,
                image: tuple[int, ...] = IMAGE) -> Path:
    """The named family at its published size as an ONNX file, input "x" of shape (N, *image) (the published
    IMAGE unless asked), output "logits": a dynamic batch, or with `fixed_batch` the 1 published files fix
    (torch.onnx's TorchScript exporter)."""
    dynamic = None if fixed_batch else {"x": {0: "N"}, "logits": {0: "N"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(build(family(name), full=True, seed=seed), (torch.zeros(1, *image),), str(path),
                          input_names=["x"], output_names=["logits"], dynamic_axes=dynamic, opset_version=opset,
                          dynamo=False)
    return path
