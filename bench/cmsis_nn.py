"""The same int8 QGraph run by CMSIS-NN's kernels on a Cortex-M core in qemu: instructions per inference.

bench/mcu.py's CMSIS-NN column (`--cmsis-nn PATH`, a CMSIS-NN checkout; nothing of it is copied into
dabuild). A small driver this module writes holds the QGraph's own weights in CMSIS-NN's layouts (conv
OHWI, fully connected [out][in]), biases, and per-channel multipliers with CMSIS-NN's shifts (31 - ours,
built with CMSIS_NN_USE_SINGLE_ROUNDING, its rounding closest to ours), and calls
arm_convolve_wrapper_s8, arm_max_pool_s8, arm_avgpool_s8 (a mean over the whole image) and
arm_fully_connected_s8 between two dabuild_mark calls; it links with the non-float CMSIS-NN sources
compiled for the profile (-ffunction-sections, --gc-sections) and dabuild's startup and linker script
for the board, and firmware.count_instructions counts the instructions between the marks.
Layers other than conv (groups 1), max_pool, mean over height and width, flatten and per-tensor dense
are refused by name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.qir.layers.linear import QConv, QDense
from dabuild.qir.qgraph import QGraph
from dabuild.targets.c import firmware
from dabuild.targets.c.profiles import Profile

FLAGS = ("-O2", "-DCMSIS_NN_USE_SINGLE_ROUNDING", "-ffunction-sections", "-fdata-sections")


def _array(kind: str, name: str, values: np.ndarray) -> str:
    flat = ", ".join(str(int(v)) for v in np.asarray(values).ravel())
    return f"static {kind} {name}[{max(1, np.asarray(values).size)}] = {{{flat}}};\n"


def _dims(n: int, h: int, w: int, c: int) -> str:
    return f"{{{n}, {h}, {w}, {c}}}"


def driver(qgraph: QGraph, sample: np.ndarray) -> str:
    """The C driver of one inference of `qgraph` on `sample` through CMSIS-NN's s8 kernels."""
    constants, calls = [], []
    largest = max(qgraph.tensors[name].size for name in qgraph.tensors)
    source, target = "act0", "act1"
    for index, layer in enumerate(qgraph.layers):
        x, y = qgraph.tensors[layer.inputs[0]], qgraph.tensors[layer.outputs[0]]
        if layer.op == "flatten":
            continue
        shape = (*x.shape, 1, 1)[:3]   # (C, H, W); a vector as C x 1 x 1
        out = (*y.shape, 1, 1)[:3]
        if isinstance(layer, QConv) and layer.groups == 1 and layer.weight.ndim == 4:
            count = layer.weight.shape[0]
            multiplier = np.broadcast_to(np.asarray(layer.multiplier, np.int64), (count,))
            shift = 31 - np.broadcast_to(np.asarray(layer.shift, np.int64), (count,))
            constants += [_array("const int8_t", f"w{index}", layer.weight.transpose(0, 2, 3, 1)),
                          _array("const int32_t", f"b{index}", layer.bias),
                          _array("int32_t", f"m{index}", multiplier), _array("int32_t", f"s{index}", shift)]
            kh, kw = layer.weight.shape[2:]
            calls.append(f"""    {{
        const cmsis_nn_conv_params params = {{{-x.params.zero_point}, {y.params.zero_point}, {{{layer.strides[1]}, {layer.strides[0]}}},
            {{{layer.pads[1]}, {layer.pads[0]}}}, {{{layer.dilations[1]}, {layer.dilations[0]}}}, {{{layer.output_min}, {layer.output_max}}}}};
        const cmsis_nn_per_channel_quant_params quant = {{m{index}, s{index}}};
        const cmsis_nn_dims input = {_dims(1, shape[1], shape[2], shape[0])}, filter = {_dims(count, kh, kw, shape[0])};
        const cmsis_nn_dims bias = {_dims(1, 1, 1, count)}, output = {_dims(1, out[1], out[2], out[0])};
        check(arm_convolve_wrapper_s8_get_buffer_size(&params, &input, &filter, &output));
        check(arm_convolve_wrapper_s8(&context, &params, &quant, &input, {source}, &filter, w{index}, &bias, b{index}, &output, {target}));
    }}""")
        elif layer.op in ("max_pool", "mean"):
            if layer.op == "max_pool":
                kernel, strides, pads, _ = OPS["max_pool"].geometry(layer.op_attrs)
                function, low, high = "arm_max_pool_s8", -128, 127
            elif sorted(getattr(layer, "axes", [])) == [2, 3]:
                kernel, strides, pads = list(shape[1:]), [1, 1], [0, 0]
                function, low, high = "arm_avgpool_s8", -128, 127
            else:
                raise SystemExit(f"--cmsis-nn: layer {layer.name!r}: a mean over other axes than height and width")
            calls.append(f"""    {{
        const cmsis_nn_pool_params params = {{{{{strides[1]}, {strides[0]}}}, {{{pads[1]}, {pads[0]}}}, {{{low}, {high}}}}};
        const cmsis_nn_dims input = {_dims(1, shape[1], shape[2], shape[0])}, filter = {_dims(1, kernel[0], kernel[1], 1)};
        const cmsis_nn_dims output = {_dims(1, out[1], out[2], out[0])};
        check({function}(&context, &params, &input, {source}, &filter, &output, {target}));
    }}""")
        elif isinstance(layer, QDense) and len(layer.multiplier) == 1:
            constants += [_array("const int8_t", f"w{index}", layer.weight.T), _array("const int32_t", f"b{index}", layer.bias)]
            calls.append(f"""    {{
        const cmsis_nn_fc_params params = {{{-x.params.zero_point}, 0, {y.params.zero_point}, {{{layer.output_min}, {layer.output_max}}}}};
        const cmsis_nn_per_tensor_quant_params quant = {{{int(layer.multiplier[0])}, {31 - int(layer.shift[0])}}};
        const cmsis_nn_dims input = {_dims(1, 1, 1, layer.in_features)}, filter = {_dims(layer.in_features, 1, 1, layer.out_features)};
        const cmsis_nn_dims bias = {_dims(1, 1, 1, layer.out_features)}, output = {_dims(1, 1, 1, layer.out_features)};
        check(arm_fully_connected_s8(&context, &params, &quant, &input, {source}, &filter, w{index}, &bias, b{index}, &output, {target}));
    }}""")
        else:
            raise SystemExit(f"--cmsis-nn: layer {layer.name!r} ({layer.op}) has no CMSIS-NN call in this driver")
        source, target = target, source
    image = np.asarray(sample).reshape(qgraph.tensors[qgraph.input].shape)
    sample_array = _array("const int8_t", "sample", image.transpose(1, 2, 0) if image.ndim == 3 else image)  # NHWC
    return f"""/* One inference through CMSIS-NN (written by dabuild's bench/cmsis_nn.py). */
#include <stdlib.h>
#include <string.h>
#include "arm_nnfunctions.h"

void dabuild_mark(void);
{''.join(constants)}{sample_array}
static int8_t act0[{largest}], act1[{largest}];
static int64_t buffer[4096];
static cmsis_nn_context context = {{buffer, sizeof buffer}};
volatile int8_t sink;

static void check(int32_t status)
{{
    if (status < 0 || status > (int32_t)sizeof buffer) {{
        exit(3);   /* a kernel refused its arguments, or needs more buffer than the driver has */
    }}
}}

int main(int argc, char **argv)
{{
    (void)argc;
    (void)argv;
    memcpy(act0, sample, sizeof sample);
    dabuild_mark();
{chr(10).join(calls)}
    dabuild_mark();
    sink = {source}[0];   /* the output is used */
    return 0;
}}
"""


def count(qgraph: QGraph, sample: np.ndarray, profile: Profile, checkout: Path, artifact: Path, work: Path,
          timeout: float = 600.0) -> int:
    """Instructions of one CMSIS-NN inference of `qgraph` on `profile`'s board; `artifact` is a dabuild export
    for that profile (its firmware/ startup and linker script boot the image)."""
    compiler = firmware.require(profile.compiler, firmware.ARM_PACKAGES)
    include = checkout / "Include"
    if not include.is_dir():
        raise SystemExit(f"--cmsis-nn {checkout}: no Include folder there "
                         "(a CMSIS-NN checkout has Include/ and Source/)")
    work.mkdir(parents=True, exist_ok=True)
    objects = []
    for source in sorted((checkout / "Source").rglob("*.c")):
        if any(tag in source.name for tag in ("_f32", "_f16", "flt")):
            continue
        obj = work / f"{source.stem}.o"
        subprocess.run([compiler, "-std=c11", *profile.flags, *FLAGS, f"-I{include}", "-c", str(source),
                        "-o", str(obj)], check=True, capture_output=True)
        objects.append(str(obj))
    (work / "cmsis_driver.c").write_text(driver(qgraph, np.asarray(sample).ravel()))
    elf = work / "image.elf"
    subprocess.run([compiler, "-std=c11", *profile.flags, *FLAGS, *firmware.LINK_FLAGS, f"-I{include}",
                    "-T", str(artifact / firmware.LINKER_SCRIPT), "-o", str(elf), str(work / "cmsis_driver.c"),
                    str(artifact / firmware.STARTUP), *objects], check=True, capture_output=True)
    return firmware.count_instructions(profile, elf, work, timeout)[0]
