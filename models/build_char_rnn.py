"""Build the char-rnn model files (spec §8): data minidbs, models/char_rnn.pbtxt (training plan) and
models/char_rnn_sample.pbtxt (generation plan). Run from the repository root:

    python models/build_char_rnn.py

The training plan reads its batches with CreateDB + TensorProtosDBInput (no Python feeding), carries the LSTM
state across iterations (truncated BPTT), reports the mean loss every REPORT iterations (over the iterations
since the last report: `stepnet run --iterations N` may stop a block early), evaluates the held-out loss (last
10 % of the text, the mean over every held-out batch, in a loop that stops on a blob) at the end and saves a
checkpoint. The sampling plan loads that
checkpoint (`stepnet run models/char_rnn_sample.pbtxt --load char_rnn_checkpoint.minidb`) and prints text.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepnet import save  # noqa: E402
from stepnet.io import minidb  # noqa: E402
from stepnet.builders.builder import BlobRef  # noqa: E402
from stepnet.builders.model import ModelBuilder  # noqa: E402
from stepnet.io.proto import ExecutionStep, NetDef, OperatorDef, PlanDef, make_argument  # noqa: E402
from stepnet.builders.rnn import lstm  # noqa: E402

DATA = "models/data"
TEXT = f"{DATA}/tinyshakespeare.txt"
TRAIN_DB = f"{DATA}/char_rnn_train.minidb"
HELDOUT_DB = f"{DATA}/char_rnn_heldout.minidb"
CHECKPOINT = "char_rnn_checkpoint.minidb"
INT64, INT32, BOOL = 10, 2, 5


def vocabulary(text: str) -> list[str]:
    return sorted(set(text))  # sorted: the same vocabulary in every process (Caffe2's list(set()) was not)


def batches(ids: np.ndarray, B: int, T: int) -> list[np.ndarray]:
    """Cut ids into B contiguous streams and return (T+1) x B windows stepping by T: row t of batch k is
    position k*T + t of each stream, so consecutive batches continue each stream (truncated BPTT)."""
    L = len(ids) // B
    streams = ids[: L * B].reshape(B, L)
    return [np.ascontiguousarray(streams[:, k * T: k * T + T + 1].T) for k in range((L - 1) // T)]


def write_data(B: int, T: int) -> list[str]:
    text = (ROOT / TEXT).read_text()
    vocab = vocabulary(text)
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], np.int32)
    cut = int(len(ids) * 0.9)
    for path, part in ((TRAIN_DB, ids[:cut]), (HELDOUT_DB, ids[cut:])):
        minidb.save_dataset(ROOT / path, ([b] for b in batches(part, B, T)))
    return vocab


def sequence_input(net, batch, T: int, B: int, V: int, prefix: str):
    """One-hot T x B x V inputs and int32 targets from a (T+1) x B batch of character ids."""
    x = net.Slice(batch, BlobRef(f"{prefix}x_ids"), starts=[0, 0], ends=[T, -1])
    y = net.Slice(batch, BlobRef(f"{prefix}y_ids"), starts=[1, 0], ends=[-1, -1])
    x64 = net.Cast(x, BlobRef(f"{prefix}x_ids64"), to=INT64)
    flat, _ = net.Reshape(x64, [BlobRef(f"{prefix}x_flat"), BlobRef(f"{prefix}x_flat_shape")], shape=[-1])
    onehot = net.OneHot([flat, BlobRef("vocab_size")], BlobRef(f"{prefix}x_onehot"))
    inp, _ = net.Reshape(onehot, [BlobRef(f"{prefix}input_blob"), BlobRef(f"{prefix}input_shape")],
                         shape=[T, B, V])
    target, _ = net.Reshape(y, [BlobRef(f"{prefix}target"), BlobRef(f"{prefix}target_shape")], shape=[-1])
    return inp, target


def lstm_forward(model, inp, B: int, H: int, V: int, forward_only: bool):
    """Run the LSTM, project to V, softmax: returns the N x V probabilities."""
    net = model.net
    h_all, _, _, _ = lstm(model, inp, BlobRef("seq_lengths"), ("hidden_init", "cell_init"), V, H, scope="LSTM",
                          forward_only=forward_only)
    logits = model.fc(h_all, "logits", H, V, axis=2)
    probs = net.Softmax(logits, BlobRef("softmax"), axis=2)
    flat, _ = net.Reshape(probs, [BlobRef("softmax_reshaped"), BlobRef("softmax_shape")], shape=[-1, V])
    return flat


def prepare_state() -> NetDef:
    """Caffe2's prepare_state net: the last states of the previous run become this run's initial states
    (truncated BPTT). A net of its own, outside the gradient computation."""
    return _net("prepare_state", [
        OperatorDef(type="Copy", input=["LSTM/hidden_state_last"], output=["hidden_init"]),
        OperatorDef(type="Copy", input=["LSTM/cell_state_last"], output=["cell_init"])])


def fill_states(init, B: int, H: int, T: int):
    for name in ("LSTM/hidden_state_last", "LSTM/cell_state_last"):
        init.ConstantFill([], BlobRef(name), shape=[1, B, H], value=0.0)
    init.ConstantFill([], BlobRef("seq_lengths"), shape=[B], value=T, dtype=INT32)


def train_plan(vocab, B: int, T: int, H: int, iterations: int, report: int, lr: float, clip: float) -> PlanDef:
    V = len(vocab)
    model = ModelBuilder("char_rnn")
    init, net = model.init_net, model.net
    init.CreateDB([], BlobRef("train_reader"), db=TRAIN_DB, db_type="minidb")
    init.CreateDB([], BlobRef("heldout_reader"), db=HELDOUT_DB, db_type="minidb")
    init.ConstantFill([], BlobRef("vocab_size"), shape=[], value=V, dtype=INT64)
    init.ConstantFill([], BlobRef("loss_sum"), shape=[], value=0.0)
    init.ConstantFill([], BlobRef("loss_count"), shape=[], value=0.0)   # iterations since the last report
    init.ConstantFill([], BlobRef("one"), shape=[], value=1.0)
    fill_states(init, B, H, T)
    batch = net.TensorProtosDBInput(BlobRef("train_reader"), BlobRef("batch"))
    inp, target = sequence_input(net, batch, T, B, V, "")
    probs = lstm_forward(model, inp, B, H, V, forward_only=False)
    xent = net.LabelCrossEntropy([probs, target], BlobRef("xent"))
    loss = net.AveragedLoss(xent, BlobRef("loss"))
    model.add_gradient_ops([loss])
    model.adam(lr, **({"clip_gradient_norm": clip} if clip else {}))
    net.Sum([BlobRef("loss_sum"), loss], BlobRef("loss_sum"))
    net.Sum([BlobRef("loss_count"), BlobRef("one")], BlobRef("loss_count"))

    # the mean loss over the iterations since the last report (fewer than `report` when --iterations cuts the
    # last block short), then both sums restart
    report_net = _net("report", [
        OperatorDef(type="Div", input=["loss_sum", "loss_count"], output=["train_loss"]),
        OperatorDef(type="Print", input=["train_loss"]),
        OperatorDef(type="Scale", input=["loss_sum"], output=["loss_sum"], arg=[make_argument("scale", 0.0)]),
        OperatorDef(type="Scale", input=["loss_count"], output=["loss_count"], arg=[make_argument("scale", 0.0)])])

    n_heldout = len(minidb.MiniDB(ROOT / HELDOUT_DB))
    eval_net = _eval_net(net.proto())
    eval_init = eval_init_net(B, H, n_heldout)
    eval_report = _net("eval_report", [   # the mean over the batches the loop ran
        OperatorDef(type="Div", input=["heldout_sum", "heldout_count"], output=["heldout_loss"]),
        OperatorDef(type="Print", input=["heldout_loss"])])
    params = sorted(set(model.params))
    save_net = _net("save", [OperatorDef(type="Save", input=params, arg=[
        make_argument("db", CHECKPOINT), make_argument("db_type", "minidb"), make_argument("absolute_path", 1)])])

    return plan_of("char_rnn", [init.proto(), prepare_state(), net.proto(), report_net, eval_init, eval_net,
                                eval_report, save_net], iterations, report)


def eval_init_net(B: int, H: int, n_heldout: int) -> NetDef:
    """Zero LSTM state, zero held-out sums, the batch count and heldout_done = False."""
    zeros = [("LSTM/hidden_state_last", [1, B, H], 0.0), ("LSTM/cell_state_last", [1, B, H], 0.0),
             ("heldout_sum", [], 0.0), ("heldout_count", [], 0.0), ("heldout_batches", [], float(n_heldout))]
    return _net("eval_init", [
        OperatorDef(type="ConstantFill", output=[name], arg=[make_argument("shape", shape),
                                                             make_argument("value", value)])
        for name, shape, value in zeros] + [
        OperatorDef(type="ConstantFill", output=["heldout_done"], arg=[make_argument("shape", []),
                                                                     make_argument("value", 0),
                                                                     make_argument("dtype", BOOL)])])


def plan_of(name: str, nets: list, iterations: int, report: int) -> PlanDef:
    """The training plan over nets (init, prepare_state, the training net, report, eval_init, eval,
    eval_report, save): init; train x (train_steps x report, report); the held-out pass; save."""
    init, net = nets[0], nets[2]
    plan = PlanDef(name=name)
    plan.network.extend(nets)
    plan.execution_step.append(ExecutionStep(name="init", network=[init.name]))
    train = ExecutionStep(name="train", num_iter=iterations // report)
    train.substep.append(ExecutionStep(name="train_steps", network=["prepare_state", net.name], num_iter=report))
    train.substep.append(ExecutionStep(name="report", network=["report"]))
    plan.execution_step.append(train)
    plan.execution_step.append(ExecutionStep(name="heldout", network=["eval_init"]))
    # the held-out loop stops on a blob (once every held-out batch ran), so --iterations leaves it alone
    plan.execution_step.append(ExecutionStep(name="heldout_steps", network=["prepare_state", "eval"],
                                             should_stop_blob="heldout_done"))
    plan.execution_step.append(ExecutionStep(name="heldout_report", network=["eval_report"]))
    plan.execution_step.append(ExecutionStep(name="save", network=["save"]))
    return plan


def _net(name, ops) -> NetDef:
    nd = NetDef(name=name)
    nd.op.extend(ops)
    return nd


def _eval_net(train: NetDef) -> NetDef:
    """The forward part of the training net reading held-out batches, forward-only, summing the loss and
    counting the batches; heldout_done once heldout_batches ran."""
    nd = NetDef(name="eval")
    for op in train.op:
        if op.type == "ConstantFill" and op.input and op.input[0] == "loss":
            break  # the gradient part starts here
        copy = OperatorDef()
        copy.CopyFrom(op)
        copy.input[:] = ["heldout_reader" if i == "train_reader" else i for i in copy.input]
        if copy.type == "RecurrentNetwork":
            keep = [a for a in copy.arg if a.name == "step_net" or not a.name.startswith(("backward_", "param",
                                                                                        "outputs_with_grads"))]
            del copy.arg[:]
            copy.arg.extend(keep)
        nd.op.append(copy)
    nd.op.append(OperatorDef(type="Sum", input=["heldout_sum", "loss"], output=["heldout_sum"]))
    nd.op.append(OperatorDef(type="Sum", input=["heldout_count", "one"], output=["heldout_count"]))
    nd.op.append(OperatorDef(type="GE", input=["heldout_count", "heldout_batches"], output=["heldout_done"]))
    return nd


def sample_plan(vocab, H: int, chars: int) -> PlanDef:
    """Generation: the same LSTM (B=1, T=1, parameters from --load), sampling one character per iteration."""
    V = len(vocab)
    model = ModelBuilder("char_rnn_sample")
    init, net = model.init_net, model.net
    init.ConstantFill([], BlobRef("vocab_size"), shape=[], value=V, dtype=INT64)
    fill_states(init, 1, H, 1)
    init.GivenTensorStringFill([], BlobRef("vocab"), shape=[V], values=vocab)
    init.ConstantFill([], BlobRef("char"), shape=[1], value=vocab.index("\n"), dtype=INT32)
    init.ConstantFill([], BlobRef("generated"), shape=[0], value=0, dtype=INT32)
    c64 = net.Cast(BlobRef("char"), BlobRef("char64"), to=INT64)
    onehot = net.OneHot([c64, BlobRef("vocab_size")], BlobRef("onehot"))
    inp, _ = net.Reshape(onehot, [BlobRef("input_blob"), BlobRef("input_shape")], shape=[1, 1, V])
    probs = lstm_forward(model, inp, 1, H, V, forward_only=True)
    net.WeightedSample(probs, BlobRef("char"))
    net.Concat([BlobRef("generated"), BlobRef("char")], [BlobRef("generated_next"), BlobRef("generated_info")],
               axis=0)
    net.Copy(BlobRef("generated_next"), BlobRef("generated"))
    show = _net("show", [
        OperatorDef(type="Gather", input=["vocab", "generated"], output=["generated_chars"]),
        OperatorDef(type="Reshape", input=["generated_chars"], output=["generated_row", "generated_shape"],
                    arg=[make_argument("shape", [1, -1])]),
        OperatorDef(type="StringJoin", input=["generated_row"], output=["text"], arg=[make_argument("delimiter", "")]),
        OperatorDef(type="Print", input=["text"])])
    init_proto = init.proto()
    # parameters come from the checkpoint: drop their fills from the init net
    keep = [op for op in init_proto.op if op.output[0] not in set(model.params)]
    del init_proto.op[:]
    init_proto.op.extend(keep)
    plan = PlanDef(name="char_rnn_sample")
    plan.network.extend([init_proto, prepare_state(), net.proto(), show])
    plan.execution_step.append(ExecutionStep(name="init", network=[init.name]))
    plan.execution_step.append(ExecutionStep(name="sample", network=["prepare_state", net.name], num_iter=chars))
    plan.execution_step.append(ExecutionStep(name="show", network=["show"]))
    return plan


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The training plan's options (build_char_rnn_dp.py takes them too): sequence length, hidden size,
    iterations, report interval, learning rate, gradient clip."""
    p.add_argument("--seq", type=int, default=25)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--report", type=int, default=250)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=5.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=32)
    add_training_args(p)
    p.add_argument("--chars", type=int, default=400)
    a = p.parse_args(argv)
    vocab = write_data(a.batch, a.seq)
    save(train_plan(vocab, a.batch, a.seq, a.hidden, a.iterations, a.report, a.lr, a.clip),
         ROOT / "models/char_rnn.pbtxt")
    save(sample_plan(vocab, a.hidden, a.chars), ROOT / "models/char_rnn_sample.pbtxt")
    print(f"vocabulary {len(vocab)}, wrote {TRAIN_DB}, {HELDOUT_DB}, models/char_rnn.pbtxt, "
          "models/char_rnn_sample.pbtxt")


if __name__ == "__main__":
    main()
