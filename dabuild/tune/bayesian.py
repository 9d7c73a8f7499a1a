"""The `bayesian` strategy: optuna's TPE sampler over one categorical choice per node (optional extra).

The objective optuna minimises is the config's cost relative to float, plus
one and the missed score for a config that fails the goal, so TPE learns both
where the goal holds and where it is cheap. Proposals that cannot beat the
best passing config are pruned unevaluated. Install with `pip install dabuild[bayesian]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from dabuild.errors import BuildError
from dabuild.quant.config import QuantConfig

if TYPE_CHECKING:
    from dabuild.tune.search import Search
    from dabuild.tune.trials import Trial

BATCH = 4  # proposals asked for and told together (fixed, so -j N records what -j 1 does)
PATIENCE = 50


class BayesianStrategy:
    name: ClassVar[str] = "bayesian"

    def search(self, search: Search) -> None:
        try:
            import optuna
        except ImportError:
            raise BuildError("strategy bayesian needs optuna: pip install 'dabuild[bayesian]'") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = search.space
        choosing = [name for name, node in space.nodes.items() if len(node.candidates) > 1]
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=search.seed))
        study.enqueue_trial({name: 0 for name in choosing})
        reference = max(1, search.costing.scale)

        def loss(trial: Trial) -> float:
            shortfall = 0.0 if trial.passed else 1.0 + abs(trial.metric - search.baseline)
            return trial.cost / reference + shortfall

        idle = 0
        while idle < PATIENCE:
            asked = [study.ask() for _ in range(BATCH)]
            configs = [QuantConfig({name: node.candidates[asked_trial.suggest_categorical(
                name, list(range(len(node.candidates)))) if name in choosing else 0]
                for name, node in space.nodes.items()}) for asked_trial in asked]
            worth = [c for c in configs if search.seen(c) is None and search.could_improve(c)]
            idle = 0 if worth else idle + 1
            search.evaluate_each(worth, "tpe")
            for asked_trial, config in zip(asked, configs):
                trial = search.seen(config)
                if trial is None:
                    study.tell(asked_trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(asked_trial, loss(trial))
