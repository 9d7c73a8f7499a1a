"""Bias correction: fold the mean error that weight quantization adds to a layer's output back into its bias.

Rounding the weights shifts each output channel by x · (W_q s_w - W). Its
mean over the data, E[x] · (W_q s_w - W), is a systematic offset (large for
narrow weights such as int4) that the bias can absorb exactly; what is left
is zero-mean noise. E[x] per input channel comes from the calibration
histograms, so the correction costs no pass over the data. For a conv each
input channel's mean multiplies the weight error summed over the kernel taps
(border padding is ignored: the mean is that of an interior output).
"""

from __future__ import annotations

import numpy as np

from dabuild.errors import BuildError
from dabuild.quant.calibrate import Stats


def input_channel_means(stats: Stats, tensor: str, axis: int, channels: int, where: str) -> np.ndarray:
    """E[x] per channel of `tensor` along `axis`, which must be the axis calibration recorded channels on."""
    recorded = stats.channel_axis(tensor)
    means = stats.channel_means(tensor)
    if recorded != axis or len(means) != channels:
        raise BuildError(f"{where}: bias correction needs the mean of input {tensor!r} for each of its {channels} "
                         f"channels on axis {axis}, but calibration recorded {len(means)} channels on axis "
                         f"{recorded}; turn tuning.bias_correction off for this model")
    return means


def mean_output_error(weight: np.ndarray, weight_q: np.ndarray, weight_scale: np.ndarray, channel_axis: int,
                      input_means: np.ndarray, groups: int = 1) -> np.ndarray:
    """E[x] · (W_q s_w - W) per output channel, for a dense weight (in, out) with channel_axis 1
    or a conv weight (out, in / groups, *kernel) with channel_axis 0."""
    shape = [1] * weight.ndim
    shape[channel_axis] = -1
    error = weight_q.astype(np.float64) * weight_scale.reshape(shape) - weight.astype(np.float64)
    if channel_axis == 1:  # dense
        return input_means @ error
    outputs, per_group = error.shape[:2]
    tap_sums = error.reshape(outputs, per_group, -1).sum(axis=-1)
    group_means = input_means.reshape(groups, per_group)[np.arange(outputs) // (outputs // groups)]
    return (tap_sums * group_means).sum(axis=1)
