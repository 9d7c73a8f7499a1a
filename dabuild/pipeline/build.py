"""One build of one recipe: plan, lock the build folder, run the stages, summarise."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dabuild import notices
from dabuild.errors import BuildError, DabuildError, UsageError
from dabuild.pipeline import stamp
from dabuild.pipeline.buildfolder import build_dir, refuse_links_out
from dabuild.pipeline.doit_tasks import RunResult, run_stages
from dabuild.pipeline.execute import Outcome, Session, Workspace, write_failure
from dabuild.pipeline.lock import BuildLock
from dabuild.pipeline.plan import Stage, plan
from dabuild.pipeline.preflight import preflight, refuse_unbuildable
from dabuild.pipeline.remote import Remote
from dabuild.pipeline.remote_settings import load_settings
from dabuild.pipeline.stage_cluster import StageCluster
from dabuild.pipeline.stages import stage_functions
from dabuild.pipeline.store import Store
from dabuild.progress import Progress
from dabuild.recipe import Recipe
from dabuild.trust import key_from


@dataclass(frozen=True)
class BuildOptions:
    build_root: Path = Path("build")
    targets: tuple[str, ...] | None = None
    jobs: int = 1
    use_cache: bool = True
    push: bool = True  # to the team's remote cache, where one is configured (--no-push: read it only)
    cluster: str | None = None  # a Dask scheduler's address: trials are scored on its workers


@dataclass(frozen=True)
class BuildSummary:
    recipe: str
    build_dir: Path
    outcomes: dict[str, str]
    counts: dict[str, int]
    metrics: dict[str, Any]
    checks: dict[str, Any]
    warnings: tuple[str, ...] = ()
    seconds: dict[str, float] | None = None  # each stage's wall time in this build (0 where doit skipped it)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "build_dir": str(self.build_dir),
            "outcomes": self.outcomes,
            "counts": self.counts,
            "metrics": self.metrics,
            "checks": self.checks,
            "warnings": list(self.warnings),
            "seconds": self.seconds or {},
        }


def workspace_for(recipe: Recipe, build_root: Path) -> Workspace:
    """The recipe's build folder; UsageError if it or the build root is a symbolic link (buildfolder.py)."""
    return Workspace(build_dir(build_root, recipe.name))


def stages_for(recipe: Recipe, targets: tuple[str, ...] | None) -> tuple[list[Stage], dict]:
    if targets:
        known = {t.name for t in recipe.targets}
        unknown = [name for name in targets if name not in known]
        if unknown:
            raise UsageError(
                f"{recipe.path}: no target named {', '.join(map(repr, unknown))}; "
                f"targets: {', '.join(sorted(known))}"
            )
    return plan(recipe, list(targets) if targets else None), recipe.known_capabilities


def build(recipe: Recipe, options: BuildOptions, progress: Progress) -> BuildSummary:
    """Build the recipe; raises the first stage's DabuildError (exit 1 or 2) when a stage fails.

    Warnings (a cache entry dropped, a cache that cannot be written, a check that could not run a part)
    are printed as they happen and recorded in build.json.
    """
    from dabuild.ir.kernels.native import compile_in_background

    with notices.collect() as warned:
        compile_in_background()  # a first build's kernel compile overlaps planning and tracing
        stages, capabilities = stages_for(recipe, options.targets)
        workspace = workspace_for(recipe, options.build_root)
        stamp_file = stamp.stamp_path(recipe.path, options.build_root, options.targets)
        try:
            return _build_locked(recipe, options, progress, stages, capabilities, workspace, stamp_file, warned)
        except OSError as error:  # the build folder itself: not creatable, full, read-only
            raise BuildError(write_failure("build", error, workspace.build_dir)) from None


def _build_locked(recipe: Recipe, options: BuildOptions, progress: Progress, stages: list[Stage],
                  capabilities: dict, workspace: Workspace, stamp_file: Path, warned: list[str]) -> BuildSummary:
    refuse_links_out(workspace.build_dir)
    with BuildLock(workspace.build_dir, progress):
        stamp.remove(stamp_file)
        workspace.clear_leftovers()
        _drop_unreadable_doit_db(workspace, progress)
        store = open_store(recipe.path.parent, options.push) if options.use_cache else None
        tunes = sum(stage.kind == "tune" for stage in stages)  # with -j, as many may run at once
        session = Session(
            workspace,
            store,
            stage_functions(options.jobs, store.trials_root if store and store.readable else None, options.cluster,
                            store.remote if store else None, store.trials_key if store else None,
                            max(1, min(options.jobs, tunes))),
            progress,
            stage_cluster(options.cluster, store, progress),
        )
        try:
            traced = [stage for stage in stages if stage.kind == "trace"]
            _raise_first_failure(run_stages(traced, session, options.jobs))
            preflight(recipe, workspace.stage_dir("trace"),
                      [capabilities[stage.name.split(":", 1)[1]] for stage in stages if stage.kind == "tune"])
            refuse_unbuildable(workspace.stage_dir("trace"), [stage for stage in stages if stage.kind == "export"],
                               recipe)
            rest = [stage for stage in stages if stage.kind != "trace"]
            # with a cluster, one thread per stage that may wait on it (the threads only wait)
            jobs = max(options.jobs, len(rest)) if session.cluster is not None else options.jobs
            _raise_first_failure(run_stages(rest, session, jobs))
        finally:
            if session.cluster is not None:
                session.cluster.close()
        summary = _summarise(recipe, workspace, stages, session, warned)
        _link_reports(workspace, stages)
        report = summary.to_json()
        if store is not None and store.remote is not None:  # what the team's remote cost this build
            report["remote"] = {"url": store.remote.url, "bytes_pulled": store.remote.bytes_pulled,
                                "bytes_pushed": store.remote.bytes_pushed}
        (workspace.build_dir / "build.json").write_text(json.dumps(report, indent=2) + "\n")
        if not warned:  # a build that warned is not taken as a no-op next time: its warnings show again
            stamp.write(stamp_file, _files_read(recipe, stages, capabilities), _files_written(workspace, stages),
                        summary.to_json())
    return summary


def stage_cluster(address: str | None, store: Store | None, progress: Progress) -> StageCluster | None:
    """Where export and check stages run: on the Dask cluster when there is one and a remote this user may
    write (workers exchange entries through it), else here (said in one line when there is a cluster)."""
    if address is None:
        return None
    if store is None or store.remote is None or not store.remote.settings.push:
        progress.info(f"dabuild: no remote cache this build may write, so its stages run on this machine and "
                      f"only tuning trials go to the Dask cluster at {address}")
        return None
    return StageCluster(address, store)


def open_store(project: Path, push: bool = True) -> Store:
    """The local store, with the team key and the remote the configuration names (pipeline/remote_settings.py)."""
    settings = load_settings(project, no_push=not push)
    try:
        key = key_from(settings.key_file if settings else None)
    except ValueError as error:
        raise UsageError(str(error)) from None
    remote = None
    if settings is not None:
        if key is None:
            notices.warn(f"remote {settings.url} ({settings.source}): no team key ($DABUILD_CACHE_KEY or key_file): "
                         "a shared cache serves only signed entries, so the remote is not used")
        else:
            remote = Remote(settings, key)
    return Store(key=key, remote=remote)


def _link_reports(workspace: Workspace, stages: list[Stage]) -> None:
    """`build/<recipe>/report/<capability>` points at each tune stage's report, where users look for it."""
    folder = workspace.build_dir / "report"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for stage in stages:
        if stage.kind == "tune" and (workspace.stage_dir(stage.name) / "report").is_dir():
            capability = stage.name.split(":", 1)[1]
            (folder / capability).symlink_to(Path("..") / stage.dirname / "report", target_is_directory=True)


def _files_read(recipe: Recipe, stages: list[Stage], capabilities: dict) -> list[Path]:
    """Everything whose change could change the build: what the no-op fast path watches."""
    from dabuild.capability import ENV_PATH
    from dabuild.resources import data_dir

    read = [recipe.path, data_dir("capabilities"), *recipe.capabilities]
    read += [Path(entry) for entry in os.environ.get(ENV_PATH, "").split(os.pathsep) if entry]
    read += [spec.path for spec in capabilities.values() if spec.path is not None]
    read += [path for stage in stages for path in stage.files.values()]
    read += _package_metadata({name for stage in stages for name in stage.packages})
    read += [path for stage in stages if stage.programs for path in stage.programs()]
    return sorted(set(read))


def _package_metadata(names: set[str]) -> list[Path]:
    """The METADATA file of each installed package: an upgrade rewrites it, so the fast path notices."""
    from importlib.metadata import PackageNotFoundError, distribution

    found = []
    for name in names:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        metadata = next((f for f in dist.files or () if f.name == "METADATA"), None)
        if metadata is not None:
            found.append(Path(str(dist.locate_file(metadata))))
    return found


def _files_written(workspace: Workspace, stages: list[Stage]) -> list[Path]:
    written = [workspace.build_dir / "build.json"]
    for stage in stages:
        written += [p for p in workspace.stage_dir(stage.name).rglob("*") if p.is_file()]
    return written


def _drop_unreadable_doit_db(workspace: Workspace, progress: Progress) -> None:
    """doit's database is only a fast path; a damaged one is removed, the manifests stay the truth."""
    db = workspace.build_dir / ".doit.db"
    if not db.exists():
        return
    try:
        with sqlite3.connect(db) as connection:
            connection.execute("select count(*) from doit").fetchone()
    except sqlite3.DatabaseError as error:
        progress.info(f"dabuild: {db} is unreadable ({error}); it will be rebuilt")
        db.unlink()


def _raise_first_failure(result: RunResult) -> None:
    if not result.failures:
        return
    failure = result.failures[0]
    if failure.error is not None:
        raise failure.error
    raise BuildError(f"stage {failure.stage} failed:\n{failure.message}")


def _summarise(recipe: Recipe, workspace: Workspace, stages: list[Stage], session: Session,
               warned: list[str]) -> BuildSummary:
    ran = {s.name: session.outcomes.get(s.name, (Outcome.UP_TO_DATE, 0.0)) for s in stages}
    outcomes = {name: outcome.value for name, (outcome, _) in ran.items()}
    seconds = {name: round(elapsed, 3) for name, (_, elapsed) in ran.items()}
    counts = {o.value: sum(1 for v in outcomes.values() if v == o.value) for o in Outcome}
    metrics: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    for stage in stages:
        folder = workspace.stage_dir(stage.name)
        if stage.kind == "tune":
            metrics[stage.name] = _read_json(folder / "metrics.json")
        elif stage.kind == "check":
            assert stage.target is not None  # every check stage belongs to a target
            checks[stage.target] = _read_json(folder / "report.json")
            checks[stage.target]["artifact"] = str(workspace.stage_dir(f"export:{stage.target}"))
    return BuildSummary(recipe.name, workspace.build_dir, outcomes, counts, metrics, checks, tuple(warned), seconds)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DabuildError(f"{path}: unreadable stage output ({error})") from error
