"""Remote-cache benchmark: cold build, warm local cache, warm remote with an empty local cache.

Runs the real `dabuild` (a fresh process each time) on a copy of a recipe (default recipes/digits-cnn) with a
file:// remote on this machine's disk, so the figures show dabuild's own cost; an SFTP or S3 remote adds its
network's latency per file and its bandwidth per byte. Prints wall times, the warm-remote / cold ratio (goal
<= 10 %) and the bytes pulled against the bytes the targets' entries hold (goal <= 1.1x).
dabuild's byte code is compiled first (into the work folder), as `pip install` does: a process that compiles every
module from source (PYTHONDONTWRITEBYTECODE=1 on an editable install) spends a second on that alone.
Usage: python bench/remote_cache.py [--recipe recipes/digits-cnn] [--target NAME]...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def environment(work: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    return dict(env, PYTHONPYCACHEPREFIX=str(work / "pycache"))


def build(work: Path, recipe: Path, cache: str, build_dir: str, targets: list[str]) -> tuple[float, dict]:
    env = dict(environment(work), DABUILD_CACHE=str(work / cache), DABUILD_REMOTE=f"file://{work / 'remote'}",
               DABUILD_CACHE_KEY="bench-team-key-0123456789abcdef")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dabuild", "build", str(recipe), "--build-dir", str(work / build_dir),
                    "-q", *(f"--target={t}" for t in targets)], check=True, env=env, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    return elapsed, json.loads(next((work / build_dir).glob("*/build.json")).read_text())


def needed_bytes(build_dir: Path) -> int:
    """The bytes of every output file of every stage the build holds: what its entries must carry."""
    return sum(info["size"] for manifest in build_dir.glob("*/*/.manifest.json")
               for info in json.loads(manifest.read_text())["files"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "digits-cnn")
    parser.add_argument("--target", action="append", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(args.recipe.parent, work / "recipes", ignore=shutil.ignore_patterns("build", "__pycache__"))
        recipe = work / "recipes" / args.recipe.name
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "dabuild")], check=True,
                       env=environment(work), stdout=subprocess.DEVNULL)
        cold, first = build(work, recipe, "cache", "build-cold", args.target)
        local, second = build(work, recipe, "cache", "build-local", args.target)
        remote, third = build(work, recipe, "empty-cache", "build-remote", args.target)
        counts = third["counts"]
        needed = needed_bytes(work / "build-remote")
        pulled = third["remote"]["bytes_pulled"]
        print(f"{first['recipe']}, targets {', '.join(args.target) or 'all'} (file:// remote, this machine's disk)")
        print(f"cold build:               {cold:7.2f} s  executed {first['counts']['executed']}, "
              f"pushed {first['remote']['bytes_pushed']} bytes")
        print(f"warm local cache:         {local:7.2f} s  restored from cache {second['counts']['restored from cache']}")
        print(f"warm remote, empty local: {remote:7.2f} s  executed {counts['executed']}, restored from the remote "
              f"{counts.get('restored from the remote', 0)}")
        print(f"warm remote / cold:       {remote / cold:7.1%}  (goal <= 10%)")
        print(f"bytes pulled / needed:    {pulled / needed:7.3f}x  ({pulled} of {needed} bytes; goal <= 1.1x)")


if __name__ == "__main__":
    main()
