"""blocked_dense: a dense with one weight scale per block of inputs and output (dabuild.qir.layers.blocked).

Per output, each block's int8 dot product (dabuild_dot, int32) is multiplied
by the block's multiplier into one int64 accumulator, which one rounding shift
(dabuild_requantize with multiplier 1) brings to the output. The input zero
point is folded into the int64 bias (sum over blocks of m * zp * sum of the
block's weights), so the dot products read the raw int8 inputs; export proves
every raw dot product fits int32 and every partial accumulator int64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.fixed_point import INT32_MAX, INT64_MAX
from dabuild.qir.layers.blocked import QBlockedDense, block_starts
from dabuild.targets.c.kernels.registry import CANONICAL, Step, kernel


@kernel("blocked_dense", "blocked_dense", inputs=CANONICAL, outputs=CANONICAL)
def blocked_dense(step: Step) -> dict[str, Any]:
    layer: QBlockedDense = step.layer  # type: ignore[assignment]
    weight = layer.weight.astype(np.int64)
    starts = block_starts(layer.in_features, layer.block_size)
    block_sums = np.add.reduceat(weight, starts, axis=0)                    # (blocks, out)
    block_magnitudes = np.add.reduceat(np.abs(weight), starts, axis=0)
    multiplier = layer.block_multiplier.astype(object)                      # Python integers: exact bounds
    zero_point = step.inputs[0].quant.zero_point
    bias = layer.bias.astype(object) - zero_point * (multiplier * block_sums.astype(object)).sum(axis=0)
    worst = np.abs(bias) + (abs(multiplier) * (128 * block_magnitudes).astype(object)).sum(axis=0)
    if int(block_magnitudes.max(initial=0)) * 128 > INT32_MAX or max(worst, default=0) > INT64_MAX // 2:
        raise BuildError(f"layer {layer.name!r} (blocked_dense): a block's dot product or the accumulator could "
                         "overflow the C kernel's int32/int64 sums; nearest representable: smaller blocks")
    last = layer.in_features - int(starts[-1])
    return {"in_features": layer.in_features, "out_features": layer.out_features,
            "rows": step.inputs[0].size // layer.in_features, "blocks": layer.blocks,
            "block_size": layer.block_size, "last_block": last,
            "weight": np.ascontiguousarray(layer.weight.T),                 # [out][in]: contiguous dot products
            "block_multiplier": np.ascontiguousarray(layer.block_multiplier.T),  # [out][block]
            "bias": np.asarray(bias, dtype=np.int64), "shift": layer.shift,
            "output_zero_point": step.outputs[0].quant.zero_point,
            "output_min": layer.output_min, "output_max": layer.output_max}
