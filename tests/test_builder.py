"""NetBuilder (stepnet/builders/builder.py): ops as methods, checks at op creation, Caffe2's automatic names, name and
device scopes, external inputs/outputs, and nets that run."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.core.errors import ArgumentError, ArityError, StepnetError, UnknownOpError
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption, argument_value

CUDA = DeviceOption(device_type=1, device_id=0)
CUDA1 = DeviceOption(device_type=1, device_id=1)


def args_of(op) -> dict:
    return {a.name: argument_value(a) for a in op.arg}


# ------------------------------------------------------------ ops as methods
def test_every_registered_op_is_a_method():
    net = NetBuilder("n")
    listed = set(dir(net))
    types = list(REGISTRY)
    assert len(types) > 100
    for op_type in types:
        assert op_type in listed, op_type
        method = getattr(net, op_type)
        assert callable(method) and method.__name__ == op_type
    assert "add_op" in listed and "proto" in listed  # the builder's own API is listed too


def test_op_methods_carry_the_op_doc():
    assert NetBuilder("n").Accuracy.__doc__ == REGISTRY.get("Accuracy").doc


@pytest.mark.parametrize("typo, near", [("Reluu", "Relu"), ("Softmx", "Softmax"), ("fc", "FC")])
def test_a_typo_gets_did_you_mean(typo, near):
    net = NetBuilder("n")
    with pytest.raises(AttributeError, match=f"no operator or attribute '{typo}'.*did you mean.*{near}"):
        getattr(net, typo)
    with pytest.raises(UnknownOpError, match=f"unknown operator type '{typo}'.*did you mean.*{near}"):
        net.add_op(typo, ["x"])
    assert not net.proto().op


def test_private_names_are_not_ops():
    with pytest.raises(AttributeError):
        NetBuilder("n")._nothing_here  # noqa: B018


# ------------------------------------------------------------ checks at creation
@pytest.mark.parametrize("make, error, words", [
    (lambda n: n.FC(["x", "w"]), ArityError, r"FC takes 3 inputs, got 2 \(x, w\)"),
    (lambda n: n.Relu("x", ["a", "b"]), ArityError, "Relu takes 1 outputs, got 2"),
    (lambda n: n.Sum([]), ArityError, "Sum takes 1 or more inputs, got 0"),
    (lambda n: n.FC(["x", "w", "b"], axis="1"), ArgumentError, "'axis' must be an integer"),
    (lambda n: n.FC(["x", "w", "b"], axis=1.5), ArgumentError, "'axis' must be an integer"),
    (lambda n: n.Relu("x", bogus=1), ArgumentError, "'bogus' is not used by Relu"),
    (lambda n: n.Softmax("x", axs=1), ArgumentError, "'axs' is not used by Softmax.*did you mean axis"),
    (lambda n: n.CreateDB([], "r"), ArgumentError, "required argument 'db' is missing"),
    (lambda n: n.FC(["x", "w", "b"], "x"), ArgumentError, "cannot write output 0 in place"),
    (lambda n: n.AtomicIter(["mutex", "it"], "other"), ArgumentError, "must write input 1"),
])
def test_bad_ops_raise_at_creation_and_leave_the_net_unchanged(make, error, words):
    net = NetBuilder("n")
    net.Relu("a", "r")
    before = net.proto().SerializeToString()
    with pytest.raises(error, match=words) as info:
        make(net)
    assert "net 'n', new op #1" in str(info.value)
    assert net.proto().SerializeToString() == before


# ------------------------------------------------------------ names
def test_automatic_output_names_as_caffe2():
    net = NetBuilder("n")
    assert net.Relu("x") == "n/Relu"
    assert net.Relu("x") == "n/Relu_2"
    assert net.Relu("x") == "n/Relu_3"
    assert net.Relu("x", 1) == "n/Relu:0"
    assert net.Split("x", 2) == ["n/Split:0", "n/Split:1"]
    assert net.Split("x", 2) == ["n/Split_2:0", "n/Split_2:1"]
    assert net.Sigmoid("x") == "n/Sigmoid"
    assert [o for op in net.proto().op for o in op.output] == [
        "n/Relu", "n/Relu_2", "n/Relu_3", "n/Relu:0", "n/Split:0", "n/Split:1", "n/Split_2:0", "n/Split_2:1",
        "n/Sigmoid"]


def test_an_external_input_counts_as_defined_for_names():
    net = NetBuilder("n")
    net.add_external_inputs("n/Tanh")
    assert net.Tanh("x") == "n/Tanh_2"


def test_next_name_without_prefix():
    net = NetBuilder("n")
    assert [net.next_name(), net.next_name(), net.next_name()] == ["n_blob_0", "n_blob_1", "n_blob_2"]
    assert isinstance(net.next_name(), BlobRef)
    assert net.next_name("Foo") == "n/Foo" and net.next_name("Foo", 3) == "n/Foo:3"


def test_ops_without_outputs_get_none():
    net = NetBuilder("n")
    assert net.Print("x") == []
    assert list(net.proto().op[0].output) == []


def test_special_keywords():
    net = NetBuilder("n")
    net.Relu("x", "y", name="first", engine="CUDNN", control_input=["c"], random_seed=7, unused_none=None)
    op = net.proto().op[0]
    assert (op.name, op.engine, list(op.control_input)) == ("first", "CUDNN", ["c"])
    assert op.device_option.random_seed == 7
    assert not op.arg  # keywords whose value is None are left out, as CreateOperator does


# ------------------------------------------------------------ scopes
def test_name_scopes_nest_and_blobrefs_are_not_rescoped():
    net = NetBuilder("n")
    with net.name_scope("a"):
        assert net.Relu("x", "y") == "a/y"
        with net.name_scope("b/"):
            assert net.Relu(["x"], "y") == "a/b/y"
            assert net.Relu(BlobRef("x"), BlobRef("z")) == "z"
            assert net.Tanh("x") == "a/b/n/Tanh"
            with net.name_scope(""):
                assert net.Relu("x", "w") == "a/b/w"
        assert net.Relu("x", "v") == "a/v"
    assert net.Relu("x", "y") == "y"
    inputs = [op.input[0] for op in net.proto().op]
    assert inputs == ["a/x", "a/b/x", "x", "a/b/x", "a/b/x", "a/x", "x"]
    assert net.external_inputs == ["a/x", "a/b/x", "x"]


def test_name_scope_is_restored_after_an_error():
    net = NetBuilder("n")
    with pytest.raises(ArityError):
        with net.name_scope("s"):
            net.FC(["x"])
    assert net.Relu("x", "y") == "y"


def test_device_scopes_nest_and_restore():
    net = NetBuilder("n")
    net.Relu("x", "plain")
    with net.device_scope(CUDA):
        net.Relu("x", "outer")
        with net.device_scope(CUDA1):
            net.Relu("x", "inner")
        net.Relu("x", "outer_again")
        net.Relu("x", "explicit", device_option=DeviceOption(device_type=0))
    net.Relu("x", "after")
    ops = {op.output[0]: op for op in net.proto().op}
    assert not ops["plain"].HasField("device_option") and not ops["after"].HasField("device_option")
    assert ops["outer"].device_option == CUDA and ops["outer_again"].device_option == CUDA
    assert ops["inner"].device_option == CUDA1
    assert ops["explicit"].device_option.device_type == 0


def test_scopes_are_shared_by_nets_built_on_one_scope():
    a = NetBuilder("a")
    b = NetBuilder("b", a.scope)
    with a.name_scope("s"), a.device_scope(CUDA):
        b.Relu("x", "y")
    op = b.proto().op[0]
    assert list(op.output) == ["s/y"] and op.device_option == CUDA


# ------------------------------------------------------------ inputs, outputs
def test_undefined_inputs_become_external_inputs_once():
    net = NetBuilder("n")
    y = net.FC(["x", "w", "b"], "y")
    net.Add([y, "x"], "z")
    net.Relu("z", "z2")
    assert net.external_inputs == ["x", "w", "b"]
    assert net.is_defined("y") and net.is_defined("x") and not net.is_defined("q")


def test_external_outputs_must_be_produced():
    net = NetBuilder("n")
    net.Relu("x", "y")
    net.add_external_outputs("y", "x", "y")  # an external input is defined too (Caffe2's BlobIsDefined)
    assert net.external_outputs == ["y", "x"]
    with pytest.raises(StepnetError, match="external output 'q' is produced by no op"):
        net.add_external_outputs("q")


def test_proto_is_live_and_printable():
    net = NetBuilder("n")
    proto = net.proto()
    net.Relu("x", "y")
    assert len(proto.op) == 1 and proto.name == "n"
    assert 'type: "Relu"' in str(net) and repr(net) == "NetBuilder('n', 1 ops)"
    again = NetBuilder(proto=proto)
    assert again.Relu("y") == "n/Relu" and again.is_defined("y")


# ------------------------------------------------------------ running
def fc_relu_reference(x, w, b):
    """relu(x w^T + b) by loops."""
    out = np.zeros((x.shape[0], w.shape[0]))
    for i in range(x.shape[0]):
        for j in range(w.shape[0]):
            dot = sum(float(x[i, k]) * float(w[j, k]) for k in range(x.shape[1]))
            out[i, j] = max(0.0, dot + float(b[j]))
    return out


def run_fc_relu():
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((4, 3)), "w": rng.standard_normal((5, 3)), "b": rng.standard_normal(5)}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    net = NetBuilder("n")
    with net.name_scope("layer"):
        y = net.Relu(net.FC([BlobRef("x"), BlobRef("w"), BlobRef("b")]))
    ws = Workspace()
    for k, v in feeds.items():
        ws.feed(k, v)
    ws.run_net_once(net.proto())
    return ws.fetch(y), fc_relu_reference(**feeds)


def test_a_built_net_runs():
    got, want = run_fc_relu()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_tester_a_broken_relu_is_caught(broken):
    broken("Relu", lambda xp, x: x * 1)  # forgets the clamp
    got, want = run_fc_relu()
    assert (want == 0).any()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_arguments_are_stored_as_caffe2_stores_them():
    net = NetBuilder("n")
    net.ConstantFill([], "c", shape=[2, 3], value=1.5, dtype=1)
    net.ConstantFill([], "e", shape=[], value=0)
    c, e = net.proto().op
    assert args_of(c) == {"shape": [2, 3], "value": 1.5, "dtype": 1}
    assert c.arg[1].HasField("f") and e.arg[1].HasField("i")
