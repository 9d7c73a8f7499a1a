"""The registry of C kernels, keyed by layer op and spec (dtype, granularity, input layout, structure).

A kernel is registered with `@kernel(op, name, ...)` on the function that
computes its template context, next to nothing else: adding one touches one
place (that function and its two templates). Its templates are
`templates/kernels/<config or name>.config.j2` (the layer's constants: weights,
tables, multipliers; optional) and `templates/kernels/<name>.forward.j2` (the layer's
forward function, with every size a literal so compilers see the trip counts
and vectorise the contiguous inner loops).

The first registered kernel of a layer's op whose spec fits is chosen, so a
specialised kernel (depthwise conv) is registered before the general one. A
kernel also names the instruction-set families of the CPU profiles it serves
(`isas`, see profiles.py): the host's int16 GEMM conv and the Cortex-M int8
conv are two kernels of one op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.layers.elementwise import QClamp
from dabuild.qir.qgraph import QGraph, QLayer, QuantParams
from dabuild.registry import Registry
from dabuild.targets.c.layout import Storage
from dabuild.targets.c.profiles import DSP, HOST, MVE, PORTABLE, PROFILES, Profile

# The storage a kernel wants its activation inputs in, and the one its outputs get.
CHANNELS_LAST, CANONICAL, ANY = "channels_last", "canonical", "any"
SAME = "same"    # outputs: the storage order of the first input of the same shape (else canonical)
ALIAS = "alias"  # outputs: the input's bytes themselves, reinterpreted (no code at all)
VIEW = "view"    # outputs: the input's bytes themselves in the storage order a transpose gives them (no code)
ALL_ISAS = (HOST, PORTABLE, DSP, MVE)


@dataclass(frozen=True)
class Operand:
    """A tensor as a step sees it: its name, its storage and its quantization."""

    name: str
    storage: Storage
    params: QuantParams | None   # None: a float island's float32 tensor
    constant: bool = False

    @property
    def quant(self) -> QuantParams:
        """The quantization of an integer operand (every operand an integer kernel reads is one)."""
        if self.params is None:
            raise BuildError(f"tensor {self.name!r} is a float island's, but an integer kernel reads it")
        return self.params

    @property
    def shape(self) -> tuple[int, ...]:
        return self.storage.shape

    @property
    def size(self) -> int:
        return self.storage.size

    @property
    def strides(self) -> tuple[int, ...]:
        return self.storage.strides


@dataclass
class Step:
    """One call in model_forward: a layer (or a layout conversion) with its kernel and operands."""

    kernel: Kernel
    name: str
    layer: QLayer | None
    inputs: list[Operand]
    outputs: list[Operand]
    profile: Profile = PROFILES[HOST]
    constants: dict[str, np.ndarray] = field(default_factory=dict)   # float constants a float layer reads
    rounding: str = "dabuild"   # the QGraph's requantization rounding (fixed_point.ROUNDINGS)
    clamp: QClamp | None = None   # a clamp (a residual block's relu) the kernel applies to its output itself
    banded: bool = False   # computes a band of output rows per call (patch.py): row_begin, row_end, in_first

    @property
    def scratch_bytes(self) -> int:
        return self.kernel.scratch(self) if self.kernel.scratch else 0


Context = Callable[[Step], dict[str, Any]]
Condition = Callable[[QLayer, QGraph, Profile], "str | None"]   # why the kernel cannot run the layer there; None: it can


@dataclass(frozen=True)
class Kernel:
    op: str
    name: str
    context: Context
    inputs: str = ANY
    outputs: str = SAME
    dtypes: tuple[str, ...] = ("int8",)
    granularities: tuple[str, ...] = ("per_tensor",)
    when: Condition | None = None
    scratch: Callable[[Step], int] | None = None   # bytes of arena scratch the forward function uses
    config: str | None = None   # stem of the constants template when kernels share one (default: `name`)
    isas: tuple[str, ...] = ALL_ISAS   # the profiles' instruction-set families it is for

    def describe(self) -> str:
        return (f"{self.name} (dtype {'/'.join(self.dtypes)}, {'/'.join(self.granularities)}, "
                f"{self.inputs} inputs)")


# By "op/kernel name", in registration order (selection tries them in it): the modules in this order fill it.
KERNELS: Registry[Kernel] = Registry("C kernel", "the c target", (
    "dabuild.targets.c.kernels.blocked", "dabuild.targets.c.kernels.elementwise",
    "dabuild.targets.c.kernels.embedding", "dabuild.targets.c.kernels.island", "dabuild.targets.c.kernels.linear",
    "dabuild.targets.c.kernels.matmul", "dabuild.targets.c.kernels.movement", "dabuild.targets.c.kernels.pool",
    "dabuild.targets.c.kernels.resize", "dabuild.targets.c.kernels.select", "dabuild.targets.c.kernels.wide",
))


def kernel(op: str, name: str, **spec: Any) -> Callable[[Context], Context]:
    """Register the decorated context function as kernel `name` of layer op `op`."""
    def register(context: Context) -> Context:
        KERNELS.add(f"{op}/{name}", Kernel(op, name, context, **spec))
        return context
    return register


def kernel_ops() -> list[str]:
    """The layer ops some C kernel runs."""
    return sorted({k.op for k in KERNELS.values()})


def layer_spec(layer: QLayer, qgraph: QGraph) -> tuple[str, str]:
    """(dtype, granularity) of a layer: its activations' dtype, per_channel when it has one multiplier per
    output channel."""
    dtypes = {qgraph.tensors[name].params.dtype for name in [*layer.inputs, *layer.outputs] if name in qgraph.tensors}
    multiplier = getattr(layer, "multiplier", None)
    per_channel = getattr(layer, "weight", None) is not None and multiplier is not None and len(multiplier) > 1
    return "/".join(sorted(dtypes)), "per_channel" if per_channel else "per_tensor"


def select(layer: QLayer, qgraph: QGraph, profile: Profile = PROFILES[HOST]) -> Kernel:
    """The first registered kernel of `profile` that runs `layer`, or a BuildError naming the layer, the
    profile and why none does."""
    dtype, granularity = layer_spec(layer, qgraph)
    reasons = []
    for candidate in KERNELS.values():
        if candidate.op != layer.op or profile.isa not in candidate.isas:
            continue
        if dtype not in candidate.dtypes or granularity not in candidate.granularities:
            reasons.append(f"{candidate.describe()} does not take {dtype} {granularity}")
            continue
        why = candidate.when(layer, qgraph, profile) if candidate.when else None
        if why is None:
            return candidate
        reasons.append(f"{candidate.name}: {why}")
    detail = "; ".join(reasons) if reasons else f"kernels exist for {', '.join(kernel_ops())}"
    raise BuildError(f"layer {layer.name!r}: the C target has no kernel for op {layer.op!r} "
                     f"({dtype}, {granularity}) on cpu {profile.name!r}: {detail}")

