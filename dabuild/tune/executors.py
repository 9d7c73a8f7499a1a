"""Where trials are scored: local worker processes, or the workers of a Dask cluster.

Both score the same configs with the same Evaluator code, so the trial history
and the chosen config do not depend on which ran them (scores are deterministic).

Dask: `dabuild build --executor dask://HOST:PORT` (or `DABUILD_EXECUTOR`). Each
worker receives the evaluation setup once, through a worker plugin (registered
on the workers present and on any that join later, a replacement included),
and builds its Evaluator from it; a trial sends only its config. A worker lost
mid-trial makes the scheduler run that trial again elsewhere, with the same
result: Dask reschedules a task whose worker died up to the scheduler's
`distributed.scheduler.allowed-failures` times (3 by default; at least 1 gives
the retry dabuild relies on), then the build stops with one error naming the
cluster. A cluster left without workers for 30 s (DABUILD_WORKERLESS_SECONDS), or a lost scheduler, is one
error too; the stage then writes nothing. Workers read the graph and statistics
from the build folder's paths, so they share the client's filesystem
(localhost, or a shared mount).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from dabuild.errors import UsageError

if TYPE_CHECKING:
    from dabuild.tune.evaluate import Score

EXECUTOR_ENV = "DABUILD_EXECUTOR"


class TrialExecutor(Protocol):
    def score(self, configs: list[dict[str, Any]], floor: float | None) -> list[Score]: ...

    def close(self) -> None: ...


def dask_address(executor: str | None) -> str | None:
    """The scheduler address of `dask://HOST:PORT`, None for `local` (or nothing); UsageError otherwise."""
    if not executor or executor == "local":
        return None
    parts = urlsplit(executor)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "dask" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise UsageError(f"executor {executor!r}: expected `local` or `dask://HOST:PORT`")
    return f"tcp://{parts.hostname}:{port}"


