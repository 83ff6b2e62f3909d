"""Write the binary adder's datasets: minidb files of TensorProtos records for TensorProtosDBInput.

Each record is one pair (a, b) of 16-bit numbers as two int32 tensors, least significant bit first over
T = 17 timesteps (the 17th step has input bits 0 0 and holds the carry of the sum):
  bits  (17, 2): bits[t] = (bit t of a, bit t of b)
  sum   (17, 1): sum[t, 0] = bit t of a + b
train.minidb holds TRAIN_PAIRS random pairs, test.minidb 1,000 other pairs (none of them in the training
set). Fixed seed: rerunning rewrites the same files.
Run from anywhere: python models/binary_adder/make_data.py
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stepnet.io.minidb import save_dataset

HERE = Path(__file__).resolve().parent
BITS = 16
T = BITS + 1
TRAIN_PAIRS = 4096
TEST_PAIRS = 1000
SEED = 20240517


def to_bits(values: np.ndarray, width: int) -> np.ndarray:
    """(n,) non-negative ints -> (n, width) int32 bits, least significant first."""
    return ((values[:, None] >> np.arange(width)) & 1).astype(np.int32)


def records(a: np.ndarray, b: np.ndarray):
    """One (bits, sum) row per pair."""
    bits = np.stack([to_bits(a, T), to_bits(b, T)], axis=2)  # (n, T, 2); bit 16 of a 16-bit number is 0
    total = to_bits(a + b, T)[:, :, None]  # (n, T, 1)
    return [(bits[i], total[i]) for i in range(len(a))]


def make_pairs(rng, count: int, exclude: set | None = None) -> tuple[np.ndarray, np.ndarray]:
    """count distinct random pairs of 16-bit numbers, none of them in exclude."""
    seen = set(exclude or ())
    out = []
    while len(out) < count:
        a, b = (int(x) for x in rng.integers(0, 1 << BITS, size=2))
        if (a, b) not in seen:
            seen.add((a, b))
            out.append((a, b))
    pairs = np.array(out, dtype=np.int64)
    return pairs[:, 0], pairs[:, 1]


def main() -> None:
    rng = np.random.default_rng(SEED)
    train_a, train_b = make_pairs(rng, TRAIN_PAIRS)
    train_pairs = set(zip(train_a.tolist(), train_b.tolist(), strict=True))
    test_a, test_b = make_pairs(rng, TEST_PAIRS, exclude=train_pairs)
    save_dataset(HERE / "train.minidb", records(train_a, train_b))
    save_dataset(HERE / "test.minidb", records(test_a, test_b))
    print(f"wrote {TRAIN_PAIRS} training pairs to {HERE / 'train.minidb'}, "
          f"{TEST_PAIRS} test pairs to {HERE / 'test.minidb'}")


if __name__ == "__main__":
    main()
