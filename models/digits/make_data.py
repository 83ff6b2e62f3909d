"""Write the scikit-learn "digits" data set (1,797 8x8 handwritten digits) as two minidb datasets for
CreateDB + TensorProtosDBInput: train.minidb (1,437 records) and test.minidb (360 records).

Each record is a serialized TensorProtos of two tensors: the image, float32 of shape (64,) scaled from the
0..16 pixel counts to [0, 1], and the label, an int32 scalar. The split is stratified (each digit keeps its
share in both files, rounded by largest remainder) and both files are shuffled, all from a fixed seed, so
the files are reproducible byte for byte.

The CSV ships inside scikit-learn (sklearn/datasets/data/digits.csv.gz: 64 pixel columns, then the label);
only the file is read, scikit-learn itself is not imported. Run from anywhere:

    pip install scikit-learn        # only to regenerate the data; stepnet does not depend on it
    python models/digits/make_data.py [--csv PATH/digits.csv.gz]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
from pathlib import Path

import numpy as np

from stepnet.io.minidb import save_dataset

HERE = Path(__file__).resolve().parent
SEED = 1797
N_TEST = 360


def sklearn_csv() -> Path:
    """The digits CSV of the installed scikit-learn, found without importing the package."""
    found = importlib.util.find_spec("sklearn")
    if found is None or not found.submodule_search_locations:
        raise SystemExit("scikit-learn is not installed: pip install scikit-learn, or pass --csv PATH")
    return Path(list(found.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if table.shape != (1797, 65):
        raise SystemExit(f"{path}: expected 1797 rows of 65 columns, got {table.shape}")
    pixels, labels = table[:, :64], table[:, 64]
    if pixels.min() < 0 or pixels.max() > 16 or set(labels.tolist()) != set(range(10)):
        raise SystemExit(f"{path}: pixels must be 0..16 and labels 0..9")
    return (pixels / 16.0).astype(np.float32), labels.astype(np.int32)


def stratified_split(labels: np.ndarray, n_test: int, rng: np.random.Generator):
    """(train indices, test indices): per class a share of n_test proportional to the class size."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n_test / len(labels)
    take = np.floor(exact).astype(int)
    for k in np.argsort(-(exact - take), kind="stable")[:n_test - take.sum()]:
        take[k] += 1
    train, test = [], []
    for c, k in zip(classes, take, strict=True):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.extend(idx[:k])
        train.extend(idx[k:])
    return rng.permutation(np.array(train)), rng.permutation(np.array(test))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, help="digits.csv.gz (default: the one inside scikit-learn)")
    p.add_argument("--out", type=Path, default=HERE, help="output folder (default: models/digits)")
    a = p.parse_args(argv)
    images, labels = read_csv(a.csv or sklearn_csv())
    train, test = stratified_split(labels, N_TEST, np.random.default_rng(SEED))
    for name, idx in (("train", train), ("test", test)):
        path = a.out / f"{name}.minidb"
        save_dataset(path, ((images[i], np.int32(labels[i])) for i in idx))
        counts = np.bincount(labels[idx], minlength=10).tolist()
        print(f"wrote {path}: {len(idx)} records, per digit {counts}")


if __name__ == "__main__":
    main()
