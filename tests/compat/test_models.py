"""compat.models.resnet: the nets' sizes against counts made independently (ResNet-50's published 25,557,032
parameters; the CIFAR net's worked out by hand below), their blob names, and forward and training runs."""
import numpy as np

from stepnet.compat import brew, model_helper, optimizer, workspace
from stepnet.compat.models import resnet


def param_count(model):
    workspace.RunNetOnce(model.param_init_net)
    return sum(workspace.FetchBlob(str(p)).size for p in model.GetParams())


def test_resnet50_has_the_published_parameter_count_and_runs_on_32x32():
    model = model_helper.ModelHelper(name="r50", arg_scope={"order": "NCHW"})
    softmax = resnet.create_resnet50(model, "data", num_input_channels=3, num_labels=1000, no_bias=True)
    assert str(softmax) == "softmax"
    assert param_count(model) == 25_557_032     # torchvision's resnet50 (v1.5: stride in the 3×3), same layers
    ops = [op.type for op in model.net.Proto().op]
    assert ops.count("Conv") == 53 and ops.count("SpatialBN") == 53 and ops.count("Sum") == 16
    assert model.net.Proto().op[-2].output[0] == "last_out_L1000"
    workspace.FeedBlob("data", np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    workspace.RunNetOnce(model.net)     # global pooling: any input size the strides leave >= 1×1
    out = workspace.FetchBlob("softmax")
    assert out.shape == (1, 1000) and abs(out.sum() - 1) < 1e-4


def test_resnet50_with_a_label_returns_softmax_and_loss():
    model = model_helper.ModelHelper(name="r50l")
    assert [str(b) for b in resnet.create_resnet50(model, "data", 3, 10, label="label")] == ["softmax", "loss"]
    names = [op.output[0] for op in model.net.Proto().op[:12]]
    assert names[:4] == ["conv1", "conv1_spatbn_relu", "conv1_spatbn_relu", "pool1"]
    assert names[4:] == ["comp_0_conv_1", "comp_0_spatbn_1", "comp_0_spatbn_1", "comp_0_conv_2", "comp_0_spatbn_2",
                         "comp_0_spatbn_2", "comp_0_conv_3", "comp_0_spatbn_3"]


def resnet_32x32_params(n, labels):
    """By hand: conv1 3→16 3×3 with bias, BN (scale, bias); per group of 2n blocks two 3×3 convs with bias and
    two BNs, and in the first block of groups 2 and 3 a 1×1 projection with bias and its BN; FC 64→labels."""
    conv = lambda i, o, k: i * o * k * k + o    # noqa: E731
    total = conv(3, 16, 3) + 2 * 16
    prev = 16
    for f in (16, 32, 64):
        for b in range(2 * n):
            cin = prev if b == 0 else f
            total += conv(cin, f, 3) + conv(f, f, 3) + 4 * f
            if cin != f:
                total += conv(cin, f, 1) + 2 * f
        prev = f
    return total + 64 * labels + labels


def test_resnet_32x32_size_and_a_few_training_steps():
    assert resnet_32x32_params(3, 10) == 565_578
    model = model_helper.ModelHelper(name="cifar", arg_scope={"order": "NCHW"})
    softmax = resnet.create_resnet_32x32(model, "data", num_input_channels=3, num_groups=1, num_labels=4)
    assert param_count(model) == resnet_32x32_params(1, 4)
    xent = model.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.AveragedLoss(xent, "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.05, policy="fixed", momentum=0.9)
    rng = np.random.default_rng(1)
    workspace.FeedBlob("data", rng.standard_normal((4, 3, 32, 32)).astype(np.float32))
    workspace.FeedBlob("label", np.array([0, 1, 2, 3], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(8):
        workspace.RunNet(model.net.Proto().name)
        losses.append(float(workspace.FetchBlob("loss")))
    assert losses[-1] < 0.5 * losses[0], losses


def test_builder_blocks_name_their_blobs_as_caffe2():
    model = model_helper.ModelHelper(name="blocks")
    builder = resnet.ResNetBuilder(model, "x", no_bias=1, is_test=True)
    builder.add_simple_block(8, 16, down_sampling=True)
    builder.add_bottleneck(16, 4, 16)
    outs = [op.output[0] for op in model.net.Proto().op]
    assert "shortcut_projection_0_spatbn" in outs and "comp_0_sum_2" in outs and "comp_1_sum_3" in outs
    assert "shortcut_projection_1" not in outs      # same width: the bottleneck adds its input unprojected
    assert builder.prev_blob == "comp_1_sum_3" and builder.comp_count == 2
    assert brew.has_helper("image_input")


def test_brew_image_input_gives_nchw_through_nhwc2nchw(tmp_path, monkeypatch):
    """brew.image_input as the ResNet-50 trainer calls it (Caffe datums, NCHW): ImageInput writes data_nhwc and an
    NHWC2NCHW gives data; with is_test the crop is the centre of the image scaled to `scale`."""
    import io

    from PIL import Image

    from stepnet.compat import state
    from stepnet.io import minidb
    from stepnet.io.image_records import datum_record

    monkeypatch.chdir(tmp_path)
    state.reset()
    rgb = np.random.default_rng(2).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    minidb.write_records("train.minidb", [("0", datum_record(buf.getvalue(), 3))])
    model = model_helper.ModelHelper(name="input")
    reader = model.CreateDB("reader", db="train.minidb", db_type="minidb")
    data, label = brew.image_input(model, reader, ["data", "label"], batch_size=2, use_caffe_datum=True, mean=128.,
                                   std=128., scale=6, crop=4, mirror=1, is_test=True)
    assert [op.type for op in model.net.Proto().op] == ["ImageInput", "NHWC2NCHW"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    want = (rgb[1:5, 1:5, ::-1].transpose(2, 0, 1).astype(np.float64) - 128) / 128
    got = workspace.FetchBlob("data")
    assert got.shape == (2, 3, 4, 4) and np.allclose(got, want) and workspace.FetchBlob("label").tolist() == [3, 3]
