"""compat.net_builder, task and session: blocks built from stop blobs (loop, stop_guard, If/Elif/Else), blocks
built from If/While ops (IfNet/Else, WhileNet/Condition), tasks with setup and instances run by LocalSession;
results against hand-computed values."""
import math

import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.net_builder import NetBuilder, ops
from stepnet.compat.session import LocalSession
from stepnet.compat.task import Node, Task, TaskGroup, WorkspaceType, final_output


def run_builder(nb):
    """Run a builder's step in a fresh workspace; returns it (a C.Workspace)."""
    plan = core.Plan("test")
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.C.Workspace()
    ws.run(plan)
    return ws


def value(ws, blob):
    return ws.blobs[str(blob)].fetch()


# --------------------------------------------------------------------------------------------- stop blobs
def test_loop_until_stopped_computes_a_factorial():
    with NetBuilder() as nb:
        n, acc = ops.Const(6), ops.Const(1)
        with ops.loop():
            ops.stop_if(ops.LE([n, ops.Const(1)]))
            ops.Mul([acc, n], [acc])
            ops.Add([n, ops.Const(-1)], [n])
    ws = run_builder(nb)
    assert value(ws, acc) == 720 and value(ws, n) == 1


def test_counted_loop_computes_fibonacci_and_counts_its_iterations():
    with NetBuilder() as nb:
        a, b, seen = ops.Const(0), ops.Const(1), ops.Const(0)
        with ops.loop(10) as loop:
            nxt = ops.Add([a, b])
            ops.Copy(b, a)
            ops.Copy(nxt, b)
            ops.Add([seen, loop.iter()], [seen])   # 0 + 1 + ... + 9
    ws = run_builder(nb)
    assert value(ws, a) == 55 and value(ws, b) == 89 and value(ws, seen) == 45


def test_loop_count_from_a_blob_and_nested_loops_restart():
    with NetBuilder() as nb:
        total = ops.Const(0)
        with ops.loop(ops.Add([ops.Const(2), ops.Const(2)])) as outer:     # 4 times
            with ops.loop(outer.iter()) as inner:                        # 0, 1, 2, 3 times
                ops.Add([total, ops.Add([ops.Mul([outer.iter(), ops.Const(10)]), inner.iter()])], [total])
    ws = run_builder(nb)
    assert value(ws, total) == sum(10 * i + j for i in range(4) for j in range(i))


def test_if_elif_else_takes_one_branch():
    def classify(x):
        with NetBuilder() as nb:
            out = ops.Const(0)
            v = ops.Const(x)
            with ops.If(ops.GT([v, ops.Const(10)])) as c:
                ops.Const(1, blob_out=out)
            with c.Elif(ops.GT([v, ops.Const(0)])) as c:
                ops.Const(2, blob_out=out)
            with c.Else():
                ops.Const(3, blob_out=out)
        return int(value(run_builder(nb), out))
    assert [classify(x) for x in (50, 11, 10, 1, 0, -7)] == [1, 1, 2, 2, 3, 3]


def test_stop_guard_tells_whether_its_block_stopped():
    with NetBuilder() as nb:
        reached = ops.Const(0)
        with ops.stop_guard() as stopped:
            ops.stop_if(ops.Const(True))
            ops.Const(1, blob_out=reached)
        with ops.stop_guard() as ran:
            ops.stop_if(ops.Const(False))
            ops.Const(2, blob_out=reached)
    ws = run_builder(nb)
    assert bool(value(ws, stopped.has_stopped())) and not bool(value(ws, ran.has_stopped()))
    assert value(ws, reached) == 2


def test_stop_ends_only_the_innermost_block():
    with NetBuilder() as nb:
        y = ops.Const(0)
        with ops.If(ops.Const(True)):
            ops.Const(1, blob_out=y)
            ops.stop()
            ops.Const(2, blob_out=y)
        after = ops.Add([y, ops.Const(10)])
    ws = run_builder(nb)
    assert value(ws, y) == 1 and value(ws, after) == 11


def test_builder_misuse_fails_clearly():
    assert not hasattr(ops, "Relu")   # no active builder
    with pytest.raises(AssertionError, match="requires a stop condition"):
        with NetBuilder():
            with ops.loop():
                ops.Const(1)
    with pytest.raises(AssertionError, match="Else"):
        with NetBuilder():
            ops.Const(1)
            with ops.Else():
                pass
    with pytest.raises(AssertionError, match="Condition outside of WhileNet"):
        with NetBuilder():
            ops.Condition()
    with NetBuilder() as nb:
        ops.Const(1)
    with pytest.raises(AssertionError, match="built already"):
        nb.current_net()


# --------------------------------------------------------------------------------------------- control ops
def test_ifnet_else_write_outer_blobs_and_keep_locals_inside():
    with NetBuilder() as nb:
        x, y, z = ops.Const(4), ops.Const(0), ops.Const(0)
        with ops.IfNet(ops.GT([x, ops.Const(3)])):
            local = ops.Mul([x, x])
            ops.Add([local, ops.Const(1)], [y])        # 17
            with ops.IfNet(ops.LT([x, ops.Const(0)])):
                ops.Const(-1, blob_out=z)
            with ops.Else():
                ops.Add([local, x], [z])                # 20
        with ops.Else():
            ops.Const(-2, blob_out=y)
    ws = run_builder(nb)
    assert value(ws, y) == 17 and value(ws, z) == 20
    assert str(local) not in ws.blobs


def test_whilenet_sums_and_its_condition_runs_before_each_iteration():
    with NetBuilder() as nb:
        i, total = ops.Const(0), ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.Add([i, ops.Const(1)], [i])
                ops.LE([i, ops.Const(10)])
            ops.Add([total, i], [total])
    ws = run_builder(nb)
    assert value(ws, i) == 11 and value(ws, total) == 55


def test_control_op_builder_makes_one_net_and_its_gradient_follows_the_branch():
    def gradient(x0):
        workspace.ResetWorkspace()
        with NetBuilder(_use_control_ops=True) as nb:
            ops.Copy(ops.Const(x0), "x")
            ops.Copy(ops.Const(0.0), "zero")
            # used before: an outer blob the branches write. Made by a fill: a Copy there would need the If's
            # gradient of y, of a later version (Caffe2's IR refuses that, core_gradients_test testVersionMismatch)
            ops.GivenTensorFill([], "y", shape=[], values=[0.0])
            with ops.IfNet(ops.GT(["x", "zero"])):
                ops.Pow("x", "y", exponent=3.0)       # y = x^3, dy/dx = 3x^2
            with ops.Else():
                ops.Scale("x", "y", scale=-5.0)       # y = -5x,  dy/dx = -5
        nets = nb.get()
        assert len(nets) == 1
        net = nets[0]
        net.AddGradientOperators(["y"])
        workspace.RunNetOnce(net)
        return float(workspace.FetchBlob("y")), float(workspace.FetchBlob("x_grad"))
    assert gradient(2.0) == pytest.approx((8.0, 12.0))
    assert gradient(-1.5) == pytest.approx((7.5, -5.0))


def test_control_op_inputs_must_be_in_the_lexical_scope():
    from stepnet.compat.control_ops_util import add_if_op, get_external_blob_names
    then_net = core.Net("then")
    then_net.Add(["a", "b"], "c")
    assert get_external_blob_names(then_net, ["a", "b", "c"]) == ({"a", "b"}, {"c"})
    assert get_external_blob_names(then_net, ["a", "b"]) == ({"a", "b"}, set())
    with pytest.raises(AssertionError, match="Input blob b is undefined"):
        add_if_op(core.Net("if"), "cond", ["a"], then_net)


# --------------------------------------------------------------------------------------------- tasks
def test_task_setup_runs_first_and_exit_last():
    with Task() as task:
        with ops.task_init():
            one = ops.Const(1)
        acc = ops.Add([one, ops.Const(4)])                     # 5
        with ops.task_exit():
            at_exit = ops.Mul([acc, ops.Const(10)])            # after the body: 6 * 10
        ops.Add([acc, one], [acc])                             # 6
        before_exit = ops.Mul([acc, ops.Const(10)])
        outs = [final_output(at_exit), final_output(before_exit)]
    with LocalSession() as session:
        session.run(task)
        assert [int(o.fetch()) for o in outs] == [60, 60]


def test_task_instances_run_in_workspaces_of_their_own():
    with TaskGroup() as tg:
        with Task(num_instances=4):
            with ops.task_init():
                shared = ops.CreateCounter([], ["shared"])
            with ops.task_instance_init():
                own = ops.CreateCounter([], ["own"])
            with ops.loop(3):
                ops.CountUp(shared)
                ops.CountUp(own)
            with ops.task_instance_exit():
                mine = ops.RetrieveCount(own)            # 3 in each instance
                with ops.loop(mine):
                    ops.CountUp(shared)
            with ops.task_exit():
                total = final_output(ops.RetrieveCount(shared))
    with LocalSession() as session:
        session.run(tg)
        assert int(total.fetch()) == 4 * (3 + 3)
        assert "own" not in workspace.C.Workspace.current.blobs


def test_sibling_loops_in_many_instances_each_check_their_own_stop_blob():
    """The plan runner remembers, per loop step, which blobs its nets write (to refuse a loop that cannot end);
    a step message of one instance freed and another taking its id must not inherit that (it said the second
    loop's stop blob was written by no net)."""
    with TaskGroup() as tg:
        with Task(num_instances=10):
            with ops.task_init():
                shared = ops.CreateCounter([], ["shared"])
            local = ops.CreateCounter([], ["local"])
            with ops.loop(3):
                ops.CountUp(local)
            mine = ops.RetrieveCount(local)
            with ops.loop(ops.Mul([mine, mine])):
                ops.CountUp(shared)
            with ops.task_exit():
                total = final_output(ops.RetrieveCount(shared))
    with LocalSession() as session:
        session.run(tg)
        assert int(total.fetch()) == 10 * 3 * 3


def test_final_output_of_a_list_and_a_task_group_by_node():
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        with Node("n1"):
            with Task():
                a, b = ops.Const(3), ops.Const(4)
                both = final_output([ops.Mul([a, a]), ops.Mul([b, b])])
    with LocalSession() as session:
        session.run(tg)
        assert [int(v) for v in both.fetch()] == [9, 16]
        assert workspace.HasBlob(str(a))   # a GLOBAL group runs in the session's workspace itself


def test_session_runs_a_net_a_step_and_a_plan():
    net = core.Net("fill")
    x = net.ConstantFill([], "x", shape=[], value=math.pi)
    for runnable in (net, core.execution_step("s", [net]), core.Plan(core.execution_step("p", [net]))):
        workspace.ResetWorkspace()
        with LocalSession() as session:   # in the current workspace (as it is when the session is made)
            session.run(runnable)
        assert workspace.FetchBlob(x) == np.float32(math.pi)
    with pytest.raises(AssertionError, match="closed"):
        session.run(net)


def test_final_output_of_a_record_comes_back_as_a_record():
    from stepnet.compat import schema
    with Task() as task:
        record = schema.Struct(("a", schema.Scalar(np.int64, core.BlobReference(str(ops.Const(2))))),
                               ("b", schema.Scalar(np.int64, core.BlobReference(str(ops.Const(3))))))
        out = final_output(record)
    with LocalSession() as session:
        session.run(task)
        fetched = out.fetch()
        assert int(fetched.a()) == 2 and int(fetched.b()) == 3
