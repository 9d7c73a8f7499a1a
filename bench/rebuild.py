"""Rebuild benchmark: cold build, no-op rebuild, reverted change, one-target change.

Runs the real `dabuild` command (a fresh process each time, as a user would) on a
copy of recipes/digits with a private cache and a private, empty kernel cache (so
the cold build is a newcomer's first: it compiles the native kernels; target
<= 20 s), and prints stage-execution counts and the no-op / cold time ratio.
Each time comes with the CPU seconds the build process and its children used,
which a loaded machine does not inflate as it does the wall time. Usage: python bench/rebuild.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def dabuild(work: Path, *args: str) -> tuple[float, dict]:
    env = dict(os.environ, DABUILD_CACHE=str(work / "cache"), DABUILD_KERNEL_CACHE=str(work / "kernels"))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dabuild", "build", str(work / "digits"), "--build-dir", str(work / "build"), "-q", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - start
    return elapsed, json.loads((work / "build" / "digits-mlp" / "build.json").read_text())


def cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def executed(summary: dict) -> int:
    return summary["counts"]["executed"]


def edit(work: Path, old: str, new: str) -> None:
    recipe = work / "digits" / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(old, new))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5, help="no-op builds to time (median is reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "recipes" / "digits", work / "digits", ignore=shutil.ignore_patterns("build"))
        before = cpu_seconds()
        cold, summary = dabuild(work)
        print(f"cold build:        {cold:6.3f} s  stages executed: {executed(summary)}  (empty kernel cache; "
              f"{cpu_seconds() - before:.1f} CPU s; target <= 20 s)")
        noops = []
        for _ in range(args.repeat):
            elapsed, summary = dabuild(work)
            noops.append(elapsed)
            assert executed(summary) == 0, summary
        noop = statistics.median(noops)
        print(f"no-op build:       {noop:6.3f} s  stages executed: {executed(summary)}  (median of {args.repeat})")
        print(f"no-op / cold:      {noop / cold:6.3f}  (target <= 0.05; whole process <= 1.0 s)")

        edit(work, "cflags: [-O2]", "cflags: [-O1]")
        elapsed, summary = dabuild(work)
        changed = sorted(s for s, o in summary["outcomes"].items() if o == "executed")
        print(f"target option changed: {elapsed:6.3f} s  stages executed: {len(changed)} {changed}")
        edit(work, "cflags: [-O1]", "cflags: [-O2]")
        elapsed, summary = dabuild(work)
        restored = sorted(s for s, o in summary["outcomes"].items() if o == "restored from cache")
        print(f"reverted change:   {elapsed:6.3f} s  stages executed: {executed(summary)}  restored: {restored}")


if __name__ == "__main__":
    main()
