"""The hostile corpus: model and data files as an attacker would write them, each in a project of its own.

Every case is made at test time into a private folder (payloads are small; bombs
are generated rather than committed): `make(name, folder)` writes recipe.yaml
and the files it names, and returns what the build must print. A payload that
runs writes `folder/MARKER`, so "no code ran" is a file that does not exist.
tests/recipe/test_hostile.py builds each case in a subprocess under a memory and time
limit, so a failure cannot take the suite down with it.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MARKER = "MARKER"
_DATA = {"x": np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4), "y": np.array([0, 1, 2, 3, 0, 1])}


class _Payload:
    """Unpickling this opens `path` for writing: a stand-in for any code a pickle may run."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _recipe(folder: Path, model: str, data: str = "data.npz", x: str = "x") -> None:
    if not (folder / data).exists():
        np.savez(folder / data, **_DATA)
    (folder / "recipe.yaml").write_text(
        f"name: hostile\nmodel: {model}\ndata:\n"
        f"  calibration: {{source: {data}, x: {x}}}\n"
        f"  evaluation: {{source: {data}, x: {x}, y: y}}\n"
        "targets:\n  - {name: mcu, kind: c}\n")


def _numpy_project(folder: Path, data: str = "data.npz", x: str = "x", weights: str = "weights.npz") -> None:
    (folder / "model.py").write_text("import numpy as np\n\n\ndef build(weights):\n"
                                     "    return lambda x: np.maximum(x @ weights['w'], 0)\n")
    if not (folder / weights).exists():
        np.savez(folder / weights, w=np.eye(4, dtype=np.float32))
    _recipe(folder, f"{{framework: numpy, source: model.py:build, weights: {weights}, inputs: {{x: [null, 4]}}}}",
            data, x)


# ------------------------------------------------------------------ torch


def _exported() -> bytes:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    program = torch.export.export(model, (torch.zeros(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def _rewrite(archive: bytes, edit: Callable[[str, bytes], bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as target:
        for name in source.namelist():
            target.writestr(name, edit(name, source.read(name)))
    return out.getvalue()


def _pt2(folder: Path, edit: Callable[[str, bytes], bytes]) -> None:
    (folder / "model.pt2").write_bytes(_rewrite(_exported(), edit))
    _recipe(folder, "{source: model.pt2}")


def pt2_sample_inputs(folder: Path) -> list[str]:
    payload = pickle.dumps(_Payload(folder / MARKER))
    _pt2(folder, lambda name, data: payload if name.endswith("sample_inputs/model.pt") else data)
    return ["model.pt2: part ", "sample_inputs/model.pt is a pickle that torch.load(weights_only=True) refuses"]


def pt2_pickled_weight(folder: Path) -> list[str]:
    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        return pickle.dumps(_Payload(folder / MARKER)) if name.endswith("weights/weight_0") else data

    _pt2(folder, edit)
    return ["model.pt2: part ", "weights/weight_0 is a pickle that torch.load(weights_only=True) refuses"]


def pt2_shape_expression(folder: Path) -> list[str]:
    code = f"__import__('builtins').open('{folder / MARKER}', 'w') and Symbol("
    _pt2(folder, lambda name, data: data.replace(b'"expr_str": "Symbol(', f'"expr_str": "{code}'.encode(), 1)
         if name.endswith("models/model.json") else data)
    return ["model.pt2: part ", "has the shape expression", "which is not arithmetic over shape symbols"]


def pt2_node_target(folder: Path) -> list[str]:
    _pt2(folder, lambda name, data: data.replace(b'"torch.ops.aten.linear.default"', b'"torch.os.system"')
         if name.endswith("models/model.json") else data)
    return ["model.pt2: part ", "calls 'torch.os.system', which is not an operator"]


def torch_state_dict(folder: Path) -> list[str]:
    (folder / "model.py").write_text("import torch\n\n\ndef build():\n"
                                     "    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n")
    (folder / "state.pt").write_bytes(pickle.dumps(_Payload(folder / MARKER)))
    _recipe(folder, "{framework: torch, source: model.py:build, weights: state.pt, inputs: {x: [null, 4]}}")
    return ["state.pt: not a state dict torch.load(weights_only=True) can read"]


# ------------------------------------------------------------------ keras


def _keras_lambda(folder: Path, suffix: str) -> list[str]:
    import os

    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    marker = str(folder / MARKER)
    inputs = keras.Input((4,))
    outputs = keras.layers.Lambda(lambda x: (open(marker, "w"), x)[1])(inputs)  # noqa: SIM115 - the payload
    keras.Model(inputs, outputs).save(folder / f"model{suffix}")
    (folder / MARKER).unlink()  # building the model ran the lambda once, here; loading must not
    _recipe(folder, f"{{source: model{suffix}}}")
    return [f"model{suffix}: keras cannot load this model", "Lambda"]


def keras_lambda(folder: Path) -> list[str]:
    return _keras_lambda(folder, ".keras")


def keras_lambda_h5(folder: Path) -> list[str]:
    return _keras_lambda(folder, ".h5")


def keras_config_bomb(folder: Path) -> list[str]:
    with zipfile.ZipFile(folder / "model.keras", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.11.3"}))
        with archive.open("config.json", "w", force_zip64=True) as member:
            block = b" " * 2**20
            for _ in range(64):
                member.write(block)
    _recipe(folder, "{source: model.keras}")
    return ["model.keras: archive member config.json inflates", "(DABUILD_MAX_ZIP_RATIO)"]


# ------------------------------------------------------------------ onnx


def _onnx(folder: Path, location: str, nodes: int = 1) -> None:
    import onnx
    from onnx import TensorProto, helper

    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        weight.external_data.add(key=key, value=value)
    chain = [helper.make_node("MatMul", ["x", "w"], ["h0"])]
    chain += [helper.make_node("Relu", [f"h{i}"], [f"h{i + 1}"]) for i in range(nodes - 1)]
    graph = helper.make_graph(chain, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info(f"h{nodes - 1}", TensorProto.FLOAT, ["n", 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    _recipe(folder, "{source: model.onnx}")


def _secret(folder: Path) -> Path:
    outside = folder.parent / f"{folder.name}-outside"
    outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(np.eye(4, dtype=np.float32).tobytes())
    return secret


def onnx_external_relative(folder: Path) -> list[str]:
    _secret(folder)
    _onnx(folder, f"../{folder.name}-outside/secret.bin")
    return ["model.onnx: tensor 'w' keeps its data in", "which leaves the model's folder (../)"]


def onnx_external_absolute(folder: Path) -> list[str]:
    _onnx(folder, str(_secret(folder)))
    return ["model.onnx: tensor 'w' keeps its data in", "which is an absolute path"]


def onnx_external_symlink(folder: Path) -> list[str]:
    (folder / "weights.bin").symlink_to(_secret(folder))
    _onnx(folder, "weights.bin")
    return ["model.onnx: tensor 'w' keeps its data in 'weights.bin', which is reached through a symbolic link"]


def onnx_node_limit(folder: Path) -> list[str]:
    (folder / "weights.bin").write_bytes(np.eye(4, dtype=np.float32).tobytes())
    _onnx(folder, "weights.bin", nodes=50_001)
    return ["model.onnx: the graph holds 50,001 nodes, over the limit of 50,000 (DABUILD_MAX_NODES)"]


def onnx_constant_of_shape(folder: Path) -> list[str]:
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("s", TensorProto.INT64, [2],
                                                                                  [10**9 // 4, 4])),
             helper.make_node("ConstantOfShape", ["shape"], ["big"]),
             helper.make_node("Shape", ["big"], ["dims"]),
             helper.make_node("Add", ["x", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    _recipe(folder, "{source: model.onnx}")
    return ["model.onnx: node 'ConstantOfShape_1' (ConstantOfShape) would make a constant of 1,000,000,000 elements"]


# ------------------------------------------------------------------ npz / npy


def _npz_member(folder: Path, name: str, member: bytes, file: str = "data.npz") -> None:
    """data.npz with the good arrays plus `name`.npy holding the raw bytes `member`."""
    np.savez(folder / file, **_DATA)
    with zipfile.ZipFile(folder / file, "a") as archive:
        archive.writestr(f"{name}.npy", member)


def _npy(header: str, version: int = 1, length: int | None = None) -> bytes:
    text = header.encode("latin1")
    size = len(text) if length is None else length
    return b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<H", size) if version == 1 else struct.pack("<I", size)) + text


def npz_object_array(folder: Path) -> list[str]:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.array([_Payload(folder / MARKER)] * 6, dtype=object), allow_pickle=True)
    _npz_member(folder, "x_objects", buffer.getvalue())
    _numpy_project(folder, x="x_objects")
    return ["recipe.yaml:", "array 'x_objects' in data.npz has dtype |O; expected numbers"]


def npz_weights_object_array(folder: Path) -> list[str]:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.array([_Payload(folder / MARKER)], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(folder / "weights.npz", "w") as archive:
        archive.writestr("w.npy", buffer.getvalue())
    _numpy_project(folder)
    return ["weights.npz: array 'w' has dtype |O; weights are numbers"]


def npy_huge_shape(folder: Path) -> list[str]:
    _npz_member(folder, "x_huge", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 4), }"))
    _numpy_project(folder, x="x_huge")
    return ["recipe.yaml:", ("data.npz: array 'x_huge': shape (1099511627776, 4) of <f4 declares 17,592,186,044,416 "
            "bytes"), "over the memory budget"]


def npy_huge_header(folder: Path) -> list[str]:
    _npz_member(folder, "x_header", _npy("{'descr': '<f4', 'shape': (6, 4)}", version=2, length=3_500_000_000))
    _numpy_project(folder, x="x_header")
    return ["recipe.yaml:", "data.npz: array 'x_header': the .npy header claims 3,500,000,000 bytes"]


def npy_shape_not_tuple(folder: Path) -> list[str]:
    _npz_member(folder, "x_list", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': 'many', }"))
    _numpy_project(folder, x="x_list")
    return ["recipe.yaml:", "data.npz: array 'x_list': the .npy header's shape many is not a tuple of sizes"]


def npz_bomb(folder: Path) -> list[str]:
    np.savez(folder / "data.npz", **_DATA)
    with zipfile.ZipFile(folder / "data.npz", "a", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("x_bomb.npy", "w", force_zip64=True) as member:
        member.write(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (16777216, 4), }"))
        block = bytes(2**20)
        for _ in range(64):
            member.write(block)
    _numpy_project(folder, x="x_bomb")
    return ["recipe.yaml:", "data.npz: archive member x_bomb.npy inflates", "(DABUILD_MAX_ZIP_RATIO)"]


CASES: dict[str, Callable[[Path], list[str]]] = {
    function.__name__: function for function in (
        pt2_sample_inputs, pt2_pickled_weight, pt2_shape_expression, pt2_node_target, torch_state_dict,
        keras_lambda, keras_lambda_h5, keras_config_bomb,
        onnx_external_relative, onnx_external_absolute, onnx_external_symlink, onnx_node_limit,
        onnx_constant_of_shape,
        npz_object_array, npz_weights_object_array, npy_huge_shape, npy_huge_header, npy_shape_not_tuple, npz_bomb,
    )
}


# ------------------------------------------------------------------ messages that name the culprit


def onnx_nan_initializer(folder: Path) -> list[str]:
    weights = np.eye(4, dtype=np.float32)
    weights[1, 2] = np.nan
    (folder / "weights.bin").write_bytes(weights.tobytes())
    _onnx(folder, "weights.bin")
    return ["model.onnx: NaN values in initializer 'w' (1 of 16)"]


def npz_infinite_weights(folder: Path) -> list[str]:
    np.savez(folder / "weights.npz", w=np.array([[np.inf, 0, 0, 0]] * 4, dtype=np.float32))
    _numpy_project(folder)
    return ["weights.npz: NaN or infinite weights in ", "(4 of 16)"]


def capability_int128(folder: Path) -> list[str]:
    _numpy_project(folder)
    lines = (Path(__file__).parents[3] / "capabilities" / "c.yaml").read_text().splitlines(keepends=True)
    line = next(number for number, text in enumerate(lines, 1) if text.startswith("precisions:"))
    lines[line - 1] = "precisions: [int8, int128]\n"  # whatever c.yaml offers, the second precision is int128
    (folder / "wide.yaml").write_text("".join(lines).replace("name: c\n", "name: wide\n"))
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("kind: c}", "kind: c, capability: wide}") + "capabilities: [wide.yaml]\n")
    return [f"wide.yaml:{line}:20: unknown precision 'int128'", "dabuild has no type for it"]


def metric_missing_module(folder: Path) -> list[str]:
    _numpy_project(folder)
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("data:\n", "data:\n  metric: no_such_scores:f1\n"))
    return ["recipe.yaml:4:11: metric 'no_such_scores:f1': no module named 'no_such_scores'"]


def recipe_not_utf8(folder: Path) -> list[str]:
    _numpy_project(folder)
    recipe = folder / "recipe.yaml"
    recipe.write_bytes(recipe.read_bytes().replace(b"name: hostile", b"name: hostile  # caf\xe9"))
    return ["recipe.yaml:1:21: not UTF-8 text: byte 0xe9 is not UTF-8"]


def capability_binary(folder: Path) -> list[str]:
    _numpy_project(folder)
    (folder / "wide.yaml").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe")
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe.read_text() + "capabilities: [wide.yaml]\n")
    return ["wide.yaml:1:11: a binary file, not YAML text: byte 0xff is not UTF-8"]


CASES.update({function.__name__: function for function in (
    onnx_nan_initializer, npz_infinite_weights, capability_int128, metric_missing_module, recipe_not_utf8,
    capability_binary)})
