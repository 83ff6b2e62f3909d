"""HSoftmax and HSoftmaxGradient (stepnet/ops/hsm.py) against a float64 loop reference written from Caffe2's
definition (each node on the label's path: FC, softmax, -log of the target's probability; the FC outputs and
softmaxes laid out row after row, node after node), a hand-computed case, the gradient op against float64
central differences of the forward op, its intermediate gradient against the softmax's Jacobian, the maker's
wiring, bad hierarchies and inputs refused with one line each, and broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from stepnet.core.limits import Limits
from stepnet.hsm_pb2 import HierarchyProto
from stepnet.ops import hsm
from stepnet.passes.gradients import backward_ops
from stepnet.runtime.workspace import Workspace
from stepnet.testing import DEVICES, infer_static, make_op, run_op

RNG = np.random.default_rng(25)

# The tree  root(0: A, B, word 5)  A(3: words 0 1 2)  B(6: C, word 3)  C(8: words 4 6): each node's first row
# in W (its offset) and its width; a word's path lists (index, length, target) from the root, children first.
PATHS = {5: [(0, 3, 2)], 0: [(0, 3, 0), (3, 3, 0)], 1: [(0, 3, 0), (3, 3, 1)], 2: [(0, 3, 0), (3, 3, 2)],
         3: [(0, 3, 1), (6, 2, 1)], 4: [(0, 3, 1), (6, 2, 0), (8, 2, 0)], 6: [(0, 3, 1), (6, 2, 0), (8, 2, 1)]}
SIZE = 10


def hierarchy(paths=PATHS, size=SIZE) -> bytes:
    h = HierarchyProto()
    if size is not None:
        h.size = size
    for word, nodes in paths.items():
        p = h.paths.add()
        p.word_id = word
        for index, length, target in nodes:
            n = p.path_nodes.add()
            n.index, n.length, n.target = index, length, target
    return h.SerializeToString()


HIER = hierarchy()


def ref_hsoftmax(x, w, b, labels, paths=PATHS):
    """Y and intermediate_output in float64, one row and one node at a time."""
    x2 = np.asarray(x, np.float64).reshape(len(labels), -1)
    y, inter = np.zeros(len(labels)), []
    for i, label in enumerate(labels.tolist()):
        for index, length, target in paths[label]:
            z = [sum(float(w[index + r, c]) * x2[i, c] for c in range(x2.shape[1])) + float(b[index + r])
                 for r in range(length)]
            e = [math.exp(v - max(z)) for v in z]
            p = [v / sum(e) for v in e]
            inter += z + p
            y[i] -= math.log(max(p[target], 1e-20))
    return y, np.array(inter)


def data(m=4, k=3, dtype=np.float32, labels=(0, 4, 5, 3)):
    return (RNG.standard_normal((m, k)).astype(dtype), RNG.standard_normal((SIZE, k)).astype(dtype),
            RNG.standard_normal(SIZE).astype(dtype), np.array(labels, np.int32))


def expected(x, w, b, labels):
    y, inter = ref_hsoftmax(x, w, b, labels)
    return [y.astype(x.dtype), inter.astype(x.dtype)]


X, W, B, LABELS = data()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["float32", "float64", "every_word", "one_row_1d", "int64_labels"])
def test_hsoftmax_matches_the_reference(case, device):
    x, w, b, labels = {
        "float32": (X, W, B, LABELS),
        "float64": data(dtype=np.float64),
        "every_word": data(7, 2, labels=(6, 5, 4, 3, 2, 1, 0)),
        "one_row_1d": (X[0], W, B, LABELS[:1]),
        "int64_labels": (X, W, B, LABELS.astype(np.int64)),
    }[case]
    check("HSoftmax", [x, w, b, labels], {"hierarchy": HIER}, expected(x, w, b, labels), device,
          tol=1e-5 if x.dtype == np.float32 else 1e-12)


def test_a_hand_computed_case():
    # word 5 under the root only: X = 0, so the FC gives b's rows 0..2 = (0, 0, ln 2): p = (1/4, 1/4, 1/2)
    b = np.zeros(SIZE, np.float32)
    b[2] = math.log(2)
    y, inter = run_op("HSoftmax", [np.zeros((1, 2), np.float32), np.ones((SIZE, 2), np.float32), b,
                                   np.array([5], np.int32)], 2, hierarchy=HIER)
    np.testing.assert_allclose(y, [math.log(2)], rtol=1e-6)
    np.testing.assert_allclose(inter, [0, 0, math.log(2), 0.25, 0.25, 0.5], rtol=1e-6)


def test_the_intermediate_size_is_inferred_from_known_labels():
    y, inter = infer_static("HSoftmax", [X, W, B, LABELS], 2, hierarchy=HIER)
    assert y.shape == (4,) and inter.shape == (2 * ((3 + 3) + (3 + 2 + 2) + 3 + (3 + 2)),)   # words 0, 4, 5, 3


# --------------------------------------------------------------------------------------------- gradient
def fd_check(x, w, b, labels, eps=1e-6, tol=1e-6):
    """HSoftmaxGradient's dX, dW, db against central differences of L = sum(dY * Y) through HSoftmax (float64)."""
    x, w, b = (a.astype(np.float64) for a in (x, w, b))
    dy = RNG.standard_normal(len(labels))
    y, inter = run_op("HSoftmax", [x, w, b, labels], 2, hierarchy=HIER)
    grads = run_op("HSoftmaxGradient", [x, w, b, labels, inter, dy], 4, hierarchy=HIER)
    inputs = [x, w, b]
    for i, analytic in enumerate(grads[:3]):
        assert analytic.shape == inputs[i].shape
        for at in np.ndindex(*inputs[i].shape):
            moved = []
            for step in (eps, -eps):
                vals = [a.copy() for a in inputs]
                vals[i][at] += step
                moved.append(float(dy @ run_op("HSoftmax", [*vals, labels], 2, hierarchy=HIER)[0]))
            numeric = (moved[0] - moved[1]) / (2 * eps)
            assert abs(numeric - analytic[at]) <= tol * (1 + abs(numeric)), \
                f"input {i} at {at}: analytic {analytic[at]:.8g}, finite differences {numeric:.8g}"
    return dy, inter, grads


def test_the_gradient_matches_finite_differences():
    fd_check(*data(3, 2, labels=(4, 0, 4)))


def test_the_intermediate_gradient_is_the_losss_and_the_softmaxs():
    x, w, b, labels = data(2, 3, np.float64, labels=(6, 2))
    dy, inter, grads = fd_check(x, w, b, labels)
    want, at = [], 0
    for i, label in enumerate(labels.tolist()):
        for _, length, target in PATHS[label]:
            p = inter[at + length:at + 2 * length]
            d_p = np.zeros(length)
            d_p[target] = -dy[i] / p[target]                 # d(-dy log p_t)/dp
            jacobian = np.diag(p) - np.outer(p, p)           # dp/dz of the softmax
            want += list(jacobian.T @ d_p) + list(d_p)
            at += 2 * length
    np.testing.assert_allclose(grads[3], want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES[1:])
def test_the_gradient_on_a_device_gives_the_cpus_values(device):
    _, inter = run_op("HSoftmax", [X, W, B, LABELS], 2, hierarchy=HIER)
    inputs = [X, W, B, LABELS, inter, RNG.standard_normal(4).astype(np.float32)]
    for got, want in zip(run_op("HSoftmaxGradient", inputs, 4, device=device, hierarchy=HIER),
                         run_op("HSoftmaxGradient", inputs, 4, hierarchy=HIER), strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_maker_wires_both_output_gradients_as_caffe2_does():
    opdef = make_op("HSoftmax", ["x", "w", "b", "l"], ["y", "inter"], hierarchy=HIER)
    ops, grads = backward_ops([opdef], {"y": "y_grad", "inter": "inter_grad"})
    (g,) = ops
    assert g.type == "HSoftmaxGradient"
    assert list(g.input) == ["x", "w", "b", "l", "inter", "y_grad"]
    assert list(g.output) == ["x_grad", "w_grad", "b_grad", "inter_grad"]
    assert [a.name for a in g.arg] == ["hierarchy"]
    assert grads["x"] == "x_grad" and grads["w"] == "w_grad" and grads["b"] == "b_grad" and grads.get("l") is None
    with pytest.raises(GradientError, match="needs a dense gradient of output 1 .'inter'."):
        backward_ops([opdef], {"y": "y_grad"})            # Caffe2's GO(1) is required too


def test_the_checker_catches_a_broken_gradient(broken):
    kernel = hsm.h_softmax_gradient

    def dx_one_percent_off(xp, x, w, b, labels, inter, dy, *, hierarchy):
        dx, dw, db, dp = kernel(xp, x, w, b, labels, inter, dy, hierarchy=hierarchy)
        return dx * 1.01, dw, db, dp
    broken("HSoftmaxGradient", dx_one_percent_off)
    with pytest.raises(AssertionError, match="input 0"):
        fd_check(*data(2, 2, labels=(1, 3)))


def test_the_reference_catches_a_broken_forward(broken):
    kernel = hsm.h_softmax

    def y_a_little_off(xp, x, w, b, labels, *, hierarchy):
        y, inter = kernel(xp, x, w, b, labels, hierarchy=hierarchy)
        return y * 0.999, inter
    broken("HSoftmax", y_a_little_off)
    with pytest.raises(AssertionError, match="HSoftmax output 0"):
        check("HSoftmax", [X, W, B, LABELS], {"hierarchy": HIER}, expected(X, W, B, LABELS), "cpu", tol=1e-5)


# --------------------------------------------------------------------------------------------- bad input
BAD_HIERARCHIES = [
    (b"\xff\xff\xff", "not a serialized HierarchyProto"),
    (hierarchy({3: [(0, 2, 0)], -1: [(0, 2, 1)]}), "word id -1; word ids must be >= 0"),
    (hierarchy({3: [(0, 2, 0)], 4: []}), "the path of word 4 has no nodes"),
    (hierarchy({3: [(0, 2, 2)]}), "index 0, length 2, target 2; each node needs"),
    (hierarchy({3: [(0, 0, 0)]}), "length 0"),
    (hierarchy({3: [(-2, 2, 0)]}), "index -2"),
    (hierarchy({3: [(0, 2, 0), (2, 2, 0), (0, 2, 1)]}, None), "comes back to the node at index 0 .a cycle."),
    (hierarchy({3: [(0, 2, 0)], 4: [(2, 2, 0)]}, None), "starts at index 2, not at the root's index 0"),
    (hierarchy({3: [(0, 2, 0)], 4: [(0, 2, 0)]}), "child 0 of the node at index 0 leads to word 3 and"),
    (hierarchy({3: [(0, 2, 0)], 4: [(0, 3, 1)]}, None), "two lengths .2 and 3."),
    (hierarchy({3: [(0, 2, 0), (2, 2, 0)], 4: [(0, 2, 1), (4, 2, 0), (2, 2, 1)]}, None),
     "the node at index 2 is reached from two places"),
    (hierarchy({3: [(0, 2, 0), (8, 4, 0)]}, 10), "past the hierarchy's size 10"),
]


@pytest.mark.parametrize("raw, message", BAD_HIERARCHIES)
def test_bad_hierarchies_are_refused(raw, message):
    with pytest.raises(ArgumentError, match=f"argument 'hierarchy': .*{message}"):
        run_op("HSoftmax", [X[:1], W, B, np.array([3], np.int32)], 2, hierarchy=raw)


def test_a_path_without_word_id_is_refused():
    h = HierarchyProto()
    h.paths.add().path_nodes.add(index=0, length=2, target=0)
    with pytest.raises(ArgumentError, match="path 0 has no word_id"):
        run_op("HSoftmax", [X[:1], W, B, np.array([0], np.int32)], 2, hierarchy=h.SerializeToString())


@pytest.mark.parametrize("inputs, error, message", [
    ([X, W, B, np.array([0, 4, 7, 3], np.int32)], ShapeError, r"labels\[2\] = 7 is not a word of the hierarchy"),
    ([X, W[:8], B[:8], LABELS], ShapeError, "node at index 8 spans rows 8..9 of W, which has 8 rows"),
    ([X, W[:, :2], B, LABELS], ShapeError, r"W \(10, 2\) must be N x 3"),
    ([X, W, B[:9], LABELS], ShapeError, r"b \(9,\) must be 1-D"),
    ([X, W, B, LABELS[:3]], ShapeError, r"labels \(3,\) must hold one word id per row of X \(4,\)"),
    ([X, W, B, LABELS.astype(np.float32)], DTypeError, "labels must hold integers"),
    ([X.astype(np.float64), W, B, LABELS], DTypeError, "one dtype"),
    ([np.float32(1), W, B, LABELS], ShapeError, "X must be at least 1-D"),
])
def test_bad_inputs_are_refused(inputs, error, message):
    with pytest.raises(error, match=message):
        run_op("HSoftmax", inputs, 2, hierarchy=HIER)


def test_the_gradient_refuses_an_intermediate_of_other_labels():
    _, inter = run_op("HSoftmax", [X, W, B, LABELS], 2, hierarchy=HIER)
    with pytest.raises(ShapeError, match=r"intermediate_output \(41,\) must be \(42,\)"):
        run_op("HSoftmaxGradient", [X, W, B, LABELS, inter[:-1], np.ones(4, np.float32)], 4, hierarchy=HIER)
    with pytest.raises(ShapeError, match="dY"):
        run_op("HSoftmaxGradient", [X, W, B, LABELS, inter, np.ones(3, np.float32)], 4, hierarchy=HIER)


def test_an_intermediate_output_over_the_blob_limit_is_refused_before_the_kernel():
    # 1000 rows of word 4 ask for 1000 * 2 * (3 + 2 + 2) floats (56 kB) from a 40-byte hierarchy
    ws = Workspace(limits=Limits(max_blob_bytes=50_000))
    x = np.zeros((1000, 3), np.float32)
    with pytest.raises(Exception, match="max_blob_bytes"):
        run_op("HSoftmax", [x, W, B, np.full(1000, 4, np.int32)], 2, ws=ws, hierarchy=HIER)
