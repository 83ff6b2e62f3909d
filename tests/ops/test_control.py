"""Control-flow ops (control.py): If, While, IsEmpty and Conditional, against results worked out here (Python
loops and definitions), on the CPU and the emulated device; nested control flow (If in While, Do in If); bad
inputs and their messages; static inference through them; the Mask R-CNN2Go file; a broken kernel caught by each
check. Do and its workspace stack: test_scopes.py; the gradients: test_control_grad.py."""
import numpy as np
import pytest
from control_nets import host, net, op_on, run, workspace

from stepnet.core.errors import ArgumentError, DTypeError, MissingBlobError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.io.proto import to_text
from stepnet.core.spec import TensorSpec
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, make_op, run_op

X = np.array([[-1.5, 2.0, 0.0], [3.0, -0.5, 1.0]], np.float32)


# ------------------------------------------------------------------------------------------- If
def if_net(device="cpu", text=False, else_net=True):
    """y = 2 relu(x) if c else -x (else: y unchanged without else_net)."""
    mk = op_on(device)
    then = net("then", mk("Relu", ["x"], ["r"]), mk("Scale", ["r"], ["y"], scale=2.0))
    other = net("else", mk("Negative", ["x"], ["y"]))
    nets = {"then_net": then, "else_net": other} if else_net else {"then_net": then}
    if text:
        nets = {k: to_text(v) for k, v in nets.items()}
    return net("main", mk("If", ["c", "x"], ["y"], **nets))


def check_if(device, text=False):
    for c in (True, False, [True], [[False]]):
        ws = run(if_net(device, text), device, c=np.array(c), x=X)
        want = 2 * np.maximum(X, 0) if np.array(c).item() else -X
        np.testing.assert_array_equal(host(ws, "y"), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("text", [False, True], ids=["n", "s"])
def test_if(device, text):
    check_if(device, text)


def test_if_without_else_leaves_outputs_alone():
    y0 = np.full_like(X, 7.0)
    ws = run(if_net(else_net=False), c=np.array(False), x=X, y=y0)
    np.testing.assert_array_equal(ws.fetch("y"), y0)
    ws = run(if_net(else_net=False), c=np.array(True), x=X, y=y0)
    np.testing.assert_array_equal(ws.fetch("y"), 2 * np.maximum(X, 0))


def test_if_runs_its_branches_in_its_workspace_bound_once():
    ws = workspace(x=X, c=np.array(True))
    main = ws.create_net(if_net())
    main.run()
    bound = {name: ws.net(name) for name in ws.nets()}
    assert sorted(bound) == ["main", "main/If#0.else_net(else)", "main/If#0.then_net(then)"]
    assert ws.fetch("r").shape == X.shape   # the branch's blobs are the op's workspace's blobs
    for c in (False, True, False):
        ws.feed("c", np.array(c))
        main.run()
        assert {name: ws.net(name) for name in ws.nets()} == bound   # the same Net objects: bound once


def test_branch_names_never_replace_other_nets():
    mk = op_on("cpu")
    same = net("main", mk("Copy", ["x"], ["y"]))   # both branches named like the outer net
    outer = net("main", mk("If", ["c", "x"], ["y"], then_net=same, else_net=same))
    ws = workspace(x=X, c=np.array(True))
    main = ws.create_net(outer)
    main.run()
    main.run()
    assert ws.net("main") is main and len(ws.nets()) == 3


@pytest.mark.parametrize("cond, message", [
    (np.array([True, False]), r"condition 'c' must be a bool tensor with one element, got \(2,\) bool"),
    (np.array([1.0], np.float32), r"condition 'c' must be a bool tensor with one element, got \(1,\) float32"),
    (np.zeros((0,), bool), r"condition 'c' must be a bool tensor with one element, got \(0,\) bool"),
])
def test_if_condition_must_be_one_bool(cond, message):
    with pytest.raises(ArgumentError, match=r"net 'main', op #0 \(If\): the " + message):
        run(if_net(), c=cond, x=X)


def test_if_needs_then_net_and_existing_blobs():
    with pytest.raises(ArgumentError, match=r"net 'n', op #0 \(If\): required argument 'then_net' is missing"):
        run(net("n", make_op("If", ["c"], [])), c=np.array(True))
    reads_nothing = net("then", make_op("Relu", ["nope"], ["y"]))
    with pytest.raises(MissingBlobError, match=r"net 'n/If#0.then_net\(then\)', op #0 \(Relu\): input blob "
                                               r"'nope' does not exist"):
        run(net("n", make_op("If", ["c"], ["y"], then_net=reads_nothing)), c=np.array(False))
    bad = net("n", make_op("If", ["c"], [], then_net=net("t"), else_net="op { type: 'Relu' input: 'x' "))
    with pytest.raises(Exception, match="else_net"):
        run(bad, c=np.array(True))


def test_errors_inside_a_branch_name_the_branch():
    fc = net("else", make_op("FC", ["x", "x", "x"], ["y"]))
    with pytest.raises(Exception, match=r"net 'main/If#0.else_net\(else\)', op #0 \(FC\)"):
        run(net("main", make_op("If", ["c", "x"], ["y"], then_net=net("t"), else_net=fc)), c=np.array(False), x=X)


# ------------------------------------------------------------------------------------------- While
def counting_net(device="cpu", with_cond_net=True):
    """i = 0, acc = 1; while i < n: i += 1, acc *= 2 (the condition from cond_net, or from the body)."""
    mk = op_on(device)
    test = mk("LT", ["i", "n"], ["c"])
    body = net("body", mk("Add", ["i", "one"], ["i"]), mk("Scale", ["acc"], ["acc"], scale=2.0))
    if with_cond_net:
        args = {"loop_net": body, "cond_net": net("cond", test)}
    else:
        body.op.append(test)
        args = {"loop_net": body}
    return net("count", *([] if with_cond_net else [test]),
               mk("While", ["c", "i", "n", "one", "acc"], ["i", "acc", "c"], **args))


def counting_feeds(n):
    return {"c": np.array([False]), "i": np.array([0], np.int32), "n": np.array([n], np.int32),
            "one": np.array([1], np.int32), "acc": np.array([1.0], np.float32)}


def check_while(device, with_cond_net=True):
    for n in (0, 1, 5):
        ws = run(counting_net(device, with_cond_net), device, **counting_feeds(n))
        i, acc = 0, 1.0
        while i < n:
            i, acc = i + 1, acc * 2
        assert host(ws, "i") == i and host(ws, "acc")[0] == acc and not host(ws, "c")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_cond_net", [True, False])
def test_while_counts(device, with_cond_net):
    check_while(device, with_cond_net)


def test_while_condition_and_nets_are_checked():
    feeds = dict(counting_feeds(3), c=np.array([1, 2], np.int32))
    loop = counting_net(with_cond_net=False)
    del loop.op[0]   # the condition as fed, not as the LT before the loop makes it
    with pytest.raises(ArgumentError, match=r"op #0 \(While\): the condition 'c' must be a bool tensor with one "
                                            r"element, got \(2,\) int32"):
        run(loop, **feeds)
    with pytest.raises(ArgumentError, match="required argument 'loop_net' is missing"):
        run(net("w", make_op("While", ["c"], [])), c=np.array(False))


def test_if_in_while():
    """for i in range(n): acc += i if i < k else acc -= 1, as a While whose body holds an If."""
    mk = op_on("cpu")
    branch = mk("If", ["small", "acc", "i", "one"], ["acc"],
                then_net=net("then", mk("Add", ["acc", "i"], ["acc"])),
                else_net=net("else", mk("Sub", ["acc", "one"], ["acc"])))
    body = net("body", mk("LT", ["i", "k"], ["small"]), branch, mk("Add", ["i", "one"], ["i"]),
               mk("LT", ["i", "n"], ["c"]))
    loop = net("loop", mk("LT", ["i", "n"], ["c"]), mk("While", ["c", "i", "n", "k", "acc"], ["i", "acc", "c"],
                                                       loop_net=body))
    for n, k in ((0, 3), (4, 2), (7, 7), (6, 0)):
        ws = run(loop, i=np.array(0), n=np.array(n), k=np.array(k), one=np.array(1), acc=np.array(0))
        acc = 0
        for i in range(n):
            acc = acc + i if i < k else acc - 1
        assert ws.fetch("acc") == acc


# ------------------------------------------------------------------------------------------- nested
def test_do_in_if():
    mk = op_on("cpu")
    inner = net("inner", mk("Mul", ["a", "a"], ["b"]))
    then = net("then", mk("Do", ["x", "s"], ["y", "s"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1]))
    outer = net("o", mk("CreateScope", [], ["s"]),
                mk("If", ["c", "x", "s"], ["y", "s"], then_net=then, else_net=net("else", mk("Copy", ["x"], ["y"]))),
                mk("HasScope", ["s"], ["has"]))
    for c in (True, False):
        ws = run(outer, c=np.array(c), x=X)
        np.testing.assert_array_equal(ws.fetch("y"), X * X if c else X)
        assert ws.fetch("has").tolist() == [c]


# ------------------------------------------------------------------------------------------- small ops
def check_is_empty(device):
    for x in (np.zeros((0, 3), np.float32), np.zeros(0, np.int32), X, np.array(1.0)):
        got = run_op("IsEmpty", [x], device=device)
        assert got.shape == () and got.dtype == np.bool_ and bool(got) == (x.size == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_is_empty(device):
    check_is_empty(device)


def conditional_reference(cond, t, f):
    out = np.empty_like(t)
    for i, c in enumerate(cond):
        out[i] = t[i] if c else f[i]
    return out


def check_conditional(device):
    rng = np.random.default_rng(3)
    for shape in ((4,), (3, 2), (5, 2, 3)):
        cond = rng.random(shape[0]) < 0.5
        t, f = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(run_op("Conditional", [cond, t, f], device=device),
                                      conditional_reference(cond, t, f))


@pytest.mark.parametrize("device", DEVICES)
def test_conditional(device):
    check_conditional(device)


@pytest.mark.parametrize("cond, t, f, error, message", [
    (np.ones((2, 1), bool), X, X, ShapeError, r"Condition must be 1-D, got shape \(2, 1\)"),
    (np.ones(3, bool), X, X, ShapeError, r"DataT \(2, 3\) must have 3 rows"),
    (np.ones(2, bool), X, X[:, :2], ShapeError, r"DataT \(2, 3\) and DataF \(2, 2\) must have the same shape"),
    (np.ones(2, bool), X, X.astype(np.int32), DTypeError, "DataT is float32 but DataF is int32"),
    (np.ones(2, np.int32), X, X, DTypeError, "Condition must be a bool tensor, got int32"),
])
def test_conditional_bad_inputs(cond, t, f, error, message):
    with pytest.raises(error, match=message):
        run_op("Conditional", [cond, t, f])


# ------------------------------------------------------------------------------------------- inference, files
def test_static_inference_through_control_flow():
    mk = op_on("cpu")
    do = mk("Do", ["x", "s"], ["d", "s"], net=net("i", mk("Copy", ["a"], ["b"])), inner_blobs=["a", "b"],
            outer_blobs_idx=[0, 1])
    outer = net("o", mk("IsEmpty", ["x"], ["empty"]), *if_net().op, *counting_net(with_cond_net=False).op,
                mk("CreateScope", [], ["s"]), do, mk("Relu", ["y"], ["r2"]), mk("Conditional", ["flags", "x", "x"],
                                                                             ["sel"]))
    specs = infer_net(outer, {"x": TensorSpec.of(X), "flags": TensorSpec.of(np.ones(2, bool))})
    assert specs["empty"].shape == () and specs["empty"].value == np.False_
    assert all(specs[n].shape is None for n in ("y", "r2", "d", "i"))   # written by nested nets: unknown
    assert specs["sel"].shape == X.shape


def test_maskrcnn2go_needs_only_the_detection_ops(data_dir, capsys):
    from stepnet.cli.run import main

    assert main(["inspect", str(data_dir / "models/maskrcnn2go_fp32_model.pb")]) == 0
    out = capsys.readouterr().out
    listed = {item.split("×")[0] for item in out.split("unsupported ops (this build cannot run them): ")[-1]
              .strip().split(", ")} if "unsupported ops" in out else set()
    assert listed <= {"BBoxTransform", "BoxWithNMSLimit", "GenerateProposals", "RoIAlign"}, listed
    assert "If" in REGISTRY and "IsEmpty" in REGISTRY


# ------------------------------------------------------------------------------------------- broken kernels
def _then_always(ctx, xp, condition, *rest, then_net, else_net):
    """The real kernel with the condition forced true."""
    return _KERNELS["If"](ctx, xp, np.array(True), *rest, then_net=then_net, else_net=else_net)


def _one_more_iteration(ctx, xp, *inputs, loop_net, cond_net):
    _KERNELS["While"](ctx, xp, *inputs, loop_net=loop_net, cond_net=cond_net)
    ctx.bind(ctx.state["nets"]["loop_net"]).run()


_KERNELS = {t: REGISTRY.get(t).kernel for t in ("If", "While")}
BROKEN = {
    "If": (check_if, _then_always),
    "While": (check_while, _one_more_iteration),
    "IsEmpty": (check_is_empty, lambda xp, x: xp.asarray(x.size > 0)),
    "Conditional": (check_conditional, lambda xp, c, t, f: xp.where(c.reshape((-1,) + (1,) * (t.ndim - 1)), f, t)),
}


@pytest.mark.parametrize("op_type", sorted(BROKEN))
def test_each_check_catches_a_broken_kernel(op_type, broken):
    check, wrong = BROKEN[op_type]
    check("cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check("cpu")


def test_while_over_do_as_caffe2_lays_it_out():
    """Caffe2's add_while_op form: the body and the condition are each one Do in its own scope; the body's Do copies
    the loop's blobs (copy_external_blobs), so its stack keeps one workspace per iteration with that iteration's
    values (what a gradient would pop)."""
    mk = op_on("cpu")
    body = net("body", mk("Add", ["i", "one"], ["i"]), mk("Scale", ["acc"], ["acc"], scale=2.0))
    cond = net("cond", mk("LT", ["i", "n"], ["c"]))
    loop_do = mk("Do", ["i", "acc", "one", "loop_ws"], ["i", "acc", "loop_ws"], net=body,
                 inner_blobs=["i", "acc", "one"], outer_blobs_idx=[3, 4, 2], copy_external_blobs=1)
    cond_do = mk("Do", ["i", "n", "cond_ws"], ["c", "cond_ws"], net=cond, inner_blobs=["i", "n", "c"],
                 outer_blobs_idx=[0, 1, 2])
    w = net("w", mk("CreateScope", [], ["loop_ws"]), mk("CreateScope", [], ["cond_ws"]),
            mk("While", ["c", "i", "acc", "one", "n", "loop_ws", "cond_ws"], ["i", "acc", "c", "loop_ws", "cond_ws"],
               loop_net=net("do_loop_body_net", loop_do), cond_net=net("do_loop_condition_net", cond_do)))
    ws = run(w, **counting_feeds(4))
    assert ws.fetch("i").tolist() == [4] and ws.fetch("acc").tolist() == [16.0]
    stack = ws.get_blob("loop_ws").value
    assert stack.top == 3 and [s.fetch("i").tolist() for s in stack.workspaces] == [[1], [2], [3], [4]]
    assert ws.get_blob("cond_ws").value.top == 4   # the condition ran 5 times, each in a pushed workspace


def test_a_while_whose_condition_nothing_writes_is_refused():
    """A true condition that no op of loop_net or cond_net (or of a net nested in them) writes: the loop could
    never end, so it is refused before its first iteration (fuzz seeds 909 and 991 hung on it); false at the
    start, the loop simply does not run."""
    mk = op_on("cpu")
    branch = mk("If", ["f", "x"], ["y"], then_net=net("t", mk("Exp", ["x"], ["y"])))
    body = net("body", mk("Tanh", ["x"], ["x"]), branch)
    cond = net("cond", mk("Not", ["f"], ["g"]))
    loop = net("loop", mk("While", ["c", "x", "f"], ["x"], loop_net=body, cond_net=cond))
    with pytest.raises(ArgumentError, match=r"op #0 \(While\): the condition 'c' is true and no op of loop_net or "
                                            "cond_net writes it"):
        run(loop, c=np.array([True]), x=np.ones(2, np.float32), f=np.array([False]))
    ws = run(loop, c=np.array([False]), x=np.ones(2, np.float32), f=np.array([False]))
    assert ws.fetch("x").tolist() == [1.0, 1.0]


@pytest.mark.parametrize("case", ["written in a nested branch", "Alias", "an op that writes unnamed", "a view",
                                  "shared array"])
def test_a_condition_that_may_change_unnamed_is_not_refused(case):
    """What _may_change counts as a way to change the condition besides naming it as an output."""
    from stepnet.ops.control import _may_change, _writes
    from stepnet.runtime.workspace import Workspace

    ws = Workspace()
    ws.feed("c", np.array([True]))
    ws.feed("x", np.ones(2, np.float32))
    blob = ws.get_blob("c")
    nested = net("t", make_op("Not", ["c"], ["c"]))          # (the If itself names only y)
    ops = {"written in a nested branch": [make_op("If", ["c", "x"], ["y"], then_net=nested)],
           "Alias": [make_op("Alias", ["c"], ["a"])],
           "an op that writes unnamed": [make_op("Load", [], [], db="x.minidb", db_type="minidb", load_all=1)],
           "a view": [make_op("Tanh", ["x"], ["x"])], "shared array": [make_op("Not", ["c"], ["d"])]}[case]
    if case == "a view":
        blob.set_view(np.array([True, False])[:1])
    if case == "shared array":
        ws.create_blob("d").value = blob.value
    assert _may_change(blob, "c", _writes([net("body", *ops)]), ws)
    plain = _writes([net("body", make_op("Tanh", ["x"], ["x"]), make_op("Print", ["x"], []))])   # Print: a
    assert not _may_change(blob, "c", plain, ws) or case in ("a view", "shared array")      # context op, no writes


def test_a_while_that_never_ends_is_interrupted_by_ctrl_c(tmp_path):
    """While has no iteration cap (Caffe2 has none; a decoder loops until its end token): a loop whose condition
    never turns false, nested in a Do, must stop on SIGINT with one line and exit status 130."""
    import signal
    import subprocess
    import sys

    from stepnet import NetDef, save

    body = NetDef(name="body", op=[make_op("ConstantFill", [], ["c"], shape=[1], value=1, dtype=5),   # true again
                                   make_op("Print", ["c"], [])])      # a line per iteration: the loop runs
    loop = NetDef(name="inner", op=[make_op("ConstantFill", [], ["c"], shape=[1], value=1, dtype=5),
                                    make_op("While", ["c"], ["c"], loop_net=body)])
    save(NetDef(name="forever", op=[make_op("CreateScope", [], ["s"]),
                                    make_op("Do", ["s"], ["s"], net=loop)]), tmp_path / "forever.pbtxt")
    proc = subprocess.Popen([sys.executable, "-m", "stepnet", "run", str(tmp_path / "forever.pbtxt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline(), proc.communicate()   # waits for the loop's first iteration, however slow
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)          # (a guard against a hang, not a measure of speed)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.decode().splitlines() == ["stepnet: interrupted"], err
