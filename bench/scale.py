"""Dask scaling benchmark: the same trials of a ResNet-style model on 1, 2, ... Dask workers of one machine.

Builds the model once (tests/architectures.py's resnet family at full size, ResNet-50 at 3x224x224, random
weights; a recipe with its onnx target and one trial, for the trace and calibration), then scores the tuned
config `--trials` times on a LocalCluster of N worker processes (one thread each) for every N in `--workers`:
trials per second and the speedup against 1 worker (goal >= 1.7x at 2 workers on 2 cores).

The machine's own ceiling is measured beside it: the same trials in N plain processes (a process pool, one
Evaluator of one thread each, no Dask). Two processes of a memory-bound ResNet trial share one memory bus and
caches, so on a small VM they may gain well under 2x; Dask's speedup is then read against that ceiling.

A model of N machines, from figures measured here: per trial, compute c (1 worker's seconds per trial) and
transfer t (a round trip of a task carrying one config and returning one score, no compute); per worker, the
setup s (the evaluation data sent once through the worker plugin, and the Evaluator built). N workers then
reach about N / (c + t) trials/s once set up, while the scheduler's own ceiling is about 1 / t.
Runs standalone; on a shared machine the figures are noisy (other processes take cores). The default workload
(16 trials of 4 images) finishes in minutes on 2 cores; each trial still runs the whole ResNet-50 integer
graph, so per-trial compute stays far above per-trial transfer, which is what the speedup and the model measure.
Usage: python bench/scale.py [--workers 1,2,4,8,16] [--trials 16] [--evaluation 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_model import make_recipe  # the ResNet-50 recipe the big-model bench builds


def prepare(work: Path, evaluation: int) -> tuple[Path, dict]:
    """Trace and calibrate the model (a build with one trial and its onnx target); (its build folder, config)."""
    make_recipe(work, calibration=evaluation, evaluation=evaluation, trials=1)
    recipe = work / "recipe.yaml"
    recipe.write_text("\n".join(line for line in recipe.read_text().splitlines() if "name: mcu" not in line) + "\n")
    subprocess.run([sys.executable, "-m", "dabuild", "build", str(work), "--build-dir", str(work / "build"),
                    "--no-cache", "-q"], check=True)
    build = work / "build" / "resnet"
    tuned = next(build.glob("tune-*"))
    return build, json.loads((tuned / "config.json").read_text())


def _echo(config: dict) -> int:
    return len(config["nodes"])


_evaluators: dict = {}  # in a plain worker process: its Evaluator (one thread), as a Dask worker's plugin builds it


def _start_plain(setup) -> None:
    from dataclasses import replace

    from dabuild.tune.evaluate import Evaluator

    _evaluators["plain"] = Evaluator(replace(setup, threads=1))


def _score_plain(config: dict) -> float:
    from dabuild.quant.config import QuantConfig

    return _evaluators["plain"].score(QuantConfig.from_dict(config), None).metric


def plain_rate(setup, config: dict, processes: int, trials: int) -> float:
    """Trials per second of `processes` plain worker processes: the machine's ceiling, without Dask."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes, initializer=_start_plain, initargs=(setup,)) as pool:
        list(pool.map(_score_plain, [config] * processes))  # every process set up and warm before the clock
        start = time.perf_counter()
        list(pool.map(_score_plain, [config] * trials))
        return trials / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4,8,16")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--evaluation", type=int, default=4, help="evaluation images per trial")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]

    from distributed import Client, LocalCluster

    from dabuild.tune.dask_executor import DaskExecutor
    from dabuild.tune.evaluate import EvalSetup

    work = Path(tempfile.mkdtemp(prefix="dabuild-scale-"))
    try:
        build, config = prepare(work, args.evaluation)
        data = np.load(work / "data.npz")
        setup = EvalSetup(build / "trace", build / "calibrate", data["x_eval"], data["y_eval"], "accuracy",
                          args.evaluation)
        print(f"ResNet-50 at 3x224x224, {args.evaluation} evaluation images per trial, {args.trials} trials "
              f"of one config")
        rate: dict[int, float] = {}
        plain: dict[int, float] = {}
        first_scores = None
        per_trial = transfer = setup_seconds = 0.0
        for n in counts:
            with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address=None) as cluster:
                start = time.perf_counter()
                executor = DaskExecutor(cluster.scheduler_address, setup)
                setup_time = time.perf_counter() - start
                start = time.perf_counter()
                scores = executor.score([config] * args.trials, None)
                elapsed = time.perf_counter() - start
                assert len({s.metric for s in scores}) == 1, "one config scored differently"
                first_scores = first_scores or scores[0].metric
                assert scores[0].metric == first_scores, "scores differ between worker counts"
                if n == 1:
                    per_trial, setup_seconds = elapsed / args.trials, setup_time
                    with Client(cluster.scheduler_address, set_as_default=False) as client:
                        start = time.perf_counter()
                        client.gather([client.submit(_echo, config, pure=False) for _ in range(args.trials)])
                        transfer = (time.perf_counter() - start) / args.trials
                executor.close()
            rate[n] = args.trials / elapsed
            plain[n] = plain_rate(setup, config, n, args.trials)
            print(f"{n:>3} workers: {rate[n]:7.3f} trials/s  speedup {rate[n] / rate[counts[0]]:5.2f}x "
                  f"(against {counts[0]})  setup {setup_time:6.2f} s;  {n} plain processes: {plain[n]:7.3f} "
                  f"trials/s, speedup {plain[n] / plain[counts[0]]:5.2f}x (this machine's ceiling); "
                  f"Dask at {rate[n] / plain[n]:4.0%} of it")
        print(f"measured: compute c = {per_trial:.3f} s/trial, transfer t = {transfer * 1000:.1f} ms/trial, "
              f"setup s = {setup_seconds:.2f} s/worker")
        for machines in (1, 2, 4, 8, 16, 64):
            model = machines / (per_trial + transfer)
            print(f"model, {machines:>3} workers: {min(model, 1 / transfer):8.2f} trials/s "
                  f"(N/(c+t), capped by the scheduler's 1/t = {1 / transfer:.0f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
