"""compat.control (steps for loops and conditionals on nets), brew.cond / brew.loop (If and While ops through
control_ops_util); against hand-computed values."""
import numpy as np
import pytest

from stepnet.compat import brew, control, core, workspace
from stepnet.compat.model_helper import ModelHelper

INT64 = core.DataType.INT64


class Counting:
    """A counter `n` (CountUp per run of `up`), a constant `limit`, and condition nets on them."""

    def __init__(self, limit=5):
        self.init = core.Net("init")
        self.counter = self.init.CreateCounter([], init_count=0)
        self.limit = self.init.ConstantFill([], shape=[], value=limit, dtype=INT64)
        self.up = core.Net("up")
        self.up.CountUp([self.counter])
        self.n = self.up.RetrieveCount([self.counter])
        self.init.ConstantFill([], [self.n], shape=[], value=0, dtype=INT64)
        self.below = core.Net("below")      # n < limit
        self.below.AddExternalOutput(self.below.LT([self.n, self.limit]))
        self.reached = core.Net("reached")  # n >= limit
        self.reached.AddExternalOutput(self.reached.GE([self.n, self.limit]))

    def run(self, step) -> int:
        plan = core.Plan("test")
        plan.AddStep(control.Do("init", self.init))
        plan.AddStep(step)
        workspace.RunPlan(plan)
        return int(workspace.FetchBlob(self.n))


def test_for_runs_its_body_n_times():
    c = Counting()
    assert c.run(control.For("for", c.up, 7)) == 7
    assert c.run(control.For("for", [control.Do("up", c.up), core.Net("idle")], 3)) == 3


def test_while_and_until_test_before_each_iteration():
    c = Counting(limit=5)
    assert c.run(control.While("while", c.below, c.up)) == 5
    assert c.run(control.Until("until", c.reached, c.up)) == 5
    c0 = Counting(limit=0)
    assert c0.run(control.While("while", c0.below, c0.up)) == 0
    assert c0.run(control.Until("until", c0.reached, c0.up)) == 0


def test_do_while_and_do_until_run_at_least_once():
    c0 = Counting(limit=0)
    assert c0.run(control.DoWhile("dowhile", c0.below, c0.up)) == 1
    assert c0.run(control.DoUntil("dountil", c0.reached, c0.up)) == 1
    c = Counting(limit=4)
    assert c.run(control.DoWhile("dowhile", c.below, [control.Do("up", c.up)])) == 4


def test_if_ifnot_switch_on_nets_and_blobs():
    def yes_no():
        yes, no = core.Net("yes"), core.Net("no")
        yes.AddExternalOutput(yes.ConstantFill([], shape=[], value=True, dtype=core.DataType.BOOL))
        no.AddExternalOutput(no.ConstantFill([], shape=[], value=False, dtype=core.DataType.BOOL))
        return yes, no

    c = Counting()
    yes, no = yes_no()
    twice = core.Net("twice")
    twice.CountUp([c.counter])
    twice.CountUp([c.counter])
    twice.RetrieveCount([c.counter], [c.n])
    assert c.run(control.If("if", yes, c.up)) == 1
    assert c.run(control.If("if", no, c.up)) == 0
    assert c.run(control.If("if", no, c.up, twice)) == 2
    assert c.run(control.IfNot("ifnot", no, c.up)) == 1
    assert c.run(control.IfNot("ifnot", yes, c.up, twice)) == 2
    blob = yes.Proto().external_output[-1]
    assert c.run(control.Do("on-blob", control.Do("cond", yes), control.If("if", blob, c.up, twice))) == 1
    assert c.run(control.Switch("switch", (yes, c.up), (no, twice), (yes, c.up))) == 2
    assert c.run(control.SwitchNot("switchnot", (yes, c.up), (no, twice))) == 2


def test_condition_nets_bool_net_merge_and_combine():
    bools = control.BoolNet(("a", True), ("b", False))
    workspace.RunNetOnce(bools)
    assert bool(workspace.FetchBlob("a")) and not bool(workspace.FetchBlob("b"))
    yes, no = core.Net("yes"), core.Net("no")
    yes.AddExternalOutput(yes.Copy("a", "a_copy"))
    no.AddExternalOutput(no.Copy("b", "b_copy"))
    for relation, expected in (("Or", True), ("And", False)):
        merged = control.MergeConditionNets("merged", [yes, no], relation)
        workspace.RunNetOnce(merged)
        assert bool(workspace.FetchBlob(merged.Proto().external_output[-1])) is expected
        combined = control.CombineConditions("combined", [yes, no], relation)
        workspace.RunNetOnce(combined)
        assert bool(workspace.FetchBlob(combined.Proto().external_output[-1])) is expected
    with pytest.raises(ValueError, match="cannot be empty"):
        control.Do("nothing")


def test_step_names_are_scoped_and_unique():
    net = core.Net("n")
    net.ConstantFill([], "z", shape=[], value=0.0)
    with core.NameScope("outer"):
        first, second = control.Do("d", net, net), control.Do("d", net, net)
    assert first.Name() == "outer/d/Do" and second.Name().startswith("outer/d/Do_")


def test_brew_loop_computes_a_factorial_and_brew_cond_picks_a_branch():
    for name, v in (("n", 5), ("acc", 1), ("one", 1), ("keep", True)):
        workspace.FeedBlob(name, np.array(v))
    body = ModelHelper(name="body")
    body.net.Mul(["acc", "n"], "acc")
    body.net.Sub(["n", "one"], "n")
    cond = ModelHelper(name="cond")
    cond.net.Copy(cond.net.GT(["n", "one"]), "keep")
    model = ModelHelper(name="factorial")
    brew.loop(model, "keep", ["n", "acc", "one", "keep"], body, cond)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("acc") == 120

    then_m, else_m = ModelHelper(name="then"), ModelHelper(name="else")
    then_m.net.Add(["acc", "acc"], "out")
    else_m.net.Sub(["one", "acc"], "out")
    pick = ModelHelper(name="pick")
    brew.cond(pick, "keep", ["acc", "one", "out"], then_m, else_m)
    for keep, expected in ((True, 240), (False, -119)):
        workspace.FeedBlob("keep", np.array(keep))
        workspace.RunNetOnce(pick.net)
        assert workspace.FetchBlob("out") == expected

