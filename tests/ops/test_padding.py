"""AddPadding, RemovePadding, GatherPadding and SequenceMask (stepnet/ops/padding.py) against loop references
written here (Caffe2's sequence_ops_test.py and sequence_mask tests in boolean_mask_test.py are the model) on
every device; gradients (AddPadding's through RemovePadding and GatherPadding, RemovePadding's through
AddPadding, SequenceMask's through its grad mode) against float64 finite differences and Caffe2's makers; bad
inputs; broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(53)


# --------------------------------------------------------------------------------------------- references
def ref_add(data, lengths, start=1, end=None, head=None, tail=None):
    """Each range of `lengths` rows (all rows when None) with `start` rows of head (zeros) before and `end` rows
    of tail (head) after; and the new lengths."""
    end = start if end is None else end
    lengths = [data.shape[0]] if lengths is None else list(lengths)
    block = data.shape[1:]
    head = np.zeros(block, data.dtype) if head is None else np.asarray(head).reshape(block)
    tail = head if tail is None else np.asarray(tail).reshape(block)
    rows, at = [], 0
    for n in lengths:
        rows += [head] * start + [data[at + r] for r in range(n)] + [tail] * end
        at += n
    out = np.array(rows, data.dtype).reshape((len(rows),) + block)
    return [out, np.array([n + start + end for n in lengths], np.int32)]


def ref_remove(data, lengths, start=1, end=None):
    end = start if end is None else end
    lengths = [data.shape[0]] if lengths is None else list(lengths)
    rows, at = [], 0
    for n in lengths:
        rows += [data[at + r] for r in range(start, n - end)]
        at += n
    return [np.array(rows, data.dtype).reshape((len(rows),) + data.shape[1:]),
            np.array([n - start - end for n in lengths], np.int32)]


def ref_gather(data, lengths, start=1, end=None):
    end = start if end is None else end
    heads, tails, at = np.zeros(data.shape[1:]), np.zeros(data.shape[1:]), 0
    for n in lengths:
        for r in range(start):
            heads += data[at + r]
        for r in range(n - end, n):
            tails += data[at + r]
        at += n
    return [heads.astype(data.dtype), tails.astype(data.dtype)]


def ref_mask(x, mode, per_row=None, axis=1, radius=10, batch=None, repeat_from=None, fill=-math.inf):
    """Element by element: its row i and column j in the view at `axis` (rows from `batch` + 1 on when
    batched; columns up to `repeat_from` when repeating), masked by Caffe2's functor conditions."""
    nd = x.ndim
    axis, first = axis % nd, 0 if batch is None else batch % nd + 1
    last = nd if repeat_from is None else repeat_from % nd
    out = x.copy()
    for idx in np.ndindex(*x.shape):
        i = int(np.ravel_multi_index(idx[first:axis], x.shape[first:axis])) if axis > first else 0
        j = int(np.ravel_multi_index(idx[axis:last], x.shape[axis:last])) if last > axis else 0
        if mode == "sequence":
            masked = j >= per_row[i]
        elif mode == "window":
            masked = j > per_row[i] + radius or j < per_row[i] - radius
        else:
            masked = {"upper": j > i, "lower": j < i, "upperdiag": j >= i, "lowerdiag": j <= i}[mode]
        if masked:
            out[idx] = fill
    return out


D = rng.uniform(-3, 3, (6, 2)).astype(np.float32)
LEN = np.array([2, 0, 3, 1], np.int32)
HEAD, TAIL = np.array([7.0, 8.0], np.float32), np.array([-1.0, -2.0], np.float32)
PADDED, PLEN = ref_add(D, LEN, 2, 1, HEAD, TAIL)
X = rng.uniform(-3, 3, (3, 5)).astype(np.float32)
X4 = rng.uniform(-3, 3, (2, 3, 4, 2)).astype(np.float32)
SL = np.array([2, 5, 0], np.int32)

CASES = [   # (id, op, inputs, args, expected outputs)
    ("add", "AddPadding", [D, LEN], {}, ref_add(D, LEN)),
    ("add_paddings", "AddPadding", [D, LEN, HEAD, TAIL], {"padding_width": 2, "end_padding_width": 1},
     ref_add(D, LEN, 2, 1, HEAD, TAIL)),
    ("add_one_padding", "AddPadding", [D, LEN.astype(np.int64), HEAD], {"end_padding_width": 3},
     ref_add(D, LEN, 1, 3, HEAD)),
    ("add_no_lengths", "AddPadding", [D], {"padding_width": 2}, ref_add(D, None, 2)[:1]),
    ("add_ints", "AddPadding", [np.arange(5, dtype=np.int64), np.array([4, 1], np.int32)], {},
     ref_add(np.arange(5, dtype=np.int64), [4, 1])),
    ("add_zero_width", "AddPadding", [D, LEN], {"padding_width": 0}, ref_add(D, LEN, 0)),
    ("remove", "RemovePadding", [PADDED, PLEN], {"padding_width": 2, "end_padding_width": 1}, [D, LEN]),
    ("remove_one_range", "RemovePadding", [D], {}, ref_remove(D, None)[:1]),
    ("remove_bool", "RemovePadding", [D[:, 0] > 0, np.array([3, 3], np.int32)], {},
     ref_remove(D[:, 0] > 0, [3, 3])),
    ("gather", "GatherPadding", [PADDED, PLEN], {"padding_width": 2, "end_padding_width": 1},
     ref_gather(PADDED, PLEN.tolist(), 2, 1)),
    ("seq", "SequenceMask", [X, SL], {"mode": "sequence"}, [ref_mask(X, "sequence", SL.tolist())]),
    ("seq_fill", "SequenceMask", [X4, np.array([1, 0], np.int64)], {"mode": "sequence", "axis": 1, "fill_val": 2.5},
     [ref_mask(X4, "sequence", [1, 0], fill=2.5)]),
    ("seq_axis2", "SequenceMask", [X4, np.arange(6, dtype=np.int32)], {"mode": "sequence", "axis": 2},
     [ref_mask(X4, "sequence", list(range(6)), axis=2)]),
    ("seq_batch", "SequenceMask", [X4, np.array([1, 3, 5], np.int32)], {"mode": "sequence", "axis": -2, "batch": 0},
     [ref_mask(X4, "sequence", [1, 3, 5], axis=-2, batch=0)]),
    ("seq_repeat", "SequenceMask", [X4, np.array([1, 3, 0, 4, 2, 3], np.int32)],
     {"mode": "sequence", "axis": 2, "repeat_from_axis": 3},
     [ref_mask(X4, "sequence", [1, 3, 0, 4, 2, 3], axis=2, repeat_from=3)]),
    ("seq_grad", "SequenceMask", [X, SL], {"mode": "sequence", "grad": True},
     [ref_mask(X, "sequence", SL.tolist(), fill=0.0)]),
    ("window", "SequenceMask", [X, np.array([0, 2, 4], np.int32)], {"mode": "window", "radius": 1},
     [ref_mask(X, "window", [0, 2, 4], radius=1)]),
    *[(mode, "SequenceMask", [X], {"mode": mode, "fill_val": -7.0}, [ref_mask(X, mode, fill=-7.0)])
      for mode in ("upper", "lower", "upperdiag", "lowerdiag")],
    ("upper_batch", "SequenceMask", [X4], {"mode": "upper", "axis": 2, "batch": 0},
     [ref_mask(X4, "upper", axis=2, batch=0)]),
    ("lowerdiag_axis3", "SequenceMask", [X4], {"mode": "lowerdiag", "axis": 3, "fill_val": 0.5},
     [ref_mask(X4, "lowerdiag", axis=3, fill=0.5)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_padding_with_one_output_sums_both_ends(device):
    got = run_op("GatherPadding", [PADDED, PLEN], 1, device=device, padding_width=2, end_padding_width=1)
    head, tail = ref_gather(PADDED, PLEN.tolist(), 2, 1)
    np.testing.assert_allclose(got, head + tail, rtol=1e-6)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [   # (op, inputs, outputs, args, wrt)
    ("AddPadding", [rng.standard_normal((6, 2)), LEN, rng.standard_normal(2), rng.standard_normal(2)], 2,
     {"padding_width": 2, "end_padding_width": 1}, [0, 2, 3]),
    ("AddPadding", [rng.standard_normal((6, 2)), LEN, rng.standard_normal(2)], 2, {}, [0, 2]),
    ("AddPadding", [rng.standard_normal((6, 2)), LEN], 2, {"padding_width": 3}, [0]),
    ("AddPadding", [rng.standard_normal(4)], 1, {"padding_width": 1}, [0]),
    ("RemovePadding", [rng.standard_normal((7, 3)), np.array([3, 4], np.int32)], 2, {}, [0]),
    ("RemovePadding", [rng.standard_normal(7)], 1, {"end_padding_width": 2}, [0]),
    ("SequenceMask", [rng.standard_normal((3, 5)), SL], 1, {"mode": "sequence", "fill_val": -4.0}, [0]),
    ("SequenceMask", [rng.standard_normal((2, 3, 4))], 1, {"mode": "upperdiag", "axis": 2, "batch": 0,
                                                          "fill_val": 3.0}, [0]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, outputs, args, wrt", GRADS, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients_match_finite_differences(op_type, inputs, outputs, args, wrt, device):
    check_gradient(op_type, inputs, outputs, outputs_with_grads=[0], wrt=wrt, device=device, **args)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


def test_makers_emit_caffe2s_ops():
    ops, grads = backward_ops([make_op("AddPadding", ["d", "len", "s", "e"], ["y", "ylen"], padding_width=2)],
                              {"y": "y_grad"})
    assert sig(ops) == [("RemovePadding", ["y_grad", "ylen"], ["d_grad"], {"padding_width": 2}),
                        ("GatherPadding", ["y_grad", "ylen"], ["s_grad", "e_grad"], {"padding_width": 2})]
    ops, _ = backward_ops([make_op("AddPadding", ["d"], ["y"])], {"y": "y_grad"})
    assert sig(ops) == [("RemovePadding", ["y_grad"], ["d_grad"], {})]
    ops, _ = backward_ops([make_op("RemovePadding", ["d", "len"], ["y", "ylen"], end_padding_width=0)],
                          {"y": "y_grad"})
    assert sig(ops) == [("AddPadding", ["y_grad", "ylen"], ["d_grad"], {"end_padding_width": 0})]
    ops, _ = backward_ops([make_op("SequenceMask", ["x", "len"], ["y"], mode="sequence", axis=2)], {"y": "y_grad"})
    assert sig(ops) == [("SequenceMask", ["y_grad", "len"], ["x_grad"], {"mode": "sequence", "axis": 2,
                                                                        "grad": 1})]


def test_padding_gradient_needs_the_lengths_output():
    with pytest.raises(GradientError, match="needs its lengths output"):
        backward_ops([make_op("AddPadding", ["d", "len"], ["y"])], {"y": "y_grad"})


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("AddPadding", [D, LEN[:3]], {}, ShapeError, "LENGTHS sum to 5 but DATA .* has 6 rows"),
    ("AddPadding", [D, LEN, HEAD[:1]], {}, ShapeError, r"start_padding \(1,\) must hold one row"),
    ("AddPadding", [D, LEN, HEAD.astype(np.float64)], {}, DTypeError, "start_padding has dtype float64"),
    ("AddPadding", [D, LEN], {"padding_width": -1}, ArgumentError, "padding_width must be >= 0"),
    ("RemovePadding", [D, np.array([1, 5], np.int32)], {}, ShapeError, "a range of 1 rows is shorter"),
    ("RemovePadding", [D, np.array([4, 1], np.int32)], {}, ShapeError, "LENGTHS sum to 5"),
    ("GatherPadding", [D > 0, np.array([3, 3], np.int32)], {}, DTypeError, "bool"),
    ("SequenceMask", [X], {"mode": "sequence"}, ArgumentError, "needs input 1"),
    ("SequenceMask", [X], {"mode": "diagonal"}, ArgumentError, "unsupported mode 'diagonal'"),
    ("SequenceMask", [X, SL[:2]], {"mode": "sequence"}, ShapeError, "2 entries but the input .* has 3 rows"),
    ("SequenceMask", [X4], {"mode": "upper", "axis": 1, "batch": 2}, ArgumentError, "must be an axis before"),
    ("SequenceMask", [X4, SL], {"mode": "window", "repeat_from_axis": 3}, ArgumentError, "needs mode 'sequence'"),
    ("SequenceMask", [X4.astype(np.int32)], {"mode": "upper"}, DTypeError, "floating-point"),
    ("SequenceMask", [X, SL.astype(np.float32)], {"mode": "window"}, DTypeError, "window centers must be int32"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, **args)


def test_sequence_mask_needs_its_mode():
    with pytest.raises(ArgumentError, match="required argument 'mode' is missing"):
        run_op("SequenceMask", [X])


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [   # wrong(good kernel, xp, *inputs, **args)
    ("add_paddings", lambda good, xp, d, *rest, **a: good(xp, d, *rest[:2], **a)),      # end padding ignored
    ("remove", lambda good, xp, d, lens, **a: good(xp, d, lens, **{**a, "end_padding_width": -1})),
    ("upper", lambda good, xp, x, **a: good(xp, x, **{**a, "mode": "upperdiag"})),
    ("seq_batch", lambda good, xp, x, *r, **a: good(xp, x, *r, **{**a, "batch": None, "axis": 3})),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    good = REGISTRY.get(op_type).kernel
    broken(op_type, lambda *a, **kw: wrong(good, *a, **kw))
    with pytest.raises((AssertionError, ShapeError)):
        check(op_type, inputs, args, want, "cpu", 0.0)


def test_check_gradient_catches_a_broken_gather_padding(broken):
    inputs = [rng.standard_normal((6, 2)), LEN, rng.standard_normal(2), rng.standard_normal(2)]
    check_gradient("AddPadding", inputs, 2, outputs_with_grads=[0], wrt=[2, 3])
    good = REGISTRY.get("GatherPadding").kernel
    broken("GatherPadding", lambda ctx, xp, d, lens, **a: good(ctx, xp, d, lens, **a)[::-1])   # ends swapped
    with pytest.raises(AssertionError, match="gradient of input 2"):
        check_gradient("AddPadding", inputs, 2, outputs_with_grads=[0], wrt=[2, 3])


# --------------------------------------------------------------------------------------------- fixed cases
def test_add_padding_without_lengths_returns_the_one_ranges_length():
    """With no LENGTHS and two outputs, the second is int32 [N + both widths] (Caffe2's), not a row of the
    padded data (the kernel once returned only the data, which the executor split over the two outputs)."""
    out, lens = run_op("AddPadding", [np.array([0.0], np.float32)], 2, padding_width=1, end_padding_width=0)
    assert out.tolist() == [0.0, 0.0] and out.dtype == np.float32
    assert lens.tolist() == [2] and lens.dtype == np.int32 and lens.shape == (1,)
    data = rng.standard_normal((3, 2)).astype(np.float32)
    check("AddPadding", [data], {"padding_width": 2, "end_padding_width": 1}, list(ref_add(data, None, 2, 1)), "cpu")


def test_remove_padding_without_lengths_returns_the_one_ranges_length():
    """RemovePadding likewise: with no LENGTHS and two outputs, int32 [N - both widths] (Caffe2's CRF asks for it)."""
    data = np.arange(10, dtype=np.float32).reshape(5, 2)
    out, lens = run_op("RemovePadding", [data], 2, padding_width=1, end_padding_width=2)
    np.testing.assert_array_equal(out, data[1:3])
    assert lens.tolist() == [2] and lens.dtype == np.int32 and lens.shape == (1,)


def ref_pad_empty(lengths, *features):
    """Lengths with 0 made 1; each feature with a zero row where each empty run was."""
    outs = [np.array([max(n, 1) for n in lengths], np.int32)]
    for f in features:
        rows, at = [], 0
        for n in lengths:
            rows += [f[at + j] for j in range(n)] if n else [np.zeros(f.shape[1:], f.dtype)]
            at += n
        outs.append(np.array(rows, f.dtype).reshape((len(rows),) + f.shape[1:]))
    return outs


PAD_LENS = np.array([0, 2, 0, 1], np.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_pad_empty_samples(device):
    f1, f2 = np.arange(3, dtype=np.int64), rng.standard_normal((3, 2)).astype(np.float32)
    check("PadEmptySamples", [PAD_LENS, f1, f2], {}, ref_pad_empty(PAD_LENS.tolist(), f1, f2), device)
    check("PadEmptySamples", [PAD_LENS, f1], {}, [np.array([1, 2, 1, 1], np.int32), np.array([0, 0, 1, 0, 2])],
          device)
    assert infer_alone("PadEmptySamples", [PAD_LENS, f2], 2)["out1"].shape == (5, 2)


def test_pad_empty_samples_bad_inputs(broken):
    with pytest.raises(ShapeError, match="has 2 rows but lengths sum to 3"):
        run_op("PadEmptySamples", [PAD_LENS, np.zeros(2)], 2)
    with pytest.raises(ShapeError, match="one output per input"):
        run_op("PadEmptySamples", [PAD_LENS, np.zeros(3)], 1)
    broken("PadEmptySamples", lambda ctx, xp, lens, f: (xp.maximum(lens, 1).astype(np.int32), f))   # no zero rows
    with pytest.raises(AssertionError):
        check("PadEmptySamples", [PAD_LENS, np.ones(3)], {}, ref_pad_empty(PAD_LENS.tolist(), np.ones(3)), "cpu")
