"""The `dabuild` command: like make, `dabuild` alone builds ./recipe.yaml.

Exit codes: 0 ok, 1 a build or check failed, 2 a usage or validation error.
Heavy modules are imported inside the commands, so `dabuild --help` and a
no-op build stay fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dabuild import __version__, notices
from dabuild.errors import BuildError, DabuildError, UsageError
from dabuild.progress import Progress, human_size
from dabuild.userpaths import PathProblem, checked_path

if TYPE_CHECKING:
    from dabuild.pipeline.build import BuildOptions
    from dabuild.recipe import Recipe

COMMANDS = ("build", "validate", "list", "graph", "clean", "capabilities", "init", "cache", "report", "kernels")
DEFAULT_RECIPE = Path("recipe.yaml")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    loudness = common.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", help="print only errors and the summary")
    loudness.add_argument("-v", "--verbose", action="store_true", help="print every stage and step")

    def recipes(sub: argparse.ArgumentParser, many: bool = True) -> None:
        sub.add_argument(
            "recipes",
            nargs="*" if many else "?",
            type=Path,
            metavar="RECIPE",
            help="recipe file or folder holding recipe.yaml (default: ./recipe.yaml)",
        )
        sub.add_argument("--build-dir", type=Path, default=Path("build"), help="build root (default: ./build)")

    parser = argparse.ArgumentParser(
        prog="dabuild",
        description="Build quantized neural-network artifacts from recipe.yaml and prove them in their runtimes.",
    )
    parser.add_argument("--version", action="version", version=f"dabuild {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    build = commands.add_parser("build", parents=[common], help="build recipes (the default command)")
    recipes(build)
    build.add_argument("--target", action="append", metavar="NAME", help="build only this target (repeatable)")
    build.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                       help="run N independent stages at once, and score tuning trials in N processes")
    build.add_argument("--no-cache", action="store_true", help="neither read nor write the run cache")
    build.add_argument("--executor", metavar="WHERE",
                       help="where trials are scored: local (default) or dask://HOST:PORT (also: DABUILD_EXECUTOR)")
    build.add_argument("--no-push", action="store_true",
                       help="read the team's remote cache but write nothing to it (also: DABUILD_NO_PUSH=1)")

    validate = commands.add_parser("validate", parents=[common], help="check recipes and report every problem")
    recipes(validate)
    listing = commands.add_parser("list", parents=[common], help="each stage: up to date, cached or stale, and why")
    recipes(listing)
    graph = commands.add_parser("graph", parents=[common], help="print the stage graph as DOT or Mermaid")
    recipes(graph)
    graph.add_argument("--format", choices=("dot", "mermaid"), default="dot")
    clean = commands.add_parser("clean", parents=[common], help="remove the recipes' build folders")
    recipes(clean)
    capabilities = commands.add_parser("capabilities", parents=[common], help="list the capability YAMLs found")
    recipes(capabilities)
    commands.add_parser("kernels", parents=[common],
                        help="compile the interpreter's native kernels now (once per machine), ahead of a first build")
    init = commands.add_parser("init", parents=[common], help="write a starter project that builds as written")
    init.add_argument("path", nargs="?", type=Path, default=DEFAULT_RECIPE)
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    report = commands.add_parser("report", parents=[common],
                                 help="write the build's report page (report.html) and print the tuning reports")
    recipes(report, many=False)
    report.add_argument("--open", action="store_true", help="open report.html in the web browser instead of printing")
    cache = commands.add_parser("cache", parents=[common], help="inspect or prune the run cache")
    cache_commands = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    cache_commands.add_parser("info", parents=[common], help="where the cache is and how big")
    prune = cache_commands.add_parser("prune", parents=[common], help="drop least recently used entries")
    prune.add_argument("--max-size", required=True, metavar="SIZE", help="e.g. 500M, 2G, 0")
    for action, words in (("push", "upload the entries a build folder holds to the team's remote"),
                          ("pull", "fetch from the remote only the entries the recipe's targets need"),
                          ("status", "each stage's entry: in the local cache, in the remote")):
        synced = cache_commands.add_parser(action, parents=[common], help=words)
        recipes(synced, many=False)
        synced.add_argument("--target", action="append", metavar="NAME", help="only this target (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "build")
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return 2 if exit_.code not in (0, None) else 0
    progress = Progress(level=0 if args.quiet else 2 if args.verbose else 1)
    notices.print_to_stderr()
    try:
        return HANDLERS[args.command](args, progress)
    except BrokenPipeError:
        return _reader_gone()
    except DabuildError as error:
        print(f"dabuild: error: {error}" if "\n" not in str(error) else str(error), file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return _interrupted()


def run() -> None:
    """The `dabuild` command: `main`, then the exit, which a late Ctrl-C (the work is done) cannot turn into a
    signal death."""
    code = main()
    _ignore_interrupts()
    if code == 130:
        # stage threads may still be inside native code (torch, onnxruntime): a normal exit would run C++
        # static destructors under them and abort ("terminate called without an active exception")
        import os

        os._exit(130)
    sys.exit(code)


def _reader_gone() -> int:
    """The reader of stdout stopped (`dabuild report | head`): nothing more to say, and no traceback when Python
    flushes stdout at exit; the command did what it was asked, so 0."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _interrupted() -> int:
    """One line and exit 130, however many stages and worker processes were running.

    Tuning's worker processes finish their trial and exit (they ignore Ctrl-C themselves); under -j, stage
    threads may still be running and would print after this line, so everything written after it goes to
    /dev/null. Nothing is lost: every stage writes into a temporary folder the next build removes, and the
    build lock dies with the process.
    """
    import os

    _ignore_interrupts()  # a second Ctrl-C must not interrupt the way out
    print("dabuild: interrupted", file=sys.stderr, flush=True)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - before waiting for workers: stage threads print on meanwhile
    # a module still being imported (in a stage thread) has started no scorer yet
    stop_scoring = getattr(sys.modules.get("dabuild.tune.scorer"), "stop_scoring", None)
    if stop_scoring is not None:
        stop_scoring()
    return 130


def _ignore_interrupts() -> None:
    """Ctrl-C is ignored from here to the exit (signal handlers belong to the main thread only)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _recipe_paths(args: argparse.Namespace) -> list[Path]:
    paths = args.recipes if isinstance(args.recipes, list) else [args.recipes] if args.recipes else []
    resolved = []
    for path in paths or [DEFAULT_RECIPE]:
        path = path / "recipe.yaml" if path.is_dir() else path
        try:
            checked_path(path)
        except PathProblem as problem:
            if str(problem).startswith("file not found"):
                raise UsageError(f"{path}: no such recipe file (write one with `dabuild init`)") from None
            raise UsageError(str(problem)) from None
        resolved.append(path)
    return resolved


def _load_recipes(args: argparse.Namespace) -> list:
    """Every named recipe, validated; all problems of all files are reported together."""
    from dabuild.errors import ValidationError
    from dabuild.recipe import load_recipe

    loaded, problems = [], []
    for path in _recipe_paths(args):
        try:
            loaded.append(load_recipe(path))
        except ValidationError as error:
            problems.extend(error.diagnostics)
    if problems:
        raise ValidationError(problems)
    return loaded


def _build(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.tune.executors import EXECUTOR_ENV, dask_address

    start = time.monotonic()
    cluster = dask_address(args.executor or os.environ.get(EXECUTOR_ENV))  # a bad address: exit 2 at once
    if cluster is not None:
        from dabuild.cluster import workerless_seconds

        workerless_seconds()  # a bad DABUILD_WORKERLESS_SECONDS: exit 2 at once, too
    targets = tuple(args.target) if args.target else None
    if _nothing_to_do(args, targets, start):
        return 0
    from dabuild.pipeline.build import BuildOptions, build

    options = BuildOptions(
        build_root=args.build_dir, targets=targets, jobs=max(1, args.jobs), use_cache=not args.no_cache,
        push=not args.no_push,
        cluster=cluster,
    )
    recipes = _load_recipes(args)
    if cluster is not None and len(recipes) > 1:
        return _build_at_once(recipes, options, progress)
    for recipe in recipes:
        start = time.monotonic()
        summary = build(recipe, options, progress)
        _print_summary(summary.to_json(), time.monotonic() - start)
    return 0


def _build_at_once(recipes: list[Recipe], options: BuildOptions, progress: Progress) -> int:
    """With a cluster, the recipes build at once (a thread each), so their trials, exports and checks meet
    on the workers; each summary prints as its build ends, and the first failure in recipe order is
    raised once every build has ended."""
    from concurrent.futures import ThreadPoolExecutor

    from dabuild.pipeline.build import build

    printing = threading.Lock()

    def build_one(recipe: Recipe) -> None:
        start = time.monotonic()
        summary = build(recipe, options, progress)
        with printing:
            _print_summary(summary.to_json(), time.monotonic() - start)

    with ThreadPoolExecutor(len(recipes), thread_name_prefix="dabuild-recipe") as pool:
        futures = [pool.submit(build_one, recipe) for recipe in recipes]
    for future in futures:
        future.result()
    return 0


def _nothing_to_do(args: argparse.Namespace, targets: tuple[str, ...] | None, start: float) -> bool:
    """The no-op fast path: every recipe's last build is still valid (see pipeline/stamp.py)."""
    from dabuild.pipeline import stamp

    paths = _recipe_paths(args)
    if len(paths) != 1:
        return False
    summary = stamp.noop(stamp.stamp_path(paths[0], args.build_dir, targets))
    if summary is None:
        return False
    _print_summary(summary, time.monotonic() - start)
    return True


def remote_count(counts: dict[str, int]) -> str:
    """`N restored from the remote, ` where a remote served this build, else nothing."""
    restored = counts.get("restored from the remote", 0)
    return f"{restored} restored from the remote, " if restored else ""


def _print_summary(summary: dict, elapsed: float) -> None:
    counts = summary["counts"]
    print(
        f"{summary['recipe']}: {sum(counts.values())} stages: {counts['executed']} executed, "
        f"{counts['restored from cache']} restored from cache, "
        f"{remote_count(counts)}{counts['up to date']} up to date "
        f"({elapsed:.2f}s)"
    )
    for stage, metrics in summary["metrics"].items():
        name = metrics.get("metric", "metric")
        print(
            f"  {stage}: {name} {'float as given' if metrics.get('given') else 'fp32'} {metrics['fp32']:.4f} -> "
            f"quantized {metrics['quantized']:.4f}"
            f" ({metrics.get('precision', 'int8')}, goal {'met' if metrics.get('goal_met') else 'MISSED'})"
        )
    for target, report in summary["checks"].items():
        verdict = "passed" if report.get("ok") else "FAILED"
        metric = report.get("metric")
        delivered = f" {metric['artifact']:.4f} in its runtime;" if metric else ""
        not_run = "".join(f"; NOT RUN: {part}" for part in report.get("not_run", []))
        proof = report.get("layer_by_layer")
        if proof:  # the outputs drifted: the samples that disagree were proven layer by layer
            error = report["max_abs_err"]  # null when not finite
            drift = "non-finite" if error is None else f"{error / report['output_params']['scale']:.3g} steps"
            verdict += f" layer by layer ({proof['samples']} samples; end to end up to {drift})"
        print(
            f"  check:{target}: {report.get('tolerance')} {verdict} on {report.get('samples')} samples{not_run};"
            f"{delivered} artifact {report['artifact']}"
        )


def _validate(args: argparse.Namespace, progress: Progress) -> int:
    """The recipe and its files, and the data against the model's inputs where they are known without tracing
    (an .onnx file's, or `model.inputs`); what needs the traced model is said, and the build checks it."""
    from dabuild.errors import ValidationError
    from dabuild.pipeline.preflight import check_data_untraced

    problems = []
    for recipe in _load_recipes(args):
        try:
            checked = check_data_untraced(recipe)
        except ValidationError as error:
            problems.extend(error.diagnostics)
            continue
        data = ("data checked against the model's inputs" if checked else
                "the data's input names and shapes need the traced model: `dabuild build` checks them first")
        progress.info(f"{recipe.path}: ok ({len(recipe.targets)} target(s); {data}; labels and tuning.space "
                      "node names are checked after tracing)")
    if problems:
        raise ValidationError(problems)
    return 0


def _list(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.pipeline.build import stages_for, workspace_for
    from dabuild.pipeline.status import statuses
    from dabuild.pipeline.store import Store

    for recipe in _load_recipes(args):
        stages, _ = stages_for(recipe, None)
        print(f"{recipe.name} ({workspace_for(recipe, args.build_dir).build_dir}):")
        for status in statuses(stages, workspace_for(recipe, args.build_dir), Store()):
            reason = f" ({status.reason})" if status.reason else ""
            print(f"  {status.name:<24} {status.state}{reason}")
    return 0


def _graph(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.pipeline.build import stages_for

    for recipe in _load_recipes(args):
        stages, _ = stages_for(recipe, None)
        edges = [(up, stage.name) for stage in stages for up in dict.fromkeys(stage.inputs.values())]
        if args.format == "dot":
            print(f'digraph "{recipe.name}" {{\n  rankdir=LR;')
            print("\n".join(f'  "{s.name}" [shape=box];' for s in stages))
            print("\n".join(f'  "{a}" -> "{b}";' for a, b in edges))
            print("}")
        else:
            print("graph LR")
            print("\n".join(f'  {s.dirname}["{s.name}"]' for s in stages))
            ids = {s.name: s.dirname for s in stages}
            print("\n".join(f"  {ids[a]} --> {ids[b]}" for a, b in edges))
    return 0


def _clean(args: argparse.Namespace, progress: Progress) -> int:
    """Empty each recipe's build folder; a link (the folder itself or anything in it) is removed, never
    what it points to."""
    from dabuild.pipeline.buildfolder import build_root, remove
    from dabuild.pipeline.lock import BuildLock

    root = build_root(args.build_dir)
    for recipe in _load_recipes(args):
        folder = root / recipe.name
        if folder.is_symlink():
            folder.unlink()
            progress.info(f"removed the link {folder} (not what it pointed to)")
        elif folder.exists():
            with BuildLock(folder, progress):
                for child in folder.iterdir():
                    if child.name != ".lock":
                        remove(child)
            progress.info(f"removed {folder}")
    return 0


def _capabilities(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.capability import discover_capabilities

    extra = [p for recipe in _load_recipes(args) for p in recipe.capabilities] if args.recipes else []
    for name, spec in sorted(discover_capabilities(extra).items()):
        print(f"{name:<12} {spec.backend} {spec.version:<8} precisions: {', '.join(spec.precisions):<16} {spec.path}")
    return 0




def _kernels(args: argparse.Namespace, progress: Progress) -> int:
    """Compile (or find and prove) the native kernels ahead, as an install step or a CI image would, so no build
    waits for them; exit 1 when they cannot be built (the warning names why), as the interpreter would run numpy."""
    from dabuild.ir.kernels.compiling import kernel_dir
    from dabuild.ir.kernels.native import SWITCH, native_backend

    backend = native_backend()
    print(f"{backend} (kernel cache {kernel_dir()})")
    return 0 if backend != "numpy" or os.environ.get(SWITCH) == "0" else 1


STARTER = Path(__file__).resolve().parent / "starter"  # recipe.yaml, model.py, make_data.py


def _init(args: argparse.Namespace, progress: Progress) -> int:
    """A project that builds as written: the starter recipe, its numpy model, and a data script, run once
    to write data.npz and weights.npz (replace them with yours)."""
    import subprocess

    path: Path = args.path if args.path.suffix in (".yaml", ".yml") else args.path / "recipe.yaml"
    folder = path.parent
    files = {path: STARTER / "recipe.yaml", folder / "model.py": STARTER / "model.py",
             folder / "make_data.py": STARTER / "make_data.py"}
    existing = [str(target) for target in files if target.exists()]
    if existing and not args.force:
        raise UsageError(f"{', '.join(existing)} exist{'s' * (len(existing) == 1)}; pass --force to overwrite")
    folder.mkdir(parents=True, exist_ok=True)
    for target, source in files.items():
        target.write_text(source.read_text())
    result = subprocess.run([sys.executable, "make_data.py"], check=False, cwd=folder, capture_output=True, text=True)
    if result.returncode:
        raise BuildError(f"{folder / 'make_data.py'} failed: {result.stderr.strip()}")
    build = "dabuild build" if folder.resolve() == Path.cwd().resolve() else f"cd {folder} && dabuild build"
    progress.info(f"wrote {', '.join(str(target) for target in files)}, data.npz and weights.npz; "
                  f"run `{build}` (the build goes to {folder / 'build'})")
    return 0


def max_size(text: str) -> int:
    """--max-size in bytes (dabuild.sizes: `500M`, `2GiB`, `0`); UsageError naming the option otherwise."""
    from dabuild.sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise UsageError(f"--max-size: {error}") from None


def _cache(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.pipeline.store import Store

    if args.cache_command in ("push", "pull", "status"):
        return _cache_sync(args, progress)
    store = Store()
    if args.cache_command == "info":
        for info in store.infos():
            print(f"{info.name:<17} {human_size(info.size):>10}  {info.entries:>6} {_ENTRY_WORDS[info.name]:<8} "
                  f"{info.root}")
    else:
        removed, freed = store.prune(max_size(args.max_size))
        progress.info(f"pruned {removed} items, freed {human_size(freed)}; temporary files removed")
    return 0


def _cache_sync(args: argparse.Namespace, progress: Progress) -> int:
    from dabuild.pipeline import sync
    from dabuild.pipeline.build import open_store, stages_for, workspace_for

    recipe = _load_recipes(args)[0]
    stages, _ = stages_for(recipe, tuple(args.target) if args.target else None)
    store = open_store(recipe.path.parent)
    if store.remote is None:
        raise UsageError("no remote cache is configured (DABUILD_REMOTE, dabuild-cache.yaml, or the user's "
                         "cache.yaml) with a team key (DABUILD_CACHE_KEY or key_file)")
    where = f"{store.remote.url} ({store.remote.settings.source})"
    if args.cache_command == "push":
        if not store.remote.settings.push:
            raise UsageError(f"the remote {where} is read-only for this user (push: false or DABUILD_NO_PUSH)")
        pushed, missing = sync.push(stages, workspace_for(recipe, args.build_dir), store)
        print(f"{recipe.name}: {pushed} entries in {where} ({human_size(store.remote.bytes_pushed)} uploaded), "
              f"{missing} stages without a built entry")
    else:
        states = sync.walk(stages, store, pull=args.cache_command == "pull")
        for state in states:
            print(f"  {state.stage:<24} local {'yes' if state.local else 'no ':<4} remote "
                  f"{'yes' if state.remote else 'no' if state.key else 'unknown (an input is in neither)'}")
        print(f"{recipe.name}: {sum(s.local for s in states)} of {len(states)} stages in the local cache, "
              f"{sum(s.remote for s in states)} in {where}; {human_size(store.remote.bytes_pulled)} downloaded")
    return 1 if store.remote.failed else 0


_ENTRY_WORDS = {"run cache": "entries", "trial store": "contexts", "compiled kernels": "libraries"}


def _report(args: argparse.Namespace, progress: Progress) -> int:
    """The tune stages' reports of the last build, found through its build.json, printed; and the build-level
    page written beside build.json (opened with --open)."""
    import webbrowser

    from dabuild.build_report import write_page
    from dabuild.pipeline.build import workspace_for

    [recipe] = _load_recipes(args)
    workspace = workspace_for(recipe, args.build_dir)
    summary_file = workspace.build_dir / "build.json"
    if not summary_file.is_file():
        raise UsageError(f"{recipe.path}: not built yet in {args.build_dir} (run `dabuild build` first)")
    stages = [stage for stage in json.loads(summary_file.read_text())["metrics"]]
    reports = [workspace.stage_dir(stage) / "report" for stage in stages]
    missing = [str(folder) for folder in reports if not (folder / "report.md").is_file()]
    if not reports or missing:
        raise UsageError(f"{recipe.name}: no tuning report in {', '.join(missing) or workspace.build_dir}; rebuild")
    page = write_page(workspace.build_dir)
    progress.info(f"wrote {page}")
    if args.open:
        webbrowser.open(page.resolve().as_uri())
        return 0
    for folder in reports:
        print((folder / "report.md").read_text(), end="")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace, Progress], int]] = {
    "build": _build,
    "validate": _validate,
    "list": _list,
    "graph": _graph,
    "clean": _clean,
    "capabilities": _capabilities,
    "init": _init,
    "cache": _cache,
    "report": _report,
    "kernels": _kernels,
}
