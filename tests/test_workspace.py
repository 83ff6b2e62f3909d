"""Workspace: blobs, feed/fetch, parent-chain binding (spec §2), nets."""
import numpy as np
import pytest

from stepnet.runtime.workspace import numpy_blas
from stepnet import NetDef, Workspace
from stepnet.core.errors import MissingBlobError, NetError, StepnetError
from stepnet.testing import make_op


def net(name, *ops, external_input=(), external_output=()):
    nd = NetDef(name=name, external_input=list(external_input), external_output=list(external_output))
    nd.op.extend(ops)
    return nd


def test_feed_keeps_dtype_and_copies():
    ws = Workspace()
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    ws.feed("a", a)
    a[0, 0] = 100
    out = ws.fetch("a")
    assert out.dtype == np.float64 and out[0, 0] == 0
    out[0, 1] = 50
    assert ws.fetch("a")[0, 1] == 1  # fetch returns a copy too
    ws.feed("i", [1, 2, 3])
    assert ws.fetch("i").dtype == np.int64  # Python ints become int64, as in Caffe2's FeedBlob
    ws.feed("s", "hello")
    assert ws.fetch("s") == "hello"


def test_fetch_missing_suggests():
    ws = Workspace()
    ws.feed("hidden_init", np.zeros(2))
    with pytest.raises(MissingBlobError, match="hidden_int.*did you mean hidden_init"):
        ws.fetch("hidden_int")
    ws.create_blob("empty")
    with pytest.raises(MissingBlobError, match="no value"):
        ws.fetch("empty")


def test_parent_chain_lookup_and_create_binding():
    root = Workspace()
    root.feed("shared", np.ones(2))
    child = Workspace(parent=root)
    assert child.has("shared") and child.find("shared") is root.find("shared")
    # CreateBlob binds to the ancestor's blob when the name exists anywhere in the chain ...
    assert child.create_blob("shared") is root.find("shared")
    # ... and creates locally otherwise; the parent does not see child blobs.
    b = child.create_blob("local")
    assert child.local_blobs() == ["local"] and not root.has("local") and child.find("local") is b
    assert child.blobs() == ["local", "shared"]
    # create_local_blob shadows.
    shadow = child.create_local_blob("shared")
    assert shadow is not root.find("shared") and child.find("shared") is shadow


def test_child_net_output_binds_to_ancestor_blob():
    """A net created in a child writes outputs whose names exist in an ancestor into the ancestor's blob."""
    root = Workspace()
    root.feed("x", np.array([1.0, 2.0], np.float32))
    root.feed("y", np.zeros(2, np.float32))
    child = Workspace(parent=root)
    child.run_net_once(net("n", make_op("Relu", ["x"], ["y"]), make_op("Relu", ["x"], ["z"])))
    np.testing.assert_array_equal(root.fetch("y"), [1.0, 2.0])
    assert not root.has("z") and child.has("z")


def test_create_net_refuses_duplicate_and_missing_input():
    ws = Workspace()
    ws.feed("x", np.ones((2, 2), np.float32))
    nd = net("n", make_op("Relu", ["x"], ["y"]))
    ws.create_net(nd)
    with pytest.raises(NetError, match="already exists.*overwrite=True"):
        ws.create_net(nd)
    ws.create_net(nd, overwrite=True)
    with pytest.raises(MissingBlobError, match="input blob 'w' does not exist"):
        ws.create_net(net("m", make_op("FC", ["x", "w", "b"], ["y"])))
    with pytest.raises(NetError, match="no net named 'nn'.*did you mean n"):
        ws.run_net("nn")


def test_create_net_with_input_blobs_then_feed():
    ws = Workspace()
    n = ws.create_net(net("n", make_op("Relu", ["x"], ["y"])), input_blobs=["x"])
    ws.feed("x", np.array([-1.0, 3.0], np.float32))
    n.run()
    np.testing.assert_array_equal(ws.fetch("y"), [0.0, 3.0])


def test_run_net_iterations_and_state():
    ws = Workspace()
    ws.run_net_once(net("init", make_op("ConstantFill", [], ["it"], shape=[1], value=0, dtype=10)))
    ws.create_net(net("train", make_op("Iter", ["it"], ["it"])))
    ws.run_net("train", iterations=5)
    assert ws.fetch("it").tolist() == [5]


def test_blob_view_write_through():
    ws = Workspace()
    big = np.zeros((3, 2), np.float32)
    blob = ws.create_blob("row")
    blob.set_view(big[1:2])
    blob.set(np.array([[4.0, 5.0]], np.float32))
    np.testing.assert_array_equal(big[1], [4.0, 5.0])
    blob.set(np.array([7.0, 8.0], np.float32))  # same size, new shape: still written through, shape kept new
    np.testing.assert_array_equal(big[1], [7.0, 8.0])
    assert ws.fetch("row").shape == (2,)
    blob.set(np.ones(5, np.float32))  # a different size rebinds and ends the view
    assert not blob.view and big[1].tolist() == [7.0, 8.0]


def test_rng_is_seeded_per_workspace():
    def draw(seed):
        ws = Workspace(seed=seed)
        ws.run_net_once(net("n", make_op("GaussianFill", [], ["g"], shape=[4])))
        return ws.fetch("g")
    np.testing.assert_array_equal(draw(3), draw(3))
    assert not np.array_equal(draw(3), draw(4))


def test_bind_keeps_one_binding_per_netdef_and_replaces_it_for_another():
    """The sub-net primitive: a NetDef is bound once per workspace and kept under its name; another NetDef of
    that name replaces it; `local` blobs are the workspace's own even when an ancestor has one of that name."""
    root = Workspace()
    root.feed("x", np.ones(2, np.float32))
    root.feed("k", np.zeros(1, np.float32))
    child = Workspace(parent=root)
    nd = net("body", make_op("Relu", ["x"], ["y"]), make_op("Sigmoid", ["x"], ["k"]))
    first = child.bind(nd, local=["k"])
    assert child.bind(nd) is first and child.net("body") is first and child.nets() == ["body"]
    assert child.get_blob("k") is not root.get_blob("k")     # local: the step's own k, root's untouched
    first.run()
    np.testing.assert_array_equal(root.fetch("k"), [0])
    same_name = net("body", make_op("Tanh", ["x"], ["y"]))
    second = child.bind(same_name)
    assert second is not first and child.net("body") is second and child.bind(same_name) is second
    assert root.nets() == []                                  # bound where asked, nowhere else


def test_binding_a_net_leaves_the_netdef_unchanged():
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    nd = net("n", make_op("Relu", ["x"], ["y"]))
    before = nd.SerializeToString()
    ws.bind(nd).run()
    ws.create_net(nd, overwrite=True).run()
    assert nd.SerializeToString() == before


def blas_counts() -> list[int]:
    """The thread counts of numpy's BLAS libraries (what Workspace(threads=) holds)."""
    return [lib.get_num_threads() for lib in numpy_blas().lib_controllers]


def _register_recorder(temporary_op):
    """A RecordThreads op appending the BLAS thread counts (threadpoolctl) it sees to the returned list, and a
    RunNet op running its net argument as a sub-net."""

    from stepnet.ops.registry import Arg

    seen = []

    def record(xp):
        seen.append(blas_counts())
    temporary_op("RecordThreads", record, inputs=0, outputs=0)
    temporary_op("RunNet", lambda ctx, xp, *, net: ctx.bind(net).run(), inputs=0, outputs=0, context=True,
                 args={"net": Arg("net")})
    return seen


def _blas_threads_seen(seen, **ws_args):
    """The counts seen inside a top-level net and inside its sub-net."""
    from stepnet.io.proto import NetDef

    seen.clear()
    inner = NetDef(name="inner")
    inner.op.add(type="RecordThreads")
    outer = NetDef(name="outer")
    outer.op.add(type="RecordThreads")
    run = outer.op.add(type="RunNet")
    run.arg.add(name="net", n=inner)
    Workspace(**ws_args).run_net_once(outer)
    return seen


def test_threads_holds_blas_while_a_net_runs(temporary_op):
    from threadpoolctl import threadpool_limits

    seen = _register_recorder(temporary_op)
    with threadpool_limits(2, user_api="blas"):
        before = blas_counts()
        assert _blas_threads_seen(seen, threads=1) == [[1] * len(before)] * 2
        assert blas_counts() == before
        assert _blas_threads_seen(seen) == [[1] * len(before)] * 2    # the default: DEFAULT_THREADS, as the CLI
        assert _blas_threads_seen(seen, threads=0) == [before] * 2      # 0: BLAS as the process has it


def test_threads_costs_nothing_when_blas_already_runs_that_many(temporary_op):
    """Where numpy's BLAS already runs `threads` threads, a run does not go through threadpoolctl (its limit
    costs about 8 µs a run: a third of a sampled character), whatever other BLAS libraries run; the count seen
    is the same."""
    from threadpoolctl import threadpool_limits

    import scipy.linalg  # noqa: F401 - SciPy's own BLAS loaded beside numpy's (numba imports SciPy)
    from threadpoolctl import ThreadpoolController

    seen = _register_recorder(temporary_op)
    ws = Workspace(threads=1)
    with threadpool_limits(1, user_api="blas"):
        assert ws.blas_threads() is None
        assert _blas_threads_seen(seen, threads=1) == [[1] * len(seen[0])] * 2
    with threadpool_limits(1, user_api="blas"):
        others = [lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
                  if lib.filepath not in {own.filepath for own in numpy_blas().lib_controllers}]
        for lib in others:
            lib.set_num_threads(2)      # another BLAS's count is not what stepnet's kernels use
        assert Workspace(threads=1).blas_threads() is None
    with threadpool_limits(2, user_api="blas"):
        before = blas_counts()
        limit = ws.blas_threads()
        assert (limit is None) == (set(before) == {1})      # (a one-CPU machine's OpenBLAS stays at 1)
        if limit is not None:
            with limit:
                assert set(blas_counts()) == {1}
        assert blas_counts() == before


def test_the_thread_count_call_reads_what_threadpoolctl_reads():
    """kernels.blas.thread_count: OpenBLAS's own function (found once) where numpy ships an OpenBLAS with its own
    threads, as numpy's wheels do; whichever call, it reads the count threadpoolctl reads, as it changes."""
    from threadpoolctl import threadpool_limits

    from stepnet.kernels.blas import thread_count

    for lib in numpy_blas().lib_controllers:
        count = thread_count(lib)
        if lib.internal_api == "openblas" and lib.threading_layer != "openmp":
            assert getattr(count, "__self__", None) is not lib      # not threadpoolctl's per-call lookup
        for n in (1, 2, 1):
            with threadpool_limits(n, user_api="blas"):
                assert count() == lib.get_num_threads()


def test_a_failing_run_gives_blas_its_count_back(temporary_op):
    """The hold (kernels.blas.ThreadHold) restores each library's count when the net raises, and a run nested
    in another's hold finds BLAS held already and takes no hold of its own."""
    from threadpoolctl import threadpool_limits

    def fail(xp):
        raise ValueError("deliberate")
    temporary_op("FailNow", fail, inputs=0, outputs=0)
    ws = Workspace(threads=1)
    with threadpool_limits(2, user_api="blas"):
        before = blas_counts()
        net = NetDef(name="fails")
        net.op.add(type="FailNow")
        with pytest.raises(StepnetError, match="deliberate"):
            ws.run_net_once(net)
        assert blas_counts() == before
        hold = ws.blas_threads()
        assert (hold is None) == (set(before) == {1})      # (a one-CPU machine's OpenBLAS stays at 1)
        if hold is not None:
            with hold:
                assert set(blas_counts()) == {1} and ws.blas_threads() is None
        assert blas_counts() == before


def test_threads_holds_blas_while_a_plan_runs(temporary_op):
    """A plan's nets are bound one level below it: the plan itself holds BLAS at `threads`."""
    from threadpoolctl import threadpool_limits

    from stepnet.io.proto import PlanDef

    seen = _register_recorder(temporary_op)
    plan = PlanDef(name="p")
    net = plan.network.add(name="n")
    net.op.add(type="RecordThreads")
    plan.execution_step.add(name="s", network=["n"], num_iter=2)
    with threadpool_limits(2, user_api="blas"):
        before = blas_counts()
        Workspace(threads=1).run_plan(plan)
        assert seen == [[1] * len(before)] * 2
        assert blas_counts() == before


def test_threads_is_inherited_and_checked():
    from stepnet.runtime.workspace import DEFAULT_THREADS

    parent = Workspace(threads=2)
    assert Workspace(parent=parent).threads == 2 and Workspace().threads == DEFAULT_THREADS == 1
    assert Workspace(threads=0).threads is None and Workspace(parent=Workspace(threads=0)).threads is None
    with pytest.raises(ValueError, match="threads must be an int >= 0, got -1"):
        Workspace(threads=-1)


def test_one_default_thread_count_for_the_cli_the_api_and_compat():
    """The Python API, stepnet.compat and `stepnet run` hold BLAS at the same default (runtime.workspace)."""
    from stepnet.cli.run import build_parser
    from stepnet.compat import workspace as compat_workspace
    from stepnet.runtime.workspace import DEFAULT_THREADS

    compat_workspace.ResetWorkspace()
    assert compat_workspace._ws().threads == Workspace().threads == DEFAULT_THREADS
    assert build_parser().parse_args(["run", "m.pbtxt"]).threads == DEFAULT_THREADS
