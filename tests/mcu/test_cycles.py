"""The cycle estimate: instruction classes counted from qemu's exec log and priced by dabuild.targets.c.cycles.

Each test links a loop of known instructions (inline assembly) between the two dabuild_mark calls of a
counting image, on the board of the profile, runs it in qemu for n and for 2n iterations, and checks what
the n extra iterations added: the instructions of each class, the taken branches and the cycles the core's
timing table gives them (the loops' first and last iterations, and the code around them, cancel out).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_c_kernels import lowered

from dabuild.targets.c import CTarget, cycles, firmware

pytestmark = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                                reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")

ITERATIONS = 1000

# Per iteration: two single loads (the second straight after the first), a dual 16-bit MAC, a flag-setting
# subtract and a taken branch back.
DSP_LOOP = """
    __asm volatile(
        "1:\\n\\t"
        "ldr %[a], [%[p]]\\n\\t"
        "ldr %[b], [%[p], #4]\\n\\t"
        "smlad %[acc], %[a], %[b], %[acc]\\n\\t"
        "subs %[n], %[n], #1\\n\\t"
        "bne 1b\\n\\t"
        : [acc] "+r"(acc), [a] "=&r"(a), [b] "=&r"(b), [n] "+r"(n) : [p] "r"(p) : "cc", "memory");
"""

# Per iteration of a low-overhead loop: a Helium byte load, a multiply-accumulate across the vector that
# follows it (the other unit: overlapped), and the loop end.
HELIUM_LOOP = """
    __asm volatile(
        "dls lr, %[n]\\n\\t"
        "1:\\n\\t"
        "vldrb.s8 q0, [%[p]]\\n\\t"
        "vmlava.s8 %[acc], q0, q0\\n\\t"
        "le lr, 1b\\n\\t"
        : [acc] "+r"(acc), [a] "=&r"(a), [b] "=&r"(b), [n] "+r"(n) : [p] "r"(p) : "lr", "q0", "memory");
"""

MAIN = """
#include <stdint.h>
void dabuild_mark(void);
static int8_t data[16] = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
volatile int32_t sink;

__attribute__((noinline)) static int32_t loop(const int8_t *p, int32_t n)
{{
    int32_t acc = 0, a, b;
{body}
    (void)a; (void)b;
    return acc;
}}

int main(int argc, char **argv)
{{
    (void)argc; (void)argv;
    dabuild_mark();
    sink = loop(data, {iterations});
    dabuild_mark();
    return 0;
}}
"""


def executed(cpu: str, body: str, iterations: int, folder: Path) -> tuple[cycles.Execution, cycles.Estimate]:
    """The loop run `iterations` times in qemu on `cpu`'s board, and its estimate on `cpu`'s timing."""
    target = CTarget(CTarget.Options(cpu=cpu))
    artifact = folder / "artifact"
    artifact.mkdir(parents=True)
    target.export(lowered("dense per tensor"), artifact)    # for its startup code and linker script
    (artifact / "main.c").write_text(MAIN.format(body=body, iterations=iterations))
    image = firmware.build_image(target.profile, ["-O2"], artifact, folder / "image", ("-DDABUILD_COUNT",))
    disassembly = cycles.disassemble(image.elf)
    execution, = firmware.trace_executions(target.profile, image.elf, folder / "image", 60, disassembly)
    return execution, cycles.estimate(execution, disassembly[0], cycles.TIMINGS[cpu])


def added(cpu: str, body: str, folder: Path) -> tuple[dict[str, int], int, int, int]:
    """What ITERATIONS more iterations add: instructions per class, instructions, taken branches, cycles."""
    one_execution, one = executed(cpu, body, ITERATIONS, folder / "once")
    two_execution, two = executed(cpu, body, 2 * ITERATIONS, folder / "twice")
    classes = {kind: two.classes.get(kind, 0) - one.classes.get(kind, 0) for kind in {*one.classes, *two.classes}}
    return ({kind: count for kind, count in classes.items() if count},
            two_execution.instructions - one_execution.instructions,
            two.taken_branches - one.taken_branches, two.cycles - one.cycles)


def test_a_dsp_loop_is_classed_and_priced_by_the_cortex_m4_table(tmp_path: Path) -> None:
    classes, instructions, taken, estimated = added("cortex-m4", DSP_LOOP, tmp_path)
    n = ITERATIONS
    assert classes == {cycles.LOAD_STORE: 2 * n, cycles.MULTIPLY: n, cycles.ALU: n, cycles.BRANCH: n}
    assert instructions == 5 * n and taken == n
    m4 = cycles.TIMINGS["cortex-m4"]
    per_iteration = (m4.load_store + m4.load_store_pipelined   # the second load follows the first
                     + 1 + 1                                    # smlad, subs
                     + 1 + m4.branch_refill)                    # bne, taken
    assert estimated == n * per_iteration


def test_a_helium_loop_overlaps_a_load_with_the_multiply_after_it(tmp_path: Path) -> None:
    classes, instructions, taken, estimated = added("cortex-m55", HELIUM_LOOP, tmp_path)
    n = ITERATIONS
    assert classes == {cycles.VECTOR_MEMORY: n, cycles.VECTOR: n, cycles.LOOP_END: n}
    assert instructions == 3 * n and taken == n
    m55 = cycles.TIMINGS["cortex-m55"]
    assert estimated == n * (m55.vector + m55.vector_overlapped + m55.loop_end)


def measured(cpu: str, case: str, folder: Path) -> dict:
    """The firmware figures of test_c_kernels' `case` exported for `cpu` and counted on one sample in qemu."""
    target = CTarget(CTarget.Options(cpu=cpu))
    artifact, work = folder / "artifact", folder / "work"
    artifact.mkdir()
    work.mkdir()
    qgraph = lowered(case)
    target.export(qgraph, artifact)
    sample = np.zeros((1, *qgraph.tensors[qgraph.input].shape), np.int8)
    return target.measurements(artifact, sample, work)["firmware"]


def test_the_counting_image_reports_classes_that_sum_to_its_instructions(tmp_path: Path) -> None:
    figures = measured("cortex-m4", "conv 3x3 pad 1", tmp_path)
    assert sum(figures["instruction_classes"].values()) == figures["instructions_per_inference"]
    assert figures["estimated_cycles_per_inference"] > figures["instructions_per_inference"]


def test_an_inference_splits_by_function_into_shares_that_sum_to_it(tmp_path: Path) -> None:
    figures = measured("cortex-m4", "conv 3x3 pad 1", tmp_path)
    functions = figures["functions"]
    assert sum(share["instructions"] for share in functions.values()) == figures["instructions_per_inference"]
    assert sum(share["estimated_cycles"] for share in functions.values()) == figures["estimated_cycles_per_inference"]
    cycles = [share["estimated_cycles"] for share in functions.values()]
    assert cycles == sorted(cycles, reverse=True)
    assert next(iter(functions)).startswith("l_c")   # the conv layer's own function takes the most


def test_a_core_without_a_timing_table_gets_no_estimate(tmp_path: Path) -> None:
    figures = measured("cortex-m33", "dense per tensor", tmp_path)
    assert figures["instructions_per_inference"] > 0 and "estimated_cycles_per_inference" not in figures
    assert sum(share["instructions"] for share in figures["functions"].values()) == figures["instructions_per_inference"]
    assert not any("estimated_cycles" in share for share in figures["functions"].values())
