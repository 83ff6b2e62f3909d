"""The data-parallel char-rnn files (models/build_char_rnn_dp.py): the committed plan is the builder's output, the
rank shards are the single-process batches cut by streams, and the plan carries the collectives. Training on 2
ranks ≡ one process: tests/mpi/test_jobs.py."""
import sys
from pathlib import Path

import numpy as np

from stepnet import load
from stepnet.io import minidb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import build_char_rnn_dp as build  # noqa: E402


def test_committed_plan_matches_the_builder_defaults():
    vocab = build.single.vocabulary((ROOT / build.single.TEXT).read_text())
    assert load(ROOT / "models/char_rnn_dp.pbtxt") == build.train_plan(vocab, 32, 25, 256, 2000, 250, 2e-3, 5.0, 2)


def test_the_shards_are_the_single_process_batches_cut_by_streams():
    for part, whole in (("train", build.single.TRAIN_DB), ("heldout", build.single.HELDOUT_DB)):
        dbs = [minidb.MiniDB(ROOT / build.single.DATA / build.SHARD.format(part=part, rank=r, size=2)) for r in (0, 1)]
        full = minidb.MiniDB(ROOT / whole)
        assert len(dbs[0]) == len(dbs[1]) == len(full)
        for i in (0, len(full) - 1):
            batch = minidb.parse_tensor_protos(full.value(i), "")[0]
            halves = [minidb.parse_tensor_protos(db.value(i), "")[0] for db in dbs]
            np.testing.assert_array_equal(np.concatenate(halves, axis=1), batch)


def test_the_plan_reads_rank_shards_and_reduces_gradients_and_losses():
    plan = load(ROOT / "models/char_rnn_dp.pbtxt")
    nets = {n.name: n for n in plan.network}
    dbs = [a.s.decode() for op in nets["char_rnn_init"].op if op.type == "CreateDB" for a in op.arg if a.name == "db"]
    assert dbs == ["models/data/char_rnn_train_{rank}of{size}.minidb",
                   "models/data/char_rnn_heldout_{rank}of{size}.minidb"]
    train = [op.type for op in nets["char_rnn"].op]
    # fused (the default): the 6 gradients in one buffer, one allreduce
    assert train.count("MPIAllreduce") == 1 and train.count("Concat") == 1
    assert train.index("Concat") < train.index("MPIAllreduce") < train.index("Split") < train.index("SumSqrElements")
    assert [op.type for op in nets["char_rnn_init"].op].count("MPIBroadcast") == 6
    for name in ("report", "eval_report"):
        assert nets[name].op[0].type == "MPIAllreduce"
