"""An interpreted op writing into the buffer its output blob already holds (runtime.executor.reusable,
Specialized.into; Caffe2 keeps an output tensor's memory from run to run): FC's result lands in the old buffer
only where nothing else holds it, so no value anyone kept or views ever changes under them, and the results
are FC's either way (against a float64 product)."""
import numpy as np

from stepnet import NetDef, Workspace
from stepnet.testing import make_op

F = np.float32


def fc_net(*extra) -> NetDef:
    """Y = FC(X, W, b), then the extra ops; run interpreted (the net has an op with no compiled form)."""
    return NetDef(name="n", op=[make_op("FC", ["X", "W", "b"], ["Y"]), *extra,
                                make_op("Print", ["W"], [], to_file=0)])


def fed(rng, m=8, k=16, n=12) -> Workspace:
    ws = Workspace(compile_steps=False)
    for name, shape in (("X", (m, k)), ("W", (n, k)), ("b", (n,))):
        ws.feed(name, rng.standard_normal(shape).astype(F))
    return ws


def expected(ws):
    x, w, b = (ws.fetch(n).astype(np.float64) for n in ("X", "W", "b"))
    return x @ w.T + b


def buffer_id(ws, name) -> int:
    return ws.find(name).value.__array_interface__["data"][0]


def test_fc_writes_into_its_outputs_buffer_when_nothing_else_holds_it(capsys):
    rng = np.random.default_rng(0)
    ws = fed(rng)
    net = ws.create_net(fc_net())
    net.run()
    first = buffer_id(ws, "Y")
    for _ in range(3):
        ws.feed("X", rng.standard_normal((8, 16)).astype(F))
        net.run()
        assert buffer_id(ws, "Y") == first            # the same memory, the new values
        np.testing.assert_allclose(ws.find("Y").value, expected(ws), rtol=1e-5, atol=1e-5)


def test_a_kept_reference_or_a_view_gets_a_new_buffer(capsys):
    """A value the user kept (ws.find(...).value), a view of it in another blob (Alias), or FC reading a view
    of its own last output: each keeps its values, and FC makes a new array."""
    rng = np.random.default_rng(1)
    ws = fed(rng, m=4, k=6, n=6)
    net = ws.create_net(fc_net(make_op("Alias", ["Y"], ["Y_view"])))
    net.run()
    kept = ws.find("Y").value
    before = kept.copy()
    ws.feed("X", rng.standard_normal((4, 6)).astype(F))
    net.run()
    np.testing.assert_array_equal(kept, before)           # the user's array did not change
    assert ws.find("Y").value is not kept
    np.testing.assert_allclose(ws.find("Y").value, expected(ws), rtol=1e-5, atol=1e-5)
    del kept
    view = ws.find("Y_view").value                        # Y's buffer, held by the Alias blob too
    assert np.shares_memory(view, ws.find("Y").value)
    frozen = view.copy()
    ws.feed("X", rng.standard_normal((4, 6)).astype(F))
    net.run()
    np.testing.assert_array_equal(view, frozen)
    assert not np.shares_memory(view, ws.find("Y").value)
    # FC reading its own last output through a view (X := Y reshaped): never written while read
    ws2 = fed(rng, m=4, k=6, n=6)
    loop = ws2.create_net(NetDef(name="loop", op=[
        make_op("FC", ["X", "W", "b"], ["Y"]), make_op("Alias", ["Y"], ["X"]),
        make_op("Print", ["W"], [], to_file=0)]))
    x = ws2.fetch("X").astype(np.float64)
    w, b = ws2.fetch("W").astype(np.float64), ws2.fetch("b").astype(np.float64)
    for _ in range(3):
        loop.run()
        x = x @ w.T + b
        np.testing.assert_allclose(ws2.fetch("Y"), x, rtol=1e-4, atol=1e-4)


def test_the_check_fails_without_the_refcount_rule(monkeypatch, capsys):
    """Proof that the kept-reference test above can fail: with every buffer taken as reusable, the user's kept
    array changes under them."""
    import stepnet.runtime.executor as executor

    rng = np.random.default_rng(2)
    ws = fed(rng)
    net = ws.create_net(fc_net())
    net.run()
    monkeypatch.setattr(executor, "reusable", lambda blob: isinstance(blob.value, np.ndarray))
    kept = ws.find("Y").value
    before = kept.copy()
    ws.feed("X", rng.standard_normal((8, 16)).astype(F))
    net.run()
    assert not np.array_equal(kept, before)


def test_a_read_only_buffer_is_never_written(capsys):
    """A value fed read-only (a user's frozen array, whose only holder is the blob) gets a new array, unchanged."""
    rng = np.random.default_rng(3)
    ws = fed(rng)
    net = ws.create_net(fc_net())
    net.run()
    frozen = np.full(ws.find("Y").value.shape, 7, F)
    frozen.setflags(write=False)
    ws.find("Y").value = frozen
    del frozen
    net.run()
    np.testing.assert_allclose(ws.find("Y").value, expected(ws), rtol=1e-5, atol=1e-5)


def test_only_ops_whose_kernels_can_write_into_a_buffer_ask_for_one(capsys):
    """The per-run question (is the output's buffer free?) is asked only for records whose specialized kernels
    declare `writes_into` (FC, numpy or fused): Softmax, also specialized, never pays for it."""
    from stepnet.kernels import jit

    rng = np.random.default_rng(4)
    for fused in (False, True) if jit.installed() else (False,):
        ws = fed(rng)
        ws.fused_cells = fused
        net = ws.create_net(fc_net(make_op("Softmax", ["Y"], ["P"])))
        net.run()
        kinds = {bop.opdef.type: bop.into is not None for bop in net.ops}
        assert kinds["FC"] and not kinds["Softmax"], kinds
