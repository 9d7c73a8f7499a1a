"""The hdl artifact's program and manifest: a QGraph traced by da4ml, and how to run it bit-exactly.

Export traces the QGraph through the `dabuild` DAIS tracer plugin (so the
path is exactly da4ml's public `trace_model`), keeps da4ml's combinational
program (`CombLogic`) as JSON and as the binary DAIS program, and records in
hdl.json what the integer interface needs: the input and output fixed-point
types (fractional bits, storage dtypes), shapes, cost and latency. Running
converts integer inputs to the real values da4ml's interpreter takes (q * 2**-f) and its real
outputs back to integers (exact: all are small dyadic numbers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from da4ml.converter import trace_model
from da4ml.trace import HWConfig, comb_trace, to_pipeline
from da4ml.types import CombLogic, Pipeline

from dabuild import notices
from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.targets.hdl.symbolic import fractional_bits

MANIFEST = "hdl.json"
COMB_FILE = "model.comb.json"   # da4ml's CombLogic, readable by CombLogic.load
DAIS_FILE = "model.dais"        # the same program as DAIS binary (int32 words), what da4ml's interpreter runs
PROBED_SAMPLES = 8              # samples each DAIS run also evaluates in Python (run_dais)


@dataclass(frozen=True)
class Manifest:
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    input_fractional_bits: int
    output_fractional_bits: int
    input_dtype: str      # numpy storage dtype of the integer inputs (int8 for int2..int8, ...)
    output_dtype: str     # and of the outputs
    cost: float           # da4ml's estimate, in LUTs
    latency: float        # the slowest output's combinational delay, in da4ml's adder-delay units
    adder_size: int
    carry_size: int
    stages: int           # pipeline stages (0: combinational logic)
    register_layers: int  # registers between stages

    @property
    def clock_cycles(self) -> int:
        """Clock edges from an input to its output (0 for combinational logic)."""
        return self.stages * self.register_layers

    def save(self, directory: Path) -> None:
        (Path(directory) / MANIFEST).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        data = json.loads((Path(directory) / MANIFEST).read_text())
        return cls(**{**data, "input_shape": tuple(data["input_shape"]),
                      "output_shape": tuple(data["output_shape"])})


def trace(qgraph: QGraph, hwconf: HWConfig) -> CombLogic:
    """The QGraph as da4ml's combinational program, traced through the public `trace_model`."""
    inputs, outputs = trace_model(qgraph, hwconf=hwconf, framework="dabuild")
    return comb_trace(inputs, outputs)


def pipelined(comb: CombLogic, latency_cutoff: float) -> CombLogic | Pipeline:
    """The logic as the RTL implements it: cut into register stages of at most `latency_cutoff` delay."""
    return to_pipeline(comb, latency_cutoff, verbose=False) if latency_cutoff > 0 else comb


def manifest_of(qgraph: QGraph, comb: CombLogic, solution: CombLogic | Pipeline, register_layers: int) -> Manifest:
    input_params, output_params = qgraph.input_params, qgraph.output_params
    return Manifest(qgraph.tensors[qgraph.input].shape, qgraph.tensors[qgraph.output].shape,
                    fractional_bits(input_params, f"graph input {qgraph.input!r}"),
                    fractional_bits(output_params, f"graph output {qgraph.output!r}"),
                    input_params.storage, output_params.storage, comb.cost, float(comb.latency[1]), comb.adder_size,
                    comb.carry_size,
                    len(solution.solutions) if isinstance(solution, Pipeline) else 0, register_layers)


def write_program(comb: CombLogic, directory: Path) -> None:
    comb.save(Path(directory) / COMB_FILE)
    comb.save_binary(Path(directory) / DAIS_FILE)


def load_program(directory: Path) -> CombLogic:
    return CombLogic.load(Path(directory) / COMB_FILE)


def to_real(manifest: Manifest, inputs: np.ndarray) -> np.ndarray:
    """Integer inputs (batch, *input_shape) as the real values the logic takes, one row per sample."""
    samples = np.asarray(inputs)
    if samples.shape[1:] != manifest.input_shape:
        raise BuildError(f"the hdl artifact takes inputs of shape (batch, {', '.join(map(str, manifest.input_shape))})"
                         f", got {samples.shape}")
    return samples.reshape(len(samples), -1).astype(np.float64) * 2.0 ** -manifest.input_fractional_bits


def to_integer(manifest: Manifest, outputs: np.ndarray, where: str) -> np.ndarray:
    """Real outputs of the logic as integers in the output's storage dtype; BuildError if any is off the grid."""
    scaled = np.asarray(outputs, dtype=np.float64) * 2.0 ** manifest.output_fractional_bits
    integers = np.round(scaled)
    if not np.array_equal(integers, scaled):
        raise BuildError(f"{where} returned values off the output's fixed-point grid "
                         f"(2**-{manifest.output_fractional_bits})")
    return integers.astype(manifest.output_dtype).reshape(len(scaled), *manifest.output_shape)


def run_dais(directory: Path, inputs: np.ndarray) -> np.ndarray:
    """Integer outputs of the artifact's program in da4ml's DAIS interpreter (C++), checked on its first samples
    against da4ml's Python evaluation (`evaluate`), which runs them all, with a warning, where they differ.

    `CombLogic.predict` runs the program's DAIS binary; it must be the artifact's model.dais word for word.
    """
    directory = Path(directory)
    manifest = Manifest.load(directory)
    comb = load_program(directory)
    if not np.array_equal(comb.to_binary(), np.fromfile(directory / DAIS_FILE, dtype=np.int32)):
        raise BuildError(f"{directory / DAIS_FILE} is not the DAIS binary of {directory / COMB_FILE}; re-export")
    outputs = comb.predict(to_real(manifest, inputs), n_threads=1)
    integers = to_integer(manifest, np.asarray(outputs).reshape(len(inputs), -1),
                          f"da4ml's DAIS interpreter on {directory}")
    probe = slice(0, PROBED_SAMPLES)
    if np.array_equal(evaluate(comb, manifest, inputs[probe]), integers[probe]):
        return integers
    notices.warn(f"da4ml's DAIS interpreter miscomputes the program of {directory} (its outputs differ from da4ml's "
                 "own Python evaluation of the same program); the outputs come from the Python evaluation, which is "
                 "exact but slower")
    return evaluate(comb, manifest, inputs)


def evaluate(comb: CombLogic, manifest: Manifest, inputs: np.ndarray) -> np.ndarray:
    """Integer outputs of the program in da4ml's Python evaluator (CombLogic.__call__: exact Python arithmetic,
    about 15 ms a sample for 4,000 operations): the arbiter where the DAIS interpreter and the RTL disagree.
    da4ml 0.6's C++ interpreter miscomputes some programs whose fixed-point values are wide (an int16 mean
    of 9 values: 31 fractional bits) where this evaluator and the Verilog agree with dabuild's reference."""
    rows = [np.ravel(comb(row)).astype(np.float64) for row in to_real(manifest, inputs)]
    return to_integer(manifest, np.array(rows).reshape(len(inputs), -1), "da4ml's Python evaluation")
