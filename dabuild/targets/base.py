"""The target plugin interface: what every backend (C, ONNX, HDL, ...) implements.

A target class is found through the `dabuild.targets` entry point group by its
`kind`. Its `Options` model validates the recipe's `options:` block, so a typo
there is reported against the recipe, not deep inside a build.

`reference` says what `check:<target>` proves the artifact against, and with it
which side of quantization the artifact's `run` faces:

- "integer": dabuild's integer reference (`run_integer`). The artifact takes the
  quantized inputs and returns its quantized outputs (int8 C, HDL), compared at
  the output's integer level.
- "fake_quant": `run_quantized`, the same integer path seen from float. The
  artifact takes float inputs and quantizes them itself (a QDQ ONNX model does,
  in its QuantizeLinear nodes), and returns float outputs; compared in float,
  where "approximate" allows one output quantization step.

(A "float" reference, the float graph itself, would need the traced Graph in
`check`; no target asks for it yet, so check_stage does not offer it.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.registry import Registry

if TYPE_CHECKING:
    from dabuild.capability import CapabilitySpec
    from dabuild.recipe import Tolerance


class Target:
    kind: ClassVar[str]
    capability: ClassVar[str]          # name of the capability YAML used when the recipe names none
    default_tolerance: ClassVar[Tolerance]   # a level of dabuild.targets.tolerance.LEVELS
    packages: ClassVar[tuple[str, ...]] = ()   # Python packages whose versions enter the export/check keys
    reference: ClassVar[str] = "integer"       # what check compares against: "integer" or "fake_quant" (see above)
    run_batch: ClassVar[int | None] = None     # samples per `run` in check (None: all at once); an in-process
                                               # runtime holds a whole batch's tensors in dabuild's memory
    size_options: ClassVar[tuple[str, ...]] = ()  # options that change `stored_bytes` (they enter the tune key)
    # How the artifact's float islands add their float sums, against the reference's order (island_order): the
    # check report states it beside the tolerance, so "exact" or "one step" is explained, not just claimed.
    float_order: ClassVar[str] = "the runtime's own order, not the reference's: islands may move an output a step"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    def __init__(self, options: Target.Options | None = None, capability: CapabilitySpec | None = None):
        """`capability`: the one the recipe resolved for this target (`ResolvedTarget`); None: the kind's own
        bundled one, as this target runs it."""
        self.options = options if options is not None else self.Options()
        self._capability = capability

    @property
    def capability_spec(self) -> CapabilitySpec:
        """The capability this target builds for: what its float-island refusals read."""
        if self._capability is None:
            from dabuild.capability import load_capability
            from dabuild.resources import data_dir

            bundled = load_capability(data_dir("capabilities") / f"{self.capability}.yaml")
            self._capability = self.capability_for(bundled, self.options.model_dump())
        return self._capability

    @classmethod
    def layer_types(cls) -> frozenset[str]:
        """The QLayer types this target writes, read off its own registry: what `refuse` and docs/ops.md check a
        lowering's layers against. An optional dependency it lacks is a BuildError naming the extra."""
        return frozenset()

    @classmethod
    def op_layers(cls, op: str, layers: frozenset[str]) -> frozenset[str]:
        """The layer types a node of IR op `op` needs written here, of its lowering's `layers`: all of them, or
        fewer or other names where the target writes a layer type for some ops only (the tflite target's
        lookup: sigmoid and tanh). docs/ops.md reads it."""
        return layers

    @classmethod
    def float_ops(cls) -> frozenset[str]:
        """The IR ops this target can write inside a float island, read off its own registry (empty: it runs
        none). A capability built for it offers no more (`capability_for`); docs/ops.md shows them."""
        return frozenset()

    @classmethod
    def refuses_float_islands(cls, options: dict[str, Any]) -> str | None:
        """Why this target, with these recipe options, runs no float islands though its capability may (e.g. a
        core without an FPU); None: it runs them wherever its capability does."""
        return None

    @classmethod
    def capability_for(cls, capability: CapabilitySpec, options: dict[str, Any]) -> CapabilitySpec:
        """The capability the search reads for this target with these recipe options: the file's, with float
        islands only of the ops the target writes in float (its own table, `float_ops`, within the file's list
        where it narrows it), none where the target refuses them (`refuses_float_islands`), or narrowed further
        by a target whose runtime computes exactly only part of what the file offers (onnx on a CPU whose u8s8
        kernels saturate)."""
        if not capability.fp32_fallback:
            return capability
        if cls.refuses_float_islands(options):
            return capability.model_copy(update={"fp32_fallback": False})
        written = cls.float_ops()
        ops = written if capability.float_ops is None else frozenset(capability.float_ops) & written
        return capability.model_copy(update={"float_ops": sorted(ops)})

    def runtime_version(self) -> dict[str, str]:
        """Versions of the external tools this target runs; part of the export/check cache keys."""
        return {}

    def export_tools(self) -> dict[str, str]:
        """Versions of the external tools `export` itself runs (a cross compiler that links the artifact to
        measure it); part of the export key, and of tune's for a target whose budget tuning measures."""
        return {}

    def export_programs(self) -> list[Path]:
        """The files of the programs `export_tools` names, which the no-op fast path watches."""
        return []

    def not_run(self) -> list[str]:
        """The parts of this target's check that cannot run here (a missing simulator or emulator, a fallback
        path), each as a sentence naming the part and why. `check` reports them in the console, its report and
        build.json, so a passing check never claims more than it ran."""
        return []

    def programs(self) -> list[Path]:
        """The files of the external programs this target runs (found on PATH, absent ones left out).

        The no-op fast path compares their size and mtime instead of asking for
        versions, so a compiler upgrade is noticed without starting a process.
        """
        return []

    # Hooks around the pipeline; most targets need none of them.
    def pre_trace(self, model_spec: Any) -> None:
        """Called before tracing (e.g. to reject a framework the target cannot take)."""

    def post_trace(self, graph: Any) -> None:
        """Called with the traced graph (e.g. to reject ops early)."""

    def refuse(self, graph: Any, integer_forms: Mapping[str, frozenset[str]]) -> None:
        """Called with the traced graph before any other stage runs: raise a BuildError listing everything
        the target cannot build (every node of every op it cannot take), so one run tells the user all of it.
        `integer_forms` maps each op with an integer lowering to the layer types it makes (the pipeline hands
        it over from dabuild.quant.lowering, so a target knows the integer IR and never the quantizer).
        It is no trace hook: it changes nothing, so the trace stays shared by every target."""

    def post_export(self, out_dir: Path) -> None:
        """Called after export with the finished artifact directory."""

    def integer_graph(self, qgraph: QGraph) -> QGraph:
        """The tuned QGraph as this target's artifact computes it, which export writes and check's integer
        reference runs: the same one, or (an option `rounding`) the same integers requantized with another
        rounding (`fixed_point.ROUNDINGS`)."""
        return qgraph

    def stored_bytes(self, qgraph: QGraph) -> int:
        """Bytes the artifact of `qgraph` stores for weights and parameters: what tuning objective `size`
        minimises for the capability this target is built for.

        The default counts every array of every layer and every graph constant in the numpy type the
        QGraph holds it in (int4 weights one a byte in int8 storage, int16-stored weights two bytes): what a
        target that writes the arrays as they are stores. A target that packs or widens them says so.
        """
        arrays = [array for layer in qgraph.layers for array in layer.arrays().values()]
        return int(sum(array.nbytes for array in [*arrays, *qgraph.constants.values()]))

    def export(self, qgraph: QGraph, out_dir: Path) -> None:
        """Write the artifact for `qgraph` into `out_dir`."""
        raise NotImplementedError(f"target {self.kind!r} does not implement export")

    def run(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> np.ndarray:
        """Execute the artifact in its real runtime on a batch of `inputs`; return its outputs.

        Inputs and outputs are quantized (the tensors' int dtype) for reference "integer" and float32
        for "fake_quant"; `work_dir` is a scratch folder the call may fill.
        """
        raise NotImplementedError(f"target {self.kind!r} does not implement run")

    def fits(self, qgraph: QGraph) -> str | None:
        """Why the artifact of `qgraph` would overflow this target's budget (None: it fits, or there is none);
        tuning never chooses a config whose artifact does not fit."""
        return None

    def measurements(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, Any]:
        """Figures of the artifact measured where it runs (e.g. flash, RAM, instructions per inference), for the
        check report; `inputs` as `run` takes them. Empty: the target measures nothing."""
        return {}

    def trace(self, artifact_dir: Path, inputs: np.ndarray, work_dir: Path) -> dict[str, np.ndarray] | None:
        """Per-layer values from the runtime on `inputs` (as `run` takes them), where the runtime allows.

        Keys are QGraph tensor names; a value is the tensor's quantized integers, or its real values
        in float. `check` compares them with the integer reference to find the first layer that
        diverges. None: the runtime shows only its outputs.
        """
        return None

    def rerun_script(self, artifact_dir: Path, inputs_file: str, outputs_file: str) -> str:
        """Shell lines that rebuild `artifact_dir` and run it on a raw inputs file (for debug bundles).

        The files hold the raw bytes of what `run` takes and returns (int8 or float32, C order).
        The script runs in the parent of `artifact_dir`, so it names the artifact by its folder name.
        """
        raise NotImplementedError(f"target {self.kind!r} does not describe how to rerun its artifact")


def held(registry: Registry[Any]) -> frozenset[str]:
    """The names a registry holds, less entries that only refuse (a stage saying why it cannot)."""
    return frozenset(name for name, entry in registry.items() if not getattr(entry, "refuses", False))


def refuse_float_layers(qgraph: QGraph, capability: CapabilitySpec, no_fpu: str | None = None) -> None:
    """BuildError naming the first float layer (a float island's, or the layer feeding one) when the capability
    cannot run float, or the core cannot (`no_fpu`: why, e.g. "cpu 'cortex-m0' has no FPU")."""
    from dabuild.qir.layers.fallback import QFloat, QFloatWeighted

    layer = next((layer for layer in qgraph.layers if isinstance(layer, (QFloat, QFloatWeighted))), None)
    if layer is None:
        return
    where = f"node {layer.name!r} ({layer.float_op}) computes in float (a float island, or the layer feeding one)"
    if no_fpu is not None:
        raise BuildError(f"{where}, but {no_fpu}; quantize the island or build for a core with one "
                         "(cortex-m4, cortex-m7, cortex-m33, cortex-m55)")
    if not capability.fp32_fallback:
        raise BuildError(f"{where}, but target capability {capability.name!r} cannot run float (fp32_fallback: "
                         "false); quantize the island or build it for a target with fp32 fallback")


def refuse_ops_without_integers(graph: Any, target: str, layer_types: Collection[str],
                                integer_forms: Mapping[str, frozenset[str]], float_ops: Collection[str] = (),
                                needed: Callable[[Any, Collection[str]], Collection[str]] | None = None) -> None:
    """BuildError, before any stage after trace runs, listing every node an integer-only target cannot take.

    A node needs an integer lowering (`integer_forms`: op -> the layer types it makes) whose layer types the
    target writes, unless its op is one of `float_ops` (the float islands the target runs: such a node stays
    float); the message names the target and, per op, every node using it, so one run tells the user all of it.
    `needed(node, layers)`: the layer types of the lowering's `layers` this node can make (default: all of them).
    """
    refused: dict[tuple[str, str], list[str]] = {}
    for node in graph.nodes:
        made = integer_forms.get(node.op)
        if made is None and node.op in float_ops:
            continue
        if made is None:
            why = "no exact integer form, and this target runs no float islands"
        else:
            missing = sorted(set(made if needed is None else needed(node, made)) - set(layer_types))
            if not missing:
                continue
            why = f"its integer layers ({', '.join(missing)}) have no kernel here"
        refused.setdefault((node.op, why), []).append(node.name)
    if refused:
        lines = [f"  {op}: {why}; node{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"
                 for (op, why), names in refused.items()]
        raise BuildError(f"target {target!r} cannot build this model; ops it cannot take:\n" + "\n".join(lines))

