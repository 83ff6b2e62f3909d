"""ReservoirSampling (stepnet/ops/reservoir.py) against the definition Caffe2's reservoir_sampling op documents:
each of N rows seen is kept with probability num_to_collect / N (checked statistically), rows are appended in
order until the reservoir is full, num_visited counts the rows (the new objects with object ids), an object id
is held once and the map and pos_to_object stay consistent; bad input, the seed, the gradient kind, the layer,
and a broken kernel caught."""
import threading

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import (ArgumentError, ArityError, DTypeError, GradientError, ResourceError, ShapeError,
                                 StepnetError)
from stepnet.core.limits import Limits
from stepnet.io.proto import DataType
from stepnet.passes.gradients import gradient_of_op
from stepnet.testing import make_op

STATE = ["res", "nv", "data", "mutex"]
DEDUP = STATE + ["ids", "map", "p2o"]


def fresh(seed=0, dedup=False, limits=None, res=None):
    """A workspace holding the layer's initial state: an empty float reservoir, num_visited 0, a mutex (and an
    empty int64 -> int32 map and pos_to_object)."""
    ws = Workspace(seed=seed, limits=limits)
    ws.feed("res", np.zeros((0,), np.float32) if res is None else res)
    ws.feed("nv", np.zeros((), np.int64))
    ws.run_operator_once(make_op("CreateMutex", [], ["mutex"]))
    if dedup:
        ws.run_operator_once(make_op("CreateMap", [], ["map"], key_dtype=DataType.INT64, value_dtype=DataType.INT32))
        ws.feed("p2o", np.zeros((0,), np.int64))
    return ws


def sample_op(n, dedup=False, **extra):
    return make_op("ReservoirSampling", DEDUP if dedup else STATE,
                   ["res", "nv", "map", "p2o"] if dedup else ["res", "nv"], num_to_collect=n, **extra)


def feed_run(ws, op, data, ids=None):
    ws.feed("data", data)
    if ids is not None:
        ws.feed("ids", ids if isinstance(ids, np.ndarray) else np.asarray(ids, np.int64))
    ws.run_operator_once(op)


def visited(ws):
    return int(ws.fetch("nv").reshape(-1)[0])


# ------------------------------------------------------------------------------------------ before it is full
def test_rows_are_appended_in_order_until_the_reservoir_is_full():
    ws, op = fresh(), sample_op(7)
    rows = np.arange(14, dtype=np.float32).reshape(7, 2)
    feed_run(ws, op, rows[:2])
    np.testing.assert_array_equal(ws.fetch("res"), rows[:2])
    assert ws.fetch("res").dtype == np.float32 and visited(ws) == 2
    feed_run(ws, op, rows[2:5])
    np.testing.assert_array_equal(ws.fetch("res"), rows[:5])
    assert visited(ws) == 5
    feed_run(ws, op, rows[5:])
    np.testing.assert_array_equal(ws.fetch("res"), rows)     # exactly full: still no draw
    assert visited(ws) == 7


def test_a_batch_that_fills_the_reservoir_appends_only_what_fits_and_samples_the_rest():
    ws, op = fresh(seed=3), sample_op(4)
    rows = np.arange(30, dtype=np.int32).reshape(10, 3)
    feed_run(ws, op, rows[:3])
    feed_run(ws, op, rows[3:])     # row 3 appended at slot 3; rows 4.. each replace a slot or are dropped
    out = ws.fetch("res")
    assert out.shape == (4, 3) and out.dtype == np.int32 and visited(ws) == 10
    seen = {tuple(r) for r in rows.tolist()}
    assert all(tuple(r) in seen for r in out.tolist())
    assert len({tuple(r) for r in out.tolist()}) == 4          # a row is held once


def test_num_visited_counts_every_row_and_an_empty_batch_changes_nothing():
    ws, op = fresh(seed=1), sample_op(3)
    total = 0
    for n in (2, 0, 5, 1, 0, 4):
        before = ws.fetch("res").copy()
        feed_run(ws, op, np.full((n, 2), n, np.float64))
        total += n
        assert visited(ws) == total
        if n == 0:
            np.testing.assert_array_equal(ws.fetch("res"), before)
    assert ws.fetch("res").shape == (3, 2) and ws.fetch("res").dtype == np.float64


def test_an_empty_first_batch_gives_the_empty_reservoir_the_datas_type_and_row_shape():
    ws, op = fresh(), sample_op(3)
    ws.feed("nv", np.array([5], np.int64))      # an empty reservoir's count is not read (nor reset) here
    feed_run(ws, op, np.zeros((0, 4), np.int32))
    res = ws.fetch("res")
    assert res.shape == (0, 4) and res.dtype == np.int32 and visited(ws) == 5
    feed_run(ws, op, np.ones((2, 4), np.int32))   # still empty: the count starts afresh, as Caffe2 resets it
    assert visited(ws) == 2 and ws.fetch("res").shape == (2, 4)


def test_string_and_object_rows_are_collected():
    ws, op = fresh(), sample_op(3)
    feed_run(ws, op, np.array(["a", "bb"]))
    feed_run(ws, op, np.array(["cccc"]))
    assert ws.fetch("res").tolist() == ["a", "bb", "cccc"]


# ------------------------------------------------------------------------------------------ the distribution
def test_each_row_is_kept_with_probability_num_to_collect_over_rows_seen():
    """N = 20 rows (ids 0..19) in batches of 3, 8 and 9, num_to_collect K = 5, T = 3000 trials with one
    seeded generator. Each row's count of trials keeping it is Binomial(T, K/N) = Binomial(3000, 0.25): mean
    750, sd sqrt(3000 * 0.25 * 0.75) = 23.7. Each count must be within 4.5 sd (a two-sided chance of 7e-6 per
    row under the definition, 1.4e-4 for any of the 20); a kernel favouring any slot or row by 11 points of
    probability fails. The pairs (0, 19) and (18, 19) are each kept together with probability
    K(K-1) / (N(N-1)) = 20/380 (sd 12.2 around 157.9), checked the same way."""
    n, k, trials = 20, 5, 3000
    ws, op = fresh(seed=12345), sample_op(k)
    counts = np.zeros(n, np.int64)
    pairs = np.zeros(2, np.int64)
    rows = np.arange(n, dtype=np.float32)[:, None]
    for _ in range(trials):
        ws.feed("res", np.zeros((0,), np.float32))
        ws.feed("nv", np.zeros((), np.int64))
        for lo, hi in ((0, 3), (3, 11), (11, 20)):
            feed_run(ws, op, rows[lo:hi])
        kept = ws.fetch("res")[:, 0].astype(int)
        assert len(kept) == k and len(set(kept.tolist())) == k
        counts[kept] += 1
        pairs += [{0, 19} <= set(kept.tolist()), {18, 19} <= set(kept.tolist())]
    p = k / n
    sd = np.sqrt(trials * p * (1 - p))
    assert np.all(np.abs(counts - trials * p) <= 4.5 * sd), counts
    q = k * (k - 1) / (n * (n - 1))
    assert np.all(np.abs(pairs - trials * q) <= 4.5 * np.sqrt(trials * q * (1 - q))), pairs


def test_the_op_seed_repeats_the_draws():
    def run(seed):
        ws = fresh(seed=seed)
        op = sample_op(3)
        op.device_option.random_seed = 77
        for b in range(5):
            feed_run(ws, op, np.arange(4, dtype=np.float32)[:, None] + 10 * b)
        return ws.fetch("res")
    np.testing.assert_array_equal(run(1), run(2))


# ------------------------------------------------------------------------------------------ object ids
def check_books(ws, n):
    """The map and pos_to_object describe the reservoir: one distinct object per row, both ways; each row is
    the data row of its object (its first column holds the id)."""
    res, p2o, table = ws.fetch("res"), ws.fetch("p2o"), ws.get_blob("map").value
    assert len(res) == len(p2o) == len(table) <= n
    assert len(set(p2o.tolist())) == len(p2o)
    assert {int(o): pos for pos, o in enumerate(p2o.tolist())} == dict(table)
    np.testing.assert_array_equal(res[:, 0], p2o)


def test_an_object_id_seen_twice_keeps_one_slot():
    ws, op = fresh(dedup=True), sample_op(4, dedup=True)
    ids = [7, 7, 3, 7]
    feed_run(ws, op, np.array([[i, j] for j, i in enumerate(ids)], np.int64), ids)
    np.testing.assert_array_equal(ws.fetch("res"), [[7, 0], [3, 2]])   # the first row of each object
    assert visited(ws) == 2 and dict(ws.get_blob("map").value) == {7: 0, 3: 1}
    assert ws.fetch("p2o").tolist() == [7, 3]
    feed_run(ws, op, np.array([[3, 9], [9, 9]], np.int64), [3, 9])     # 3 is held: skipped, not counted
    np.testing.assert_array_equal(ws.fetch("res"), [[7, 0], [3, 2], [9, 9]])
    assert visited(ws) == 3 and dict(ws.get_blob("map").value) == {7: 0, 3: 1, 9: 2}
    check_books(ws, 4)


def test_the_books_stay_consistent_while_objects_are_replaced():
    ws, op = fresh(seed=4, dedup=True), sample_op(5, dedup=True)
    rng = np.random.default_rng(0)
    expected_visits = 0
    for _ in range(60):
        ids = rng.integers(0, 30, size=int(rng.integers(0, 7)))
        held = set(ws.get_blob("map").value)
        new = set(ids.tolist()) - held
        data = np.stack([ids, ids * 3], axis=1).astype(np.int64).reshape(-1, 2)
        feed_run(ws, op, data, ids)
        expected_visits += len(new) if len(ids) else 0
        assert visited(ws) == expected_visits
        check_books(ws, 5)
    assert len(ws.fetch("res")) == 5


def test_an_evicted_object_can_come_back():
    ws, op = fresh(seed=0, dedup=True), sample_op(1, dedup=True)
    feed_run(ws, op, np.array([[1, 0]], np.int64), [1])
    for i in range(2, 40):       # with one slot, object 1 is replaced with probability 1 - 1/40 overall
        feed_run(ws, op, np.array([[i, 0]], np.int64), [i])
    assert 1 not in ws.get_blob("map").value
    before = visited(ws)
    feed_run(ws, op, np.array([[1, 0]], np.int64), [1])
    assert visited(ws) == before + 1
    check_books(ws, 1)


# ------------------------------------------------------------------------------------------ bad input
def run_bad(ws, op, data, ids=None):
    with pytest.raises(StepnetError) as info:
        feed_run(ws, op, data, ids)
    return info


@pytest.mark.parametrize("n", [0, -3, 2**31])
def test_num_to_collect_must_be_positive(n):
    info = run_bad(fresh(), sample_op(n), np.ones((2, 2), np.float32))
    assert info.type is ArgumentError and "num_to_collect" in str(info.value)


def test_num_to_collect_is_required():
    op = make_op("ReservoirSampling", STATE, ["res", "nv"])
    info = run_bad(fresh(), op, np.ones((2, 2), np.float32))
    assert info.type is ArgumentError


@pytest.mark.parametrize("nv", [np.zeros((), np.int32), np.zeros((2,), np.int64), np.zeros((0,), np.int64)])
def test_num_visited_must_be_one_int64(nv):
    ws = fresh()
    ws.feed("nv", nv)
    info = run_bad(ws, sample_op(3), np.ones((2, 2), np.float32))
    assert info.type is DTypeError and "num_visited" in str(info.value) and "\n" not in str(info.value)


def test_rows_of_another_shape_or_type_are_refused():
    ws, op = fresh(), sample_op(3)
    feed_run(ws, op, np.ones((2, 3), np.float32))
    assert run_bad(ws, op, np.ones((2, 4), np.float32)).type is ShapeError
    assert run_bad(ws, op, np.ones((2, 3, 1), np.float32)).type is ShapeError
    assert run_bad(ws, op, np.ones((2, 3), np.int32)).type is DTypeError
    assert run_bad(ws, op, np.float32(1.0)).type is ShapeError     # 0-d data has no rows
    np.testing.assert_array_equal(ws.fetch("res"), np.ones((2, 3)))  # nothing changed
    assert visited(ws) == 2


def test_a_state_out_of_step_is_refused():
    ws, op = fresh(res=np.ones((3, 2), np.float32)), sample_op(5)
    ws.feed("nv", np.array(1, np.int64))
    info = run_bad(ws, op, np.ones((1, 2), np.float32))
    assert info.type is ShapeError and "reset" in str(info.value)


def test_the_mutex_input_must_be_a_mutex():
    ws = fresh()
    ws.feed("mutex", np.zeros(1, np.float32))
    assert run_bad(ws, sample_op(3), np.ones((1, 2), np.float32)).type is DTypeError


def test_object_ids_are_checked():
    ws, op = fresh(dedup=True), sample_op(3, dedup=True)
    assert run_bad(ws, op, np.ones((2, 1)), np.array([1, 2], np.int32)).type is DTypeError
    assert run_bad(ws, op, np.ones((2, 1)), np.array([1, 2, 3], np.int64)).type is ShapeError
    assert run_bad(ws, op, np.ones((2, 1)), np.array([[1, 2]], np.int64)).type is ShapeError
    ws.run_operator_once(make_op("CreateMap", [], ["map"]))          # int32 keys: not Caffe2's MapType64To32
    info = run_bad(ws, op, np.ones((2, 1)), np.array([1, 2], np.int64))
    assert info.type is DTypeError and "int64 keys" in str(info.value)


def test_the_input_and_output_counts_go_together():
    ws = fresh(dedup=True)
    five = make_op("ReservoirSampling", DEDUP[:5], ["res", "nv"], num_to_collect=2)
    assert run_bad(ws, five, np.ones((1, 1)), [1]).type is ArityError
    four_out = make_op("ReservoirSampling", STATE, ["res", "nv", "map", "p2o"], num_to_collect=2)
    assert run_bad(ws, four_out, np.ones((1, 1))).type is ArityError


def test_the_state_must_be_written_in_place():
    op = make_op("ReservoirSampling", STATE, ["other", "nv"], num_to_collect=2)
    assert run_bad(fresh(), op, np.ones((1, 1))).type is ArgumentError


def test_the_blob_limit_is_checked_before_the_reservoir_grows():
    ws, op = fresh(limits=Limits(max_blob_bytes=1000)), sample_op(1000)
    feed_run(ws, op, np.ones((40, 4), np.float32))            # 40 rows of 16 bytes: 640
    with pytest.raises(ResourceError):
        feed_run(ws, op, np.ones((30, 4), np.float32))        # 70 rows: 1120 bytes
    assert visited(ws) == 40 and ws.fetch("res").shape == (40, 4)


def test_no_gradient_may_be_asked_for():
    with pytest.raises(GradientError):
        gradient_of_op(sample_op(3), ["res_grad", "nv_grad"])


def test_threads_sharing_the_state_lose_no_visit():
    ws, op = fresh(seed=2), sample_op(6)
    net = NetDef(name="sampler", op=[op])
    ws.feed("data", np.ones((3, 2), np.float32))
    ws.create_net(net)
    workers = [threading.Thread(target=ws.run_net, args=("sampler", 50)) for _ in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert visited(ws) == 3 * 50 * 3 and ws.fetch("res").shape == (6, 2)


# ------------------------------------------------------------------------------------------ the checker
def test_a_kernel_always_replacing_slot_0_is_caught(broken):
    """The kernel with its draws pinned to slot 0 once the reservoir is full: the last row is then always kept,
    which the distribution test's bound refuses."""
    from stepnet.ops import reservoir

    def pinned(ctx, xp, *inputs, num_to_collect, rng):
        class Zero:
            def integers(self, lo, hi):
                return np.zeros(np.shape(hi), np.int64)
        return reservoir.reservoir_sampling(ctx, xp, *inputs, num_to_collect=num_to_collect, rng=Zero())
    broken("ReservoirSampling", pinned)
    with pytest.raises(AssertionError):
        test_each_row_is_kept_with_probability_num_to_collect_over_rows_seen()


# ------------------------------------------------------------------------------------------ the layer
@pytest.fixture
def caffe2_state():
    from stepnet.compat.state import reset
    reset()
    yield
    reset()


@pytest.mark.filterwarnings("ignore:.*'valued_dtype'")   # (Caffe2's layer spells CreateMap's value_dtype so)
@pytest.mark.parametrize("with_ids", [False, True])
def test_the_reservoir_sampling_layer_runs_in_a_layer_model(caffe2_state, with_ids):
    """caffe2.python.layers' ReservoirSampling in a LayerModelHelper model: its init net makes the state, its
    train net samples each batch fed (ids given twice are held once)."""
    from stepnet.compat import layer_model_helper, layer_model_instantiator as inst, schema, workspace

    fields = [("data", schema.Scalar((np.float32, (2,))))] + ([("object_id", schema.Scalar(np.int64))]
                                                               if with_ids else [])
    model = layer_model_helper.LayerModelHelper("m", schema.Struct(*fields), schema.Struct())
    out = model.ReservoirSampling(model.input_feature_schema, num_to_collect=4)
    model.output_schema = schema.Struct()
    init_net, train_net = inst.generate_training_nets_forward_only(model)
    assert [op.type for op in train_net.Proto().op] == ["ReservoirSampling"]
    workspace.RunNetOnce(init_net)
    ids = np.array([5, 6, 5], np.int64)
    batches = []
    for b in range(4):
        x = np.stack([ids + 10 * b, np.full(3, b)], axis=1).astype(np.float32)
        schema.FeedRecord(model.input_feature_schema, [x, ids + 10 * b] if with_ids else [x])
        if not b:
            workspace.CreateNet(train_net)     # (as in Caffe2, once the inputs exist)
        workspace.RunNet(train_net.Proto().name)
        batches.append(x)
        if not b:     # the first batch, appended in order (with ids, the second 5 skipped)
            np.testing.assert_array_equal(workspace.FetchBlob(out.reservoir()), x[:2] if with_ids else x)
    reservoir = workspace.FetchBlob(out.reservoir())
    seen = np.concatenate(batches)
    assert reservoir.shape == (4, 2)
    assert all(any((row == s).all() for s in seen) for row in reservoir)
    assert int(workspace.FetchBlob(out.num_visited()).reshape(-1)[0]) == (8 if with_ids else 12)
    if with_ids:
        assert len({float(v) for v in reservoir[:, 0]}) == 4      # one row per object


def test_packed_records_are_collected_as_records():
    """Caffe2's way to sample several fields together: PackRecords, then the op on the packed tensor."""
    ws, op = fresh(), sample_op(3)
    ws.feed("a", np.array([1, 2], np.int32))
    ws.feed("b", np.array([[1.5], [2.5]], np.float32))
    ws.run_operator_once(make_op("PackRecords", ["a", "b"], ["data"], fields=["a", "b"]))
    ws.run_operator_once(op)
    ws.run_operator_once(make_op("UnPackRecords", ["res"], ["a2", "b2"], fields=["a", "b"]))
    np.testing.assert_array_equal(ws.fetch("a2"), [1, 2])
    np.testing.assert_array_equal(ws.fetch("b2"), [[1.5], [2.5]])


def test_six_inputs_keep_pos_to_object_in_the_output_blob():
    """Caffe2 accepts 6 inputs with 4 outputs: POS_TO_OBJECT is then whatever output 3's blob holds."""
    ws = fresh(dedup=True)
    op = make_op("ReservoirSampling", DEDUP[:6], ["res", "nv", "map", "kept_ids"], num_to_collect=3)
    feed_run(ws, op, np.array([[4], [8], [4]], np.int64), [4, 8, 4])
    feed_run(ws, op, np.array([[9]], np.int64), [9])
    assert ws.fetch("kept_ids").tolist() == [4, 8, 9] and dict(ws.get_blob("map").value) == {4: 0, 8: 1, 9: 2}
