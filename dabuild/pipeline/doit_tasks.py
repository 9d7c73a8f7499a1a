"""The plan as doit tasks, run through doit's API from dabuild's own loader (no dodo.py).

doit answers "unchanged since the last run" from its database in the build
folder (file_dep checksums + the stage's static key parts), orders tasks by their
file dependencies (each stage's manifest is the target its consumers depend on),
and runs independent tasks in parallel threads under `-j`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from doit.action import PythonAction
from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter
from doit.task import Task, dict_to_task
from doit.tools import config_changed

from dabuild import notices
from dabuild.errors import DabuildError
from dabuild.pipeline.execute import Outcome, Session
from dabuild.pipeline.manifest import MANIFEST, Manifest
from dabuild.pipeline.plan import Stage, watched_parts


@dataclass
class Failure:
    stage: str
    message: str
    error: DabuildError | None = None


@dataclass
class RunResult:
    failures: list[Failure] = field(default_factory=list)


def _outputs_intact(session: Session, stage: Stage):
    def intact(task: Task, values: dict[str, Any]) -> bool:
        folder = session.workspace.stage_dir(stage.name)
        manifest = Manifest.read(folder)
        return manifest is not None and manifest.matches(folder, deep=False)

    return intact


def _watched(stage: Stage) -> dict[str, Any]:
    """What doit compares besides files; a tool that cannot even report its version makes the stage
    run, where it fails with its own clear message."""
    try:
        return watched_parts(stage)
    except DabuildError as error:
        return {**stage.static_parts, "unavailable": str(error)}


def to_task(stage: Stage, session: Session, result: RunResult, warnings: object | None = None) -> Task:
    """One doit task per stage; its action defers to the session (cache, atomic publish), its warnings
    counted in the build's `warnings` (notices.current() of the thread that runs the stages)."""

    def action() -> TaskFailed | None:
        try:
            with notices.bound(warnings):
                session.run(stage)
        except DabuildError as error:
            result.failures.append(Failure(stage.name, str(error), error))
            return TaskFailed(str(error))
        return None

    workspace = session.workspace
    return dict_to_task(
        {
            "name": stage.name,
            "actions": [PythonAction(action)],
            "file_dep": [str(p) for p in stage.files.values()]
            + [str(workspace.stage_dir(up) / MANIFEST) for up in stage.inputs.values()],
            "targets": [str(workspace.stage_dir(stage.name) / MANIFEST)],
            "uptodate": [config_changed(_watched(stage)), _outputs_intact(session, stage)],
            "verbosity": 2,
        }
    )


def _reporter_class(session: Session, result: RunResult) -> type:
    class Reporter(ConsoleReporter):
        """Quiet towards the console (dabuild prints its own lines), recording what doit skipped."""

        def execute_task(self, task: Task) -> None:
            pass

        def skip_uptodate(self, task: Task) -> None:
            session.outcomes[task.name] = (Outcome.UP_TO_DATE, 0.0)
            session.progress.debug(f"{task.name:<24} {Outcome.UP_TO_DATE.value}")

        def add_failure(self, task: Task, fail: Any) -> None:
            if not any(f.stage == task.name for f in result.failures):
                result.failures.append(Failure(task.name, fail.get_msg()))

        def add_success(self, task: Task) -> None:
            pass

        def complete_run(self) -> None:
            pass

    return Reporter


class _Loader(TaskLoader2):
    def __init__(self, tasks: list[Task], config: dict[str, Any]):
        super().__init__()
        self._tasks = tasks
        self._config = config

    def load_doit_config(self) -> dict[str, Any]:
        return self._config

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Task]:
        return self._tasks


def run_stages(stages: list[Stage], session: Session, jobs: int) -> RunResult:
    """Run every stage through doit; failures are collected, not raised."""
    result = RunResult()
    warnings = notices.current()
    tasks = [to_task(stage, session, result, warnings) for stage in stages]
    config = {
        "dep_file": str(session.workspace.build_dir / ".doit.db"),
        "backend": "sqlite3",
        "reporter": _reporter_class(session, result),
        "verbosity": 2,
        "outfile": io.StringIO(),
    }
    args = ["run"]
    if jobs > 1:
        args += ["-n", str(jobs), "-P", "thread"]
    code = DoitMain(_Loader(tasks, config)).run(args)
    if code != 0 and not result.failures:
        result.failures.append(Failure("doit", f"doit stopped with exit code {code}"))
    return result
