"""The search driver every strategy shares: budget, goal, objective, trial store and history.

A strategy only proposes configs (`search.evaluate([...])`); the driver
scores them (in parallel when asked), records each as a trial in proposal
order, and raises `StopSearch` when the budget (`max_trials`, `timeout`) is
spent, every config of the space has been seen, or a passing config reaches
the cheapest cost the space allows. Because results are committed in proposal
order and stop conditions are checked per commit, `-j N` records exactly the
trials `-j 1` would.

The chosen config is the cheapest passing one by the objective (size in
weight bits, BOPs, or the capability's cost estimate: see
`dabuild.tune.objective`), ties to the better score, then the earlier trial;
with no passing config, the best-scoring one, reported as a miss.

Reaching the least cost ends the search (no config can be cheaper, and the
objective, not the score, chooses among passing configs): no strategy spends a
trial on configs as cheap as the best passing one.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from dabuild.progress import Progress
from dabuild.quant.config import QuantConfig
from dabuild.tune.evaluate import Evaluator, Score
from dabuild.tune.objective import Objective, counted
from dabuild.tune.scorer import Scorer
from dabuild.tune.space import TuningSpace
from dabuild.tune.trials import Trial, TrialStore

SUBSET_ROWS = 300  # evaluation rows of a subset score (strategies rank by it before spending full evaluations)
CHUNK = 32  # configs `evaluate_each` scores at once: enough for any -j, fixed so results never depend on it


class StopSearch(Exception):
    """Raised through the strategy when the driver ends the search; the message says why."""


@dataclass(frozen=True)
class Goal:
    criterion: str  # relative | absolute
    tolerable_loss: float

    def threshold(self, baseline: float, higher_is_better: bool) -> float:
        """The worst score within the tolerable loss of the float `baseline`."""
        allowed = self.tolerable_loss * (abs(baseline) if self.criterion == "relative" else 1.0)
        return baseline - allowed if higher_is_better else baseline + allowed

    def passes(self, baseline: float, value: float, higher_is_better: bool) -> bool:
        limit = self.threshold(baseline, higher_is_better)
        return value >= limit if higher_is_better else value <= limit


@dataclass(frozen=True)
class Budget:
    max_trials: int
    timeout: float = 0.0  # seconds; 0: none


class Search:
    def __init__(self, space: TuningSpace, evaluator: Evaluator, scorer: Scorer, store: TrialStore, goal: Goal,
                 objective: str | Objective, budget: Budget, progress: Progress, seed: int = 0,
                 history: IO[str] | None = None, fits: Callable[[QuantConfig], str | None] | None = None):
        """`objective`: an Objective, or the name of one the space counts (size, bops). `fits`: why a config's
        artifact would overflow a target's budget (None: it fits); a config that meets the goal but not the
        budget does not pass, so it is never chosen."""
        self.space, self.evaluator, self.scorer, self.store = space, evaluator, scorer, store
        self.costing = counted(space, objective) if isinstance(objective, str) else objective
        self.objective = self.costing.name
        self.goal, self.budget, self.progress, self.seed = goal, budget, progress, seed
        self.history = history
        self.fits = fits
        self.misfits: dict[str, str] = {}  # config hash -> why its artifact overflows a budget
        self.trials: list[Trial] = []
        self.stop_reason = "the strategy finished"
        self.strategy_name = ""
        self._seen: dict[str, Trial] = {}
        self._floor = self.costing.floor
        self._start = time.monotonic()
        self._errors: dict[str, dict[str, float]] = {}
        self._scored: dict[str, tuple[Score, bool]] = {}  # scored in this run but not (yet) recorded; from store?
        self._subset_metrics: dict[str, float] = {}
        self.subset_rows = evaluator.subset(SUBSET_ROWS)
        self.harmful: list[str] = []  # nodes a strategy found the most harmful, most first (named on a miss)
        self.step = ""  # the phase the last evaluation belonged to (the stop reason names it)
        self.pricing_seconds = 0.0  # spent pricing configs (`cost`), within the search's own time
        self.priced: set[str] = set()  # hashes of the configs priced

    # ------------------------------------------------------------ what strategies read

    @property
    def metric(self):
        return self.evaluator.metric

    @property
    def baseline(self) -> float:
        return self.evaluator.baseline

    def cost(self, config: QuantConfig) -> int:
        """The objective's cost of `config`; the time it takes is counted in `pricing_seconds`."""
        start = time.perf_counter()
        try:
            return self.costing.cost(config)
        finally:
            self.pricing_seconds += time.perf_counter() - start
            self.priced.add(config.content_hash())

    @property
    def seconds(self) -> float:
        """Wall seconds since the search began."""
        return time.monotonic() - self._start

    def best(self) -> Trial | None:
        """The cheapest passing trial (ties: better score, then earlier); None before any passes."""
        passing = [t for t in self.trials if t.passed]
        if not passing:
            return None
        return min(passing, key=self._rank)

    def _rank(self, trial: Trial) -> tuple[float, float, int]:
        """How passing trials compare: the cheaper, then the better score, then the earlier."""
        sign = -1 if self.metric.higher_is_better else 1
        return (trial.cost, sign * trial.metric, trial.index)

    def best_found(self) -> Trial | None:
        """The chosen trial: the best passing one, else the best-scoring one."""
        if not self.trials:
            return None
        sign = -1 if self.metric.higher_is_better else 1
        return self.best() or min(self.trials, key=lambda t: (t.stopped, sign * t.metric, t.cost, t.index))

    def could_improve(self, config: QuantConfig) -> bool:
        """Might `config` beat the best passing trial? Only a strictly cheaper one can."""
        best = self.best()
        return best is None or self.cost(config) < best.cost

    def seen(self, config: QuantConfig) -> Trial | None:
        return self._seen.get(config.content_hash())

    def node_errors(self, config: QuantConfig | None = None, subset: bool = False) -> dict[str, float]:
        """Per-node output MSE against float under `config` (default: the space's default); no trial spent.
        With `subset`, on `subset_rows` only: a strategy counting full evaluations spends no full pass on it."""
        config = config or self.space.default()
        key = config.content_hash() + (":subset" if subset else "")
        if key not in self._errors:
            self._errors[key] = self.evaluator.node_errors(config, self.subset_rows if subset else None)
        return self._errors[key]

    @property
    def subset_evaluations(self) -> int:
        """How many configs were scored on the subset (cheap estimates, not trials)."""
        return len(self._subset_metrics)

    def subset_metric(self, config: QuantConfig) -> float:
        """`config`'s metric as `subset_rows` estimate it (`Evaluator.subset_metric`: no trial spent);
        remembered by config."""
        key = config.content_hash()
        if key not in self._subset_metrics:
            self._check_budget()
            self._subset_metrics[key] = self.evaluator.subset_metric(config, self.subset_rows)
        return self._subset_metrics[key]

    def subset_passes(self, config: QuantConfig) -> bool:
        """Does `config` meet the goal on the subset, measured against the float graph on the same rows? (On a
        marginal subset, `Evaluator.subset_is_marginal`, the subset metric estimates the whole set's, which is
        then held to the goal against the whole set's baseline.)"""
        if self.evaluator.subset_is_marginal:
            return self.goal.passes(self.baseline, self.subset_metric(config), self.metric.higher_is_better)
        baseline = self.evaluator.subset_baseline(self.subset_rows)
        return self.goal.passes(baseline, self.subset_metric(config), self.metric.higher_is_better)

    def subset_predicts_pass(self, config: QuantConfig) -> bool:
        """Does the subset expect `config` to pass on the full set? It must pass on the subset, and score
        better there than every config the full set already failed: a subset score that once went with a
        miss is no evidence of a pass (the subset is a sample; near the goal its verdict is noise)."""
        if not self.subset_passes(config):
            return False
        sign = 1 if self.metric.higher_is_better else -1
        failed = [self._subset_metrics[t.config_hash] for t in self.trials
                  if not t.passed and t.config_hash in self._subset_metrics]
        return all(sign * self.subset_metric(config) > sign * value for value in failed)

    def harmful_nodes(self, count: int = 3) -> list[str]:
        """The `count` most harmful nodes: the strategy's ranking, else by per-node output MSE (default config)."""
        if self.harmful:
            return self.harmful[:count]
        errors = self.node_errors()
        return sorted(errors, key=lambda name: -errors[name])[:count]

    # ------------------------------------------------------------ the one thing strategies do

    def evaluate(self, configs: Sequence[QuantConfig], step: str, until_pass: bool = False,
                 until_fail: bool = False) -> list[Trial]:
        """Score `configs` and record them in order; returns their trials (a config seen before returns its
        earlier trial and costs nothing). With `until_pass`/`until_fail`, recording ends after the first
        passing/failing new trial; the rest of the batch is not recorded (though kept in the store).
        """
        self.step = step
        self._check_budget()
        unique: dict[str, QuantConfig] = {}
        for config in configs:
            key = config.content_hash()
            if key not in self._seen and key not in unique:
                unique[key] = config
        room = self.budget.max_trials - len(self.trials)
        fresh = dict(list(unique.items())[:room])
        floor = self.goal.threshold(self.baseline, True) if self.metric.higher_is_better else None
        for key in fresh:
            if key not in self._scored:
                stored = self.store.get(key, floor)
                if stored is not None:
                    self._scored[key] = (stored, True)
        missing = [key for key in fresh if key not in self._scored]
        for key, score in zip(missing, self.scorer.score([fresh[key] for key in missing], floor)):
            self.store.put(key, score)
            self._scored[key] = (score, False)
        results: list[Trial] = []
        for config in configs:
            key = config.content_hash()
            if key not in self._seen:
                if key not in fresh:
                    raise StopSearch(f"max_trials ({self.budget.max_trials}) reached in phase {step}")
                score, cached = self._scored.pop(key)
                trial = self._commit(config, key, score, cached=cached, step=step)
                results.append(trial)
                self._check_done()
                if (until_pass and trial.passed) or (until_fail and not trial.passed):
                    return results
            else:
                results.append(self._seen[key])
        self._check_budget()
        return results

    def evaluate_each(self, configs: Sequence[QuantConfig], step: str) -> list[Trial]:
        """Evaluate `configs` as if one by one, skipping each that cannot beat the best passing trial by the
        time it is reached; scored in batches (in parallel with -j), recorded exactly as serially."""
        recorded: list[Trial] = []
        pending = deque(configs)
        while pending:
            chunk: list[QuantConfig] = []
            while pending and len(chunk) < CHUNK:
                config = pending.popleft()
                if self.seen(config) is None and self.could_improve(config):
                    chunk.append(config)
            if not chunk:
                break
            batch = self.evaluate(chunk, step, until_pass=True)
            recorded += batch
            pending.extendleft(reversed(chunk[len(batch):]))
        return recorded

    def _commit(self, config: QuantConfig, key: str, score: Score, cached: bool, step: str) -> Trial:
        passed = self.goal.passes(self.baseline, score.metric, self.metric.higher_is_better)
        if passed and self.fits is not None:
            misfit = self.fits(config)
            if misfit is not None:
                self.misfits[key] = misfit
                passed = False
        trial = Trial(len(self.trials), config, key, score.metric, score.mse, self.space.size(config),
                      self.space.bops(config), self.cost(config), passed, score.seconds, cached, step,
                      score.stopped)
        self.trials.append(trial)
        self._seen[key] = trial
        if self.history is not None:
            self.history.write(json.dumps(trial.to_json(), sort_keys=True) + "\n")
            self.history.flush()
        self.progress.debug(f"trial {trial.index} ({step}): {self.metric.name} {trial.metric:.4f}, "
                            f"{self.objective} {trial.cost}, {'pass' if passed else 'fail'}"
                            f"{' (' + self.misfits[key] + ')' if key in self.misfits else ''}"
                            f"{' (stored)' if cached else ''}")
        self.progress.status(self._status())
        return trial

    def _status(self) -> str:
        """`tune: trial 12 of 100, best accuracy 0.9711 at size 4096, at most ~35 s left` for a terminal."""
        done = len(self.trials)
        best = self.best()
        found = (f"best {self.metric.name} {best.metric:.4f} at {self.objective} {best.cost}" if best
                 else "none passes yet")
        elapsed = time.monotonic() - self._start
        left = elapsed / done * (self.budget.max_trials - done)
        if self.budget.timeout:
            left = min(left, max(0.0, self.budget.timeout - elapsed))
        return f"  tune: trial {done} of at most {self.budget.max_trials}, {found}, at most ~{left:.0f} s left"

    def _check_done(self) -> None:
        best = self.best()
        if best is not None and best.cost <= self._floor:
            raise StopSearch(f"a passing config has the least {self.objective} the space allows (phase {self.step})")
        if len(self._seen) >= self.space.total():
            raise StopSearch(f"every config of the space was evaluated (phase {self.step})")

    def _check_budget(self) -> None:
        phase = f" in phase {self.step}" if self.step else ""
        if len(self.trials) >= self.budget.max_trials:
            raise StopSearch(f"max_trials ({self.budget.max_trials}) reached{phase}")
        # the first trials (the default config's batch) are always scored, however long setting up took: a
        # build with a timeout has a result, and a loaded machine does not turn it into "no trial was evaluated"
        if self.budget.timeout and self.trials and time.monotonic() - self._start > self.budget.timeout:
            raise StopSearch(f"timeout ({self.budget.timeout:g} s) reached{phase}")

    # ------------------------------------------------------------ running a strategy

    def run(self, strategy: object) -> Trial | None:
        """Let `strategy.search(self)` propose until it returns or the driver stops it; the chosen trial."""
        self.strategy_name = getattr(strategy, "name", type(strategy).__name__)
        try:
            strategy.search(self)  # type: ignore[attr-defined]
            if self.step:
                self.stop_reason = f"the strategy finished (last phase {self.step})"
        except StopSearch as stop:
            self.stop_reason = str(stop)
        return self.best_found()
