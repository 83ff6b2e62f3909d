"""compat.crf: CRFWithLoss's loss and its gradient against a brute-force reference written here (every tag path
of the padded sequence enumerated: score = unary scores + transitions, loss = logsumexp(all) - labelled)."""
import itertools

import numpy as np

from stepnet.compat import crf, workspace
from stepnet.compat.model_helper import ModelHelper

LOW = -1000.0


def brute_force_loss(pred, labels, trans):
    t, n = pred.shape
    padded = np.full((t + 2, n + 2), LOW)
    padded[1:-1, :n] = pred
    padded[0, n], padded[-1, n + 1] = 0.0, 0.0
    scores = []
    for path in itertools.product(range(n + 2), repeat=t + 2):
        scores.append(sum(padded[i, y] for i, y in enumerate(path))
                      + sum(trans[a, b] for a, b in zip(path[:-1], path[1:])))
    scores = np.array(scores)
    top = scores.max()
    total = top + np.log(np.exp(scores - top).sum())
    gold = [n] + list(labels) + [n + 1]
    gold_score = sum(padded[i, y] for i, y in enumerate(gold)) + sum(trans[a, b] for a, b in zip(gold[:-1], gold[1:]))
    return total - gold_score


def build(pred, labels, trans):
    model = ModelHelper(name="crf_model")
    p, l, tr = model.net.AddExternalInputs("pred", "labels", "transitions")
    workspace.FeedBlob("pred", pred)
    workspace.FeedBlob("labels", labels)
    workspace.FeedBlob("transitions", trans)
    loss = crf.CRFWithLoss(model, pred.shape[1], tr).crf_loss(p, l)
    return model, loss


def test_loss_matches_every_path_enumerated():
    rng = np.random.RandomState(3)
    for t, n in ((1, 1), (2, 3), (4, 2)):
        pred = rng.randn(t, n).astype(np.float32)
        trans = rng.uniform(-1, 1, (n + 2, n + 2)).astype(np.float32)
        labels = rng.randint(n, size=t).astype(np.int64)
        model, loss = build(pred, labels, trans)
        workspace.RunNetOnce(model.param_init_net)
        workspace.RunNetOnce(model.net)
        np.testing.assert_allclose(workspace.FetchBlob(str(loss)), brute_force_loss(pred, labels, trans),
                                   rtol=1e-4, atol=1e-4)


def test_gradients_match_finite_differences_of_the_reference():
    rng = np.random.RandomState(5)
    t, n = 3, 2
    pred = rng.randn(t, n).astype(np.float32)
    trans = rng.uniform(-1, 1, (n + 2, n + 2)).astype(np.float32)
    labels = np.array([1, 0, 1], np.int64)
    model, loss = build(pred, labels, trans)
    grads = model.net.AddGradientOperators([loss])
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    eps = 1e-3
    for name, value in (("pred", pred), ("transitions", trans)):
        got = workspace.FetchBlob(str(grads[name]))
        want = np.zeros(value.shape)
        for idx in np.ndindex(value.shape):
            up, down = value.astype(np.float64), value.astype(np.float64)
            up[idx] += eps
            down[idx] -= eps
            args = dict(pred=pred, labels=labels, trans=trans)
            args["pred" if name == "pred" else "trans"] = up
            hi = brute_force_loss(**args)
            args["pred" if name == "pred" else "trans"] = down
            want[idx] = (hi - brute_force_loss(**args)) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)


def test_the_reference_catches_a_wrong_loss():
    pred = np.array([[0.5, -0.2]], np.float32)
    trans = np.zeros((4, 4), np.float32)
    right = brute_force_loss(pred, [0], trans)
    assert abs(right - brute_force_loss(pred, [1], trans)) > 0.1      # the labelled path matters
    # hand value: with zero transitions, one step: logsumexp(0.5, -0.2) - 0.5 (impossible tags add ~exp(-1000))
    assert np.isclose(right, np.log(np.exp(0.5) + np.exp(-0.2)) - 0.5, atol=1e-6)
