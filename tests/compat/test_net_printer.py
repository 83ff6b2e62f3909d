"""compat.net_printer's text (the expected strings are written out from Caffe2's printing rules: one
`net.Op([inputs], [outputs], arg=value)` line an op in Caffe2 syntax, `outputs = Op(inputs, arg=value)` without
it, `with` blocks for loops, concurrency and reporters), analyze's concurrent-definition error and debug_net."""
import numpy as np
import pytest

from stepnet.compat import core, net_printer, workspace
from stepnet.compat.checkpoint import Job
from stepnet.compat.task import Task


def small_net():
    net = core.Net("n")
    net.Add(["a", "b"], "c", broadcast=1)
    net.Split(["p/in"], ["p/out1", "p/out2"], axis=0)
    net.GivenTensorStringFill([], "s", shape=[1], values=["hi"])
    return net


def test_net_in_caffe2_syntax():
    assert net_printer.to_string(small_net()) == "\n".join([
        "n = core.Net('n')",
        "n.Add(['a', 'b'], ['c'], broadcast=1)",
        "n.Split(['p/in'], ['p/out1', 'p/out2'], axis=0)",
        "n.GivenTensorStringFill([], ['s'], shape=[1], values=[\"'hi'\"])",
    ])


def test_net_as_calls_with_and_without_factored_prefixes():
    net = small_net()
    assert net_printer.to_string(net, c2_syntax=False) == "\n".join([
        "# net: n",
        "c = Add(a, b, broadcast=1)",
        "p/out1, p/out2 = Split(p/in, axis=0)",
        "s = GivenTensorStringFill(shape=[1], values=[\"'hi'\"])",
    ])
    assert net_printer.to_string(net, c2_syntax=False, factor_prefixes=True).splitlines()[2] == \
        "p/out[1, 2] = Split(p/in, axis=0)"


def test_step_blocks():
    n1 = core.Net("n1")
    n1.ConstantFill([], "x", shape=[1], value=1.0)
    rep_net = core.Net("rep")
    rep_net.ConstantFill([], "y", shape=[1], value=2.0)
    inner = core.execution_step("inner", [n1], num_iter=3)
    rep = core.execution_step("rep_step", [rep_net])
    rep.RunEveryMillis(100)
    both = core.execution_step("both", [inner, rep], concurrent_substeps=True)
    assert net_printer.to_string(both) == "\n".join([
        "with parallel():",
        "    with step(inner):",
        "        with loop(3):",
        "            n1 = core.Net('n1')",
        "            n1.ConstantFill([], ['x'], shape=[1], value=1.0)",
        "    with reporter(rep_step, interval_ms=100):",
        "        rep = core.Net('rep')",
        "        rep.ConstantFill([], ['y'], shape=[1], value=2.0)",
    ])
    assert net_printer.to_string(core.execution_step("nothing", [], num_iter=2)) == "with loop(2):\n    pass"


def test_stop_blob_loop():
    net = core.Net("body")
    net.ConstantFill([], "stop", shape=[], value=True, dtype=core.DataType.BOOL)
    step = core.execution_step("until", [net], should_stop_blob="stop")
    assert net_printer.to_string(step) == "\n".join([
        "with loop():",
        "    body = core.Net('body')",
        "    body.ConstantFill([], ['stop'], shape=[], value=1, dtype=5)",
        "    yield stop_if(stop)",
    ])


def test_analyze_rejects_a_blob_made_by_two_concurrent_steps():
    a, b = core.Net("a"), core.Net("b")
    a.ConstantFill([], "out", shape=[1], value=1.0)
    b.ConstantFill([], "out", shape=[1], value=2.0)
    with Job() as job:
        Task(step=core.execution_step("par", [core.execution_step("sa", [a]), core.execution_step("sb", [b])],
                                      concurrent_substeps=True))
    with pytest.raises(AssertionError, match="Blobs created by multiple parallel steps: out"):
        net_printer.analyze(job)


def test_debug_net_logs_each_op_then_runs_it(capfd):
    net = core.Net("dbg")
    net.Add(["a", "b"], "c")
    logged = net_printer.debug_net(net)
    workspace.FeedBlob("a", np.array([1.0, 2.0], np.float32))
    workspace.FeedBlob("b", np.array([10.0, 20.0], np.float32))
    workspace.RunNetOnce(logged)
    np.testing.assert_array_equal(workspace.FetchBlob("c"), [11.0, 22.0])
    assert [op.type for op in logged.Proto().op][-1] == "Add"
    captured = capfd.readouterr()
    assert "c = Add(a, b)" in captured.out + captured.err
