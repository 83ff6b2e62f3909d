"""caffe2.python.modeling's net modifiers (ComputeNormForBlobs, ComputeStatisticsForBlobs,
ComputeHistogramForBlobs, GradientClipping) against float64 numpy definitions of what they compute, with
Caffe2's blob names and output-record fields."""
import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.modeling.compute_histogram_for_blobs import ComputeHistogramForBlobs
from stepnet.compat.modeling.compute_norm_for_blobs import ComputeNormForBlobs
from stepnet.compat.modeling.compute_statistics_for_blobs import ComputeStatisticsForBlobs
from stepnet.compat.modeling.gradient_clipping import GradientClipping
from stepnet.compat.modeling.net_modifier import NetModifier

X = np.array([[0.5, -1.5, 2.0], [0.25, 3.0, -0.75]], dtype=np.float32)


def _net_with(name="x", value=X):
    workspace.FeedBlob(name, value)
    net = core.Net("modified")
    net.AddExternalInput(name)
    return net


@pytest.mark.parametrize("p,averaged", [(1, False), (2, False), (2, True)])
def test_norms(p, averaged):
    net = _net_with()
    modifier = ComputeNormForBlobs(["x"], logging_frequency=0, p=p, compute_averaged_norm=averaged)
    modifier(net)
    workspace.RunNetOnce(net)
    x = X.astype(np.float64)
    expected = np.abs(x).sum() if p == 1 else (x * x).sum()    # LpNorm's p=2 is the sum of squares
    if averaged:
        expected /= x.size
    suffix = ("_averaged" if averaged else "") + f"_l{p}_norm"
    assert modifier.field_name_suffix() == suffix
    np.testing.assert_allclose(workspace.FetchBlob("x" + suffix), [expected], rtol=1e-6)
    assert "x" + suffix in net.output_record().field_blobs()
    assert [op.type for op in net.Proto().op] == ["LpNorm"]        # no Print below logging_frequency 1


def test_statistics_min_max_mean():
    net = _net_with()
    ComputeStatisticsForBlobs(["x"], logging_frequency=10)(net)
    assert [op.type for op in net.Proto().op] == ["Cast", "Summarize", "Print"]
    workspace.RunNetOnce(net)
    stats = workspace.FetchBlob("x_summary")
    x = X.astype(np.float64)
    np.testing.assert_allclose(stats[:3], [x.min(), x.max(), x.mean()], rtol=1e-6)


@pytest.mark.parametrize("accumulate", [False, True])
def test_histogram_fractions(accumulate):
    lower, upper, buckets = -1.0, 2.5, 7
    net = _net_with()
    modifier = ComputeHistogramForBlobs(["x"], logging_frequency=0, num_buckets=buckets, lower_bound=lower,
                                        upper_bound=upper, accumulate=accumulate)
    modifier(net)
    workspace.CreateNet(net)
    workspace.RunNet(net, 2)                   # the running histogram holds both runs: the same fractions
    x = X.astype(np.float64).ravel()
    counts = np.zeros(buckets + 2)
    width = (upper - lower) / buckets
    for v in x:                                # bucket 0: below lower, buckets + 1: at or above upper
        k = 0 if v < lower else buckets + 1 if v >= upper else 1 + int((v - lower) / width)
        counts[k] += 1
    name = "x" + ("_acc_normalized_hist" if accumulate else "_curr_normalized_hist")
    np.testing.assert_allclose(workspace.FetchBlob(name), counts / x.size, rtol=1e-6)
    assert name in net.output_record().field_blobs()


@pytest.mark.parametrize("norm_type,use_param", [("l2_norm", False), ("l1_norm", False), ("l2_norm", True)])
def test_gradient_clipping(norm_type, use_param):
    grad = np.array([3.0, -4.0, 12.0], dtype=np.float32)
    param = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    workspace.FeedBlob("g", grad)
    workspace.FeedBlob("w", param)
    net = core.Net("clip")
    net.AddExternalInputs("g", "w")
    threshold = 2.0
    GradientClipping("by_norm", norm_type, threshold, use_parameter_norm=use_param,
                     compute_norm_ratio=use_param)(net, grad_map={"w": "g"})
    workspace.RunNetOnce(net)
    g, w = grad.astype(np.float64), param.astype(np.float64)
    order = 2 if norm_type == "l2_norm" else 1
    norm = np.linalg.norm(g, order)
    limit = threshold * (np.linalg.norm(w, order) if use_param else 1.0)
    expected = g * limit / norm if norm > limit else g
    np.testing.assert_allclose(workspace.FetchBlob("g"), expected, rtol=1e-5)
    if use_param:
        np.testing.assert_allclose(workspace.FetchBlob("w_norm_ratio"), [norm / np.linalg.norm(w)], rtol=1e-5)


def test_sparse_gradients_are_not_clipped_and_bad_methods_refused():
    net = core.Net("clip")
    GradientClipping("by_norm", "l2_norm", 1.0)(net, grad_map={"e": core.GradientSlice("i", "v")})
    assert len(net.Proto().op) == 0
    with pytest.raises(AssertionError):
        GradientClipping("by_value", "l2_norm", 1.0)
    with pytest.raises(AssertionError):
        GradientClipping("by_norm", "linf_norm", 1.0)


def test_undefined_blob_and_abstract_base():
    with pytest.raises(Exception, match="blob nope is not defined in net"):
        ComputeNormForBlobs(["nope"], 1)(core.Net("empty"))
    with pytest.raises(TypeError):
        NetModifier()
