"""The torch frontend: small nets built here, traced with torch.export (or torch.fx), run by dabuild's interpreter.

Every traced graph must compute what torch computes (atol 1e-4) for several
batch sizes, as traced and after the canonical passes; errors must name what
went wrong and where.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from dabuild.errors import BuildError, UsageError  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.trace import load_model, trace_model  # noqa: E402
from dabuild.trace.base import choose_framework  # noqa: E402

BATCHES = (1, 3, 8)
ATOL = 1e-4


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random parameters and batch-norm statistics far from the defaults, then eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) - 0.5)
        for layer in module.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                layer.running_var.uniform_(0.5, 2.0, generator=generator)
    return module.eval()


def assert_matches_torch(model: nn.Module, inputs: dict[str, list[int | None]]) -> Graph:
    """Trace `model`; the raw and optimised graphs must agree with torch on random inputs of several batch sizes."""
    graph = trace_model(model, inputs=inputs)
    assert all(spec.shape[0] is None for spec in graph.inputs), "the batch axis must stay dynamic"
    optimized = optimize(graph)
    rng = np.random.default_rng(1)
    for batch in BATCHES:
        feeds = {name: rng.standard_normal((batch, *shape[1:])).astype(np.float32) for name, shape in inputs.items()}
        with torch.no_grad():
            expected = model(*(torch.from_numpy(array) for array in feeds.values()))
        expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        for candidate in (graph, optimized):
            outputs = run(candidate, feeds)
            for name, want in zip(candidate.outputs, expected_list):
                np.testing.assert_allclose(outputs[name], want.numpy(), atol=ATOL, rtol=0)
    return optimized


def ops(graph: Graph) -> set[str]:
    return {node.op for node in graph.nodes}


# ---------------------------------------------------------------- models


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class Residual(nn.Module):
    """A ResNet basic block with a strided 1x1 projection on the shortcut."""

    def __init__(self, channels: int = 4, out: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.project = nn.Sequential(nn.Conv2d(channels, out, 1, stride=2, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.project(x))


class DepthwiseSeparable(nn.Module):
    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, 12, 1)
        self.bn = nn.BatchNorm2d(12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.bn(self.pointwise(F.relu6(self.depthwise(x)))))


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, stride=2, dilation=2, padding=2)
        self.same = nn.Conv1d(4, 4, 4, padding="same")
        self.pool = nn.AvgPool1d(2)
        self.adaptive = nn.AdaptiveAvgPool1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adaptive(self.pool(F.leaky_relu(self.same(torch.tanh(self.conv(x))), 0.1)))


class Activations(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y = F.hardswish(y) + F.gelu(y) + F.gelu(y, approximate="tanh") + F.leaky_relu(y, 0.2)
        y = y + F.hardsigmoid(y) + torch.sigmoid(y) + F.hardtanh(y, -0.5, 0.5) + torch.clamp(y, max=0.3)
        return torch.softmax(y, dim=-1)


class CatSplit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.split(x, [1, 3], dim=1)
        c, d = torch.chunk(self.conv(x), 2, dim=1)
        y = torch.cat([b, c * d, a], dim=1)[:, 1:6, ::2]
        y = y.permute(0, 2, 3, 1).transpose(1, 2).reshape(y.shape[0], -1)
        return y[:, 3] .unsqueeze(1) - y.sum(dim=1, keepdim=True) / 4 + y.amax(-1).unsqueeze(-1) * y.mean(-1, True)


class Pools(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.avg_pool2d(x, 3, stride=2, padding=1)  # count_include_pad=True, torch's default
        b = F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)
        c = F.max_pool2d(F.pad(x, (1, 0, 0, 1), value=-2.0), 3, stride=2, ceil_mode=True)[:, :, :4, :4]
        d = F.adaptive_avg_pool2d(x, 4)
        return torch.cat([a, b, c, d], dim=1).unsqueeze(2).squeeze(2) * 2 + 1


class Attention(nn.Module):
    """Products of two computed tensors, indexing, padding modes and scalar arithmetic on either side."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 5, 6)
        scores = torch.softmax(self.query(x) @ self.key(x).transpose(-1, -2) / 2.0, dim=1)  # (N, 5, 5)
        mixed = torch.bmm(scores, x)  # (N, 5, 6)
        first = -mixed[:, 0] + (1 - mixed[:, -1])  # select, neg, rsub
        padded = F.pad(mixed.unsqueeze(1), (1, 2, 2, 1), mode="reflect") + F.pad(mixed.unsqueeze(1), (1, 2, 2, 1), mode="replicate")
        return first.unsqueeze(1) * torch.clamp(padded.mean(dim=(1, 2)), 0.0, 6.0)[:, None, :6]


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(4, 5), nn.Linear(3, 5)

    def forward(self, image: torch.Tensor, meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joined = self.left(image) - self.right(meta)
        return joined, -joined[:, :2]


class BoundedBatch(nn.Module):
    """export rejects the dynamic batch (the assert bounds it); fx records the assert as a call and goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.shape[0] <= 1024, "batch too large")
        offset = torch.tensor([[0.5, -0.5], [1.0, 2.0]])  # a constant made in forward: a get_attr in fx
        return F.relu(self.bn(self.fc(x))).view(x.shape[0], 2, 2) * 3 + offset


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ceil(self.fc(x)) + torch.floor(x)


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


# ---------------------------------------------------------------- numerics


def test_mlp() -> None:
    model = randomize(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10)))
    graph = assert_matches_torch(model, {"x": [1, 64]})
    assert [(n.op, n.attrs.get("activation", "none")) for n in graph.nodes] == [
        ("dense", "relu"), ("dense", "relu"), ("dense", "none")
    ]


def test_conv_bn_relu_pool_flatten_linear() -> None:
    graph = assert_matches_torch(randomize(ConvNet()), {"x": [2, 3, 16, 16]})
    assert {"conv", "max_pool", "global_avg_pool", "dense"} <= ops(graph)


def test_nodes_are_named_by_their_module_path() -> None:
    """Node names are the modules' paths (what a user reads in the model's code and in tuning.space.op_name),
    an nn.Sequential's numbered children prefixed with their class; the folded batch norm leaves its conv's."""
    graph = optimize(trace_model(randomize(ConvNet()), inputs={"x": [2, 3, 16, 16]}))
    names = {node.name: node.op for node in graph.nodes}
    assert names["features.0"] == "conv" and names["features.4"] == "conv" and names["head"] == "dense"
    assert names["features.3"] == "max_pool" and names["pool"] == "global_avg_pool"
    mlp = trace_model(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), inputs={"x": [1, 64]})
    assert [node.name for node in mlp.nodes] == ["linear_0", "relu_1", "linear_2"]


def test_residual_block() -> None:
    graph = assert_matches_torch(randomize(Residual()), {"x": [1, 4, 8, 8]})
    assert {"conv", "add"} <= ops(graph)


def test_depthwise_separable_block() -> None:
    graph = assert_matches_torch(randomize(DepthwiseSeparable()), {"x": [1, 6, 7, 7]})
    depthwise = [n for n in graph.nodes if n.op == "conv" and n.attrs.get("groups") == 6]
    assert len(depthwise) == 1


def test_conv1d_with_stride_dilation_same_padding_and_pooling() -> None:
    graph = assert_matches_torch(randomize(Conv1dNet()), {"x": [1, 2, 23]})
    assert "avg_pool" in ops(graph)


def test_activations() -> None:
    graph = assert_matches_torch(randomize(Activations()), {"x": [1, 8]})
    assert {"hard_swish", "gelu", "hard_sigmoid", "softmax"} <= ops(graph)


def test_cat_split_chunk_slice_permute_and_reductions() -> None:
    graph = assert_matches_torch(randomize(CatSplit()), {"x": [1, 4, 4, 6]})
    assert {"split", "concat", "slice", "transpose", "reduce_max"} <= ops(graph)


def test_pooling_variants_and_padding() -> None:
    assert_matches_torch(Pools().eval(), {"x": [1, 2, 8, 8]})


def test_attention_like_products_select_and_padding_modes() -> None:
    graph = assert_matches_torch(randomize(Attention()), {"x": [1, 5, 6]})
    assert {"matmul", "pad", "slice", "squeeze", "relu6"} <= ops(graph)


def test_two_inputs_and_two_outputs_keep_their_names() -> None:
    graph = assert_matches_torch(randomize(TwoInputs()), {"image": [1, 4], "meta": [1, 3]})
    assert [spec.name for spec in graph.inputs] == ["image", "meta"]
    assert len(graph.outputs) == 2


def test_a_plain_function_of_tensors_is_traced_too() -> None:
    def function(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3 - x / 2

    graph = trace_model(function, framework="torch", inputs={"x": [1, 5]})
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], function(torch.from_numpy(x)).numpy(), atol=ATOL)


def test_a_factory_taking_no_arguments_is_called() -> None:
    graph = trace_model(ConvNet, framework="torch", inputs={"x": [1, 3, 8, 8]})
    assert "conv" in ops(graph)
    with pytest.raises(UsageError, match=r"returned a int, not a torch.nn.Module"):
        trace_model(lambda: 3, framework="torch", inputs={"x": [1, 3]})


def test_fx_fallback_when_export_rejects_the_dynamic_batch() -> None:
    stream = io.StringIO()
    model = randomize(BoundedBatch())
    graph = trace_model(model, inputs={"x": [1, 6]}, progress=Progress(stream, level=2, live=False))
    log = stream.getvalue()
    assert "torch.export failed" in log and "falling back to torch.fx.symbolic_trace" in log
    assert "with torch.fx" in log
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], expected, atol=ATOL, rtol=0)


def test_training_mode_is_restored_after_tracing() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    model.train()
    graph = trace_model(model, inputs={"x": [1, 3]})
    assert model.training
    assert "batch_norm" in ops(graph)  # running statistics, as in eval mode


def test_export_archive(tmp_path: Path) -> None:
    model = randomize(ConvNet())
    example = torch.zeros(2, 3, 16, 16)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = tmp_path / "convnet.pt2"
    torch.export.save(program, str(path))
    assert choose_framework(path) == "torch"
    graph = trace_model(path)
    assert [(spec.name, spec.shape) for spec in graph.inputs] == [("x", (None, 3, 16, 16))]
    x = np.random.default_rng(2).standard_normal((3, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], expected, atol=ATOL, rtol=0)


def test_archive_inputs_must_match_model_inputs(tmp_path: Path) -> None:
    program = torch.export.export(nn.Linear(4, 2), (torch.zeros(2, 4),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(program, str(tmp_path / "linear.pt2"))
    graph = trace_model(tmp_path / "linear.pt2", inputs={"features": [None, 4]})  # names come from the recipe
    assert [spec.name for spec in graph.inputs] == ["features"]
    with pytest.raises(UsageError, match=r"linear.pt2: input x has shape \[\?, 4\]; model.inputs declares \[\?, 5\]"):
        trace_model(tmp_path / "linear.pt2", inputs={"x": [1, 5]})


def test_unreadable_archive_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt2"
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UsageError, match=r"broken.pt2: not a readable torch.export archive"):
        trace_model(path)


# ---------------------------------------------------------------- choosing and loading


def test_user_module_subclasses_choose_torch() -> None:
    assert choose_framework(ConvNet()) == "torch"  # its type's module is this test file, not torch
    assert choose_framework(nn.Linear(2, 2)) == "torch"


MODEL_PY = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))

def build():
    return Net()
"""


def test_state_dict_is_loaded_into_the_factory_module(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL_PY)
    trained = nn.Linear(4, 3)
    torch.save({"fc.weight": trained.weight.detach(), "fc.bias": trained.bias.detach()}, tmp_path / "state.pt")
    model = load_model(f"{tmp_path / 'model.py'}:build", tmp_path / "state.pt")
    assert torch.equal(model.fc.weight, trained.weight)
    graph = trace_model(model, inputs={"x": [1, 4]})
    x = np.ones((2, 4), np.float32)
    expected = torch.relu(trained(torch.from_numpy(x))).detach().numpy()
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], expected, atol=ATOL, rtol=0)


def test_bad_state_dict_names_the_file_and_every_mismatched_key(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL_PY)
    torch.save({"fc.weight": torch.zeros(5, 4), "head.bias": torch.zeros(3)}, tmp_path / "state.pt")
    with pytest.raises(UsageError) as caught:
        load_model(f"{tmp_path / 'model.py'}:build", tmp_path / "state.pt")
    message = str(caught.value)
    assert "state.pt" in message and "model.py:build" in message
    assert "missing key fc.bias" in message and "unexpected key head.bias" in message
    assert "fc.weight: file has shape [5, 4], the model [3, 4]" in message


def test_a_weights_file_that_is_not_a_state_dict(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL_PY)
    (tmp_path / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(UsageError, match="state.pt: not a state dict torch.load"):
        load_model(f"{tmp_path / 'model.py'}:build", tmp_path / "state.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(UsageError, match="holds a list, not a state dict"):
        load_model(f"{tmp_path / 'model.py'}:build", tmp_path / "list.pt")


class MathActivations(nn.Module):
    """The elementwise ops of issue 10, each on a branch of its own, summed (max/min/where too)."""

    def __init__(self) -> None:
        super().__init__()
        self.prelu = nn.PReLU(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positive = x.abs() + 0.5
        mask = torch.arange(8) % 2 == 0
        terms = [F.elu(x, 0.7), F.selu(x), F.softplus(x), F.softsign(x), -x, torch.exp(x), torch.log(positive),
                 torch.sqrt(positive), torch.rsqrt(positive), 1 / positive, x ** 3, torch.erf(x),
                 F.log_softmax(x, dim=-1), torch.maximum(x, x.flip(-1)), torch.minimum(x, torch.zeros(8)),
                 self.prelu(x), torch.where(mask, x, torch.ones(8))]
        return torch.stack(terms, 1).sum(1)


class Norms(nn.Module):
    """LayerNorm, GroupNorm, InstanceNorm and LRN as torch spells them, after a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.group = nn.GroupNorm(3, 6)
        self.instance = nn.InstanceNorm2d(6, affine=True)
        self.lrn = nn.LocalResponseNorm(3, alpha=0.1)
        self.layer = nn.LayerNorm([5, 5])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.layer(self.lrn(self.instance(self.group(y)) + y))


class Decoder(nn.Module):
    """Transposed convs (grouped, output padding, 1-D), interpolation, a 3-D conv and pool, tile and gather."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up1d = nn.ConvTranspose1d(6, 2, 3, stride=2, dilation=2)
        self.conv3d = nn.Conv3d(1, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.up(x)
        nearest = F.interpolate(y, scale_factor=2, mode="nearest")
        linear = F.interpolate(y, size=(11, 13), mode="bilinear", align_corners=False)
        corners = F.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=True)
        line = self.up1d(y.mean(-1))
        volume = F.max_pool3d(self.conv3d(y[:, :1, None].expand(-1, -1, 3, -1, -1)), 2)
        picked = y.index_select(1, torch.tensor([5, 0, 2])).repeat(1, 2, 1, 1)
        return nearest, linear, corners, line, volume, picked


def test_math_activations_prelu_max_min_and_where() -> None:
    graph = assert_matches_torch(randomize(MathActivations()), {"x": [1, 8]})
    assert {"elu", "selu", "softplus", "neg", "exp", "log", "sqrt", "reciprocal", "pow", "erf", "log_softmax", "max",
            "min", "prelu", "where"} <= ops(graph)


def test_layer_group_instance_norm_and_lrn() -> None:
    graph = assert_matches_torch(randomize(Norms()), {"x": [1, 3, 5, 5]})
    assert {"layer_norm", "group_norm", "instance_norm"} <= ops(graph)


def test_transposed_convs_interpolation_3d_tile_and_gather() -> None:
    graph = assert_matches_torch(randomize(Decoder()), {"x": [1, 4, 4, 5]})
    assert {"conv_transpose", "resize", "tile", "gather", "max_pool"} <= ops(graph)


def test_multihead_attention_in_eval_mode() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
            self.norm = nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x + self.attention(x, x, x, need_weights=False)[0])

    graph = assert_matches_torch(randomize(Block()), {"x": [1, 5, 8]})
    assert {"matmul", "softmax", "layer_norm"} <= ops(graph)


# ---------------------------------------------------------------- errors


def test_unsupported_ops_are_listed_together_with_node_module_and_line() -> None:
    with pytest.raises(UsageError) as caught:
        trace_model(randomize(Unsupported()), inputs={"x": [1, 4]})
    message = str(caught.value)
    assert "2 torch ops cannot be mapped" in message
    for op in ("ceil", "floor"):
        assert f"aten.{op} (node {op}, module <root> (Unsupported), at {__file__}:" in message
    assert caught.value.exit_code == 2


def test_a_model_that_cannot_be_captured_names_the_model_and_both_errors() -> None:
    with pytest.raises(BuildError) as caught:
        trace_model(DataDependent(), inputs={"x": [1, 3]})
    message = str(caught.value)
    assert f"DataDependent (defined in {__file__}) with inputs x[?, 3] cannot be captured" in message
    assert "torch.export failed with" in message and "torch.fx.symbolic_trace failed with" in message
    assert "\n" not in message  # first lines only, not torch's pages
    assert caught.value.exit_code == 1


def test_inputs_that_do_not_fit_the_model() -> None:
    with pytest.raises(BuildError, match=r"with inputs x\[\?, 63\] cannot be captured"):
        trace_model(nn.Linear(64, 2), inputs={"x": [1, 63]})


def test_torch_needs_input_shapes() -> None:
    with pytest.raises(UsageError, match="model.inputs"):
        trace_model(nn.Linear(2, 2))


def test_a_float64_module_is_refused_not_computed_in_float32() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).double().eval()
    with pytest.raises(UsageError, match=r"computes in torch.float64 \(0.weight, 0.bias\); dabuild computes in float32"):
        trace_model(model, "torch", {"x": (None, 4)})
