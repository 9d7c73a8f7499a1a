"""What "cheapest" means: the cost a search minimises among the configs that meet the accuracy goal.

`size` is the bytes the target's artifact stores for weights and parameters
(`Target.stored_bytes`: int4 packed two a byte where the target packs them,
int16-stored weights counted as stored) when the tune stage knows the target
it tunes for; without one (a bare `tune_stage` call) it is the total weight
bits counted from the tuning space. Either way an activation wider than 8 bits
(int16) adds the RAM it takes beyond int8 (`TuningSpace.wide_activation_bits`). `bops` (multiply-accumulates x weight bits
x input bits) is counted from the space and means the same on every backend. `estimate` is the backend's own figure: a capability YAML may name a
cost model (`cost_model: da4ml`), a class registered under the entry-point
group `dabuild.cost_models` whose instances price a quantized graph
(`model(qgraph) -> float`, in the model's `unit`, e.g. da4ml's LUTs). Where a
capability names one, `estimate` is the recipe's default objective, since the
backend knows better than a bit count what its hardware costs; elsewhere the
default is `size`, and asking for `estimate` is an error naming the capability.

Costs are integers (an estimate is rounded), so trials compare and store as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Protocol

from dabuild import plugins
from dabuild.capability import COST_MODELS, CapabilitySpec
from dabuild.errors import BuildError
from dabuild.qir.qgraph import QGraph
from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.tune.space import NodeSpace, TuningSpace

ESTIMATE = "estimate"
OBJECTIVES = ("size", "bops", ESTIMATE)
UNITS = {"size": "bits", "bops": "bit operations"}
StoredBytes = Callable[[QGraph], int]  # a target's `stored_bytes`


class CostModel(Protocol):
    """A backend's cost estimate of a quantized graph (an entry point of `dabuild.cost_models`)."""

    unit: ClassVar[str]
    packages: ClassVar[tuple[str, ...]]  # whose versions enter the tune stage's key: they decide the estimates

    def __call__(self, qgraph: QGraph) -> float: ...


@dataclass(frozen=True)
class Objective:
    name: str                                # size | bops | estimate
    unit: str
    cost: Callable[[QuantConfig], int]
    floor: int                               # no config of the space costs less (0: no bound known)
    scale: int                               # a large cost of the space, to express costs as fractions


def resolve_objective(asked: str | None, capability: CapabilitySpec) -> str:
    """The objective a recipe's `tuning.objective` means for `capability` (None: its default)."""
    if asked is None:
        return ESTIMATE if capability.cost_model else "size"
    if asked not in OBJECTIVES:
        raise BuildError(f"unknown tuning objective {asked!r} (known: {', '.join(OBJECTIVES)})")
    if asked == ESTIMATE and capability.cost_model is None:
        raise BuildError(f"tuning.objective {ESTIMATE!r}: capability {capability.name!r} names no cost_model "
                         "to estimate with; use size or bops")
    return asked


def counted(space: TuningSpace, name: str) -> Objective:
    """size or bops, counted from the space; the float graph is the scale."""
    cost = partial(space.cost, objective=name)
    return Objective(name, UNITS[name], cost, space.floor(name), cost(space.fp32()))


class Estimate:
    """A cost model over configs: each config quantized and priced once, remembered by its hash."""

    def __init__(self, model: Callable[[QGraph], float], quantize: Callable[[QuantConfig], QGraph]) -> None:
        self.model, self.quantize = model, quantize
        self._costs: dict[str, int] = {}

    def __call__(self, config: QuantConfig) -> int:
        key = config.content_hash()
        if key not in self._costs:
            self._costs[key] = round(self.model(self.quantize(config)))
        return self._costs[key]


def load_cost_model(capability: CapabilitySpec) -> CostModel:
    """A fresh instance of the capability's cost model; BuildError when its package is missing."""
    name = capability.cost_model
    if name is None:
        raise BuildError(f"capability {capability.name!r} names no cost_model")
    try:
        return plugins.load(COST_MODELS, name)()
    except ImportError as error:
        raise BuildError(f"cost model {name!r} of capability {capability.name!r} cannot be loaded: {error} "
                         f"(is the package it needs, {error.name or 'unknown'}, installed?)") from error


def artifact_size(space: TuningSpace, stored_bytes: StoredBytes, quantize: Callable[[QuantConfig], QGraph]) -> Objective:
    """`size` as the artifact's bytes: each config quantized and measured by the target once (by its hash).

    The floor is the bytes of every node at its fewest bits (per tensor, fewest scales, where offered), the
    scale the default config's. Activations wider than 8 bits add the RAM bytes they take beyond int8
    (`TuningSpace.wide_activation_bits`), as the counted size does."""
    stored = Estimate(stored_bytes, quantize)

    def cost(config: QuantConfig) -> int:
        return stored(config) + space.wide_activation_bits(config) // 8

    def fewest(node: NodeSpace) -> NodeConfig:
        def key(index: int) -> tuple[int, int, int]:  # by position: ties go to the earlier candidate
            choice = node.candidates[index]
            scales = sum(getattr(choice, role) is not None and getattr(choice, role).granularity != "per_tensor"
                         for role in ("weight", "activation"))
            return (node.weight_bits(choice), scales, index)
        return node.candidates[min(range(len(node.candidates)), key=key)]

    floor = cost(QuantConfig({name: fewest(node) for name, node in space.nodes.items()}))
    return Objective("size", "bytes", cost, floor, cost(space.default()))


def make_objective(asked: str | None, space: TuningSpace, capability: CapabilitySpec,
                   quantize: Callable[[QuantConfig], QGraph], stored_bytes: StoredBytes | None = None) -> Objective:
    """The recipe's objective for `capability` over `space`; `quantize` lowers a config for a cost model, and
    `stored_bytes` (the target's) measures its artifact for `size` (None: size counts weight bits)."""
    name = resolve_objective(asked, capability)
    if name == "size" and stored_bytes is not None:
        return artifact_size(space, stored_bytes, quantize)
    if name != ESTIMATE:
        return counted(space, name)
    model = load_cost_model(capability)
    estimate = Estimate(model, quantize)
    return Objective(name, model.unit, estimate, 0, estimate(space.default()))
