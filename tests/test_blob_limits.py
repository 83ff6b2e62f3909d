"""--max-blob-bytes while nets run (issue #24 §2): ops whose output sizes come from their arguments, their inputs'
shapes or values (records with `grows`) are refused before their kernel allocates; every stored result is held
to the limit (the executor's backstop), nested nets (While, If, Do, step nets) included; image feeds are checked
from their header; static inference sizes huge outputs without building them. Each case: a model a few hundred
bytes long asks for a blob of about 4 MB; under a 1 MiB limit it is refused with the one message (and nothing of
its size is allocated: tracemalloc, which sees numpy's allocations, and a kernel that must not be called), under
a generous limit the same model runs."""
import contextlib
import tracemalloc
from typing import NamedTuple

import numpy as np
import pytest

from stepnet import NetDef, Workspace, save
from stepnet.cli.run import main
from stepnet.core.errors import ResourceError
from stepnet.core.limits import Limits
from stepnet.core.spec import spec
from stepnet.passes.shapes import infer_net
from stepnet.testing import make_op

MIB = 1 << 20
SMALL, GENEROUS = Limits(max_blob_bytes=MIB), Limits(max_blob_bytes=64 * MIB)
f32, i32, i64 = np.float32, np.int32, np.int64


class Case(NamedTuple):
    op: str
    inputs: dict            # name -> array (the model's inputs, fed)
    args: dict
    blob: str               # what the refusal says of output 'y'


CASES = {
    "Tile": Case("Tile", {"x": np.ones((1, 1000), f32)}, {"tiles": 1000, "axis": 0}, "(1000, 1000) float32"),
    "OneHot": Case("OneHot", {"i": np.array([1], i64), "n": np.array([1000000], i64)}, {}, "(1, 1000000) float32"),
    "ResizeNearest": Case("ResizeNearest", {"x": np.ones((1, 1, 4, 4), f32)}, {"width_scale": 250.0,
                                                                               "height_scale": 250.0},
                          "(1, 1, 1000, 1000) float32"),
    "ResizeNearest-scales": Case("ResizeNearest", {"x": np.ones((1, 1, 4, 4), f32),
                                                   "s": np.array([250, 250], f32)}, {}, "(1, 1, 1000, 1000) float32"),
    "PadImage": Case("PadImage", {"x": np.ones((1, 1, 1, 1), f32)}, {"pad": 500}, "(1, 1, 1001, 1001) float32"),
    "Conv-pads": Case("Conv", {"x": np.ones((1, 1, 1, 1), f32), "w": np.ones((1, 1, 1, 1), f32)},
                      {"kernel": 1, "pad": 500}, "(1, 1, 1001, 1001) float32"),
    "ConvTranspose-stride": Case("ConvTranspose", {"x": np.ones((1, 1, 2, 2), f32), "w": np.ones((1, 1, 1, 1), f32)},
                                 {"kernel": 1, "stride": 1000}, "(1, 1, 1001, 1001) float32"),
    "LengthsToSegmentIds": Case("LengthsToSegmentIds", {"l": np.array([1000000], i32)}, {}, "(1000000,) int32"),
    "Mul-broadcast": Case("Mul", {"a": np.ones((1000, 1), f32), "b": np.ones((1, 1000), f32)}, {},
                          "(1000, 1000) float32"),
    "Gather": Case("Gather", {"d": np.ones((1, 1000), f32), "i": np.zeros(1000, i64)}, {}, "(1000, 1000) float32"),
    "LengthsTile": Case("LengthsTile", {"d": np.ones((1, 1000), f32), "l": np.array([1000], i32)}, {},
                        "(1000, 1000) float32"),
    "SparseToDense": Case("SparseToDense", {"i": np.array([999], i64), "v": np.ones((1, 1000), f32)}, {},
                          "(1000, 1000) float32"),
    "Concat": Case("Concat", {**{f"x{k}": np.ones(100000, f32) for k in range(10)}}, {"axis": 0},
                   "(1000000,) float32"),
    "MatMul": Case("MatMul", {"a": np.ones((1000, 1), f32), "b": np.ones((1, 1000), f32)}, {},
                   "(1000, 1000) float32"),
    "GatherRanges": Case("GatherRanges", {"d": np.ones(1000, f32), "r": np.full((1, 1000, 2), [0, 1000], i32)}, {},
                         "(1000000,) float32"),
    "FC": Case("FC", {"x": np.ones((1000, 1), f32), "w": np.ones((1000, 1), f32), "b": np.ones(1000, f32)}, {},
               "(1000, 1000) float32"),
    "LengthsTile-long": Case("LengthsTile", {"d": np.ones((100, 100), f32), "l": np.full(100, 100, i32)}, {},
                             "(10000, 100) float32"),   # lengths of 100 entries: more than specs carry statically
}


def model(case: Case) -> NetDef:
    outputs = ["y", "y_more"] if case.op in ("Concat", "GatherRanges") else ["y"]
    return NetDef(name="model", op=[make_op(case.op, list(case.inputs), outputs, **case.args)])


@contextlib.contextmanager
def peak_memory():
    """peak[0]: the most memory traced while the block ran (tracemalloc sees numpy's arrays)."""
    peak = [0]
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def fed(case: Case, limits: Limits) -> Workspace:
    """A fresh workspace fed the case's inputs."""
    ws = Workspace(limits=limits)
    for name, value in case.inputs.items():
        ws.feed(name, value)
    return ws


def refusal(case: Case, limit: int = MIB) -> str:
    dims, dtype = case.blob.rsplit(" ", 1)
    nbytes = int(np.prod([int(d) for d in dims.strip("(,)").split(",")])) * np.dtype(dtype).itemsize
    return (f"net 'model', op #0 ({case.op}): blob 'y' would be {case.blob}, {nbytes} bytes ({nbytes / MIB:.1f} "
            f"MiB), over the limit of {limit} bytes (1.0 MiB) per blob; raise it with --max-blob-bytes SIZE")


@pytest.mark.parametrize("name", CASES)
def test_an_op_that_grows_is_refused_before_its_kernel(name, patched):
    case = CASES[name]
    from stepnet.ops import REGISTRY

    calls = []
    kernel = REGISTRY.get(case.op).kernel
    patched(case.op, kernel=lambda *a, **k: calls.append(1) or kernel(*a, **k))
    ws = fed(case, GENEROUS)
    with peak_memory() as peak:
        ws.run_net_once(model(case))                    # under a generous limit the model runs
    y = ws.fetch("y")
    assert calls == [1] and f"{y.shape} {y.dtype}" == case.blob
    assert peak[0] >= y.nbytes                          # (the measure sees the blob when it is made)
    ws = fed(case, SMALL)
    with peak_memory() as peak, pytest.raises(ResourceError) as info:
        ws.run_net_once(model(case))                    # under 1 MiB it is refused
    assert str(info.value).startswith(refusal(case)), str(info.value)
    # before the kernel: nothing of the blob's size (about 4 MB) allocated; the bound leaves room for what the
    # refusal itself allocates (its message, the traceback, and caches a first error fills)
    assert calls == [1] and peak[0] < MIB


def test_without_the_check_before_the_kernel_the_blob_is_allocated_and_the_backstop_refuses_it(patched):
    case = CASES["Mul-broadcast"]
    patched("Mul", grows=None)                          # the rule broken: no check before the kernel
    ws = fed(case, SMALL)
    with peak_memory() as peak, pytest.raises(ResourceError) as info:
        ws.run_net_once(model(case))
    assert str(info.value).startswith(refusal(case)) and peak[0] >= 4000000   # allocated, then refused


def test_the_backstop_holds_every_stored_result_to_the_limit(temporary_op, monkeypatch):
    """An op no record marks as growing (a throwaway doubler) is stopped when its result is stored; with the
    backstop taken out the result would be kept."""
    from stepnet.ops import binding

    temporary_op("TestDouble", lambda xp, x: xp.concatenate([x, x]))
    ws = Workspace(limits=SMALL)
    ws.feed("x", np.ones(200000, f32))                  # 800 KB, under the limit; doubled it is over
    net = NetDef(name="model", op=[make_op("TestDouble", ["x"], ["y"])])
    with pytest.raises(ResourceError, match=r"^net 'model', op #0 \(TestDouble\): blob 'y' would be \(400000,\) "
                                            r"float32, 1600000 bytes \(1.5 MiB\), over the limit"):
        ws.run_net_once(net)
    assert ws.find("y").value is None                  # nothing over the limit was stored
    ws.feed("x", np.ones(100000, f32))
    ws.run_net_once(net)
    assert ws.fetch("y").shape == (200000,)
    monkeypatch.setattr(binding, "store", lambda blob, value, limit, label: setattr(blob, "value", value))
    ws.feed("x", np.ones(200000, f32))
    ws.run_net_once(net)                                # the rule broken: the blob over the limit is kept
    assert ws.fetch("y").nbytes > MIB


def _while_doubling(op_type: str) -> NetDef:
    """While(true): x2 = op(x, x), x = x2 each iteration, forever: only the blob limit stops it."""
    cond = NetDef(name="cond", op=[make_op("ConstantFill", [], ["c"], shape=[1], dtype=5, value=True)])
    double = (make_op("Concat", ["x", "x"], ["x2", "x_split"], axis=0) if op_type == "Concat" else
              make_op(op_type, ["x"], ["x2"]))
    loop = NetDef(name="loop", op=[double, make_op("Copy", ["x2"], ["x"])])
    return NetDef(name="model", op=[make_op("ConstantFill", [], ["c"], shape=[1], dtype=5, value=True),
                                    make_op("While", ["c", "x"], ["x", "c"], loop_net=loop, cond_net=cond)])


@pytest.mark.parametrize("op_type", ["Concat", "TestDouble"])
def test_a_while_doubling_a_tensor_is_stopped_at_the_limit(op_type, temporary_op):
    """Nested nets run through the same executor: a Concat (grows) is refused before it allocates 1 MiB; an op
    not marked (TestDouble) when its 1.5 MiB result is stored."""
    temporary_op("TestDouble", lambda xp, x: xp.concatenate([x, x]))
    ws = Workspace(limits=SMALL)
    ws.feed("x", np.ones(3, f32))
    with peak_memory() as peak, pytest.raises(ResourceError) as info:
        ws.run_net_once(_while_doubling(op_type))
    message = str(info.value)
    assert message.startswith(f"net 'model/While#1.loop_net(loop)', op #0 ({op_type}): blob 'x2' would be (393216,) "
                              "float32, 1572864 bytes (1.5 MiB), over the limit of 1048576 bytes"), message
    assert ws.fetch("x").shape == (196608,)             # the last doubling under the limit is kept
    assert peak[0] < (3 if op_type == "Concat" else 4) * MIB   # x and its doubling at most, never a runaway


@pytest.mark.parametrize("op_type", ["If", "Do"])
def test_the_nets_of_if_and_do_meet_the_workspaces_limit(op_type):
    """(A Do runs in a workspace of its own, which once took the default limits: its nets escaped the flag.)"""
    def nested(n: int) -> NetDef:
        inner = NetDef(name="inner", op=[make_op("ConstantFill", [], ["y"], shape=[n], value=1.0)])
        if op_type == "If":
            return NetDef(name="model", op=[make_op("If", ["c"], ["y"], then_net=inner)])
        return NetDef(name="model", op=[make_op("CreateScope", [], ["scope"]),
                                        make_op("Do", ["c", "scope"], ["y", "scope"], net=inner, inner_blobs=["c", "y"],
                                                outer_blobs_idx=[0, 1])])
    ws = Workspace(limits=SMALL)
    ws.feed("c", np.array([True]))
    ws.run_net_once(nested(1000))
    assert ws.fetch("y").shape == (1000,)
    with pytest.raises(ResourceError, match=rf"^net 'model/{op_type}#\d\.\w+\(inner\)', op #0 \(ConstantFill\): "
                                            r"blob 'y' would be \(1000000,\) float32"):
        ws.run_net_once(nested(1000000))


def _save(nd: NetDef, path) -> str:
    save(nd, path)
    return str(path)


def test_the_cli_refuses_in_one_line_what_static_inference_cannot_see(tmp_path, monkeypatch, capsys):
    """A While in a predict net, and OneHot's index_size from a Cast of a float (no value statically)."""
    monkeypatch.chdir(tmp_path)
    init = NetDef(name="init", op=[make_op("ConstantFill", [], ["x"], shape=[3], value=1.0),
                                   make_op("ConstantFill", [], ["size"], shape=[1], value=1000000.0),
                                   make_op("ConstantFill", [], ["i"], shape=[1], dtype=10, value=1)])
    one_hot = NetDef(name="predict", op=[make_op("Cast", ["size"], ["n"], to=10), make_op("OneHot", ["i", "n"], ["y"])],
                     external_output=["y"])
    _save(init, "init.pbtxt"), _save(one_hot, "one_hot.pbtxt")
    assert main(["run", "init.pbtxt", "one_hot.pbtxt", "--max-blob-bytes", "1M", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "stepnet: error: net 'predict', op #1 (OneHot): blob 'y' would be (1, 1000000) float32, 4000000 bytes"), err
    assert main(["run", "init.pbtxt", "one_hot.pbtxt", "--max-blob-bytes", "8M", "-q"]) == 0
    loop = _while_doubling("Concat")
    loop.external_output.append("x")
    _save(NetDef(name="predict", op=loop.op, external_output=["x"]), "loop.pbtxt")
    assert main(["run", "init.pbtxt", "loop.pbtxt", "--max-blob-bytes", "1M", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "op #0 (Concat): blob 'x2' would be (393216,) float32" in err, err


# ----------------------------------------------------------------------------------------- image feeds
def test_an_image_feed_is_checked_from_its_header_before_decoding(tmp_path, monkeypatch, capsys):
    from PIL import Image, ImageFile

    monkeypatch.chdir(tmp_path)
    Image.new("1", (1000, 1000)).save("big.png")        # a few hundred bytes; 3 MB as an RGB blob
    assert (tmp_path / "big.png").stat().st_size < 2000
    from stepnet.io.feeds import parse_feed

    assert parse_feed("X=big.png", 4 * MIB)["X"].shape == (1, 1000, 1000, 3)
    assert parse_feed("X=big.png:gray", MIB)["X"].shape == (1, 1000, 1000, 1)   # 1 MB: under the limit
    loads = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im))
    with pytest.raises(ResourceError, match=r"^--feed big.png: blob 'X' would be \(1, 1000, 1000, 3\) uint8, "
                                            r"3000000 bytes \(2.9 MiB\), over the limit of 1048576 bytes"):
        parse_feed("X=big.png", MIB)
    with pytest.raises(ResourceError, match=r"^--feed big.png: blob 'big.png' would be \(1, 1000, 1000, 4\)"):
        parse_feed("big.png:rgba", MIB)                 # (no name: the predict net's first input)
    assert loads == []                                  # refused before Pillow decoded a pixel
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    _save(NetDef(name="net", op=[make_op("Copy", ["X"], ["y"])]), "init.pbtxt")     # a net that reads X
    assert main(["run", "init.pbtxt", "--feed", "X=big.png", "--max-blob-bytes", "1M", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stepnet: error: --feed big.png: blob 'X' would be"), err
    assert main(["run", "init.pbtxt", "--feed", "X=big.png", "--max-blob-bytes", "4M", "-q"]) == 0


# ----------------------------------------------------------------------------------------- static inference
BOMBS = {   # a shape function sizing these by building index arrays, or folding values, took GBs and seconds
    "PadImage": (make_op("PadImage", ["x"], ["y"], pad=100000000), {"x": spec((1, 1, 1, 1))},
                 "(1, 1, 200000001, 200000001) float32", make_op("PadImage", ["x"], ["y"], pad=1, mode="reflect")),
    "ResizeNearest": (make_op("ResizeNearest", ["x"], ["y"], width_scale=2e8), {"x": spec((1, 1, 1, 1))},
                      "(1, 1, 1, 200000000) float32", make_op("ResizeNearest", ["x"], ["y"], width_scale=3.0)),
    "LengthsRangeFill": (make_op("LengthsRangeFill", ["l"], ["y"]), {"x": spec((1, 1, 2, 2)),
                                                                     "l": spec((1,), i32, np.array([1 << 30], i32))},
                         "(1073741824,) int32", make_op("LengthsRangeFill", ["l2"], ["y"])),
}


@pytest.mark.parametrize("name", BOMBS)
def test_static_inference_sizes_huge_outputs_without_building_them(name):
    op, known, blob, good = BOMBS[name]
    nd = NetDef(name="model", op=[op])
    with peak_memory() as peak:
        with pytest.raises(ResourceError) as info:
            infer_net(nd, known, max_blob_bytes=MIB)
        assert infer_net(nd, known)["y"].shape is not None   # no limit: the spec, still without the array
    assert str(info.value).startswith(f"net 'model', op #0 ({op.type}): blob 'y' would be {blob}, ")
    assert peak[0] < MIB
    ws = Workspace()                                     # a small one agrees with the kernel
    ws.feed("x", np.arange(4, dtype=f32).reshape(1, 1, 2, 2))
    ws.feed("l2", np.array([2, 3], i32))
    ws.run_net_once(NetDef(name="model", op=[good]))
    inferred = infer_net(NetDef(name="model", op=[good]), {"x": spec((1, 1, 2, 2)),
                                                          "l2": spec((2,), i32, np.array([2, 3], i32))})
    assert inferred["y"].shape == ws.fetch("y").shape


# ----------------------------------------------------------------------------------------- the runners
def test_a_compiled_net_meets_the_limit_on_a_new_signature():
    """A plain net run many times runs compiled; a bigger input is a new signature, run op by op: checked."""
    ws = Workspace(limits=SMALL)
    ws.feed("a", np.ones((10, 1), f32))
    ws.feed("b", np.ones((1, 10), f32))
    net = ws.create_net(model(CASES["Mul-broadcast"]))
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None             # (the third run ran compiled)
    ws.feed("a", np.ones((1000, 1), f32))
    ws.feed("b", np.ones((1, 1000), f32))
    with pytest.raises(ResourceError, match=r"op #0 \(Mul\): blob 'y' would be \(1000, 1000\) float32"):
        net.run()
    assert ws.fetch("y").shape == (10, 10)


def test_ops_growing_by_their_values_are_checked_at_every_compiled_call():
    """The compiled runner reuses the sizes of the run it was built from; an op whose sizes follow its values
    (OneHot's size input) runs by its kernel in the compiled net, checked at every call: a larger size sends the
    rest of that run op by op (the right shape downstream), one over the limit is refused before it is made, and
    the blob of the op after it keeps what the last run left there (as op by op; the compiled run had put its
    buffer back before the ops ran)."""
    ws = Workspace(limits=SMALL)
    ws.feed("idx", np.array([0, 3], np.int64))
    ws.feed("size", np.array([4], np.int64))
    net = ws.create_net(NetDef(name="model", op=[make_op("OneHot", ["idx", "size"], ["y"]),
                                                   make_op("Sigmoid", ["y"], ["z"])]))
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None
    ws.feed("size", np.array([8], np.int64))
    net.run()
    want = np.zeros((2, 8), f32)
    want[0, 0] = want[1, 3] = 1
    np.testing.assert_allclose(ws.fetch("z"), 1 / (1 + np.exp(-want)), rtol=1e-6)
    ws.feed("size", np.array([MIB], np.int64))        # 2 x 1Mi float32: 8 MiB, over the limit
    with pytest.raises(ResourceError, match=r"op #0 \(OneHot\): blob 'y' would be \(2, 1048576\) float32"):
        net.run()
    assert ws.fetch("z").shape == (2, 8)


def test_recurrent_state_tensors_are_held_to_the_limit():
    from tests.rnn.test_recurrent import rnn_op, run as run_rnn, sum_mul_step

    x = np.ones((MIB // 4, 1, 1), f32)                   # 1 MiB: at the limit; the state has one row more
    with pytest.raises(ResourceError, match=r"\(RecurrentNetwork\): blob 'o_states' would be \(262145, 1, 1\) "
                                            r"float32, 1048580 bytes"):
        run_rnn(rnn_op(sum_mul_step()), x, np.ones(1, f32), Workspace(limits=SMALL))
    ws = run_rnn(rnn_op(sum_mul_step()), x[:4], np.ones(1, f32), Workspace(limits=SMALL))
    assert ws.fetch("o_all").shape == (4, 1, 1)
