"""Running a .tflite file in TFLite Micro's interpreter (the tflite-micro package) and in LiteRT.

TFLM's Python interpreter runs TFLM's reference kernels, which requantize with TFLite's double rounding
(`rounding: tflm`); LiteRT runs with its reference kernels (`OpResolverType.BUILTIN_REF`), the portable C++
every TFLite kernel is checked against. Both take one sample at a time here: the file fixes a batch of 1.

The arena TFLM needs is what its RecordingMicroAllocator prints after an invoke ("Arena allocation total N
bytes": head and tail of the arena, every tensor, buffer and node structure TFLM placed there); the Python
package returns no number, so `arena_bytes` reads that line from the process's stderr.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.errors import BuildError

ARENA_LINE = re.compile(rb"Arena allocation total (\d+) bytes")
ARENA_LIMIT = 64 * 2**20   # the host arena TFLM may take; what it really uses is measured


def _tflm(path: Path, recording: bool = False) -> Any:
    from tflite_micro.python.tflite_micro import runtime

    config = runtime.InterpreterConfig.kAllocationRecording if recording else runtime.InterpreterConfig.kPreserveAllTensors
    try:
        return runtime.Interpreter.from_file(str(path), arena_size=ARENA_LIMIT, intrepreter_config=config)
    except (RuntimeError, ValueError) as error:
        raise BuildError(f"TFLite Micro could not load {path}: {error}") from None


def file_inputs(manifest: dict[str, Any], inputs: np.ndarray) -> np.ndarray:
    """What the file takes for quantized `inputs`: themselves, or in `float_io` the real values they stand for,
    (q - zero point) * scale in float32, which the file's QUANTIZE turns back into the same integers."""
    if not manifest.get("float_io"):
        return inputs
    scale, zero_point = manifest["input_params"]
    return (np.asarray(inputs, np.int64) - zero_point).astype(np.float32) * np.float32(scale)


def quantized_outputs(manifest: dict[str, Any], outputs: np.ndarray) -> np.ndarray:
    """The file's outputs as the quantized integers, int64: in `float_io` its DEQUANTIZE's float32 values
    quantized back (exact: each is (q - zero point) * scale in float32)."""
    if not manifest.get("float_io"):
        return np.asarray(outputs).astype(np.int64)
    scale, zero_point = manifest["output_params"]
    steps = np.asarray(outputs, np.float64) / np.float64(np.float32(scale))
    return (np.sign(steps) * np.floor(np.abs(steps) + 0.5)).astype(np.int64) + zero_point


def run_tflm(path: Path, inputs: np.ndarray) -> np.ndarray:
    """TFLM's outputs for `inputs` (the file's input type, batch first), one sample per invoke."""
    interpreter = _tflm(path)
    dtype = interpreter.get_input_details(0)["dtype"]
    rows = []
    try:
        for sample in np.asarray(inputs):
            interpreter.set_input(np.ascontiguousarray(sample[None], dtype=dtype), 0)
            interpreter.invoke()
            rows.append(np.array(interpreter.get_output(0))[0])
    except RuntimeError as error:
        raise BuildError(f"TFLite Micro could not run {path}: {error}") from None
    return np.stack(rows) if rows else np.zeros((0,), np.int8)


def tflm_tensors(path: Path, inputs: np.ndarray, indices: dict[str, int]) -> dict[str, np.ndarray]:
    """The file tensors `indices` (name -> tensor index) after each sample's invoke, TFLM keeping every tensor
    (kPreserveAllTensors), batch first."""
    interpreter = _tflm(path)
    dtype = interpreter.get_input_details(0)["dtype"]
    rows: dict[str, list[np.ndarray]] = {name: [] for name in indices}
    try:
        for sample in np.asarray(inputs):
            interpreter.set_input(np.ascontiguousarray(sample[None], dtype=dtype), 0)
            interpreter.invoke()
            for name, index in indices.items():
                rows[name].append(np.array(interpreter.GetTensor(index, 0)["tensor_data"])[0])
    except RuntimeError as error:
        raise BuildError(f"TFLite Micro could not run {path}: {error}") from None
    return {name: np.stack(values) for name, values in rows.items() if values}


def arena_bytes(path: Path, sample: np.ndarray) -> int | None:
    """The arena TFLM used for one invoke on `sample`, as its RecordingMicroAllocator reports it (None: no
    report found)."""
    interpreter = _tflm(path, recording=True)
    dtype = interpreter.get_input_details(0)["dtype"]
    interpreter.set_input(np.ascontiguousarray(sample[None], dtype=dtype), 0)
    interpreter.invoke()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            interpreter.print_allocations()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        found = ARENA_LINE.search(captured.read())
    return int(found.group(1)) if found else None


def run_litert(path: Path, inputs: np.ndarray) -> np.ndarray:
    """LiteRT's outputs for `inputs` with its reference kernels, one sample per invoke."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    try:
        interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        interpreter.allocate_tensors()
        [given], [taken] = interpreter.get_input_details(), interpreter.get_output_details()
        rows = []
        for sample in np.asarray(inputs):
            interpreter.set_tensor(given["index"], np.ascontiguousarray(sample[None], dtype=given["dtype"]))
            interpreter.invoke()
            rows.append(interpreter.get_tensor(taken["index"])[0])
    except (RuntimeError, ValueError) as error:
        raise BuildError(f"LiteRT could not run {path}: {error}") from None
    return np.stack(rows) if rows else np.zeros((0,), np.int8)


def main(argv: list[str] | None = None) -> int:
    """`python -m dabuild.targets.tflite.runtime model.tflite inputs.bin outputs.bin`: TFLM on raw quantized
    samples, writing the raw quantized outputs, as the target's `run` (what a debug bundle's run.sh calls;
    model.json beside the model says their types and the file's edges)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("outputs")
    args = parser.parse_args(argv)
    manifest = json.loads((Path(args.model).parent / "model.json").read_text())
    x = np.fromfile(args.inputs, dtype=manifest["input_dtype"]).reshape(-1, *manifest["input_shape"])
    y = quantized_outputs(manifest, run_tflm(Path(args.model), file_inputs(manifest, x)))
    np.ascontiguousarray(y, dtype=manifest["output_dtype"]).tofile(args.outputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
