"""Build binary_adder.pbtxt: a PlanDef that trains a basic RNN to add two 16-bit numbers bit by bit.

Least significant bit first, one timestep per bit (T = 17: the last step emits the carry). Per step the RNN
reads the two input bits and emits the logit of the sum bit:
    i2h = FC(x, axis=2) over all timesteps                       (outside the RecurrentNetwork op)
    hidden_t = Tanh(FC(hidden_t_prev) + i2h_t)                   (the step net; FCs carry the biases)
    logits = FC(hidden_all, axis=2), loss = mean SigmoidCrossEntropyWithLogits(logits, sum bits)
The step net is turned into a RecurrentNetwork op by stepnet.builders.rnn.recurrent_net, which also derives
the backward step net; ModelBuilder adds the gradient ops and Adam. Data comes from minidbs written by
make_data.py, read inside the plan (CreateDB + TensorProtosDBInput). After training, a test net reads 1,000
held-out pairs, runs the RNN forward-only and prints the bit accuracy over all 17 x 1,000 output bits
(blob `bit_accuracy`).

Run from the repository root:  python models/binary_adder/build.py
then                             stepnet run models/binary_adder/binary_adder.pbtxt --fetch bit_accuracy
"""
from __future__ import annotations

from pathlib import Path

from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import ExecutionStep, to_text
from stepnet.builders.rnn import recurrent_net

HERE = Path(__file__).resolve().parent
DATA_DIR = "models/binary_adder"  # CreateDB opens its path as given: run the plan from the repository root
HIDDEN = 16
BATCH = 64
ITERATIONS = 800
REPORT_EVERY = 100
LEARNING_RATE = 0.01
TEST_PAIRS = 1000
FLOAT = 1  # TensorProto.DataType FLOAT, for Cast


def read_batch(net: NetBuilder, reader: str, batch: int, prefix: str):
    """(x T x N x 2 float, y T x N x 1 float): a batch of records, cast and made time-major."""
    bits, total = net.TensorProtosDBInput([reader], [f"{prefix}_bits", f"{prefix}_sum"], batch_size=batch)
    x = net.Transpose(net.Cast(bits, f"{prefix}_bits_f", to=FLOAT), f"{prefix}_x", axes=[1, 0, 2])
    y = net.Transpose(net.Cast(total, f"{prefix}_sum_f", to=FLOAT), f"{prefix}_y", axes=[1, 0, 2])
    return x, y


def rnn(net: NetBuilder, i2h, scope: str, forward_only: bool):
    """The basic RNN over i2h (T x N x H): returns hidden_all (T x N x H)."""
    h_prev = BlobRef("rnn/hidden_t_prev")
    step = NetBuilder("rnn_step")
    step.add_external_inputs("input_t", "timestep", h_prev)
    h2h = step.FC([h_prev, BlobRef("rnn/h2h_w"), BlobRef("rnn/h2h_b")], BlobRef("rnn/h2h_t"), axis=2)
    pre = step.Sum([h2h, BlobRef("input_t")], BlobRef("rnn/pre_t"))
    hidden = step.Tanh(pre, BlobRef("rnn/hidden_t"))
    step.add_external_outputs(hidden)
    outs = recurrent_net(net, step, [(BlobRef("input_t"), i2h)], [(h_prev, BlobRef("rnn/hidden_init"))],
                         {h_prev: hidden}, timestep=BlobRef("timestep"), scope=scope,
                         forward_only=forward_only)
    return outs[0]


def build():
    m = ModelBuilder("binary_adder")
    init = m.init_net
    init.CreateDB([], "train_reader", db=f"{DATA_DIR}/train.minidb", db_type="minidb")
    init.CreateDB([], "test_reader", db=f"{DATA_DIR}/test.minidb", db_type="minidb")
    m.create_param("rnn/h2h_w", [HIDDEN, HIDDEN])
    m.create_param("rnn/h2h_b", [HIDDEN], ("ConstantFill", {"value": 0.0}))
    m.create_param("rnn/hidden_init", [HIDDEN], ("ConstantFill", {"value": 0.0}), trainable=False)

    # training net: one batch, forward, loss, gradients, Adam
    net = m.net
    net.add_external_inputs("train_reader")
    x, y = read_batch(net, "train_reader", BATCH, "train")
    x = net.StopGradient(x, x)  # data: no gradient flows back into the reader ops
    i2h = m.fc(x, "rnn/i2h", 2, HIDDEN, axis=2)
    hidden_all = rnn(net, i2h, "rnn", forward_only=False)
    logits = m.fc(hidden_all, "out", HIDDEN, 1, axis=2)
    xent = net.SigmoidCrossEntropyWithLogits([logits, y], "xent")
    loss = net.AveragedLoss(xent, "loss")
    m.add_gradient_ops([loss])
    m.adam(LEARNING_RATE)

    report = NetBuilder("binary_adder_report", m.scope)
    report.add_external_inputs(loss)
    report.Print(loss, [])

    # test net: 1,000 held-out pairs in one batch, forward-only RNN with the trained weights
    test = NetBuilder("binary_adder_test", m.scope)
    test.add_external_inputs("test_reader", *m.params)
    tx, ty = read_batch(test, "test_reader", TEST_PAIRS, "test")
    t_i2h = test.FC([tx, "rnn/i2h_w", "rnn/i2h_b"], "test_i2h", axis=2)
    t_hidden = rnn(test, t_i2h, "rnn_test", forward_only=True)
    t_logits = test.FC([t_hidden, "out_w", "out_b"], "test_logits", axis=2)
    prob = test.Sigmoid(t_logits, "test_prob")
    predicted = test.Cast(test.GT([prob, test.ConstantFill([], "half", shape=[1], value=0.5)], "test_bit",
                                  broadcast=1), "test_bit_f", to=FLOAT)
    correct = test.Cast(test.EQ([predicted, ty], "test_correct"), "test_correct_f", to=FLOAT)
    accuracy = test.ReduceMean(correct, "bit_accuracy", keepdims=0)
    test.Print(accuracy, [])
    test.add_external_outputs(accuracy)

    plan = m.to_plan(ITERATIONS, report_net=report, report_every=REPORT_EVERY)
    plan.network.append(test.proto())
    plan.execution_step.append(ExecutionStep(name="test", network=[test.name]))
    return plan


def main() -> None:
    plan = build()
    header = ("# Generated by models/binary_adder/build.py -- edit that script, not this file.\n"
              "# Run from the repository root: stepnet run models/binary_adder/binary_adder.pbtxt\n")
    (HERE / "binary_adder.pbtxt").write_text(header + to_text(plan))
    print(f"wrote {HERE / 'binary_adder.pbtxt'}")


if __name__ == "__main__":
    main()
