"""A ResNet-50 build end to end: each stage's time, calibration and trial cost against inference, peak memory.

Builds ResNet-50 (tests/architectures.py's resnet family at full size, random weights) at 3x224x224 as a
recipe: 512 calibration and 256 evaluation images (random normal pixels; the
labels are the fp32 model's own top-1 classes, so fp32 accuracy is 1.0),
strategy basic with max_trials 10 (allow_miss: a missed goal keeps the best
config), targets c and onnx. Runs `dabuild build` in a child process and prints

- each stage's time as the build reports it, and the whole build's (goal <= 400 s on a 2-core machine,
  issue 20), with the CPU named and the load average (1, 5, 15 min) at the start and at the end;
- each tune stage's search time and the part of it spent pricing configs (objective size), and its time
  outside the search (setting up, the traced pass of the default config, writing the outputs), as it reports them,
  and configs priced both ways in this process (`pricing_seconds`): lowered and measured whole, as objective
  size did before it priced by layer, and as the tune stage now prices them; seconds a config, their ratio,
  and whether both ways cost every config the same bytes;
- calibrate time / interpreter inference of the same 512 images (goal <= 1.5):
  the Interpreter run here on the traced graph, with the batch size and threads
  the calibrate stage uses; once against the stage's time in the build, and once
  against `calibrate` run here on the same batches, each batch's inference timed
  just before calibration takes it (on a shared machine, the build and the
  later inference see different loads; interleaved, both see the same), in wall seconds and in
  CPU seconds (which another process's load inflates far less);
- one full trial (tune:c's chosen config scored on every evaluation image,
  timed here as `Evaluator.score` runs it) / onnxruntime running the onnx target's int8 QDQ model on
  the same 256 images (goal <= 2), both on the machine's cores;
- the build's peak memory: the largest sum of RSS over the build's processes at one time (sampled every
  50 ms from /proc; pages a forked trial worker shares with its parent count in both, so the sum is an upper
  bound), against the budget plus one Python process's baseline (dabuild, numpy and onnxruntime imported)
  per process alive at that peak; the build runs with DABUILD_MEMORY set to 2e9 bytes (unless the
  environment sets another budget), and with -j N its tune stages and trial workers split that budget;
- C source bytes / weight bytes (goal <= 2; int8 weights, int32 biases) and the
  time of compiling the generated C at -O2.

Another family or a smaller image (`--architecture efficientnet_b0 --image 64`) makes a mid-size build; a looser
goal (`--tolerable-loss 0.2`) lets configs pass, so the search's cheaper phase prices many.

Usage: python bench/big_model.py [--work DIR] [--calibration 512] [--evaluation 256] [--trials 10] [-j 1]
                                 [--architecture resnet] [--image 224] [--tolerable-loss 0.01] [--priced 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the families' one definition
from architectures import IMAGE, export_onnx
from model_speed import cpu_name  # bench/, this script's folder

GOALS = {"build": 400, "calibrate": 1.5, "trial": 2.0, "rss": 2.0, "source": 2.0}
# The build's budget is the RSS goal itself, in its unit (2 GB = 2e9 bytes; "2G" would be 2 GiB), unless set otherwise.
BUDGET, MEMORY = "DABUILD_MEMORY", str(int(GOALS["rss"] * 1e9))


def make_recipe(work: Path, calibration: int, evaluation: int, trials: int, architecture: str = "resnet",
                image: int = IMAGE[1], tolerable_loss: float = 0.01) -> Path:
    """model.onnx, data.npz (labels from onnxruntime's fp32 run) and recipe.yaml in `work`; the recipe is named
    after the architecture (a family of tests/architectures.py, at full size, on image x image pixels), with
    dashes for underscores; the goal is accuracy within `tolerable_loss`, relative."""
    import onnxruntime as ort

    shape = (IMAGE[0], image, image)
    model = export_onnx(architecture, work / "model.onnx", image=shape)
    rng = np.random.default_rng(0)
    x_cal = rng.standard_normal((calibration, *shape), np.float32)
    x_eval = rng.standard_normal((evaluation, *shape), np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    labels = np.concatenate([session.run(None, {"x": x_eval[i:i + 32]})[0].argmax(1) for i in range(0, evaluation, 32)])
    np.savez(work / "data.npz", x_cal=x_cal, x_eval=x_eval, y_eval=labels)
    (work / "recipe.yaml").write_text(f"""\
name: {architecture.replace("_", "-")}
model: {{source: model.onnx}}
data:
  calibration: {{source: data.npz, x: x_cal, samples: {calibration}}}
  evaluation: {{source: data.npz, x: x_eval, y: y_eval}}
  metric: accuracy
tuning:
  strategy: basic
  accuracy: {{criterion: relative, tolerable_loss: {tolerable_loss}}}
  max_trials: {trials}
  allow_miss: true
targets:
  - {{name: mcu, kind: c, options: {{cflags: [-O2]}}, check_io: {{tolerance: exact}}}}
  - {{name: ort, kind: onnx}}
""")
    return work


class TreeMemory:
    """The largest sum of RSS over a process and its descendants, sampled every 50 ms on a thread (Linux)."""

    def __init__(self, root: int):
        self.root, self.peak, self.processes = root, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            sizes = [rss for pid in self._tree() if (rss := _rss(pid)) is not None]
            if sum(sizes) > self.peak:
                self.peak, self.processes = sum(sizes), len(sizes)

    def _tree(self) -> list[int]:
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the process ended meanwhile
            parents[int(stat.parent.name)] = int(fields[1])
        tree, frontier = [self.root], [self.root]
        while frontier:
            frontier = [pid for pid, parent in parents.items() if parent in frontier]
            tree += frontier
        return tree


def _rss(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(match[1]) * 1024 if match else None


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes: how much else ran beside the build."""
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def baseline_bytes() -> int:
    """The RSS of a Python process that has imported what a build's processes import."""
    code = ("import numpy, onnx, onnxruntime, dabuild.cli, dabuild.ir.interpreter, re; "
            "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) * 1024


def build(recipe: Path, build_dir: Path, jobs: int, must_pass: bool = True) -> tuple[float, dict[str, float], str,
                                                                                     TreeMemory]:
    """Wall seconds of the build, each stage's reported seconds, its output and its processes' memory; a
    failed build ends the benchmark unless not `must_pass`."""
    start = time.perf_counter()
    lines = []
    with subprocess.Popen([sys.executable, "-m", "dabuild", "build", str(recipe), "--build-dir", str(build_dir),
                           "--no-cache", "-j", str(jobs)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as child:
        memory = TreeMemory(child.pid)
        assert child.stdout is not None
        for line in child.stdout:  # shown as it comes: a long build's progress is visible in a log
            print(f"    | {line}", end="", flush=True)
            lines.append(line)
    memory.stop()
    elapsed = time.perf_counter() - start
    output = "".join(lines)
    if child.returncode and must_pass:
        raise SystemExit(f"the build failed (exit {child.returncode})")
    stages = {match[1]: float(match[2]) for match in re.finditer(r"^(\S+)\s+executed \(([\d.]+)s\)", output, re.M)}
    return elapsed, stages, output, memory


def inference_seconds(build_dir: Path, images: np.ndarray) -> tuple[float, float, float, float]:
    """The Interpreter on the traced graph over `images`, batched and threaded as the calibrate stage runs it,
    and `calibrate` (the stage's work without its file I/O) on the same batches, each batch's inference timed
    just before calibration takes it: both see the same load on a shared machine. (wall seconds of inference,
    of calibration; then this process's CPU seconds of each, all its threads together, which another
    process's load inflates far less than wall time)."""
    from dabuild.ir.graph import Graph
    from dabuild.ir.interpreter import Interpreter
    from dabuild.ir.kernels.compiling import available_cores
    from dabuild.ir.memory import samples_that_fit
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import calibrate, histogram_bytes
    from dabuild.recipe import DataSpec

    graph = Graph.load(build_dir / "trace")
    batch = samples_that_fit(graph, "calibrate", DataSpec.model_fields["batch_size"].default,
                             histogram_bytes(graph, per_channel=False))  # as the stage keeps them for this recipe
    interpreter = Interpreter(graph, threads=available_cores())
    name = graph.inputs[0].name
    inference, inference_cpu = 0.0, 0.0

    def batches() -> Iterator[dict[str, np.ndarray]]:
        nonlocal inference, inference_cpu
        for low in range(0, len(images), batch):
            start, cpu = time.perf_counter(), time.process_time()
            interpreter.run({name: images[low:low + batch]})
            inference += time.perf_counter() - start
            inference_cpu += time.process_time() - cpu
            yield {name: images[low:low + batch]}

    start, cpu = time.perf_counter(), time.process_time()
    calibrate(graph, batches(), Progress.silent(), per_channel=False)
    return (inference, time.perf_counter() - start - inference, inference_cpu,
            time.process_time() - cpu - inference_cpu)


def qdq_seconds(model: Path, images: np.ndarray) -> float:
    """onnxruntime (all cores) running the int8 QDQ model over `images` in batches of 32, after one warm-up."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    session.run(None, {name: images[:1]})
    start = time.perf_counter()
    for low in range(0, len(images), 32):
        session.run(None, {name: images[low:low + 32]})
    return time.perf_counter() - start


def full_trial_seconds(build_dir: Path, images: np.ndarray, labels: np.ndarray) -> float:
    """One plain trial: tune:c's chosen config scored on `images` (`Evaluator.score`, no floor: lowered, the
    integer graph run over every image in the stage's batches, its MSE against the float outputs), the float
    pass it compares against made before the clock starts. The tune stage's own first trial reads the pass that
    also made its report's per-node errors, so its history's seconds are not a plain trial's."""
    from dabuild.quant.config import QuantConfig
    from dabuild.recipe import DataSpec
    from dabuild.tune.evaluate import EvalSetup, Evaluator

    evaluator = Evaluator(EvalSetup(build_dir / "trace", build_dir / "calibrate", images, labels, "accuracy",
                                    DataSpec.model_fields["batch_size"].default))
    config = QuantConfig.load(build_dir / "tune-c" / "config.json")
    evaluator.float_outputs  # noqa: B018 -- the float pass, outside the trial's time
    return evaluator.score(config).seconds


def compile_seconds(export: Path) -> float:
    """cc -O2 on each generated .c file, run in the artifact's folder (model.c pulls weights.bin in with
    `.incbin`, a path relative to it), objects written elsewhere."""
    sources = sorted(path.name for path in export.glob("*.c"))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for source in sources:
            subprocess.run(["cc", "-O2", "-c", source, "-o", str(Path(scratch) / f"{source}.o")], cwd=export,
                           check=True)
    return time.perf_counter() - start


def weight_bytes(build_dir: Path) -> int:
    """int8 weights and int32 biases of the traced graph's convs and dense layers."""
    from dabuild.ir.graph import Graph

    graph = Graph.load(build_dir / "trace")
    total = 0
    for node in graph.nodes:
        if node.op in ("conv", "dense"):
            total += graph.constants[node.inputs[1]].size
            if len(node.inputs) > 2:
                total += 4 * graph.constants[node.inputs[2]].size
    return total


def pricing_seconds(build_dir: Path, images: np.ndarray, count: int) -> None:
    """Prices `count` configs of each target's space as basic's op-wise and cheaper phases do (the default, then
    one node changed at a time, in graph order) twice: each lowered whole and measured whole, as objective size
    did before it priced by layer (a fresh lowering, the c target's steps all laid out, the onnx model made), and
    as the tune stage now prices them (`Evaluator.priced` and the target's `stored_bytes`); prints seconds a
    config both ways and their ratio, and whether every config cost the same bytes both ways."""
    from dabuild.quant.quantize import quantize
    from dabuild.targets.c import CTarget
    from dabuild.targets.c.codegen import stored_bytes
    from dabuild.targets.onnx import OnnxTarget
    from dabuild.targets.onnx.qdq import initializer_bytes, to_qdq_onnx
    from dabuild.tune.evaluate import EvalSetup, Evaluator
    from dabuild.tune.space import build_space, integer_writers

    c, ort = CTarget(), OnnxTarget()
    whole_graph = {"c": lambda qgraph: stored_bytes(qgraph, c.profile),
                   "onnx": lambda qgraph: initializer_bytes(to_qdq_onnx(qgraph, ort.options.opset, check=False,
                                                                        isa=ort.isa))}
    for kind, target in (("c", c), ("onnx", ort)):
        capability = target.capability_spec
        evaluator = Evaluator(EvalSetup(build_dir / "trace", build_dir / "calibrate", images,
                                        np.zeros(len(images), np.int64), "accuracy", len(images)))
        writers = integer_writers(evaluator.graph, capability)
        evaluator.setup = dataclasses.replace(evaluator.setup, integer_writers=writers)
        space = build_space(evaluator.graph, capability, {})
        default = space.default()
        configs = [default] + [space.with_node(default, name, choice) for name, node in space.nodes.items()
                               for choice in node.candidates if choice != default.nodes[name]]
        configs = configs[:count]
        start = time.perf_counter()
        whole = [whole_graph[kind](quantize(evaluator.graph, evaluator.stats, config, False, evaluator.weight_cache,
                                            writers)) for config in configs]
        before = (time.perf_counter() - start) / len(configs)
        start = time.perf_counter()
        layered = [target.stored_bytes(evaluator.priced(config)) for config in configs]
        after = (time.perf_counter() - start) / len(configs)
        print(f"pricing {kind:<4} {len(configs)} configs: whole graph {before:.3f} s a config, by layer {after:.3f} s "
              f"a config = {before / after:.1f}x faster; the same bytes for every config: "
              f"{'yes' if whole == layered else 'NO'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the recipe and build (default: a temporary one)")
    parser.add_argument("--calibration", type=int, default=512)
    parser.add_argument("--evaluation", type=int, default=256)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--architecture", default="resnet", help="a family of tests/architectures.py, at full size")
    parser.add_argument("--image", type=int, default=IMAGE[1], help="image height and width")
    parser.add_argument("--tolerable-loss", type=float, default=0.01,
                        help="accuracy loss the goal allows (relative): a looser goal lets configs pass, so the "
                             "search prices cheaper ones")
    parser.add_argument("--priced", type=int, default=200, help="configs priced both ways (see pricing_seconds)")
    args = parser.parse_args()
    os.environ.setdefault(BUDGET, MEMORY)  # the build's budget, and this process's for the inference it times
    with tempfile.TemporaryDirectory(prefix="dabuild-big-model-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        make_recipe(work, args.calibration, args.evaluation, args.trials, args.architecture, args.image,
                    args.tolerable_loss)
        print(f"{args.architecture} (full size) at {args.image}x{args.image}, {args.calibration} calibration / "
              f"{args.evaluation} evaluation images, basic, max_trials {args.trials}, relative loss "
              f"{args.tolerable_loss:g}, targets c and onnx, -j {args.jobs}, {os.cpu_count()} cores, "
              f"{BUDGET}={os.environ.get(BUDGET, MEMORY)}", flush=True)
        print(f"cpu: {cpu_name()}; load average at the start {load_average()}", flush=True)
        elapsed, stages, output, memory = build(work, work / "build", args.jobs)
        build_dir = work / "build" / args.architecture.replace("_", "-")
        largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9  # Linux reports KiB
        for stage, seconds in stages.items():
            print(f"  {stage:<22} {seconds:8.1f} s")
        print(f"whole build               {elapsed:8.1f} s   goal <= {GOALS['build']} s on {cpu_name()}; "
              f"load average at the end {load_average()}")
        for line in output.splitlines():
            if line.startswith("  tune:") or re.match(r"tune:\S+: (search|set up) ", line):
                print(line)
        with np.load(work / "data.npz") as data:
            x_cal, x_eval, y_eval = data["x_cal"], data["x_eval"], data["y_eval"]
        pricing_seconds(build_dir, x_eval[:8], args.priced)
        inference, calibration, inference_cpu, calibration_cpu = inference_seconds(build_dir, x_cal)
        print(f"calibrate {stages['calibrate']:.1f} s / interpreter inference of the same images {inference:.1f} s "
              f"= {stages['calibrate'] / inference:.2f} (the stage in the build, inference after it)")
        print(f"calibrate() {calibration:.1f} s / interpreter inference {inference:.1f} s, batch by batch interleaved "
              f"= {calibration / inference:.2f}   goal <= {GOALS['calibrate']}")
        print(f"calibrate() {calibration_cpu:.1f} CPU s / interpreter inference {inference_cpu:.1f} CPU s, the same "
              f"runs = {calibration_cpu / inference_cpu:.2f} (CPU seconds of this process, all its threads)")
        trial = full_trial_seconds(build_dir, x_eval, y_eval)
        qdq = qdq_seconds(build_dir / "export-ort" / "model.onnx", x_eval)
        print(f"one full trial {trial:.1f} s / onnxruntime int8 QDQ on the evaluation images {qdq:.1f} s "
              f"= {trial / qdq:.2f}   goal <= {GOALS['trial']}")
        budget, baseline = float(os.environ[BUDGET]) / 1e9, baseline_bytes() / 1e9
        allowed = budget + memory.processes * baseline
        print(f"peak RSS of the build's processes together {memory.peak / 1e9:.2f} GB (processes alive then: "
              f"{memory.processes}; the largest alone {largest:.2f} GB)   goal <= budget {budget:.2f} GB + "
              f"{memory.processes} x baseline {baseline:.2f} GB = {allowed:.2f} GB")
        export = build_dir / "export-mcu"
        source = sum(path.stat().st_size for path in export.iterdir() if path.suffix in (".c", ".h"))
        weights = weight_bytes(build_dir)
        print(f"C source {source / 1e6:.1f} MB / weight bytes {weights / 1e6:.1f} MB = {source / weights:.2f}   "
              f"goal <= {GOALS['source']}")
        print(f"C compile at -O2 {compile_seconds(export):.1f} s   goal < 60 s", flush=True)


if __name__ == "__main__":
    main()
