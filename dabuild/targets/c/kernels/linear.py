"""dense and conv kernels: int8 dot products into int32, requantized per tensor or per channel.

The input zero point leaves the inner loop. dense and depthwise conv use
sum (x - zp) * w = sum x * w - zp * sum w, with zp * sum w in the bias at
export time (the raw sum stays inside int32: |x| <= 128 < 255, which the
lowering's overflow bound covers; the corrected bias joins it in int64), and
depthwise reads its input through a ring of the padded rows one output row
spans, bordered by the zero point, so every window is whole.

The general conv is a small GEMM. Per tile of output pixels it gathers their
windows, centred (x - zp, and 0 where the window pads: a padded x - zp is
exactly 0, as the reference pads), into rows of `depth` contiguous int16 in a
few kilobytes of scratch (im2col), and multiplies them by the weights,
widened to int16 at export and laid out [group][out][depth] with depth (and
the outputs of a group) padded with zeros to whole blocks. Its inner loop
keeps CHANNEL_BLOCK x PIXEL_BLOCK int32 sums in locals over one contiguous
depth: int16 x int16 products summed pairwise, which compilers turn into
pmaddwd (SSE2, at plain -O2) or its NEON/AVX counterparts, every loaded
vector used by several sums and no horizontal sum until the end.

On a Cortex-M profile the general conv is `conv_mcu`: the same tiled GEMM
with int8 weights in flash and a register block sized for the core (2 x 2
sums on M0/M3; 2 channels x 3 pixels on the DSP cores, whose inner loop is
SMLAD on int16 columns and weights stored in channel pairs, each word
widened by SXTB16 into both channels' pairs; 2 channels x 3 or 2 pixels of 16-lane int8 vector
MACs on Helium, whose columns stay int8 and whose input zero point is folded
into the bias, the padding taps then holding the zero point). Its scratch is
one block of pixels' windows, nothing more.

Weights are laid out at export time so the inner loops are contiguous: dense
[out][in]; depthwise [kh][kw][out], a vector multiply-add across the
channels of one pixel (on a DSP core int16, each block of four channels
stored (w0, w2, w1, w3): the pairs SMLABB/SMLATT take, widened once; on the
DSP planar path, 3 wide and stride 1, [out][kh] of (w0, w1, w1, w2): the pairs
SMLAD takes against two neighbouring pixels of one channel).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.fixed_point import INT32_MAX
from dabuild.qir.layers.linear import QConv, QConvTranspose, QDense, QWeighted
from dabuild.qir.qgraph import QGraph
from dabuild.targets.c.kernels.registry import CANONICAL, CHANNELS_LAST, Step, kernel
from dabuild.targets.c.profiles import DSP, HOST, MVE, PORTABLE, Profile

BOTH = ("per_tensor", "per_channel")


def _requantization(step: Step, layer: QWeighted, weight_sums: np.ndarray, centred: bool = False) -> dict[str, Any]:
    """Bias with the input zero point folded in, and the output's requantization constants.

    `narrow_sum`: no raw sum plus bias can leave int32 (|x| <= 128, or |x - zp| <= 255 for centred inputs,
    times the output's sum of |w|, plus |bias|), so the kernel adds them in int32.
    """
    zero_point = step.inputs[0].quant.zero_point
    bias = layer.bias.astype(np.int64) - zero_point * weight_sums
    if np.abs(bias).max(initial=0) > INT32_MAX:
        raise BuildError(f"layer {layer.name!r}: the bias with the input zero point folded in overflows int32")
    magnitudes = np.abs(layer.weight.astype(np.int64))
    per_output = magnitudes.sum(axis=0) if isinstance(layer, QDense) else magnitudes.reshape(len(magnitudes), -1).sum(1)
    largest = (255 if centred else 128) * per_output.reshape(-1) + np.abs(bias).reshape(-1)
    output_zero_point = step.outputs[0].quant.zero_point
    return {"bias": bias, "multiplier": layer.multiplier, "shift": layer.shift,
            "narrow_sum": bool(largest.max(initial=0) <= INT32_MAX),
            "tieless": step.rounding == "dabuild" and abs(output_zero_point) <= 128 and bool(largest.max(initial=0) <= INT32_MAX)
            and never_ties(largest, np.asarray(layer.multiplier), np.asarray(layer.shift)),
            "high_shift": bool(np.all((np.asarray(layer.shift) >= 32) & (np.asarray(layer.shift) <= 62))),
            # Helium's four-lane requantization (dabuild_requantize32_mve) rounds once, as dabuild does, and
            # takes shifts of 33..62 only (at 32 its rounding term 2^(shift-33) is not an integer)
            "vector_requantize": step.rounding == "dabuild" and bool(np.all((np.asarray(layer.shift) >= 33)
                                                                           & (np.asarray(layer.shift) <= 62))),
            "per_channel": len(layer.multiplier) > 1, "output_zero_point": output_zero_point,
            "output_min": layer.output_min, "output_max": layer.output_max}


def never_ties(largest: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> bool:
    """Whether no output's sum can tie in its requantization, so dabuild's rounding (half away from zero) is
    rounding half up and dabuild_requantize32_tieless applies (shifts 33..54). acc * m is an odd multiple of
    2^(s-1), a tie, only if v2(acc) + v2(m) = s - 1 (v2: the power of 2 dividing it); a nonzero |acc| <= L has
    v2(acc) < bit_length(L), so none ties where s - v2(m) >= bit_length(L) + 1 (a multiplier of 0 never ties).
    Per output channel, L its bound on |sum + bias| (a per-tensor multiplier takes the largest)."""
    if not np.all((shift >= 33) & (shift <= 54)) or np.any(multiplier < 0):
        return False
    bounds = np.broadcast_to(largest if len(multiplier) > 1 else largest.max(initial=0), multiplier.shape)
    for bound, m, s in zip(bounds.tolist(), multiplier.tolist(), shift.tolist(), strict=True):
        twos = (m & -m).bit_length() - 1 if m else 0
        if m and s - twos < int(bound).bit_length() + 1:
            return False
    return True


@kernel("dense", "dense", config="weighted", inputs=CANONICAL, outputs=CANONICAL, granularities=BOTH)
def dense(step: Step) -> dict[str, Any]:
    layer: QDense = step.layer  # type: ignore[assignment]
    weight = np.ascontiguousarray(layer.weight.T)  # [out][in]: each output one contiguous dot product
    nibbles = step.profile.cortex_m and _fits_nibbles(weight)
    return {"in_features": layer.in_features, "out_features": layer.out_features,
            "rows": step.inputs[0].size // layer.in_features,
            "weight": pack_nibbles(weight) if nibbles else weight, "nibbles": nibbles,
            "row_bytes": -(-layer.in_features // 2) if nibbles else layer.in_features,
            **_requantization(step, layer, weight.astype(np.int64).sum(axis=1))}


def pack_nibbles(rows: np.ndarray) -> np.ndarray:
    """4-bit weights (int4 chosen, or any whose values fit) two per byte along each row, the even index in the
    low nibble, a row of odd length padded with 0: what a Cortex-M profile stores in flash for a dense layer."""
    padded = np.zeros((*rows.shape[:-1], rows.shape[-1] + rows.shape[-1] % 2), np.int64)
    padded[..., :rows.shape[-1]] = rows
    nibbles = padded & 15
    return (nibbles[..., 0::2] | nibbles[..., 1::2] << 4).astype(np.uint8)


def _planar(layer: QConv, qgraph: QGraph, profile: Profile) -> str | None:
    return None if len(layer.strides) in (1, 2) else f"{len(layer.strides)}-D convolution (1-D and 2-D only)"


def _depthwise(layer: QConv, qgraph: QGraph, profile: Profile) -> str | None:
    channels = qgraph.tensors[layer.inputs[0]].shape[0]
    if layer.groups != channels or layer.weight.shape[1] != 1:
        return "not depthwise (groups == input channels)"
    if channels == 1 and profile.cortex_m:
        return "one input channel: on a Cortex-M the GEMM conv's dot products over the window are faster"
    return _planar(layer, qgraph, profile)


def window(step: Step, kernel_shape: list[int], strides: list[int], pads: list[int],
           dilations: list[int]) -> dict[str, int]:
    """The 2-D geometry of a 1-D or 2-D window op over channels-last storage (1-D as a height of 1)."""
    x, y = step.inputs[0].shape, step.outputs[0].shape
    if len(kernel_shape) == 1:
        kernel_shape, strides, dilations = [1, *kernel_shape], [1, *strides], [1, *dilations]
        pads = [0, pads[0], 0, pads[1]]
        x, y = (x[0], 1, x[1]), (y[0], 1, y[1])
    return {"channels": x[0], "height": x[1], "width": x[2], "out_channels": y[0], "out_height": y[1],
            "out_width": y[2], "kernel_height": kernel_shape[0], "kernel_width": kernel_shape[1],
            "stride_height": strides[0], "stride_width": strides[1], "dilation_height": dilations[0],
            "dilation_width": dilations[1], "pad_top": pads[0], "pad_left": pads[1], "pad_bottom": pads[2],
            "pad_right": pads[3]}


def _conv_window(step: Step) -> dict[str, int]:
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = window(step, list(layer.weight.shape[2:]), layer.strides, layer.pads, layer.dilations)
    padded = any(geometry[f"pad_{side}"] for side in ("top", "left", "bottom", "right"))
    geometry["padded_height"] = geometry["height"] + geometry["pad_top"] + geometry["pad_bottom"]
    geometry["padded_width"] = geometry["width"] + geometry["pad_left"] + geometry["pad_right"]
    geometry["padded"] = padded
    return geometry


def _band_rows(geometry: dict[str, int]) -> int:
    """The padded input rows one output row's windows span."""
    return (geometry["kernel_height"] - 1) * geometry["dilation_height"] + 1


def _ring_bytes(step: Step) -> int:
    """Depthwise scratch: a ring of the padded rows one output row reads (row_band.j2), none without padding;
    on the planar DSP path rows of four channels' padded input widened to int16 (_plane_rows)."""
    geometry = _conv_window(step)
    if _planar_depthwise(step, geometry):
        return _plane_bytes(geometry)
    return _ring_of_rows_bytes(geometry) if geometry["padded"] else 0


def _ring_of_rows_bytes(geometry: dict[str, int]) -> int:
    """The bytes of row_band.j2's ring: the padded int8 rows one output row reads."""
    return _band_rows(geometry) * geometry["padded_width"] * geometry["channels"]


PLANAR_GROUP = 4   # channels the planar depthwise loop widens at a time: one word of the channels-last input
PLANAR_ROW = 3     # the fewest outputs a row for it: per channel and row it sets up what a narrower row cannot repay


def _plane_width(geometry: dict[str, int]) -> int:
    """The int16 a planar depthwise row holds: the padded row to a whole word, and one word past it (a stride-2
    step's third word reaches one pixel beyond the padded row)."""
    return _round_up(geometry["padded_width"], 2) + 2


PLANAR_CHUNK = 4   # output rows the planar loop computes at least per widening (each widening's first rows repeat)


def _plane_rows(geometry: dict[str, int]) -> int:
    """The padded input rows the planar loop widens at a time: as many as fit the ring of padded rows the other
    loop keeps (so the arena does not grow), but those of at least PLANAR_CHUNK output rows (few channels make
    that ring small: 1,200 bytes for VWW's 8 at 48 x 48), at most the padded input."""
    fitting = _ring_of_rows_bytes(geometry) // (2 * PLANAR_GROUP * _plane_width(geometry))
    least = _band_rows(geometry) + (PLANAR_CHUNK - 1) * geometry["stride_height"]
    return min(geometry["padded_height"], max(fitting, least))


def _plane_bytes(geometry: dict[str, int]) -> int:
    return 2 * PLANAR_GROUP * _plane_rows(geometry) * _plane_width(geometry)


def _planar_depthwise(step: Step, geometry: dict[str, int]) -> bool:
    """Whether a padded depthwise conv takes depthwise_planar_dsp.j2: a DSP core, not built for size,
    multiplier 1, whole blocks of four channels, a kernel 3 wide of stride 1 and no column dilation, and sums that
    start at the bias inside int32 with every shift 32 or more, on rows of PLANAR_ROW outputs or more. (Stride 2
    widens four inputs per output, and its loop, measured on VWW's four such layers, took 1.2 to 1.8x the other
    loop's cycles, still 1.0 to 1.4x with two pixels widened a step and SMMLA requantization. Rows of 3, which
    took 1.2x before those two, take 0.83x now: VWW's conv76, 78 K -> 65 K estimated M4 cycles.)"""
    layer: QConv = step.layer  # type: ignore[assignment]
    if step.profile.isa != DSP or step.profile.for_size or not geometry["padded"]:
        return False
    if geometry["out_channels"] != geometry["channels"] or geometry["channels"] % PLANAR_GROUP:
        return False
    if geometry["kernel_width"] != 3 or geometry["dilation_width"] != 1 or geometry["stride_width"] != 1:
        return False
    if geometry["out_width"] < PLANAR_ROW:
        return False
    weight = _planar_weight(layer)
    requantization = _requantization(step, layer, weight.astype(np.int64).sum(axis=(1, 2, 3)))
    return bool(requantization["narrow_sum"] and requantization["high_shift"])


def _paired_taps(taps: np.ndarray) -> np.ndarray:
    """Depthwise weights [kh][3][out] as the planar loop reads them: per channel and kernel row the int16 pairs
    (w0, w1) and (w1, w2), [out][kh][4]."""
    w0, w1, w2 = (taps[:, k, :].astype(np.int16) for k in range(3))
    return np.ascontiguousarray(np.stack([w0, w1, w1, w2], axis=-1).transpose(1, 0, 2))


# The GEMM conv's register block (int32 sums kept in locals), the pixels gathered per tile, and the
# multiple the depth is padded to (8 int16: whole SSE2 and NEON vectors, no scalar tail). 2 channels x
# 6 pixels fits x86-64's 16 vector registers (12 sums, 2 weight vectors, 1 product) with every pixel
# vector a memory operand; of the blocks tried on the ResNet-style bench (4x2, 4x3, 2x4, 3x4, 4x4,
# 2x6, 2x8, 8x1, tiles of 8 to 32 pixels) it ran the fewest instructions in the least time.
CHANNEL_BLOCK, PIXEL_BLOCK, TILE_PIXELS, DEPTH_MULTIPLE = 2, 6, 12, 8


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _gemm_shape(step: Step, channel_block: int, pixel_block: int, tile_pixels: int,
                depth_multiple: int, window: dict[str, int] | None = None) -> dict[str, int]:
    """The geometry of a GEMM conv with this register block, tile and depth multiple (over `window`, the layer's
    own by default)."""
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = window or _conv_window(step)
    group_channels = int(layer.weight.shape[1])
    window_depth = geometry["kernel_height"] * geometry["kernel_width"] * group_channels
    return {**geometry, "group_channels": group_channels, "window_depth": window_depth,
            "depth": _round_up(window_depth, depth_multiple),
            "pixels": geometry["out_height"] * geometry["out_width"], "tile_pixels": tile_pixels,
            "channel_block": channel_block, "pixel_block": pixel_block,
            "group_outputs": geometry["out_channels"] // layer.groups,
            "block_outputs": _round_up(geometry["out_channels"] // layer.groups, channel_block)}


def _gemm_geometry(step: Step) -> dict[str, int]:
    window = _conv_window(step)
    tile = min(TILE_PIXELS, _round_up(window["out_height"] * window["out_width"], PIXEL_BLOCK))
    return _gemm_shape(step, CHANNEL_BLOCK, PIXEL_BLOCK, tile, DEPTH_MULTIPLE)


def _gemm_weight(step: Step, geometry: dict[str, int], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """The weight rows [group][out][kh][kw][in/groups], and them as stored: outputs padded to whole channel
    blocks and depth to its multiple, with zeros."""
    layer: QConv = step.layer  # type: ignore[assignment]
    groups, outputs, depth = layer.groups, geometry["group_outputs"], geometry["window_depth"]
    rows = _planar_weight(layer).reshape(groups, outputs, depth)
    weight: np.ndarray = np.zeros((groups, geometry["block_outputs"], geometry["depth"]), dtype)
    weight[:, :outputs, :depth] = rows
    return rows, weight


def _gemm_bytes(step: Step) -> int:
    geometry = _gemm_geometry(step)
    return 2 * geometry["tile_pixels"] * geometry["depth"]


def _planar_weight(layer: QConv) -> np.ndarray:
    """(O, C/groups, *kernel) -> (O, kh, kw, C/groups), a 1-D kernel with kh = 1."""
    weight = layer.weight if layer.weight.ndim == 4 else layer.weight[:, :, None, :]
    return weight.transpose(0, 2, 3, 1)


@kernel("conv", "conv_depthwise", config="weighted", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, granularities=BOTH,
        when=_depthwise, scratch=_ring_bytes)
def conv_depthwise(step: Step) -> dict[str, Any]:
    layer: QConv = step.layer  # type: ignore[assignment]
    weight = _planar_weight(layer)  # (O, kh, kw, 1)
    geometry = _conv_window(step)
    multiplier = geometry["out_channels"] // geometry["channels"]
    taps = np.ascontiguousarray(weight[..., 0].transpose(1, 2, 0))  # [kh][kw][out]
    widened = step.profile.isa == DSP and multiplier == 1 and not step.profile.for_size
    planar = _planar_depthwise(step, geometry)
    return {**geometry, "input_zero_point": step.inputs[0].quant.zero_point, "band_rows": _band_rows(geometry),
            "depth_multiplier": multiplier, "widened": widened, "planar": planar,
            "plane_width": _plane_width(geometry), "plane_rows": _plane_rows(geometry),
            "weight": _paired_taps(taps) if planar else _widened_taps(taps) if widened else taps,
            **_requantization(step, layer, weight.astype(np.int64).sum(axis=(1, 2, 3)))}


def _widened_taps(taps: np.ndarray) -> np.ndarray:
    """Depthwise weights [kh][kw][out] as the DSP loop reads them: int16, each whole block of four channels
    stored (w0, w2, w1, w3), so its two words are the pairs SMLABB/SMLATT take against SXTB16 and SXTB16 ROR #8
    of the inputs' word without widening a weight in the loop (twice the flash of int8: a few kilobytes for
    depthwise layers); the last channels past the blocks in order."""
    blocks = taps.shape[-1] // 4 * 4
    widened = taps.astype(np.int16)
    widened[..., :blocks] = interleave(widened[..., :blocks])
    return widened


@kernel("conv", "conv", config="weighted", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, granularities=BOTH, when=_planar,
        scratch=_gemm_bytes, isas=(HOST,))
def conv(step: Step) -> dict[str, Any]:
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = _gemm_geometry(step)
    groups = layer.groups
    _, weight = _gemm_weight(step, geometry, np.int16)
    return {**geometry, "input_zero_point": step.inputs[0].quant.zero_point, "groups": groups,
            "channel_block": CHANNEL_BLOCK, "pixel_block": PIXEL_BLOCK, "isa": HOST, "centred": True,
            "column_type": "int16_t", "pad_value": 0, "vector_output": False, "fold_bias": False,
            # one window row is contiguous in both source and columns when no group or dilation interleaves it
            "contiguous_rows": groups == 1 and geometry["dilation_width"] == 1,
            "weight": weight, **_requantization(step, layer, np.zeros(geometry["out_channels"], np.int64), centred=True)}


def _mcu_geometry(step: Step) -> dict[str, int]:
    """The GEMM geometry of `conv_mcu` for the step's profile: its register block and depth multiple; the
    tile is one block of pixels (the least scratch)."""
    window = _conv_window(step)
    pixels = window["out_height"] * window["out_width"]
    # Helium: 2 channels x 3 or 2 pixels, the block that wastes fewest pixel slots on the last partial tile
    # (9 pixels: 3 x 3), larger first on a tie. 4 pixels would need 8 accumulators and 6 row pointers
    # beside the loop counter, more than the 13 general registers, and gcc spills one inside the loop.
    # DSP: 2 channels x 3 pixels (conv_dsp.loop.j2, the block of conv_rows_dsp.j2); M0/M3: 2 x 2.
    pixel_block = {MVE: min((3, 2), key=lambda block: (_round_up(pixels, block), -block)),
                   DSP: WIDENED_PIXELS}.get(step.profile.isa, 2)
    return _gemm_shape(step, 2, pixel_block, pixel_block, step.profile.depth_multiple)


def _mcu_bytes(step: Step) -> int:
    geometry = _mcu_geometry(step)
    column_bytes = 1 if step.profile.isa == MVE else 2
    return column_bytes * geometry["tile_pixels"] * geometry["depth"]


def interleave(rows: np.ndarray) -> np.ndarray:
    """Each 4 weights of a row (w0, w1, w2, w3) stored as (w0, w2, w1, w3): SXTB16 of the word gives (w0, w1),
    SXTB16 of it rotated by 8 gives (w2, w3), the pairs of int16 columns SMLAD multiplies. Its own inverse."""
    shape = rows.shape
    return rows.reshape(*shape[:-1], -1, 2, 2).swapaxes(-1, -2).reshape(shape)


def _row_multiple(profile: Profile) -> int:
    """What `conv_rows` needs a window row's bytes to be a multiple of: a 16-lane vector on Helium and a word on
    a DSP core (else their im2col, the depth padded to whole vectors or words, is faster: ResNet-style conv0,
    rows of 9, 1.2 M instructions on M4 against 2.2 M in the portable loop), anything for portable C and when
    built for size (one kernel, no im2col code)."""
    if profile.for_size:
        return 1
    return {MVE: 16, DSP: 4}.get(profile.isa, 1)


def _rows_apply(layer: QConv, qgraph: QGraph, profile: Profile) -> str | None:
    if (why := _planar(layer, qgraph, profile)) is not None:
        return why
    if layer.groups != 1 or any(d != 1 for d in layer.dilations):
        return "grouped or dilated (a window row is not contiguous in the input)"
    channels = qgraph.tensors[layer.inputs[0]].shape[0]
    row_bytes = int(layer.weight.shape[-1]) * channels
    if _fits_nibbles(layer.weight):   # 4-bit: packed, any row
        return None
    if row_bytes % _row_multiple(profile):
        return f"a window row of {row_bytes} bytes is no multiple of {_row_multiple(profile)}"
    if profile.isa == DSP and not profile.for_size and channels % 4:
        return f"{channels} channels, no multiple of 4 (the im2col GEMM widens such windows to int16 once per pixel)"
    return None


def _fits_nibbles(weight: np.ndarray) -> bool:
    """int4 chosen (or weights whose values all fit 4 bits): a Cortex-M stores them two per byte."""
    return bool(np.all((weight >= -8) & (weight <= 7)))


def _rows_geometry(step: Step) -> dict[str, int]:
    """`conv_rows`' geometry: 2 channels x 2 pixels per block (the 13 usable registers of a DSP core hold 4 sums,
    4 widened weight pairs and a widened pixel word; see conv_mcu), 3 pixels on Helium when the output row is a
    multiple of 3 or long enough that its last partial block costs little (its sums cost no widening registers).

    A 1x1 conv of stride 1 without padding reads each pixel's channels alone, so its whole input is one row of
    height x width pixels: blocks run across what were row ends (KWS's 25 x 5 pointwise convs: 41 blocks of 3
    pixels and one of 2, where rows of 5 took 2 + 2 + 1 each); not when banded (patch.py), row by row."""
    window = _conv_window(step)
    if _pointwise(window) and not step.banded:   # a band's rows are given at run time
        pixels = window["out_height"] * window["out_width"]
        window = {**window, "height": 1, "width": pixels, "out_height": 1, "out_width": pixels,
                  "padded_height": 1, "padded_width": pixels}
    width = window["out_width"]
    pixel_block = 3 if step.profile.isa == MVE and (width % 3 == 0 or width >= LONG_ROW) else 2
    return _gemm_shape(step, 2, pixel_block, pixel_block, 1, window)


LONG_ROW = 24   # output pixels from which Helium's conv_rows takes blocks of 3 whatever the remainder


def _pointwise(window: dict[str, int]) -> bool:
    return (window["kernel_height"] == window["kernel_width"] == window["stride_height"] == window["stride_width"] == 1
            and not window["padded"])


def _band_bytes(step: Step) -> int:
    geometry = _conv_window(step)
    if _widened(step):
        if _single_pixels(geometry):
            return 2 * WIDENED_PIXELS * geometry["channels"]
        return 2 * geometry["kernel_height"] * geometry["padded_width"] * geometry["channels"]
    return geometry["kernel_height"] * geometry["padded_width"] * geometry["channels"] if geometry["padded"] else 0


WIDENED_PIXELS = 3   # conv_rows_dsp.j2's block: 2 channels x 3 pixels (6 sums, 3 pixel pairs, a weight word and
# its two pairs, w, x and the count fill the 14 registers), the fewest cycles per MAC that fit them


def _widened(step: Step) -> bool:
    """Whether conv_rows takes the DSP path of conv_rows_dsp.j2 (int16-widened input, channel-paired weights):
    a DSP core not built for size, int8 weights and channels a multiple of 4 (so every window's kernel rows
    start on a word of the input and widen alike)."""
    layer: QConv = step.layer  # type: ignore[assignment]
    channels = step.inputs[0].shape[0]
    return (step.profile.isa == DSP and not step.profile.for_size and channels % 4 == 0
            and not _fits_nibbles(layer.weight))


def _single_pixels(window: dict[str, int]) -> bool:
    """A 1x1 kernel without padding: each window is one pixel, widened with its block (any stride)."""
    return window["kernel_height"] == window["kernel_width"] == 1 and not window["padded"]


UNROLLED_CHANNEL_PAIRS = 8   # conv_rows_dsp.j2's channel-pair loop is unrolled for a 1x1 conv of at most 8 input
# channels and this many output pairs: each pair's bias then sits at a constant offset and the requantization
# constants stay in registers (VWW's 8 -> 16 conv on M4, 617 K -> 571 K estimated cycles; at 16 or 32 input
# channels, unrolled 16 pairs took more, 470 K -> 489 K and 830 K -> 905 K)


def _unrolled_channel_pairs(single: bool, geometry: dict[str, int]) -> bool:
    return (single and geometry["kernel_width"] * geometry["channels"] <= 8
            and geometry["block_outputs"] // 2 <= UNROLLED_CHANNEL_PAIRS)


PAIR_UNROLL = 64   # the most pairs a trip: a loop end costs about 6 cycles to a pair's 12 or 13 (VWW on M4: 16 against
# 8, 12.16 -> 11.91 M estimated cycles for 4 KB more code; on int16 weights 32 against 16, 10.97 -> 10.87 M for 6 KB
# more, 64, 10.80 M for 9 KB more: a 128-channel 1x1 conv's row in one trip)


WIDE_WEIGHT_BYTES = 32768   # the DSP GEMM loops take a layer's weights as int16 (`wide_weights`, wide_loads.j2) up
# to this many int8 bytes, so doubling them costs at most 32 KB of flash a layer: an LDRD of both channels' pairs
# where the int8 word took a load and two SXTB16, 12 estimated M4 cycles for 12 MACs where it took 13 (VWW's 1x1
# convs up to 16 KB: 11.49 M -> 10.97 M, 98 KB more rodata; up to 32 KB, its 128 -> 256 conv too, 10.71 M ->
# 10.66 M for 32 KB more; a 1x1 conv of unrolled channel pairs keeps int8, 571 K against 636 K int16 unrolled and
# 666 K int16 rolled)


def _wide_weights(weight: np.ndarray, pixel_stride: int, row_depth: int) -> bool:
    """Whether a DSP GEMM loop takes int16 weights (wide_loads.j2): at most WIDE_WEIGHT_BYTES of int8, and every
    input its asm loads within an LDR's reach (4095 bytes) of the trip's input pointer."""
    reach = 2 * ((WIDENED_PIXELS - 1) * pixel_stride + 2 * (_pair_unroll(row_depth // 2) - 1))
    return weight.size <= WIDE_WEIGHT_BYTES and reach <= LDR_REACH


LDR_REACH = 4095   # the largest immediate offset of a Thumb-2 LDR


def _pair_unroll(pairs: int) -> int:
    """Pairs of int16 inputs per trip of the DSP GEMM loops: the most, up to PAIR_UNROLL, that divide a row's
    `pairs`, so no remainder code (VWW's stem, 14 pairs: one trip of 14, where trips of 2 cost 7 loop ends)."""
    return max(unroll for unroll in range(1, PAIR_UNROLL + 1) if pairs % unroll == 0)


def _pixel_blocks(width: int, block: int) -> list[tuple[int, int, int]]:
    """(pixels, first, end) of the runs of blocks covering an output row: whole blocks, then one of the rest."""
    whole = width - width % block
    return [run for run in ((block, 0, whole), (width % block, whole, width)) if run[0] and run[2] > run[1]]


def channel_paired(weight: np.ndarray) -> np.ndarray:
    """[..., out][depth] int8 (out and depth even) as the DSP GEMM loops read them (conv_rows_dsp.j2,
    conv_dsp.loop.j2): per pair of channels (c0, c1) and pair of depth (a, b) the word [c0 a, c1 a, c0 b, c1 b],
    so SXTB16 gives channel c0's pair and SXTB16 ROR 8 channel c1's; a channel pair's words follow one another."""
    *rest, outputs, depth = weight.shape
    pairs = weight.reshape(*rest, outputs // 2, 2, depth // 2, 2)
    return np.ascontiguousarray(np.moveaxis(pairs, -3, -1)).reshape(*rest, outputs, depth)


def channel_paired_wide(weight: np.ndarray) -> np.ndarray:
    """[..., out][depth] int8 (out and depth even) as int16 in channel pairs (conv_rows_dsp.j2's `wide_weights`):
    per pair of channels (c0, c1) and pair of depth (a, b) the words (c0 a, c0 b) and (c1 a, c1 b), the pairs
    SMLAD takes as loaded, so a pair of inputs costs two weight loads where the int8 word took a load and two
    SXTB16 (one cycle less on a Cortex-M4); a channel pair's words follow one another."""
    *rest, outputs, depth = weight.shape
    pairs = weight.astype(np.int16).reshape(*rest, outputs // 2, 2, depth // 2, 2)
    return np.ascontiguousarray(np.swapaxes(pairs, -3, -2)).reshape(*rest, outputs, depth)


@kernel("conv", "conv_rows", config="weighted", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, granularities=BOTH,
        when=_rows_apply, scratch=_band_bytes, isas=(PORTABLE, DSP, MVE))
def conv_rows(step: Step) -> dict[str, Any]:
    """The Cortex-M conv without im2col: a window's rows are contiguous int8 of the input (or, when the layer
    pads, of the band: the kernel-height rows of the padded input one output row reads, copied per output row),
    so its scratch is that band or nothing."""
    layer: QConv = step.layer  # type: ignore[assignment]
    if _widened(step):
        return _conv_rows_dsp(step)
    geometry = _rows_geometry(step)
    rows, weight = _gemm_weight(step, geometry, np.int8)
    row_bytes = geometry["kernel_width"] * geometry["channels"]
    nibbles = _fits_nibbles(weight)   # two per byte along each kernel row, read by the portable loop
    # The portable loop centres x itself (the bias keeps its narrow type); the SMLAD and Helium loops take raw x
    # with the zero point folded into the bias
    vector = {MVE: 16, DSP: 4}.get(step.profile.isa)
    centred = nibbles or vector is None or row_bytes % vector != 0
    weight_sums = rows.reshape(-1, geometry["window_depth"]).astype(np.int64).sum(1)
    if nibbles:
        weight = pack_nibbles(weight.reshape(len(weight[0]), geometry["kernel_height"], row_bytes))
    weight_row = -(-row_bytes // 2) if nibbles else row_bytes
    requantization = _requantization(step, layer, 0 * weight_sums if centred else weight_sums, centred)
    vector_output = _vector_output(step, geometry, requantization)
    return {**geometry, "input_zero_point": step.inputs[0].quant.zero_point, "isa": step.profile.isa,
            "widened": False, "weight": weight, "nibbles": nibbles, "centred": centred, "weight_row": weight_row,
            "weight_depth": geometry["kernel_height"] * weight_row, "vector_output": vector_output, **requantization}


def _conv_rows_dsp(step: Step) -> dict[str, Any]:
    """conv_rows' DSP path (conv_rows_dsp.j2): the raw input widened, the zero point folded into the bias."""
    layer: QConv = step.layer  # type: ignore[assignment]
    window = _conv_window(step)
    single = _single_pixels(window)
    if _pointwise(window) and not step.banded:   # one long row: blocks run across what were row ends
        pixels = window["out_height"] * window["out_width"]
        window = {**window, "height": 1, "width": pixels, "out_height": 1, "out_width": pixels, "padded_width": pixels}
    geometry = _gemm_shape(step, 2, WIDENED_PIXELS, WIDENED_PIXELS, 1, window)
    rows, weight = _gemm_weight(step, geometry, np.int8)
    requantization = _requantization(step, layer, rows.reshape(-1, geometry["window_depth"]).astype(np.int64).sum(1))
    bias = np.zeros(geometry["block_outputs"], np.int64)   # an odd last channel's pair starts at 0 too
    bias[:len(requantization["bias"])] = requantization["bias"]
    requantization["bias"] = bias
    # the depth in the order the input widens ((x0, x2, x1, x3) per 4: `interleave`), then in channel pairs
    unrolled = _unrolled_channel_pairs(single, geometry)
    pixel_stride = geometry["channels"] if single else geometry["stride_width"] * geometry["channels"]
    wide = _wide_weights(weight, pixel_stride, geometry["kernel_width"] * geometry["channels"]) and not unrolled
    paired = channel_paired_wide(interleave(weight)) if wide else channel_paired(interleave(weight))
    return {**geometry, "input_zero_point": step.inputs[0].quant.zero_point, "weight": paired, "wide_weights": wide,
            "widened": True, "pair_unroll": _pair_unroll(geometry["kernel_width"] * geometry["channels"] // 2),
            "single_pixels": single, "blocks": _pixel_blocks(geometry["out_width"], WIDENED_PIXELS),
            "unrolled_channel_pairs": unrolled,
            # the sums start at the bias where they provably stay in int32 and the output takes the int32 path
            "fold_bias": requantization["narrow_sum"] and requantization["high_shift"], **requantization}


def _vector_output(step: Step, geometry: dict[str, int], requantization: dict[str, Any]) -> bool:
    """Whether a Helium GEMM conv requantizes two pixels x two channels as one vector (mve_outputs.j2): where the
    sums fit int32, every shift is 33..62 (see dabuild_requantize32_mve, which rounds as dabuild does), the
    channels fill whole blocks and no group offsets them."""
    layer: QConv = step.layer  # type: ignore[assignment]
    return (step.profile.isa == MVE and requantization["narrow_sum"] and requantization["vector_requantize"]
            and layer.groups == 1 and geometry["block_outputs"] == geometry["out_channels"])


@kernel("conv", "conv_mcu", config="weighted", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, granularities=BOTH,
        when=_planar, scratch=_mcu_bytes, isas=(PORTABLE, DSP, MVE))
def conv_mcu(step: Step) -> dict[str, Any]:
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = _mcu_geometry(step)
    groups, depth = layer.groups, geometry["window_depth"]
    rows, weight = _gemm_weight(step, geometry, np.int8)
    wide = step.profile.isa == DSP and _wide_weights(weight, geometry["depth"], geometry["depth"])
    if step.profile.isa == DSP:
        weight = channel_paired_wide(weight) if wide else channel_paired(weight)
    # portable C: int16 columns x - zp; DSP: int16 columns x as stored, Helium: int8 ones, the zero point folded
    # into the bias and the padding taps holding it (the DSP im2col then copies, a load and a store a value, where
    # centring put an add before each store: VWW's stem on M4, 1.30 -> 1.22 M estimated cycles)
    centred = step.profile.isa == PORTABLE
    weight_sums = np.zeros(geometry["out_channels"], np.int64) if centred else rows.reshape(-1, depth).astype(np.int64).sum(1)
    zero_point = step.inputs[0].quant.zero_point
    requantization = _requantization(step, layer, weight_sums, centred)
    return {**geometry, "input_zero_point": zero_point, "groups": groups, "isa": step.profile.isa,
            "centred": centred, "column_type": "int8_t" if step.profile.isa == MVE else "int16_t",
            "pad_value": 0 if centred else zero_point,
            "contiguous_rows": groups == 1 and geometry["dilation_width"] == 1,
            "weight": weight, "wide_weights": wide, "vector_output": _vector_output(step, geometry, requantization),
            "pair_unroll": _pair_unroll(geometry["depth"] // 2),
            # the sums start at the bias (one load a channel, no add an output) where they stay in int32 and
            # requantize without ties, and every block's channels are real ones
            "fold_bias": (step.profile.isa == DSP and requantization["tieless"] and groups == 1
                          and geometry["block_outputs"] == geometry["out_channels"]), **requantization}


def _transposed_taps(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> dict[str, np.ndarray]:
    """Per output position along one axis, the (input index, tap) pairs that reach it: p + pad = i * stride +
    k * dilation. `start` indexes `inputs` and `taps` (CSR: pairs of position p lie in start[p]:start[p + 1])."""
    inputs, taps, start = [], [], [0]
    for position in range(out):
        for tap in range(kernel):
            reach = position + pad - tap * dilation
            if reach % stride == 0 and 0 <= reach // stride < size:
                inputs.append(reach // stride)
                taps.append(tap)
        start.append(len(inputs))
    return {"start": np.array(start, np.int32), "inputs": np.array(inputs or [0], np.int32),
            "taps": np.array(taps or [0], np.int32)}


def _planar_transposed(layer: QConvTranspose, qgraph: QGraph, profile: Profile) -> str | None:
    return None if len(layer.strides) in (1, 2) else f"{len(layer.strides)}-D transposed convolution (1-D and 2-D only)"


@kernel("conv_transpose", "conv_transpose", config="weighted", inputs=CANONICAL, outputs=CANONICAL,
        granularities=BOTH, when=_planar_transposed)
def conv_transpose(step: Step) -> dict[str, Any]:
    """Each output gathers the inputs and taps that reach it (tables per axis), over its group's channels; the
    input is centred in the loop (border outputs see fewer taps, so the zero point cannot join the bias)."""
    layer: QConvTranspose = step.layer  # type: ignore[assignment]
    x, y = step.inputs[0].shape, step.outputs[0].shape
    kernel_shape = list(layer.weight.shape[2:])
    spatial = len(kernel_shape)
    lift = 2 - spatial  # a 1-D layer as a 2-D one of height 1
    sizes, outs = [1] * lift + list(x[1:]), [1] * lift + list(y[1:])
    kernels = [1] * lift + kernel_shape
    strides, dilations = [1] * lift + layer.strides, [1] * lift + layer.dilations
    pads = [0] * lift + layer.pads[:spatial]
    axes = [_transposed_taps(sizes[a], outs[a], kernels[a], strides[a], pads[a], dilations[a]) for a in range(2)]
    requantization = _requantization(step, layer, np.zeros(len(layer.bias), np.int64), centred=True)
    return {"channels": x[0], "height": sizes[0], "width": sizes[1], "out_channels": y[0], "out_height": outs[0],
            "out_width": outs[1], "kernel_height": kernels[0], "kernel_width": kernels[1],
            "group_in": x[0] // layer.groups, "group_out": y[0] // layer.groups, "rows": axes[0], "columns": axes[1],
            "weight": layer.weight, "input_zero_point": step.inputs[0].quant.zero_point, **requantization}
