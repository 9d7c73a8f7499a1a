"""The committed .tflite models and the runtimes they are checked in; shared by tests and bench/tflite.py.

`run_litert` runs a file in LiteRT with its reference kernels (BUILTIN_REF),
taking and returning float: an int8 or int16 input is quantized by the file's
own scale and zero point (round half away from zero, as TFLite's QUANTIZE
does), an integer output dequantized.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dabuild.ir.graph import Graph
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.trace.tflite_frontend import TfliteTracer
from dabuild.tune.space import build_space

MODELS_DIR = Path(__file__).parent / "tflite_models"
MODELS = sorted(MODELS_DIR.glob("*.tflite"))


def model(name: str) -> Path:
    return MODELS_DIR / f"{name}.tflite"


def inputs_for(path: Path, samples: int = 16, seed: int = 3) -> np.ndarray:
    """Seeded normal float inputs of the file's input shape (the converter calibrated on the same law)."""
    shape = next(iter(TfliteTracer(str(path)).get_input_shapes().values()))
    return np.random.default_rng(seed).normal(0, 1, (samples, *shape[1:])).astype(np.float32)


def run_litert(path: Path, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    [given] = interpreter.get_input_details()
    [taken] = interpreter.get_output_details()
    interpreter.allocate_tensors()
    feed = x
    if given["dtype"] != np.float32:
        scale, zero_point = given["quantization"]
        info = np.iinfo(given["dtype"])
        q = np.sign(x / scale) * np.floor(np.abs(x / scale) + 0.5) + zero_point
        feed = np.clip(q, info.min, info.max).astype(given["dtype"])
    rows = []
    for sample in feed:  # one at a time: the files fix a batch of 1 (a transposed conv's output shape too)
        interpreter.set_tensor(given["index"], sample[None])
        interpreter.invoke()
        rows.append(interpreter.get_tensor(taken["index"])[0])
    out = np.stack(rows)
    if taken["dtype"] != np.float32:
        scale, zero_point = taken["quantization"]
        out = (out.astype(np.float64) - zero_point) * scale
    return np.asarray(out, dtype=np.float64)


def run_tflm(path: Path, qgraph: QGraph, x: np.ndarray, tensors: tuple[int, ...] = ()) -> dict[int | str, np.ndarray]:
    """TFLite Micro's interpreter (the tflite-micro package) on float inputs `x`, quantized by `qgraph`'s input
    params where the file takes integers: "output" (as the output's integers: a float output quantized back by
    the QGraph's output params) and, by file tensor index, the `tensors` asked for (kept: kPreserveAllTensors)."""
    from tflite_micro.python.tflite_micro import runtime

    from dabuild.qir.reference import quantize_input

    interpreter = runtime.Interpreter.from_file(str(path),
                                                intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors)
    takes_integers = interpreter.get_input_details(0)["dtype"] != np.float32
    feed = quantize_input(qgraph, x) if takes_integers else x
    rows: dict[int | str, list[np.ndarray]] = {}
    for sample in feed:
        interpreter.set_input(sample[None], 0)
        interpreter.invoke()
        rows.setdefault("output", []).append(np.array(interpreter.get_output(0))[0])
        for index in tensors:
            rows.setdefault(index, []).append(np.array(interpreter.GetTensor(index, 0)["tensor_data"])[0])
    values = {key: np.stack(parts) for key, parts in rows.items()}
    if values["output"].dtype.kind == "f":
        params = qgraph.output_params
        values["output"] = params.saturate(np.rint(values["output"].astype(np.float64) / params.scale)
                                           + params.zero_point)
    values["output"] = values["output"].astype(np.int64)
    return values


def trace_of_operator(trace: dict[str, np.ndarray], index: int) -> np.ndarray:
    """The last tensor the integer reference wrote for the file's operator `index`, channels last as TFLM has it."""
    name = [key for key in trace if key.startswith(f"op{index}_") and not key.endswith(":accumulator")][-1]
    values = trace[name]
    return values.transpose(0, 2, 3, 1) if values.ndim == 4 else values


def imported(path: Path) -> Graph:
    return optimize(TfliteTracer(str(path)).trace())


def given_qgraph(path: Path, capability: str = "c") -> tuple[Graph, QGraph]:
    """The file's graph and its QGraph with every quantization the file states kept (strategy given's default)."""
    from dabuild.capability import discover_capabilities

    graph = imported(path)
    x = inputs_for(path, 32, seed=5)
    stats = calibrate(graph, [{graph.inputs[0].name: x}], Progress.silent())
    return graph, quantize(graph, stats, build_space(graph, discover_capabilities()[capability]).default())
