"""Gradients of the lengths and segment operators (their makers and kernels are in stepnet/ops/segment_grad.py):
float64 finite differences on every device (sparse gradients densified), the ops and GradientSlices Caffe2's
makers give, the gradient kernels (the later IndicesInGradient forms and the older ones) against loop
references, bad inputs, and broken gradient kernels caught."""
import numpy as np
import pytest
from sparse_grad_data import f32, f64, i32

from stepnet.core.errors import ShapeError
from stepnet.passes.gradients import GradientSlice, backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# ----------------------------------------------------------------------------------------- finite differences
IDX = i32(0, 2, 2, 4, 1, 0)          # repeats, and rows of DATA (5 rows) never picked
LENS = i32(2, 0, 3, 1)               # an empty segment
CASES = [   # (op, inputs, args, wrt)
    ("LengthsSum", [f64(6, 2), LENS], {}, None),
    ("LengthsMean", [f64(6, 2), LENS], {}, None),
    ("LengthsMax", [f64(6, 2), LENS], {}, None),
    ("LengthsSum", [f64(6), LENS], {}, None),
    ("SparseLengthsSum", [f64(5, 2), IDX, LENS], {}, None),
    ("SparseLengthsMean", [f64(5, 2), IDX, LENS], {}, None),
    ("SparseLengthsWeightedSum", [f64(5, 2), f64(6), IDX, LENS], {}, [0]),
    ("SparseLengthsWeightedSum", [f64(5, 2), f64(6), IDX, LENS], {"grad_on_weights": 1}, None),
    ("SparseLengthsSum", [f64(4, 2, 2), i32(3, 3, 0), i32(1, 2)], {}, None),
    ("LengthsTile", [f64(3, 2), i32(2, 0, 3)], {}, None),
    ("SparseToDense", [i32(0, 2, 2), f64(3, 2), f64(4, 1)], {}, [1]),
    ("SparseToDense", [i32(4, 1), f64(2)], {"output_first_dim": 6}, [1]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, wrt", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradients_match_finite_differences(op_type, inputs, args, wrt, device):
    check_gradient(op_type, inputs, wrt=wrt, device=device, **args)


# ------------------------------------------------------------------------------------------- emitted ops
@pytest.mark.parametrize("op_type, inputs, args, want, slice_", [
    ("LengthsSum", ["d", "len"], {}, [("LengthsIndicesInGradientSumGradient", ["y_grad", "len", "d"],
                                       ["d_grad"], {})], None),
    ("LengthsMean", ["d", "len"], {}, [("LengthsIndicesInGradientMeanGradient", ["y_grad", "len", "d"],
                                        ["d_grad"], {})], None),
    ("LengthsMax", ["d", "len"], {}, [("LengthsMaxWithMainInputAndForwardOutputGradient",
                                       ["y", "y_grad", "len", "d"], ["d_grad"], {})], None),
    ("SparseLengthsSum", ["d", "i", "len"], {}, [("SparseLengthsIndicesInGradientSumGradient",
                                                  ["y_grad", "len", "i"], ["d_grad_values"], {})],
     GradientSlice("i", "d_grad_values")),
    ("SparseLengthsMean", ["d", "i", "len"], {}, [("SparseLengthsIndicesInGradientMeanGradient",
                                                   ["y_grad", "len", "i"], ["d_grad_values"], {})],
     GradientSlice("i", "d_grad_values")),
    ("SparseLengthsWeightedSum", ["d", "w", "i", "len"], {},
     [("SparseLengthsIndicesInGradientWeightedSumGradient", ["w", "y_grad", "len", "i"], ["d_grad_values"],
       {})],
     GradientSlice("i", "d_grad_values")),
    ("SparseLengthsWeightedSum", ["d", "w", "i", "len"], {"grad_on_weights": 1},
     [("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient", ["w", "y_grad", "len", "d", "i"],
       ["d_grad_values", "w_grad"], {"grad_on_weights": 1})], GradientSlice("i", "d_grad_values")),
    ("LengthsTile", ["d", "len"], {}, [("LengthsSum", ["y_grad", "len"], ["d_grad"], {})], None),
])
def test_segment_makers_emit_caffe2s_ops(op_type, inputs, args, want, slice_):
    ops, grads = backward_ops([make_op(op_type, inputs, ["y"], **args)], {"y": "y_grad"})
    assert sig(ops) == want
    assert grads["d"] == (slice_ or "d_grad")
    assert ("w_grad" in grads.values()) == bool(args.get("grad_on_weights"))


def test_sparse_to_dense_gradient_is_a_gather_of_dy():
    ops, grads = backward_ops([make_op("SparseToDense", ["i", "v", "like"], ["y"])], {"y": "y_grad"})
    assert sig(ops) == [("Gather", ["y_grad", "i"], ["v_grad"], {})]
    assert grads["v"] == "v_grad" and "like" not in grads


# --------------------------------------------------------------------------------------- gradient kernels
def segments_of(lens):
    return [s for s, n in enumerate(lens) for _ in range(n)]


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_gradient_kernels_against_loops(device):
    lens = [2, 0, 3, 1]
    go = f32(4, 2)
    seg = segments_of(lens)
    sums = np.stack([go[s] for s in seg])
    means = np.stack([go[s] / lens[s] for s in seg])
    for name, want, extra in (("LengthsSumGradient", sums, []), ("LengthsMeanGradient", means, []),
                              ("LengthsIndicesInGradientSumGradient", sums, [f32(6, 2)]),
                              ("SparseLengthsIndicesInGradientMeanGradient", means, [i32(0, 1, 2, 3, 4, 5)]),
                              ("SparseLengthsSumGradient", sums, [])):
        got = run_op(name, [go, i32(*lens), *extra], device=device)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
    weights = f32(6)
    got = run_op("SparseLengthsIndicesInGradientWeightedSumGradient",
                 [weights, go, i32(*lens), i32(*range(6))], device=device)
    np.testing.assert_allclose(got, np.stack([weights[k] * go[s] for k, s in enumerate(seg)]), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sum_with_main_input_gives_the_weights_gradient(device):
    data, weights, idx, lens = f32(5, 3), f32(4), i32(4, 0, 4, 2), [3, 1]
    go = f32(2, 3)
    values, dw = run_op("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
                        [weights, go, i32(*lens), data, idx], outputs=2, device=device)
    seg = segments_of(lens)
    np.testing.assert_allclose(values, np.stack([weights[k] * go[s] for k, s in enumerate(seg)]), rtol=1e-6)
    np.testing.assert_allclose(dw, [float(np.dot(go[s], data[idx[k]])) for k, s in enumerate(seg)], rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_max_gradient_gives_every_tied_element_the_gradient(device):
    data = np.array([[1, 5], [3, 5], [3, 0], [2, 2]], dtype=np.float32)   # ties in both segments
    lens = i32(3, 1)
    y = run_op("LengthsMax", [data, lens], device=device)
    go = f32(2, 2)
    got = run_op("LengthsMaxWithMainInputAndForwardOutputGradient", [y, go, lens, data], device=device)
    want = np.zeros_like(data)
    for k, s in enumerate(segments_of([3, 1])):
        for j in range(2):
            want[k, j] = go[s, j] if data[k, j] == y[s, j] else 0.0
    np.testing.assert_array_equal(got, want)
    assert got[1, 0] == got[2, 0] == go[0, 0] and got[0, 1] == got[1, 1] == go[0, 1]


def older_forms(device):
    """(name, result, loop reference) of the gradient ops older nets hold, which take no indices input:
    SparseLengthsMeanGradient([dY, LENGTHS]), SparseLengthsWeightedSumGradient([WEIGHTS, dY, LENGTHS]) and
    SparseLengthsWeightedSumWithMainInputGradient([WEIGHTS, dY, LENGTHS, DATA, INDICES])."""
    lens, go, weights = [1, 0, 3], f32(3, 2), f32(4)
    data, idx = f32(5, 2), i32(4, 0, 0, 2)
    seg = segments_of(lens)
    mean = np.array([[go[s, j] / lens[s] for j in range(2)] for s in seg])
    weighted = np.array([[weights[k] * go[s, j] for j in range(2)] for k, s in enumerate(seg)])
    d_weights = np.array([sum(go[s, j] * data[idx[k], j] for j in range(2)) for k, s in enumerate(seg)])
    values, dw = run_op("SparseLengthsWeightedSumWithMainInputGradient", [weights, go, i32(*lens), data, idx],
                        outputs=2, device=device)
    return [("SparseLengthsMeanGradient", run_op("SparseLengthsMeanGradient", [go, i32(*lens)], device=device),
             mean),
            ("SparseLengthsWeightedSumGradient",
             run_op("SparseLengthsWeightedSumGradient", [weights, go, i32(*lens)], device=device), weighted),
            ("SparseLengthsWeightedSumWithMainInputGradient values", values, weighted),
            ("SparseLengthsWeightedSumWithMainInputGradient dWEIGHTS", dw, d_weights)]


def check_older_forms(device):
    for name, got, want in older_forms(device):
        assert got.dtype == np.float32 and got.shape == want.shape, f"{name}: {got.dtype} {got.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_the_older_gradient_forms_against_loops(device):
    check_older_forms(device)


@pytest.mark.parametrize("op_type, inputs, args, message", [
    ("LengthsSumGradient", [np.zeros((3, 2)), i32(1, 1)], {}, "one row per segment"),
    ("SparseLengthsWeightedSumGradient", [np.zeros(3), np.zeros((2, 2)), i32(1, 1)], {}, "LENGTHS sum to 2"),
    ("LengthsMaxWithMainInputAndForwardOutputGradient",
     [np.zeros((2, 2)), np.zeros((2, 2)), i32(1, 1), np.zeros((3, 2))], {}, "LENGTHS sum to 2"),
])
def test_gradient_kernels_reject_bad_inputs(op_type, inputs, args, message):
    with pytest.raises(ShapeError, match=message):
        run_op(op_type, inputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
def test_check_gradient_catches_a_mean_gradient_that_forgets_the_length(broken):
    check_gradient("SparseLengthsMean", [f64(5, 2), IDX, LENS])
    broken("SparseLengthsIndicesInGradientMeanGradient", REGISTRY.get("SparseLengthsSumGradient").kernel)
    with pytest.raises(AssertionError, match=r"SparseLengthsMean: gradient of input 0 \(in0\) is wrong"):
        check_gradient("SparseLengthsMean", [f64(5, 2), IDX, LENS])


@pytest.mark.parametrize("op_type", ["SparseLengthsMeanGradient", "SparseLengthsWeightedSumGradient",
                                     "SparseLengthsWeightedSumWithMainInputGradient"])
def test_the_older_forms_check_catches_broken_kernels(op_type, broken):
    def ones_weights(xp, *inputs, **_):
        """The right shapes, every weight (or 1/length) taken as 1 and every dWEIGHTS as 0."""
        go, lengths = (inputs[1], inputs[2]) if "Weighted" in op_type else (inputs[0], inputs[1])
        rows = xp.take(go, xp.asarray(np.repeat(np.arange(len(lengths)), np.asarray(lengths))), axis=0)
        return (rows, xp.zeros(rows.shape[0], go.dtype)) if "MainInput" in op_type else rows
    check_older_forms("cpu")
    broken(op_type, ones_weights)
    with pytest.raises(AssertionError, match=op_type):
        check_older_forms("cpu")


def test_weighted_sum_with_main_input_gradient_of_no_indices():
    """No positions (empty INDICES and DATA): empty gradients, not a reshape error."""
    got = run_op("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
                 [np.zeros(0, np.float32), np.zeros((2, 3), np.float32), np.zeros(2, np.int32),
                  np.zeros((0, 3), np.float32), np.zeros(0, np.int64)], 2)
    assert [g.shape for g in got] == [(0, 3), (0,)]
