"""Binding checks and run-time errors of the executor (DESIGN §3 rules 3 and 7)."""
import warnings

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import (
    ArgumentError, ArityError, DTypeError, MissingBlobError, NetError, OpError, ResourceError, ShapeError,
    StepnetWarning, UnknownOpError)
from stepnet.io.proto import DeviceOption, make_argument
from stepnet.testing import make_op, nested_nets


def net(name, *ops, **kw):
    nd = NetDef(name=name, **kw)
    nd.op.extend(ops)
    return nd


@pytest.fixture
def ws():
    w = Workspace()
    w.feed("x", np.ones((2, 3), np.float32))
    w.feed("w", np.ones((4, 3), np.float32))
    w.feed("b", np.zeros(4, np.float32))
    return w


def test_unknown_op_suggests(ws):
    with pytest.raises(UnknownOpError, match=r"net 'n', op #0 \(Reluu\).*did you mean Relu"):
        ws.create_net(net("n", make_op("Reluu", ["x"], ["y"])))


def test_wrong_arity(ws):
    with pytest.raises(ArityError, match=r"op #1 \(FC\): FC takes 3 inputs, got 2 \(x, w\)"):
        ws.create_net(net("n", make_op("Relu", ["x"], ["r"]), make_op("FC", ["x", "w"], ["y"])))


def test_argument_of_wrong_type(ws):
    op = make_op("FC", ["x", "w", "b"], ["y"])
    op.arg.append(make_argument("axis", 1.5))
    with pytest.raises(ArgumentError, match="argument 'axis' must be an integer.*stores a float"):
        ws.create_net(net("n", op))


def test_duplicate_argument(ws):
    op = make_op("FC", ["x", "w", "b"], ["y"], axis=1)
    op.arg.append(make_argument("axis", 1))
    with pytest.raises(ArgumentError, match="given twice"):
        ws.create_net(net("n", op))


def test_unknown_argument_warns_once_or_errors_when_strict(ws):
    op = make_op("FC", ["x", "w", "b"], ["y"], axsi=1)
    with pytest.warns(StepnetWarning, match="argument 'axsi' is not used by FC.*did you mean axis"):
        ws.create_net(net("n", op))
    with pytest.raises(ArgumentError, match="axsi"):
        Workspace(parent=ws, strict=True).create_net(net("n2", op))


def test_known_hints_are_silent(ws):
    op = make_op("FC", ["x", "w", "b"], ["y"], use_cudnn=1, cudnn_exhaustive_search=0, ws_nbytes_limit=64,
                 order="NCHW", **{"rnn_executor.num_threads": 4})
    op.engine = "CUDNN"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ws.create_net(net("n", op))


def test_the_cudnn_tensor_core_hint_is_silent_even_when_strict(ws):
    """resnet50_trainer.py puts enable_tensor_core (read by Caffe2's cuDNN Conv/ConvTranspose) in its arg_scope,
    so every Conv and ConvGradient of its nets carries it: an engine hint, accepted with --strict too."""
    for op_type, ins, outs in (("Conv", ["X", "W", "b"], ["Y"]), ("ConvGradient", ["X", "W", "dY"], ["dW", "db"])):
        op = make_op(op_type, ins, outs, kernel=3, enable_tensor_core=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Workspace(parent=ws, strict=True).create_net(net(op_type, op), input_blobs=ins)


def test_missing_input_blob_suggests(ws):
    with pytest.raises(MissingBlobError, match="input blob 'xx' does not exist.*did you mean x"):
        ws.create_net(net("n", make_op("Relu", ["xx"], ["y"])))


def test_empty_input_blob_at_run(ws):
    ws.create_blob("hole")
    n = ws.create_net(net("n", make_op("Relu", ["hole"], ["y"])))
    with pytest.raises(MissingBlobError, match=r"op #0 \(Relu\): input 'hole' holds no value"):
        n.run()


def test_shape_mismatch_names_net_op_and_shapes(ws):
    ws.feed("w_bad", np.ones((4, 5), np.float32))
    with pytest.raises(ShapeError, match=r"net 'n', op #0 \(FC\).*x \(2, 3\) float32, w_bad \(4, 5\)"):
        ws.run_net_once(net("n", make_op("FC", ["x", "w_bad", "b"], ["y"])))


def test_external_input_check():
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    nd = net("n", make_op("Relu", ["x"], ["y"]), make_op("Relu", ["z"], ["q"]), external_input=["x"])
    ws.feed("z", np.ones(2, np.float32))
    with pytest.raises(NetError, match="source for input 'z' is unknown"):
        ws.create_net(nd)
    nd2 = net("m", make_op("Relu", ["x"], ["y"]), external_input=["x"], external_output=["nope"])
    with pytest.raises(NetError, match="external_output 'nope' is produced by no op"):
        ws.create_net(nd2)


def test_net_device_option_fills_ops():
    ws = Workspace(gpu="emulate")
    ws.feed("x", np.ones(2, np.float32), device_option=DeviceOption(device_type=1))
    nd = net("n", make_op("Relu", ["x"], ["y"]), device_option=DeviceOption(device_type=1))
    before = nd.SerializeToString()
    ws.run_net_once(nd)
    assert type(ws.get_blob("y").value).__name__ == "DeviceArray"
    assert nd.SerializeToString() == before, "binding wrote the net's device_option into the caller's ops"
    assert not nd.op[0].HasField("device_option")


def test_a_source_written_only_later_is_still_unknown(ws):
    """An input that a later op writes has no source when it is read (Caffe2's NetBase check)."""
    nd = net("n", make_op("Relu", ["z"], ["y"]), make_op("Relu", ["x"], ["z"]), external_input=["x"])
    with pytest.raises(NetError, match=r"op #0 \(Relu\): source for input 'z' is unknown"):
        ws.create_net(nd)


def test_kernel_failure_becomes_op_error(ws, broken):
    def boom(xp, x):
        raise ZeroDivisionError("boom")
    broken("Relu", boom)
    with pytest.raises(OpError, match=r"op #0 \(Relu\) failed: ZeroDivisionError: boom.*x \(2, 3\)"):
        ws.run_net_once(net("n", make_op("Relu", ["x"], ["y"])))


def test_check_nan_names_first_op():
    ws = Workspace(check_nan=True)
    ws.feed("x", np.array([-1.0, 4.0], np.float32))
    nd = net("n", make_op("Relu", ["x"], ["r"]), make_op("Log", ["x"], ["l"]), make_op("Relu", ["l"], ["z"]))
    with pytest.raises(OpError, match=r"op #1 \(Log\) produced NaN in output 'l'"):
        ws.run_net_once(nd)


def test_check_nan_reports_inf_and_passes_integer_and_string_outputs():
    ws = Workspace(check_nan=True)
    ws.feed("x", np.array([0.0, 4.0], np.float32))
    ws.feed("s", np.array(["a", "b"], dtype=object))
    ws.run_net_once(net("ok", make_op("Shape", ["x"], ["shape"]), make_op("Copy", ["s"], ["s2"]),
                        make_op("Relu", ["x"], ["r"])))
    with pytest.raises(OpError, match=r"op #0 \(Log\) produced Inf in output 'l'"):
        ws.run_net_once(net("n", make_op("Log", ["x"], ["l"])))


def test_check_nan_on_the_emulated_device_names_the_op_and_device():
    ws = Workspace(gpu="emulate", check_nan=True)
    gpu = DeviceOption(device_type=1)
    ws.feed("x", np.array([-1.0, 4.0], np.float32), device_option=gpu)
    nd = net("n", make_op("Relu", ["x"], ["r"]), make_op("Log", ["x"], ["l"]), device_option=gpu)
    with pytest.raises(OpError, match=r"op #1 \(Log\) produced NaN in output 'l' \(\(2,\) float32 on emulated:0\)"):
        ws.run_net_once(nd)


@pytest.mark.parametrize("values, bad", [([1.0, np.nan, np.inf], "NaN"), ([1.0, -np.inf], "Inf")])
def test_check_nan_checks_arrays_that_are_no_ndarrays(values, bad, fake_backend, broken):
    """An op whose output is an array of another backend (as CuPy's are: not ndarray subclasses)."""
    broken("Relu", lambda xp, x: fake_backend(np.array(values, np.float32)))
    ws = Workspace(check_nan=True)
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(OpError, match=rf"op #0 \(Relu\) produced {bad} in output 'y' \(\(\d,\) float32 on fake:0\)"):
        ws.run_net_once(net("n", make_op("Relu", ["x"], ["y"])))


def test_check_nan_passes_finite_arrays_of_another_backend(fake_backend, broken):
    broken("Relu", lambda xp, x: fake_backend(np.array([1.0, 2.0], np.float32)))
    ws = Workspace(check_nan=True)
    ws.feed("x", np.ones(2, np.float32))
    ws.run_net_once(net("n", make_op("Relu", ["x"], ["y"])))
    assert isinstance(ws.get_blob("y").value, fake_backend)


def test_every_net_type_runs_sequentially(ws):
    for t in ("", "simple", "dag", "async_dag", "async_scheduling", "async_simple", "prof_dag", "rnn"):
        nd = net(f"n_{t}", make_op("Relu", ["x"], ["a"]), make_op("Relu", ["a"], ["b"]), type=t)
        ws.run_net_once(nd)
        assert ws.fetch("b").shape == (2, 3)


def test_enforced_inplace():
    ws = Workspace()
    ws.feed("it", np.zeros(1, np.int64))
    with pytest.raises(ArgumentError, match="in place"):
        ws.create_net(net("n", make_op("Iter", ["it"], ["it2"])))


# --------------------------------------------------------------------------------------------- nested nets
def nested(levels: int, text_at: int | None = None) -> NetDef:
    """`levels` RunNet wrappers around a net copying x to y; wrapper number `text_at` holds its net as text."""
    return nested_nets(levels, "RunNet", net("leaf", make_op("Copy", ["x"], ["y"])), text_at)


@pytest.fixture
def run_net_op(temporary_op):
    from stepnet.ops.registry import Arg

    def run_net(ctx, xp, *, net):
        ctx.bind(net).run()
    temporary_op("RunNet", run_net, inputs=0, outputs=0, context=True, args={"net": Arg("net")})


@pytest.mark.parametrize("text_at", [None, 0, 20, 32])
def test_nets_nested_to_protobufs_limit_run(ws, run_net_op, text_at):
    ws.run_net_once(nested(33, text_at))        # the leaf's op is at level 100, as deep as one file may hold
    assert ws.fetch("y").shape == (2, 3)


@pytest.mark.parametrize("levels, text_at", [(34, None), (34, 20), (34, 0), (1000, None)])
def test_nets_nested_deeper_are_one_error(ws, run_net_op, levels, text_at):
    from stepnet.core.errors import FileFormatError
    with pytest.raises((NetError, FileFormatError), match="messages are nested more than 100 levels deep") as info:
        ws.run_net_once(nested(levels, text_at))
    assert "\n" not in str(info.value)


def test_a_net_argument_whose_text_is_not_utf8(ws, run_net_op):
    from stepnet.core.errors import FileFormatError
    outer = NetDef(name="outer")
    outer.op.add(type="RunNet").arg.add(name="net", s=b'name: "caf\xe9" op { type: "Copy" input: "x" output: "y" }')
    with pytest.raises(FileFormatError, match=r"net 'outer', op #0 \(RunNet\), argument 'net': the net's text is not "
                                              r"valid UTF-8 \(byte 0xe9 at offset 10"):
        ws.run_net_once(outer)


def _fc_net(ws, x, w, b):
    for name, value in (("x", x), ("w", w), ("b", b)):
        ws.feed(name, value)
    return ws.create_net(NetDef(name="fc", op=[make_op("FC", ["x", "w", "b"], ["y"])]), overwrite=True)


def test_specialized_ops_check_once_per_input_signature(ws, patched):
    """FC's record specializes per input signature: same results as the kernel, checked again (with the
    kernel's message) when the shapes change, and a replaced kernel is never bypassed."""
    from stepnet.runtime.executor import Specialized
    from stepnet.ops import REGISTRY

    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (5, 3), (5,)))
    net = _fc_net(ws, x, w, b)
    call = net.ops[0].call
    assert isinstance(call, Specialized)
    net.run()
    state = call.state
    net.run()
    np.testing.assert_array_equal(ws.fetch("y"), REGISTRY.get("FC").kernel(np, x, w, b))
    assert call.state is state
    ws.feed("x", x[:2])                                   # a new signature: specialized again
    net.run()
    assert ws.fetch("y").shape == (2, 5) and call.state[0] != state[0]
    ws.feed("w", w[:, :2])                                # and checked again
    with pytest.raises(ShapeError, match=r"FC: X \(2, 3\) at axis=1 is M x K = 2 x 3"):
        net.run()
    patched("FC", kernel=lambda xp, X, W, b, **a: np.zeros((1,), np.float32))
    net = _fc_net(Workspace(), x, w, b)
    assert net.ops[0].call.specialize is None   # (FC grows: only the size check is kept per signature)
    net.run()
    assert net.workspace.fetch("y").shape == (1,)


def _one_op_net(op_type, inputs):
    net = NetDef(name="n")
    net.op.append(make_op(op_type, inputs, ["y"]))
    return net


def test_a_kernel_reading_a_tensor_attribute_of_another_object_is_a_dtype_error(temporary_op):
    """An input blob holding a non-tensor (a reader, a queue: a hostile net can wire one in) that the kernel
    reads as an array: the error names the input and its type, not the AttributeError."""
    temporary_op("ReadsShape", lambda xp, x: np.zeros(x.shape), inputs=1, outputs=1)
    ws = Workspace()
    ws.create_blob("x").value = object()
    with pytest.raises(DTypeError, match=r"op #0 \(ReadsShape\): input 'x' is a object, not a tensor"):
        ws.create_net(_one_op_net("ReadsShape", ["x"])).run()


def test_an_attribute_error_of_the_kernels_own_is_still_an_op_error(temporary_op):
    def buggy(xp, x):
        return x.no_such_attribute
    temporary_op("Buggy", buggy, inputs=1, outputs=1)
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(OpError, match="AttributeError"):
        ws.create_net(_one_op_net("Buggy", ["x"])).run()


@pytest.mark.parametrize("failure", [MemoryError(), ValueError("array is too big; `arr.size * ...`")])
def test_an_impossible_allocation_is_a_resource_error(temporary_op, failure):
    def huge(xp, x):
        raise failure
    temporary_op("Huge", huge, inputs=1, outputs=1)
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(ResourceError, match=r"op #0 \(Huge\): an array of impossible size"):
        ws.create_net(_one_op_net("Huge", ["x"])).run()


def test_a_kernel_returning_one_array_for_several_outputs_is_an_error(ws):
    """A kernel slip (one array where a tuple is due) once spread the array's rows over the outputs: AddPadding's
    output_lens became a float row. It is an error naming the op now, and nothing is stored."""
    from stepnet.ops import REGISTRY

    ws.feed("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    split = net("n", make_op("Split", ["t"], ["a", "b"], axis=0))
    with REGISTRY.patched("Split", kernel=lambda *args, **kw: args[-1]):   # the input array itself
        with pytest.raises(OpError, match=r"net 'n', op #0 \(Split\) failed: TypeError: the kernel returned one "
                                          r"ndarray for 2 outputs"):
            ws.run_net_once(split)
    assert not ws.has("a") or ws.get_blob("a").value is None
    ws.run_net_once(split)   # the real kernel: two rows, each its own output
    np.testing.assert_array_equal(ws.fetch("b"), [[3, 4, 5]])
