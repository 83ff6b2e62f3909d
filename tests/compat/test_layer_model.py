"""compat.layer_model_helper, layer_model_instantiator, layers and regularizer: values the layer nets compute
against numpy float64 definitions, the nets each context gets, records and global constants."""
import numpy as np
import pytest

from stepnet.compat import core, layer_model_helper, layer_model_instantiator as inst, schema, workspace
from stepnet.compat.layers.layers import InstantiationContext
from stepnet.compat.layers.tags import Tags
from stepnet.compat.modeling.parameter_sharing import ParameterSharing
from stepnet.compat.regularizer import L1Norm, L2Norm

rng = np.random.default_rng(5)


def make_model(dim=4, extra=None):
    return layer_model_helper.LayerModelHelper(
        "m", schema.Struct(("x", schema.Scalar((np.float32, (dim,))))), extra or schema.Struct())


def run_forward(model):
    model.output_schema = schema.Struct()
    init_net, train_net = inst.generate_training_nets_forward_only(model)
    workspace.RunNetOnce(init_net)
    workspace.RunNetOnce(train_net)
    return init_net, train_net


def sigmoid_xent(logit, label):
    """-(label log sigmoid(logit) + (1 - label) log(1 - sigmoid(logit))), written out."""
    p = 1.0 / (1.0 + np.exp(-logit))
    return -(label * np.log(p) + (1.0 - label) * np.log(1.0 - p))


def test_fc_then_weighted_lr_loss_match_their_definitions():
    extra = schema.Struct(("label", schema.Scalar((np.float32, ()))), ("weight", schema.Scalar((np.float64, ()))))
    model = make_model(4, extra)
    logit = model.FC(model.input_feature_schema.x, 1)
    loss = model.BatchLRLoss(schema.Struct(("label", model.trainer_extra_schema.label), ("logit", logit),
                                           ("weight", model.trainer_extra_schema.weight)))
    x = rng.normal(size=(6, 4)).astype(np.float32)
    label = rng.integers(0, 2, size=6).astype(np.float32)
    weight = rng.uniform(0.5, 2.0, size=6)
    schema.FeedRecord(model.input_feature_schema, [x])
    schema.FeedRecord(model.trainer_extra_schema, [label, weight])
    run_forward(model)
    w = workspace.FetchBlob(model.layers[0].w).astype(np.float64)
    b = workspace.FetchBlob(model.layers[0].b).astype(np.float64)
    assert w.shape == (1, 4) and np.all(np.abs(w) <= 0.5)          # uniform in +-sqrt(1/4)
    want_logit = x.astype(np.float64) @ w.T + b
    np.testing.assert_allclose(workspace.FetchBlob(logit()), want_logit, rtol=1e-5, atol=1e-6)
    want_loss = np.mean(sigmoid_xent(want_logit[:, 0], label) * weight)
    np.testing.assert_allclose(workspace.FetchBlob(loss()), want_loss, rtol=1e-5)


def test_loss_layers_are_left_out_of_the_prediction_net_and_records_are_set():
    extra = schema.Struct(("label", schema.Scalar((np.float32, (1,)))))
    model = make_model(3, extra)
    pred = model.FC(model.input_feature_schema.x, 1)
    model.BatchMSELoss(schema.Struct(("label", model.trainer_extra_schema.label), ("prediction", pred)))
    model.output_schema = schema.Struct(("pred", pred))
    predict_net = inst.generate_predict_net(model)
    assert [op.type for op in predict_net.Proto().op] == ["FC"]
    assert str(model.input_feature_schema.x()) in predict_net.Proto().external_input
    assert list(predict_net.Proto().external_output) == [str(pred())]
    assert predict_net.output_record().field_blobs() == [pred()]
    eval_net = inst.generate_eval_net(model)
    assert [op.type for op in eval_net.Proto().op][0] == "FC" and "SquaredL2Distance" in [
        op.type for op in eval_net.Proto().op]


def test_mse_loss_is_half_the_squared_distance_averaged():
    record = schema.NewRecord(core.Net("feeds"), schema.Struct(
        ("label", schema.Scalar((np.float64, ()))), ("prediction", schema.Scalar((np.float32, (1,))))))
    model = make_model()
    loss = model.BatchMSELoss(record)
    label, pred = rng.normal(size=5), rng.normal(size=(5, 1)).astype(np.float32)
    schema.FeedRecord(record, [label, pred])
    run_forward(model)
    want = np.mean(0.5 * (label - pred[:, 0].astype(np.float64)) ** 2)
    np.testing.assert_allclose(workspace.FetchBlob(loss()), want, rtol=1e-5)


@pytest.mark.parametrize("reducer", ["Sum", "Mean", "Sqrt", "Max"])
def test_sparse_lookup_pools_the_embedding_rows(reducer):
    model = make_model()
    ids = schema.NewRecord(model.net, schema.List(schema.Scalar(np.int64,
                                                               metadata=schema.Metadata(categorical_limit=10))))
    out = model.SparseLookup(ids, [3], reducer)
    lengths = np.array([2, 1, 3], np.int32)
    values = np.array([1, 4, 9, 0, 0, 7], np.int64)
    schema.FeedRecord(ids, [lengths, values])
    run_forward(model)
    table = workspace.FetchBlob(model.layers[0].w).astype(np.float64)
    assert table.shape == (10, 3)
    pool = {"Sum": lambda r: r.sum(0), "Mean": lambda r: r.mean(0), "Sqrt": lambda r: r.sum(0) / np.sqrt(len(r)),
            "Max": lambda r: r.max(0)}[reducer]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    want = np.stack([pool(table[values[s:s + n]]) for s, n in zip(starts, lengths)])
    np.testing.assert_allclose(workspace.FetchBlob(out()), want, rtol=1e-5, atol=1e-6)


def test_margin_rank_loss_sums_the_hinge_over_every_negative():
    record = schema.NewRecord(core.Net("feeds"), schema.Struct(
        ("pos_prediction", schema.Scalar((np.float32, (1,)))), ("neg_prediction", schema.List(np.float32))))
    model = make_model()
    loss = model.MarginRankLoss(record, margin=0.3)
    pos = np.array([0.5, 0.1], np.float32)
    lengths, neg = np.array([2, 1], np.int32), np.array([0.4, 0.0, 0.9], np.float32)
    schema.FeedRecord(record, [pos, lengths, neg])
    run_forward(model)
    pairs = [(0.5, 0.4), (0.5, 0.0), (0.1, 0.9)]
    want = sum(max(0.0, 0.3 - (p - n)) for p, n in pairs)
    np.testing.assert_allclose(workspace.FetchBlob(loss()), want, rtol=1e-5)


@pytest.mark.parametrize("reg, norm", [(L1Norm(0.5), lambda w: 0.5 * np.abs(w).sum()),
                                       (L2Norm(0.25), lambda w: 0.25 * (w ** 2).sum())])
def test_loss_regularizers_add_their_term_to_the_loss(reg, norm):
    model = make_model()
    model.default_optimizer = model.NoOptim
    out = model.FC(model.input_feature_schema.x, 2, weight_reg=reg)
    model.add_loss(model.AveragedLoss(out, 1))
    model.output_schema = schema.Struct()
    schema.FeedRecord(model.input_feature_schema, [rng.normal(size=(3, 4)).astype(np.float32)])
    init_net, train_net = inst.generate_training_nets(model)
    terms = [name for name in model.loss.field_names() if "regularization" in name]
    assert len(terms) == 1 and "LpNormGradient" in [op.type for op in train_net.Proto().op]
    workspace.RunNetOnce(init_net)
    workspace.RunNetOnce(train_net)
    w = workspace.FetchBlob(model.layers[0].w).astype(np.float64)
    np.testing.assert_allclose(workspace.FetchBlob(model.loss[terms[0]]()), norm(w), rtol=1e-5)


def test_global_constants_and_layer_names():
    model = make_model()
    blob = model.add_global_constant("C", [1, 2, 3], dtype=np.int64)
    assert model.maybe_add_global_constant("C", [1, 2, 3], dtype=np.int64) == blob
    with pytest.raises(AssertionError):
        model.maybe_add_global_constant("C", [1, 2, 4], dtype=np.int64)
    workspace.RunNetOnce(model.create_init_net("init"))
    np.testing.assert_array_equal(workspace.FetchBlob(blob), np.array([1, 2, 3], np.int64))
    assert workspace.FetchBlob(model.global_constants["ONE"]) == pytest.approx(1.0)
    np.testing.assert_array_equal(workspace.FetchBlob(model.global_constants["ZERO_RANGE"]), [0, 0])
    model.FC(model.input_feature_schema.x, 2)
    model.FC(model.input_feature_schema.x, 2)
    with core.NameScope("tower"), ParameterSharing({"fc": "shared"}):
        model.FC(model.input_feature_schema.x, 2)
    assert [layer.name for layer in model.layers] == ["fc", "fc_auto_0", "tower/fc"]
    assert model.layers[2].w == "tower/shared/w"


def test_select_record_by_context_and_tags():
    model = make_model(2)
    x = model.input_feature_schema.x
    with Tags(Tags.EXCLUDE_FROM_PREDICTION):
        doubled = model.Scale(x, 1, scale=2.0)
    assert Tags.EXCLUDE_FROM_PREDICTION in model.layers[0].tags
    joined = model.SelectRecordByContext(schema.Struct((InstantiationContext.PREDICTION, x),
                                                       (InstantiationContext.TRAINING, doubled),
                                                       (InstantiationContext.EVAL, doubled)))
    model.output_schema = schema.Struct(("joined", joined))
    schema.FeedRecord(x, [np.array([[1.0, 3.0]], np.float32)])
    predict_net = inst.generate_predict_net(model)
    workspace.RunNetOnce(predict_net)
    np.testing.assert_array_equal(workspace.FetchBlob(joined()), [[1.0, 3.0]])
    workspace.RunNetOnce(inst.generate_eval_net(model))
    np.testing.assert_array_equal(workspace.FetchBlob(joined()), [[2.0, 6.0]])


def test_an_unknown_layer_name_is_a_value_error():
    with pytest.raises(ValueError, match="non-registered layer: NoSuchLayer"):
        make_model().NoSuchLayer(None)


def test_distill_loss_mixes_the_two_cross_entropies():
    record = schema.NewRecord(core.Net("feeds"), schema.Struct(
        ("teacher_label", schema.Scalar((np.float32, ()))), ("label", schema.Scalar((np.float32, ()))),
        ("logit", schema.Scalar((np.float32, (1,))))))
    model = make_model()
    loss = model.BatchDistillLRLoss(record, teacherWeight=0.3)
    teacher, label = rng.uniform(size=4).astype(np.float32), rng.integers(0, 2, size=4).astype(np.float32)
    logit = rng.normal(size=(4, 1)).astype(np.float32)
    schema.FeedRecord(record, [teacher, label, logit])
    run_forward(model)
    z = logit[:, 0].astype(np.float64)
    want = 0.7 * sigmoid_xent(z, label).mean() + 0.3 * sigmoid_xent(z, teacher).mean()
    np.testing.assert_allclose(workspace.FetchBlob(loss()), want, rtol=1e-5)


def test_feature_sparse_to_dense_lays_float_features_out_by_id():
    record = schema.NewRecord(core.Net("feeds"), schema.Struct(("f", schema.Map(np.int64, np.float32))))
    model = make_model()
    specs = schema.FeatureSpec(feature_type="FLOAT", feature_names=["a", "b", "c"], feature_ids=[7, 3, 11])
    out = model.FeatureSparseToDense(record, [("f", specs)])
    lengths = np.array([2, 0, 3], np.int32)
    keys = np.array([3, 11, 7, 3, 5], np.int64)
    values = np.array([1.5, 2.5, -1.0, 4.0, 9.0], np.float32)
    schema.FeedRecord(record, [lengths, keys, values])
    model.output_schema = schema.Struct()
    init_net, train_net = inst.generate_training_nets_forward_only(model)
    workspace.RunNetOnce(init_net)
    workspace.RunNetOnce(train_net)
    want = np.zeros((3, 3))
    offset = 0
    for row, n in enumerate(lengths):
        for k, v in zip(keys[offset:offset + n], values[offset:offset + n]):
            if k in (7, 3, 11):
                want[row, [7, 3, 11].index(k)] = v
        offset += n
    np.testing.assert_array_equal(workspace.FetchBlob(out.f()), want.astype(np.float32))
    assert model.layers[0].get_metadata()[0][0] == {"type": "FLOAT", "names": ["a", "b", "c"], "ids": [7, 3, 11],
                                                   "cardinality": 1}


CAFFE2_LAYER_MODULES = {   # Caffe2's caffe2/python/layers/<module>.py -> the layer class it defines
    "adaptive_weight": "AdaptiveWeight", "add_bias": "AddBias", "arc_cosine_feature_map": "ArcCosineFeatureMap",
    "batch_distill_lr_loss": "BatchDistillLRLoss", "batch_lr_loss": "BatchLRLoss", "batch_mse_loss": "BatchMSELoss",
    "batch_normalization": "BatchNormalization", "batch_sigmoid_cross_entropy_loss": "BatchSigmoidCrossEntropyLoss",
    "batch_softmax_loss": "BatchSoftmaxLoss", "build_index": "MapToRange", "concat": "Concat",
    "constant_weight": "ConstantWeight", "conv": "Conv", "dropout": "Dropout", "fc": "FC",
    "fc_without_bias": "FCWithoutBias", "feature_sparse_to_dense": "FeatureSparseToDense", "functional": "Functional",
    "gather_record": "GatherRecord", "homotopy_weight": "HomotopyWeight", "label_smooth": "LabelSmooth",
    "last_n_window_collector": "LastNWindowCollector", "margin_rank_loss": "MarginRankLoss",
    "merge_id_lists": "MergeIdLists", "pairwise_dot_product": "PairwiseDotProduct",
    "position_weighted": "PositionWeighted", "random_fourier_features": "RandomFourierFeatures",
    "reservoir_sampling": "ReservoirSampling", "sampling_train": "SamplingTrain",
    "sampling_trainable_mixin": "SamplingTrainableMixin", "select_record_by_context": "SelectRecordByContext",
    "semi_random_features": "SemiRandomFeatures", "sparse_feature_hash": "SparseFeatureHash",
    "sparse_lookup": "SparseLookup", "split": "Split", "uniform_sampling": "UniformSampling"}


def test_caffe2_s_layer_module_names_import_their_layers():
    """A program importing a layer from its Caffe2 module (`from caffe2.python.layers.fc import FC`) gets it."""
    import importlib

    from stepnet.compat import alias
    alias.install()
    missing = [f"{m}.{c}" for m, c in CAFFE2_LAYER_MODULES.items()
               if not hasattr(importlib.import_module(f"caffe2.python.layers.{m}"), c)]
    assert missing == []
