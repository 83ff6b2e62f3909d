"""Tensor vectors (stepnet/ops/tensor_vector.py): CollectTensor's reservoir sampling against the rule written
here from Caffe2's docs (the first num_to_collect runs append; later runs draw one position uniformly from
[0, runs so far] and replace there if it is below num_to_collect), the vectors kept aligned, the sample close
to uniform, ConcatTensorVector and TensorVectorSize, bad inputs, and a broken kernel caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.testing import make_op


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def collect(runs, keep, seed=0):
    """Run a bound CollectTensor `runs` times on rows (k, -k) and (10k,); the two vectors' contents."""
    ws = Workspace(seed=seed)
    run(ws, "CreateTensorVector", [], ["va"])
    run(ws, "CreateTensorVector", [], ["vb"])
    net = NetDef(name="collect")
    net.op.extend([make_op("CollectTensor", ["va", "vb", "a", "b"], ["va", "vb"], num_to_collect=keep)])
    bound = None
    for k in range(runs):
        ws.feed("a", np.array([[k, -k]], np.float32))
        ws.feed("b", np.array([10 * k], np.int64))
        bound = bound or ws.bind(net)   # (bound once: the op counts its runs)
        bound.run()
    return ws, ws.get_blob("va").value, ws.get_blob("vb").value


def check_reservoir(runs=400, keep=20):
    ws, va, vb = collect(runs, keep)
    assert len(va) == len(vb) == keep
    firsts = [int(t[0, 0]) for t in va]
    assert [int(t[0]) for t in vb] == [10 * f for f in firsts]          # kept together, at one position
    assert all(t.tolist() == [[f, -f]] for t, f in zip(va, firsts))
    assert len(set(firsts)) == keep and all(0 <= f < runs for f in firsts)
    assert sum(f >= keep for f in firsts) >= keep // 2    # the late rows are sampled too (each kept w.p. keep/k)
    _, short, _ = collect(5, keep)
    assert [int(t[0, 0]) for t in short] == [0, 1, 2, 3, 4]              # under num_to_collect: all, in order


def test_reservoir_sampling_follows_the_rule():
    check_reservoir()


def test_the_sample_is_close_to_uniform():
    counts = np.zeros(4)
    for seed in range(60):
        _, va, _ = collect(40, 4, seed)
        for t in va:
            counts[int(t[0, 0]) // 10] += 1
    assert counts.min() > 0.6 * counts.mean()    # each quarter of the rows is kept about equally often


def test_the_check_catches_a_sampler_that_keeps_the_first_rows(broken):
    def first_only(ctx, xp, *inputs, num_to_collect, rng):
        n = len(ctx.outputs)
        for v, t in zip(inputs[:n], inputs[n:]):
            if len(v) < num_to_collect:
                v.append(np.array(t))
        return (None,) * n
    broken("CollectTensor", first_only)
    with pytest.raises(AssertionError):
        check_reservoir()


def test_concat_and_size():
    ws, _, _ = collect(3, 10)
    run(ws, "ConcatTensorVector", ["va"], ["cat"])
    run(ws, "TensorVectorSize", ["va"], ["n"])
    assert ws.fetch("cat").tolist() == [[0, -0], [1, -1], [2, -2]] and ws.fetch("cat").dtype == np.float32
    assert ws.fetch("n").shape == () and ws.fetch("n").dtype == np.int32 and ws.fetch("n").item() == 3


def test_bad_inputs():
    ws = Workspace()
    run(ws, "CreateTensorVector", [], ["v"])
    with pytest.raises(ShapeError, match="the tensor vector is empty"):
        run(ws, "ConcatTensorVector", ["v"], ["cat"])
    ws.feed("x", np.zeros((1, 2), np.float32))
    with pytest.raises(ArgumentError, match="num_to_collect must be > 0, got -1"):
        run(ws, "CollectTensor", ["v", "x"], ["v"])
    run(ws, "CollectTensor", ["v", "x"], ["v"], num_to_collect=5)
    ws.get_blob("v").value.append(np.zeros((1, 3), np.float32))
    with pytest.raises(ShapeError, match="tensor 1 of the vector is .1, 3. float32, tensor 0 is .1, 2. float32"):
        run(ws, "ConcatTensorVector", ["v"], ["cat"])
    with pytest.raises(ArityError, match="takes n tensor vectors and n tensors"):
        run(ws, "CollectTensor", ["v", "x", "x"], ["v"], num_to_collect=5)
    with pytest.raises(DTypeError, match="input 0 must be a tensor vector made by CreateTensorVector, got ndarray"):
        run(ws, "TensorVectorSize", ["x"], ["n"])
