"""Property-based fuzzing (hypothesis): real files from tests/data and models/, mutated (bytes, text, fields of
parsed messages, minidb records, feed values) and fed to every reader, plus one-op nets built from random
OperatorDefs run through a Workspace. The only property: every failure is a StepnetError, and nothing hangs.

Reproducible in CI: derandomized, no example database, a fixed number of examples (tests/fuzzing.py has the
mutators; tools/fuzz_campaign.py runs them many thousand times through the command line).
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import fuzzing  # noqa: E402
from stepnet import Workspace  # noqa: E402
from stepnet.io import minidb, proto  # noqa: E402
from stepnet.cli.tools import describe_net, unsupported_ops  # noqa: E402
from stepnet.core.errors import StepnetError  # noqa: E402
from stepnet.io.feeds import parse_feed  # noqa: E402
from stepnet.graph.view import walk  # noqa: E402
from stepnet.core.spec import TensorSpec  # noqa: E402
from stepnet.passes.shapes import infer_net  # noqa: E402

FUZZ = settings(max_examples=int(os.environ.get("STEPNET_FUZZ_EXAMPLES", 60)), deadline=None, derandomize=True,
                database=None, suppress_health_check=list(HealthCheck), print_blob=True)
SEEDS = {name: fuzzing.read(name) for name in fuzzing.BINARY_MODELS + fuzzing.TEXT_MODELS + fuzzing.MINIDBS}


class Hang(BaseException):
    """A case ran past its time limit (a BaseException: stepnet's `except Exception` must not swallow it)."""


@contextlib.contextmanager
def limited(seconds: float = 10):
    """Fail a case that runs longer than `seconds` instead of hanging the suite (POSIX; elsewhere no limit)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            yield
    except Hang:
        raise AssertionError(f"the case still ran after {seconds} s") from None   # hypothesis shows the case
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def clean(fn, *args, **kwargs):
    """fn's result, or None when it raised a StepnetError; any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except StepnetError:
        return None


def inspect_model(model) -> None:
    """What `stepnet inspect --shapes` does with a model, short of printing."""
    if isinstance(model, proto.PlanDef):
        nets, level = list(model.network), 1
    elif isinstance(model, proto.NetDef):
        nets, level = [model], 0
    else:
        return
    for net in nets:
        describe_net(net, level=level)
        list(walk(net, level=level))
    unsupported_ops(nets, level)
    known: dict = {}
    for net in nets:
        known = clean(infer_net, net, known) or {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ------------------------------------------------------------------------------------------- model files
@FUZZ
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(fuzzing.BINARY_MODELS + fuzzing.TEXT_MODELS),
       kind=st.sampled_from(["bytes", "text"]))
def test_mutated_model_files(workdir, rng, seed, kind):
    data = SEEDS[seed]
    if kind == "text" and seed.endswith(".pbtxt"):
        data = fuzzing.mutate_text(rng, data.decode()).encode("utf-8", "surrogatepass")
    else:
        data = fuzzing.mutate_bytes(rng, data, list(SEEDS.values()))
    path = workdir / f"model{os.path.splitext(seed)[1]}"
    path.write_bytes(data)
    with limited():
        for kind_arg in (None, "net", "plan"):
            model = clean(proto.load, path, kind=kind_arg)
            if model is not None:
                clean(inspect_model, model)


@FUZZ
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(["models/xor/plan.pbtxt",
                                                                    "models/xor/predict_net.pbtxt",
                                                                    "models/binary_adder/binary_adder.pbtxt",
                                                                    "tests/data/caffe2/squeeze_predict_net.pb"]),
       text=st.booleans())
def test_field_edits_of_real_models_load_inspect_and_run(workdir, rng, seed, text):
    model = proto.load(fuzzing.ROOT / seed)
    fuzzing.edit_message(rng, model)
    data, suffix = fuzzing.serialize(rng, model, text)
    path = workdir / f"edited{suffix}"
    path.write_bytes(data)
    with limited(20):
        loaded = clean(proto.load, path)
        if loaded is None:
            return
        clean(inspect_model, loaded)
        if "xor" in seed:   # small enough to run: every value the edits use is tiny or astronomically large
            ws = Workspace(seed=0, gpu="cpu")
            if isinstance(loaded, proto.PlanDef):
                clean(ws.run_plan, loaded, iterations=1)
            else:
                for name, value in {"X": np.ones((2, 2), np.float32), "W1": np.ones((2, 2), np.float32),
                                    "b1": np.zeros(2, np.float32), "W2": np.ones((1, 2), np.float32),
                                    "b2": np.zeros(1, np.float32)}.items():
                    ws.feed(name, value)
                clean(ws.run_net_once, loaded)


# ------------------------------------------------------------------------------------------- minidb files
@pytest.fixture(scope="module")
def checkpoint(workdir):
    path = workdir / "seed.minidb"
    minidb.save_blobs(path, {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "s": b"text",
                             "i": np.array([1, 2], np.int64)}, chunk_size=5)
    return path.read_bytes()


@FUZZ
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(["checkpoint"] + fuzzing.MINIDBS))
def test_mutated_minidb_files(workdir, checkpoint, rng, seed):
    data = checkpoint if seed == "checkpoint" else SEEDS[seed]
    path = workdir / "mutated.minidb"
    path.write_bytes(fuzzing.mutate_minidb(rng, data))
    with limited():
        clean(minidb.load_blobs, path)
        db = clean(minidb.MiniDB, path)
        for i in range(min(len(db), 20) if db is not None else 0):
            clean(minidb.parse_tensor_protos, db.value(i), "record")


# ------------------------------------------------------------------------------------------- feeds
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_feed_literals(rng):
    with limited():
        clean(parse_feed, "X=" + fuzzing.random_literal(rng))


@FUZZ
@given(text=st.text(alphabet="[](){}0123456789.,-+e:xjaTNn'\" ", max_size=60))
def test_feed_text(text):
    with limited():
        clean(parse_feed, "X=" + text)


@FUZZ
@given(rng=st.randoms(use_true_random=False), npz=st.booleans())
def test_npy_and_npz_feeds(workdir, rng, npz):
    path = workdir / ("feed.npz" if npz else "feed.npy")
    path.write_bytes(fuzzing.npz_bytes(rng) if npz else fuzzing.npy_bytes(rng))
    with limited():
        clean(parse_feed, f"X={path}")


# ------------------------------------------------------------------------------------------- one-op nets
@settings(FUZZ, max_examples=FUZZ.max_examples * 4)
@given(rng=st.randoms(use_true_random=False))
def test_one_op_nets(workdir, rng):
    op, pool = fuzzing.random_op(rng)
    net = proto.NetDef(name="fuzz", op=[op])
    cwd = os.getcwd()
    os.chdir(workdir)   # ops that write (Save, Checkpoint) write here
    try:
        with limited():
            clean(infer_net, net, {name: TensorSpec.of(value) for name, value in pool.items()})
            ws = Workspace(seed=0, gpu=rng.choice(["cpu", "emulate"]))
            for name, value in pool.items():
                ws.feed(name, value)
            clean(ws.run_net_once, net)
    finally:
        os.chdir(cwd)


# ------------------------------------------------------------------------------------------- newer surfaces
import fuzzing_surfaces as fs  # noqa: E402


@FUZZ
@given(rng=st.randoms(use_true_random=False), seed=st.sampled_from(["control", "models/xor/plan.pbtxt",
                                                                    "models/binary_adder/binary_adder.pbtxt"]))
def test_draw_escapes_every_name_it_is_given(rng, seed):
    """Mutated models with hostile names (quotes, <>, ], braces, newlines, 3000 characters): the dot text is
    made or refused with a StepnetError, and Graphviz parses what is made (where it is installed)."""
    import shutil
    import subprocess

    from stepnet.export.draw import Options, to_dot

    model = fs.control_net(rng) if seed == "control" else proto.load(fuzzing.ROOT / seed)
    fs.mutate_control(rng, model) if seed == "control" else fuzzing.edit_message(rng, model)
    for _ in range(rng.randint(1, 4)):
        fs.rename(rng, model)
    with limited():
        text = clean(to_dot, [model], Options(backward=rng.random() < 0.5, max_ops=rng.choice([1, 5, 600])))
    if text is not None and shutil.which("dot"):
        done = subprocess.run(["dot", "-Tcanon"], input=text.encode(), capture_output=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[:500]


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_hostile_metrics_files(workdir, rng):
    from stepnet.cli.metrics import read

    path = workdir / "m.csv"
    path.write_bytes(fs.hostile_csv(rng))
    with limited():
        clean(read, path)


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_collective_ops_with_hostile_arguments(rng):
    net = fs.collective_net(rng)
    with limited():
        clean(Workspace(seed=0, gpu="cpu").run_net_once, net)


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_control_flow_nets(rng):
    net = fs.control_net(rng)
    fs.mutate_control(rng, net)
    with limited():
        ws = Workspace(seed=0, gpu="cpu")
        ws.feed("x", np.array([[1.0, -2.0], [0.5, 3.0]], np.float32))
        clean(ws.run_net_once, net)


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_int8_and_detection_ops_on_hostile_shapes(rng):
    op, pool = fs.hostile_op(rng)
    with limited():
        clean(infer_net, proto.NetDef(name="fuzz", op=[op]), {n: TensorSpec.of(v) for n, v in pool.items()})
        ws = Workspace(seed=0, gpu="cpu")
        for name, value in pool.items():
            ws.feed(name, value)
        clean(ws.run_net_once, proto.NetDef(name="fuzz", op=[op]))


@settings(FUZZ, max_examples=max(FUZZ.max_examples // 2, 1))
@given(rng=st.randoms(use_true_random=False))
def test_export_onnx_of_one_op_nets(rng):
    """Every converter on a random op of the registry with random arguments: exported or refused cleanly."""
    pytest.importorskip("onnx")
    from stepnet.export.onnx import export_onnx

    op, pool = fuzzing.random_op(rng)
    net = proto.NetDef(name="one_op", op=[op], external_output=list(op.output)[:1])
    with limited():
        clean(export_onnx, net, None, inputs={n: pool[n] for n in dict.fromkeys(op.input) if n in pool})
