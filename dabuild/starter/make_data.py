"""Write data.npz and weights.npz for the starter recipe; replace them with your own data and weights.

Four Gaussian clusters in 16 dimensions; model.py's first layer is random and
its second layer the least-squares fit to the one-hot labels, so no training
loop is needed and the float model is about 99 % accurate. Seeded: a rerun
writes the same arrays.

    python make_data.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES, HIDDEN, CLASSES = 16, 32, 4


def main() -> None:
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 1.5, (CLASSES, FEATURES))

    def samples(count: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, CLASSES, count)
        return (centers[labels] + rng.normal(0, 1, (count, FEATURES))).astype(np.float32), labels

    x_train, y_train = samples(1000)
    x_test, y_test = samples(400)
    w1 = rng.normal(0, FEATURES**-0.5, (FEATURES, HIDDEN)).astype(np.float32)
    b1 = np.zeros(HIDDEN, np.float32)
    hidden = np.maximum(x_train @ w1 + b1, 0)
    design = np.hstack([hidden, np.ones((len(hidden), 1), np.float32)])
    fit = np.linalg.lstsq(design, np.eye(CLASSES)[y_train], rcond=None)[0].astype(np.float32)
    np.savez(HERE / "weights.npz", w1=w1, b1=b1, w2=fit[:-1], b2=fit[-1])
    np.savez(HERE / "data.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


if __name__ == "__main__":
    main()
