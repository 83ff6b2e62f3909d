"""Build models/digits/train.pbtxt: a PlanDef that trains an MLP (64-128-10, ReLU) on the digits data set and
prints the test accuracy. Run it from the repository root (the db paths are relative to the working folder):

    stepnet run models/digits/train.pbtxt

The plan: the init net fills the parameters and opens both datasets (CreateDB); the train net reads a batch
(TensorProtosDBInput), computes SoftmaxWithLoss, its gradients and a momentum SGD step (LR halved every
STEP_SIZE iterations); the report net prints the iteration and the loss every REPORT_EVERY iterations; at the
end the test net reads the whole test set in one batch and prints its Accuracy. Regenerate with
`python models/digits/build.py` (options: --iterations, --out, --data-dir).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from stepnet import proto
from stepnet.builder import NetBuilder
from stepnet.model import ModelBuilder

HERE = Path(__file__).resolve().parent
DATA_DIR = "models/digits"       # as seen from the repository root
ITERATIONS = 600                 # batches of BATCH: about 27 epochs of the 1,437 training images
BATCH = 64
N_TEST = 360
HIDDEN = 128
BASE_LR, MOMENTUM, STEP_SIZE, GAMMA = 0.1, 0.9, 200, 0.5
REPORT_EVERY = 50


def mlp(model: ModelBuilder, data):
    """The classifier's logits; a model built with param_model= reuses the same weights."""
    hidden = model.relu(model.fc(data, "fc1", 64, HIDDEN), "fc1_relu")
    return model.fc(hidden, "fc2", HIDDEN, 10)


def build(iterations: int = ITERATIONS, data_dir: str = DATA_DIR):
    train = ModelBuilder("digits")
    init = train.init_net
    train_db = init.CreateDB([], "train_reader", db=f"{data_dir}/train.minidb", db_type="minidb")
    test_db = init.CreateDB([], "test_reader", db=f"{data_dir}/test.minidb", db_type="minidb")

    data, label = train.net.TensorProtosDBInput([train_db], ["data", "label"], batch_size=BATCH)
    data = train.net.StopGradient(data, data)
    _, loss = train.net.SoftmaxWithLoss([mlp(train, data), label], ["softmax", "loss"])
    train.add_gradient_ops([loss])
    train.sgd(BASE_LR, policy="step", stepsize=STEP_SIZE, gamma=GAMMA, momentum=MOMENTUM)

    report = NetBuilder("digits_report", train.scope)
    report.Print("optimizer_iteration")
    report.Print(loss)

    test = ModelBuilder("digits_test", param_model=train)
    test_data, test_label = test.net.TensorProtosDBInput([test_db], ["test_data", "test_label"],
                                                         batch_size=N_TEST)
    scores = test.softmax(mlp(test, test_data), "test_softmax")
    accuracy = test.net.Accuracy([scores, test_label], "accuracy")
    test.net.Print(accuracy)
    test.net.add_external_outputs(accuracy)
    return train.to_plan(iterations, report, REPORT_EVERY, name="digits_mlp", final_nets=[test.net])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="write the digits training plan")
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    p.add_argument("--data-dir", default=DATA_DIR, help="folder of train/test.minidb as the plan will see it")
    p.add_argument("--out", type=Path, default=HERE / "train.pbtxt")
    a = p.parse_args(argv)
    proto.save(build(a.iterations, a.data_dir), a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
