"""PackSegments / UnpackSegments, PackRNNSequence / UnpackRNNSequence, ReversePackedSegs and
VariableLengthSequencePadding (stepnet/ops/packing.py) against loop references written here (Caffe2's
pack_ops_test.py and pack_rnn_sequence_op_test.py references loop the same way) on every device; the packed sizes
follow the lengths' values (unknown statically unless known); gradients against float64 finite differences and the
ops Caffe2's makers emit; bad inputs; broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef, argument_value
from stepnet.core.spec import TensorSpec
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(47)


# --------------------------------------------------------------------------------------------- references
def ref_pack(lengths, data, max_length=-1, pad=0.0):
    t = max(lengths, default=0) if max_length == -1 else max_length
    out = np.full((len(lengths), t) + data.shape[1:], pad, dtype=data.dtype)
    mask = np.zeros((len(lengths), t), bool)
    start = 0
    for b, n in enumerate(lengths):
        for r in range(min(n, t)):
            out[b, r] = data[start + r]
            mask[b, r] = True
        start += n
    return out, mask


def ref_unpack(lengths, packed, max_length=-1):
    rows = [packed[b, r] for b, n in enumerate(lengths) for r in range(n if max_length == -1 else min(n, max_length))]
    return np.array(rows, packed.dtype).reshape((len(rows),) + packed.shape[2:])


def ref_pack_rnn(values, lengths):
    t = max(lengths, default=0)
    out = np.zeros((t, len(lengths)) + values.shape[1:], values.dtype)
    start = 0
    for c, n in enumerate(lengths):
        for r in range(n):
            out[r, c] = values[start + r]
        start += n
    return out


def ref_unpack_rnn(packed, lengths):
    rows = [packed[r, c] for c, n in enumerate(lengths) for r in range(n)]
    return np.array(rows, packed.dtype).reshape((len(rows),) + packed.shape[2:])


def ref_reverse(data, lengths):
    out = data.copy()
    for b, n in enumerate(lengths):
        for t in range(n):
            out[t, b] = data[n - 1 - t, b]
    return out


def ref_padding(data, lengths):
    """Caffe2's kernel (variable_length_sequence_padding.h): for each sequence j, every step i from its length to
    N set to 0, over the flat N x B x M layout."""
    n, b = data.shape[:2]
    m = int(np.prod(data.shape[2:], dtype=np.int64))
    flat = data.reshape(-1).copy()
    for j in range(b):
        for i in range(lengths[j], n):
            flat[b * m * i + m * j:b * m * i + m * j + m] = 0
    return flat.reshape(data.shape)


L = [2, 0, 3, 1]
LEN = np.array(L, np.int32)
DATA = rng.uniform(-3, 3, (6, 2, 2)).astype(np.float32)
PACKED = ref_pack(L, DATA)[0]
INTS = np.arange(6, dtype=np.int64)
SEQ = rng.uniform(-3, 3, (4, 3, 2)).astype(np.float32)
SEQ_LEN = np.array([2, 4, 0], np.int64)

CASES = [   # (id, op, inputs, args, expected outputs)
    ("pack", "PackSegments", [LEN, DATA], {}, ref_pack(L, DATA)[:1]),
    ("pack_mask", "PackSegments", [LEN, DATA], {"return_presence_mask": True}, list(ref_pack(L, DATA))),
    ("pack_minf", "PackSegments", [LEN.astype(np.int64), DATA], {"pad_minf": True}, ref_pack(L, DATA, pad=-np.inf)[:1]),
    ("pack_minf_ints", "PackSegments", [LEN, INTS], {"pad_minf": True}, ref_pack(L, INTS)[:1]),
    ("pack_cut", "PackSegments", [LEN, DATA], {"max_length": 2, "return_presence_mask": 1},
     list(ref_pack(L, DATA, 2))),
    ("pack_longer", "PackSegments", [LEN, DATA], {"max_length": 5}, ref_pack(L, DATA, 5)[:1]),
    ("pack_bool", "PackSegments", [LEN, DATA[:, 0, 0] > 0], {}, ref_pack(L, DATA[:, 0, 0] > 0)[:1]),
    ("pack_all_empty", "PackSegments", [np.zeros(3, np.int32), DATA[:0]], {"max_length": 2, "return_presence_mask": 1},
     list(ref_pack([0, 0, 0], DATA[:0], 2))),
    ("unpack", "UnpackSegments", [LEN, PACKED], {}, [ref_unpack(L, PACKED)]),
    ("unpack_cut", "UnpackSegments", [LEN, PACKED[:, :2]], {"max_length": 2}, [ref_unpack(L, PACKED[:, :2], 2)]),
    ("unpack_padded_wider", "UnpackSegments", [LEN, ref_pack(L, DATA, 5)[0]], {}, [DATA]),
    ("pack_rnn", "PackRNNSequence", [DATA, LEN], {}, [ref_pack_rnn(DATA, L)]),
    ("pack_rnn_ints", "PackRNNSequence", [INTS.reshape(6, 1), LEN], {}, [ref_pack_rnn(INTS.reshape(6, 1), L)]),
    ("unpack_rnn", "UnpackRNNSequence", [ref_pack_rnn(DATA, L), LEN], {}, [DATA]),
    ("unpack_rnn_longer", "UnpackRNNSequence", [SEQ, np.array([1, 3, 2], np.int32)], {},
     [ref_unpack_rnn(SEQ, [1, 3, 2])]),
    ("reverse", "ReversePackedSegs", [SEQ, SEQ_LEN], {}, [ref_reverse(SEQ, SEQ_LEN.tolist())]),
    ("reverse_ints", "ReversePackedSegs", [np.arange(24).reshape(4, 3, 2), np.array([3, 1, 4], np.int32)], {},
     [ref_reverse(np.arange(24).reshape(4, 3, 2), [3, 1, 4])]),
    ("padding", "VariableLengthSequencePadding", [SEQ, SEQ_LEN], {}, [ref_padding(SEQ, SEQ_LEN.tolist())]),
    ("padding_4d_past_t", "VariableLengthSequencePadding",
     [SEQ.reshape(4, 3, 2, 1).astype(np.float64), np.array([1, 9, 3], np.int32)], {},
     [ref_padding(SEQ.reshape(4, 3, 2, 1).astype(np.float64), [1, 9, 3])]),
    ("padding_2d_nan", "VariableLengthSequencePadding", [np.full((3, 2), np.nan, np.float32),
                                                         np.array([0, 2], np.int32)], {},
     [ref_padding(np.full((3, 2), np.nan, np.float32), [0, 2])]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_round_trips(device):
    packed = run_op("PackSegments", [LEN, DATA], device=device)
    np.testing.assert_array_equal(run_op("UnpackSegments", [LEN, packed], device=device), DATA)
    rnn = run_op("PackRNNSequence", [DATA, LEN], device=device)
    np.testing.assert_array_equal(run_op("UnpackRNNSequence", [rnn, LEN], device=device), DATA)
    twice = run_op("ReversePackedSegs", [run_op("ReversePackedSegs", [SEQ, SEQ_LEN], device=device), SEQ_LEN],
                   device=device)
    np.testing.assert_array_equal(twice, SEQ)


def test_packed_sizes_follow_the_lengths_values():
    net = NetDef(name="p")
    net.op.append(make_op("PackSegments", ["len", "d"], ["p", "m"], return_presence_mask=True))
    net.op.append(make_op("PackRNNSequence", ["d", "len"], ["r"]))
    d = TensorSpec((6, 2), np.dtype(np.float32))
    unknown = infer_net(net, {"len": TensorSpec((4,), np.dtype(np.int32)), "d": d})
    assert unknown["p"].shape is None and unknown["m"].dtype == np.bool_ and unknown["r"].shape is None
    known = infer_net(net, {"len": TensorSpec.of(LEN), "d": d})
    assert (known["p"].shape, known["m"].shape, known["r"].shape) == ((4, 3, 2), (4, 3), (3, 4, 2))
    cut = make_op("PackSegments", ["len", "d"], ["p"], max_length=5)
    net2 = NetDef(name="q")
    net2.op.append(cut)
    assert infer_net(net2, {"len": TensorSpec((4,), np.dtype(np.int32)), "d": d})["p"].shape == (4, 5, 2)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [   # (op, inputs, args, wrt)
    ("PackSegments", [LEN, rng.standard_normal((6, 2))], {}, [1]),
    ("PackSegments", [LEN, rng.standard_normal(6)], {"pad_minf": False, "max_length": 4}, [1]),
    ("UnpackSegments", [LEN, rng.standard_normal((4, 3, 2))], {}, [1]),
    ("UnpackSegments", [LEN, rng.standard_normal((4, 3))], {"max_length": 3}, [1]),
    ("PackRNNSequence", [rng.standard_normal((6, 2)), LEN], {}, [0]),
    ("UnpackRNNSequence", [rng.standard_normal((3, 4, 2)), LEN], {}, [0]),
    ("ReversePackedSegs", [rng.standard_normal((4, 3, 2)), SEQ_LEN], {}, [0]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, wrt", GRADS, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients_match_finite_differences(op_type, inputs, args, wrt, device):
    check_gradient(op_type, inputs, wrt=wrt, device=device, **args)


@pytest.mark.parametrize("forward, inputs, args, want", [
    ("PackSegments", ["len", "d"], {"pad_minf": True}, ("UnpackSegments", ["len", "y_grad"], ["d_grad"])),
    ("UnpackSegments", ["len", "d"], {"max_length": 3}, ("PackSegments", ["len", "y_grad"], ["d_grad"])),
    ("PackRNNSequence", ["d", "len"], {}, ("UnpackRNNSequence", ["y_grad", "len"], ["d_grad"])),
    ("UnpackRNNSequence", ["d", "len"], {}, ("PackRNNSequence", ["y_grad", "len"], ["d_grad"])),
    ("ReversePackedSegs", ["d", "len"], {}, ("ReversePackedSegs", ["y_grad", "len"], ["d_grad"])),
])
def test_makers_emit_caffe2s_ops(forward, inputs, args, want):
    ops, grads = backward_ops([make_op(forward, inputs, ["y"], **args)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops] == \
        [want + ({k: int(v) for k, v in args.items()},)]
    assert grads["d"] == "d_grad" and "len" not in grads


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("PackSegments", [LEN, DATA[:5]], ShapeError, "LENGTHS sum to 6 but DATA .* has 5 rows"),
    ("PackSegments", [np.array([2, -1, 5], np.int32), DATA], ShapeError, r"LENGTHS\[1\] = -1"),
    ("PackSegments", [LEN.astype(np.float32), DATA], DTypeError, "LENGTHS must be int32 or int64"),
    ("PackSegments", [LEN.reshape(2, 2), DATA], ShapeError, "1-D vector"),
    ("UnpackSegments", [LEN, PACKED[:3]], ShapeError, "4 entries but DATA .* has 3 segments"),
    ("UnpackSegments", [LEN, PACKED[:, :2]], ShapeError, "a length of 3 exceeds DATA's packed length 2"),
    ("UnpackSegments", [LEN, DATA[:4, 0, 0]], ShapeError, "at least 2-D"),
    ("PackRNNSequence", [DATA[:4], LEN], ShapeError, "LENGTHS sum to 6 but VALUES"),
    ("PackRNNSequence", [INTS[:6], LEN], ShapeError, "at least 2-D"),
    ("UnpackRNNSequence", [SEQ, LEN], ShapeError, r"T x 4 x \.\.\."),
    ("UnpackRNNSequence", [SEQ[:1], np.array([1, 3, 2], np.int32)], ShapeError, "longest length"),
    ("ReversePackedSegs", [SEQ, np.array([1, 5, 0], np.int32)], ShapeError, "length of 5 exceeds DATA's 4"),
    ("ReversePackedSegs", [SEQ, LEN], ShapeError, "LENGTHS has 4 entries but DATA .* batch of 3"),
    ("ReversePackedSegs", [SEQ[0], SEQ_LEN], ShapeError, "3-D"),
    ("VariableLengthSequencePadding", [SEQ, np.array([1, -2, 0], np.int32)], ShapeError, r"SEQ_LENGTHS\[1\] = -2"),
    ("VariableLengthSequencePadding", [SEQ, LEN], ShapeError, "SEQ_LENGTHS has 4 entries but INPUT .* batch of 3"),
    ("VariableLengthSequencePadding", [SEQ[0, 0], SEQ_LEN[:2]], ShapeError, r"\(T, batch, \.\.\.\)"),
    ("VariableLengthSequencePadding", [SEQ.astype(np.int32), SEQ_LEN], DTypeError, "INPUT must be a float"),
    ("VariableLengthSequencePadding", [SEQ, SEQ_LEN.astype(np.float32)], DTypeError, "SEQ_LENGTHS"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device)


@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, error, match):
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs)


def test_the_gradient_of_a_cutting_unpack_fails_as_in_caffe2():
    """UnpackSegments(max_length) drops rows; its gradient PackSegments needs them all (pack_segments.cc checks
    that the lengths add up to DATA's rows), so Caffe2's gradient of a cutting unpack fails, and so does this."""
    with pytest.raises(ShapeError, match="LENGTHS sum to 6 but DATA"):
        check_gradient("UnpackSegments", [LEN, rng.standard_normal((4, 2))], wrt=[1], max_length=2)


def test_unpack_max_length_must_be_the_packed_length():
    with pytest.raises(ShapeError, match="max_length=3 but DATA .* is packed to 2"):
        run_op("UnpackSegments", [LEN, PACKED[:, :2]], max_length=3)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [   # wrong(good kernel, xp, *inputs, **args)
    ("pack_minf", lambda good, xp, lens, d, **a: good(xp, lens, d, **{**a, "pad_minf": 0})),
    ("pack_cut", lambda good, xp, lens, d, **a: (good(xp, lens, d, **a)[0], xp.ones((4, 2), dtype=bool))),
    ("unpack_rnn_longer", lambda good, xp, v, lens: v.transpose(1, 0, 2).reshape(-1, 2)[:6]),
    ("reverse", lambda good, xp, d, lens: d[::-1].copy()),                  # reverses the padding too
    ("padding", lambda good, xp, d, lens: good(xp, d, lens + 1)),            # pads one step late
    ("padding_4d_past_t", lambda good, xp, d, lens: good(xp, d.transpose(1, 0, 2, 3), lens[:1].repeat(4))
     .transpose(1, 0, 2, 3)),                                                  # batch-major instead of time-major
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    good = REGISTRY.get(op_type).kernel
    broken(op_type, lambda *a, **kw: wrong(good, *a, **kw))
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 0.0)


def test_check_gradient_catches_a_broken_reversal_gradient(broken):
    inputs = [rng.standard_normal((4, 3, 2)), SEQ_LEN]
    check_gradient("ReversePackedSegs", inputs, wrt=[0])
    broken("ReversePackedSegs", lambda xp, d, lens: xp.roll(d, 1, axis=0))   # not its own adjoint
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("ReversePackedSegs", inputs, wrt=[0])


def test_padding_runs_in_place_as_caffe2s_backend_runs_it_and_has_no_gradient():
    """Caffe2 allows INPUT and OUTPUT to be one blob (its ONNX backend pads an RNN's Y so) and registers no
    gradient for the op."""
    from stepnet.runtime.workspace import Workspace
    ws = Workspace()
    ws.feed("y", SEQ)
    ws.feed("len", SEQ_LEN)
    net = NetDef(name="pad")
    net.op.append(make_op("VariableLengthSequencePadding", ["y", "len"], ["y"]))
    ws.run_net_once(net)
    np.testing.assert_array_equal(ws.fetch("y"), ref_padding(SEQ, SEQ_LEN.tolist()))
    with pytest.raises(Exception, match="VariableLengthSequencePadding"):
        backward_ops([make_op("VariableLengthSequencePadding", ["d", "len"], ["y"])], {"y": "y_grad"})
