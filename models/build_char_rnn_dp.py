"""Build models/char_rnn_dp.pbtxt: the char-rnn of models/build_char_rnn.py trained data-parallel over K processes,
and each rank's shard of its data. Run from the repository root:

    python models/build_char_rnn_dp.py [--ranks 2]
    mpiexec -n 2 stepnet run models/char_rnn_dp.pbtxt

Batch k of the single-process data (B streams of the text) is cut into K groups of B/K streams; rank r reads group
r of every batch from `models/data/char_rnn_{train,heldout}_<r>of<K>.minidb`, which the plan names with the
placeholders `{rank}of{size}`. The model is the single-process one at batch B/K with `ModelBuilder.data_parallel()`
between the backward pass and Adam (parameters broadcast from rank 0; gradients summed over the ranks and scaled by
1/K, before the global-norm clipping), so K ranks train as one process on the B streams. The printed train and
held-out losses are averaged over the ranks (MPIAllreduce); only rank 0 prints and writes the checkpoint.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "models")]

import build_char_rnn as single  # noqa: E402

from stepnet import save  # noqa: E402
from stepnet.io import minidb  # noqa: E402
from stepnet.builders.builder import BlobRef  # noqa: E402
from stepnet.builders.model import ModelBuilder  # noqa: E402
from stepnet.passes.data_parallel import COMM, GRAD_SCALE  # noqa: E402
from stepnet.io.proto import OperatorDef, PlanDef, make_argument  # noqa: E402

SHARD = "char_rnn_{part}_{rank}of{size}.minidb"
CHECKPOINT = "char_rnn_dp_checkpoint.minidb"


def write_shards(B: int, T: int, K: int, text: Path = ROOT / single.TEXT, data: Path = ROOT / single.DATA) -> list:
    """Every rank's shard of the training (first 90 %) and held-out (last 10 %) batches; returns the vocabulary."""
    if B % K:
        raise SystemExit(f"the batch of {B} streams does not split into {K} equal shards")
    content = text.read_text()
    vocab = single.vocabulary(content)
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in content], np.int32)
    cut = int(len(ids) * 0.9)
    per = B // K
    for part, chunk in (("train", ids[:cut]), ("heldout", ids[cut:])):
        batches = single.batches(chunk, B, T)
        for r in range(K):
            path = data / SHARD.format(part=part, rank=r, size=K)
            minidb.save_dataset(path, ([np.ascontiguousarray(b[:, r * per:(r + 1) * per])] for b in batches))
    return vocab


def _mean_over_ranks(total: str, count: str, out: str) -> list[OperatorDef]:
    """out = (sum of total over the ranks) / K / count (count is the same on every rank); total is summed in
    place."""
    return [OperatorDef(type="MPIAllreduce", input=[COMM, total], output=[total]),
            OperatorDef(type="WeightedSum", input=[total, GRAD_SCALE], output=[out]),
            OperatorDef(type="Div", input=[out, count], output=[out])]


def train_plan(vocab, B: int, T: int, H: int, iterations: int, report: int, lr: float, clip: float, K: int,
               data: str = single.DATA, checkpoint: str = CHECKPOINT) -> PlanDef:
    V, b = len(vocab), B // K
    shard = f"{data}/{SHARD}"
    model = ModelBuilder("char_rnn")
    init, net = model.init_net, model.net
    init.CreateDB([], BlobRef("train_reader"), db=shard.format(part="train", rank="{rank}", size="{size}"),
                  db_type="minidb")
    init.CreateDB([], BlobRef("heldout_reader"), db=shard.format(part="heldout", rank="{rank}", size="{size}"),
                  db_type="minidb")
    init.ConstantFill([], BlobRef("vocab_size"), shape=[], value=V, dtype=single.INT64)
    init.ConstantFill([], BlobRef("loss_sum"), shape=[], value=0.0)
    init.ConstantFill([], BlobRef("loss_count"), shape=[], value=0.0)   # iterations since the last report
    init.ConstantFill([], BlobRef("one"), shape=[], value=1.0)
    single.fill_states(init, b, H, T)
    batch = net.TensorProtosDBInput(BlobRef("train_reader"), BlobRef("batch"))
    inp, target = single.sequence_input(net, batch, T, b, V, "")
    probs = single.lstm_forward(model, inp, b, H, V, forward_only=False)
    loss = net.AveragedLoss(net.LabelCrossEntropy([probs, target], BlobRef("xent")), BlobRef("loss"))
    model.add_gradient_ops([loss])
    model.data_parallel()
    model.adam(lr, **({"clip_gradient_norm": clip} if clip else {}))
    net.Sum([BlobRef("loss_sum"), loss], BlobRef("loss_sum"))
    net.Sum([BlobRef("loss_count"), BlobRef("one")], BlobRef("loss_count"))

    # the mean loss over the ranks and the iterations since the last report, then both sums restart
    report_net = single._net("report", [
        *_mean_over_ranks("loss_sum", "loss_count", "train_loss"),
        OperatorDef(type="Print", input=["train_loss"]),
        OperatorDef(type="Scale", input=["loss_sum"], output=["loss_sum"], arg=[make_argument("scale", 0.0)]),
        OperatorDef(type="Scale", input=["loss_count"], output=["loss_count"], arg=[make_argument("scale", 0.0)])])
    n_heldout = len(minidb.MiniDB(ROOT / shard.format(part="heldout", rank=0, size=K)))
    eval_net = single._eval_net(net.proto())
    eval_init = single.eval_init_net(b, H, n_heldout)
    # every rank's shard has the same number of batches: the mean over the ranks of each rank's mean
    eval_report = single._net("eval_report", [*_mean_over_ranks("heldout_sum", "heldout_count", "heldout_loss"),
                                              OperatorDef(type="Print", input=["heldout_loss"])])
    save_net = single._net("save", [OperatorDef(type="Save", input=sorted(set(model.params)), arg=[
        make_argument("db", checkpoint), make_argument("db_type", "minidb"), make_argument("absolute_path", 1)])])

    return single.plan_of("char_rnn_dp", [init.proto(), single.prepare_state(), net.proto(), report_net, eval_init,
                                          eval_net, eval_report, save_net], iterations, report)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="K, the number of processes (the batch is split K ways)")
    p.add_argument("--batch", type=int, default=32, help="the global batch B (streams), as in char_rnn.pbtxt")
    single.add_training_args(p)
    a = p.parse_args(argv)
    vocab = write_shards(a.batch, a.seq, a.ranks)
    save(train_plan(vocab, a.batch, a.seq, a.hidden, a.iterations, a.report, a.lr, a.clip, a.ranks),
         ROOT / "models/char_rnn_dp.pbtxt")
    print(f"wrote the shards of {a.ranks} ranks in {single.DATA} and models/char_rnn_dp.pbtxt")


if __name__ == "__main__":
    main()
