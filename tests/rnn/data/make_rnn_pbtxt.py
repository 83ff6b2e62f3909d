"""Regenerate the two training plans in this folder (run from the repository root:
`python tests/rnn/data/make_rnn_pbtxt.py`). Both hold an LSTM in Caffe2's rnn_cell.LSTM layout (spec §3.16) and
its training graph, with the RecurrentNetworkGradient op and its backward step net written out in the file:

- lstm_char_rnn_plan.pbtxt: char-rnn as in caffe2/python/examples/char_rnn.py and the breadbread1984
  Caffe2-C-LSTM-demo layout: FC(axis=2) -> RecurrentNetwork whose step_net / backward_step_net are text-format
  NetDefs in Argument.s (the pre-2017-10 form; step net type "rnn") -> FC(axis=2) -> Softmax(axis=2) ->
  Reshape -> LabelCrossEntropy -> AveragedLoss, gradients on hidden_state_all (outputs_with_grads [0]).
- lstm_classifier_plan.pbtxt: the step nets as nested NetDefs in Argument.n; the loss reads hidden_state_last
  (outputs_with_grads [1]), as in the ads-ranking train net noted in shared/realmodels/SOURCES.md.
Plain SGD: WeightedSum(param, ONE, grad, LR) with a constant negative LR, as Caffe2's build_sgd adds it.
"""
from pathlib import Path

from stepnet.builders.builder import BlobRef
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import ExecutionStep, PlanDef, save, to_text
from stepnet.builders.rnn import lstm

D, H, N, C = 4, 6, 2, 3
HERE = Path(__file__).parent


def build(name: str, classifier: bool) -> PlanDef:
    m = ModelBuilder(name)
    owg = (1,) if classifier else (0,)
    for blob in ("hidden_init", "cell_init"):
        m.init_net.ConstantFill([], BlobRef(blob), shape=[1, N, H], value=0.0)
    h_all, h_last, _, _ = lstm(m, "input", "seq_lengths", ("hidden_init", "cell_init"), D, H, scope="LSTM",
                               outputs_with_grads=owg)
    width = C if classifier else D
    logits = m.fc(h_last if classifier else h_all, BlobRef("logits"), H, width, axis=2)
    softmax = m.net.Softmax([logits], BlobRef("softmax"), axis=2)
    flat, _ = m.net.Reshape([softmax], [BlobRef("softmax_reshaped"), BlobRef("_softmax_old_shape")],
                            shape=[-1, width])
    xent = m.net.LabelCrossEntropy([flat, BlobRef("target")], BlobRef("xent"))
    m.net.AveragedLoss([xent], BlobRef("loss"))
    m.add_gradient_ops(["loss"])
    m.init_net.ConstantFill([], BlobRef("LR"), shape=[1], value=-0.5)
    m.init_net.ConstantFill([], BlobRef("ONE"), shape=[1], value=1.0)
    for p, g in m.param_to_grad.items():
        m.net.WeightedSum([p, BlobRef("ONE"), g, BlobRef("LR")], p)
    plan = PlanDef(name=name + "_plan")
    plan.network.extend([m.init_net.proto(), m.net.proto()])
    plan.execution_step.append(ExecutionStep(name="init", network=[m.init_net.name]))
    plan.execution_step.append(ExecutionStep(name="train", network=[m.net.name], num_iter=10))
    return plan


def steps_as_text(plan: PlanDef) -> None:
    """Move step_net / backward_step_net from Argument.n to a text NetDef in Argument.s (older Caffe2 files)."""
    for net in plan.network:
        for op in net.op:
            if op.type not in ("RecurrentNetwork", "RecurrentNetworkGradient"):
                continue
            for arg in op.arg:
                if arg.name in ("step_net", "backward_step_net"):
                    step = type(arg.n)()
                    step.CopyFrom(arg.n)
                    if arg.name == "step_net":
                        step.type = "rnn"
                    arg.ClearField("n")
                    arg.s = to_text(step).encode()


if __name__ == "__main__":
    char_rnn = build("char_rnn", classifier=False)
    steps_as_text(char_rnn)
    save(char_rnn, HERE / "lstm_char_rnn_plan.pbtxt", text=True)
    save(build("classifier", classifier=True), HERE / "lstm_classifier_plan.pbtxt", text=True)
