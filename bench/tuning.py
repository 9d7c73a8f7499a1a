"""Tuning benchmark: trials `basic` needs against Intel Neural Compressor's basic order, and resume after
doubling max_trials.

(a) On the digits MLP, with the C capability's choices plus fp32 fallback per
    node, count the trials until the goal is first met: dabuild's `basic`
    (through the real tune stage) and INC's basic order (default, op-type-wise,
    op-wise fp32 fallback in graph order, accumulated fallback; the reference
    enumeration of tests/test_strategies.py) on the same space and scorer.
    Goals: accuracy within 1 % relative (the issue's target), and the harder
    negative log-likelihood within 0.1 % relative (a user metric).
(b) Tunes with max_trials N, then 2N on the same trial store, and prints how
    many of the first run's trials the second run evaluated again (target 0).

(c) Mixed precision on the digits CNN (recipes/digits-cnn), same calibration
    and evaluation data for both: onnxruntime's uniform w4a8 (quantize_static,
    QDQ at opset 21, per-channel int4 weights, int8 activations, MinMax) against
    dabuild's `mixed-precision` strategy through the real tune stage with
    bench/capabilities/mixed.yaml (int8 or int4 weights). Prints accuracies,
    their ratios to fp32 (target >= 0.99) and dabuild's total weight bits against
    uniform int8 (target <= 0.6); dabuild's uniform int4 (minmax and mse ranges)
    for reference, and the same search with per-tensor weights only, where
    uniform int4 with minmax ranges is not enough.

Usage: python bench/tuning.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from ort_peer import calibration_reader, ort_accuracy, upgrade_to_opset21  # noqa: E402
from test_mixed_precision import MIXED, PER_TENSOR_WEIGHTS, uniform_weights  # noqa: E402
from test_strategies import inc_basic_trials  # noqa: E402
from test_tuning import C_FALLBACK, NLL, digits_recipe, tune  # noqa: E402

from dabuild.data import batches, load_inputs, load_labels  # noqa: E402
from dabuild.ir.graph import Graph  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.quant.calibrate import calibrate  # noqa: E402
from dabuild.quant.config import QuantConfig  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402
from dabuild.trace.base import trace_stage  # noqa: E402
from dabuild.tune.evaluate import EvalSetup, Evaluator  # noqa: E402
from dabuild.tune.search import Goal  # noqa: E402
from dabuild.tune.space import build_space  # noqa: E402

GOALS = [
    ("accuracy, 1 % relative", "accuracy", {"criterion": "relative", "tolerable_loss": 0.01}),
    ("NLL, 0.1 % relative", "nll.py:nll", {"criterion": "relative", "tolerable_loss": 0.001}),
]


def prepare(root: Path, name: str = "digits") -> tuple[Path, tuple[Path, Path]]:
    """A private copy of recipes/<name>, traced and calibrated into root/<name>-trace, root/<name>-calibrate."""
    folder = root / name
    shutil.copytree(REPO / "recipes" / name, folder, ignore=shutil.ignore_patterns("build", "__pycache__"))
    (folder / "nll.py").write_text(NLL)
    recipe = load_recipe(folder / "recipe.yaml")
    stages = (root / f"{name}-trace", root / f"{name}-calibrate")
    model = recipe.model.model_copy(update={"source": str(recipe.base_dir / recipe.model.source)})  # as planning resolves it
    trace_stage(model, stages[0], Progress.silent())
    graph = Graph.load(stages[0])
    spec = recipe.data.calibration
    arrays = load_inputs(spec, [t.name for t in graph.inputs])
    calibrate(graph, batches(arrays, spec.batch_size), Progress.silent()).save(stages[1])
    return folder, stages


def trials_to_goal(root: Path, folder: Path, stages: tuple[Path, Path], label: str, metric: str,
                   goal: dict) -> None:
    recipe = digits_recipe(folder, strategy="basic", accuracy=goal)
    recipe.data.metric = metric
    run = tune(stages, root / f"basic-{metric.replace(':', '-')}", recipe, C_FALLBACK)
    passing = [t["trial"] + 1 for t in run["history"] if t["passed"]]
    data = np.load(folder / "data.npz")
    evaluator = Evaluator(EvalSetup(*stages, data["x_test"].astype(np.float32), data["y_test"], metric, 64,
                                    metric_file=folder / "nll.py" if metric.startswith("nll.py:") else None))
    space = build_space(evaluator.graph, C_FALLBACK)
    check = Goal(**goal)
    inc = inc_basic_trials(space, lambda c: evaluator.score(c).metric,
                           lambda m: check.passes(evaluator.baseline, m, evaluator.metric.higher_is_better),
                           evaluator.metric.higher_is_better)
    print(f"trials to meet {label} ({space.total()} configs): dabuild basic {passing[0] if passing else 'never'}"
          f" (of {run['trials']} run, chosen {run['metric']} {run['quantized']:.4f} vs fp32 {run['fp32']:.4f}),"
          f" INC basic order {inc if inc is not None else 'never'}")


def resume(root: Path, folder: Path, stages: tuple[Path, Path], trials: int) -> None:
    store = root / "trial-store"
    strict = {"criterion": "absolute", "tolerable_loss": 0.0}
    runs = []
    for budget in (trials, 2 * trials):
        recipe = digits_recipe(folder, strategy="random", accuracy=strict, max_trials=budget, allow_miss=True)
        runs.append(tune(stages, root / f"resume-{budget}", recipe, C_FALLBACK, store))
    first = {t["config_hash"] for t in runs[0]["history"]}
    again = [t for t in runs[1]["history"] if t["config_hash"] in first and not t["cached"]]
    print(f"max_trials {trials} -> {2 * trials} (strategy random): first run {runs[0]['trials']} trials, "
          f"second run {runs[1]['trials']} trials, {runs[1]['evaluated']} evaluated, "
          f"{len(again)} of the first run's re-evaluated")


def onnxruntime_w4a8(model_file: Path, calibration: np.ndarray, batch_size: int, root: Path) -> bytes:
    """model.onnx quantized by onnxruntime the way its docs suggest for 4-bit weights: quantize_static, QDQ,
    per-channel symmetric int4 weights, int8 activations, MinMax over the calibration samples. Upgraded to
    opset 21 first, where QuantizeLinear/DequantizeLinear take int4."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(upgrade_to_opset21(model_file, root / "model-opset21.onnx"), root / "model-w4a8.onnx",
                    calibration_reader(calibration, batch_size), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt4, activation_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return (root / "model-w4a8.onnx").read_bytes()


def weight_layout(config: QuantConfig) -> str:
    """node dtype/granularity/algorithm of each weighted node."""
    return ", ".join(f"{name} {c.weight.dtype}/{c.weight.granularity}/{c.weight.algorithm}"
                     for name, c in config.nodes.items() if c.weight)


def mixed_precision(root: Path) -> None:
    folder, stages = prepare(root, "digits-cnn")
    recipe = load_recipe(folder / "recipe.yaml")
    graph = Graph.load(stages[0])
    calibration = load_inputs(recipe.data.calibration, [t.name for t in graph.inputs])["x"]
    x = load_inputs(recipe.data.evaluation, [t.name for t in graph.inputs])["x"]
    labels = load_labels(recipe.data.evaluation)
    ort_fp32 = ort_accuracy((folder / "model.onnx").read_bytes(), x, labels)
    ort_w4a8 = ort_accuracy(onnxruntime_w4a8(folder / "model.onnx", calibration,
                                            recipe.data.calibration.batch_size, root), x, labels)
    evaluator = Evaluator(EvalSetup(*stages, x, labels, "accuracy", recipe.data.evaluation.batch_size))
    fp32 = evaluator.baseline
    default = build_space(graph, MIXED)
    int8_bits = default.size(default.default())  # the default weights are int8
    print(f"mixed precision on the digits CNN ({int8_bits // 8} weights; the same {len(calibration)} calibration "
          f"and {len(x)} evaluation samples for both): fp32 accuracy dabuild {fp32:.4f}, onnxruntime {ort_fp32:.4f}")
    print(f"  onnxruntime uniform w4a8 (QDQ, per-channel int4 weights, int8 activations, MinMax): accuracy "
          f"{ort_w4a8:.4f}, {ort_w4a8 / ort_fp32:.4f}x fp32")
    for label, narrowing in (("per-channel or per-tensor weights", {}),
                             ("per-tensor weights only (tuning.space)", PER_TENSOR_WEIGHTS)):
        space = build_space(graph, MIXED, narrowing)
        print(f"  {label}:")
        for weight in ({"dtype": "int8"}, {"dtype": "int4"}, {"dtype": "int4", "algorithm": "mse"}):
            config = uniform_weights(space, **weight)
            score = evaluator.score(config).metric
            print(f"    dabuild uniform {'/'.join(weight.values())} weights: accuracy {score:.4f}, "
                  f"{score / fp32:.4f}x fp32 ({weight_layout(config)})")
        tag = "mixed-" + str(len(narrowing))
        run = tune(stages, root / tag, digits_recipe(folder, strategy="mixed-precision", space=narrowing), MIXED)
        print(f"    dabuild mixed-precision (capability {MIXED.name}): accuracy {run['quantized']:.4f}, "
              f"{run['quantized'] / fp32:.4f}x fp32 (target >= 0.99), weight bits {run['size_bits']} = "
              f"{run['size_bits'] / int8_bits:.4f}x uniform int8 (target <= 0.6), {run['trials']} trials "
              f"({weight_layout(QuantConfig.load(root / tag / 'config.json'))})")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder, stages = prepare(root)
        for label, metric, goal in GOALS:
            trials_to_goal(root, folder, stages, label, metric, goal)
        resume(root, folder, stages, 20)
        mixed_precision(root)


if __name__ == "__main__":
    main()
