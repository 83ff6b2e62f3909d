"""synth_init's layer widths (stepnet/builders/synth_widths.py): channel classes solved under the net's constraints —
grouped and depthwise convolutions, Sums tying widths, given weights, detection heads tied to anchors and
classes, nets nested in If — on small nets built here with the expected shapes written out, and on the vendored
Mask R-CNN2Go nets (whose group arguments are the real channel counts of its depthwise layers)."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from stepnet.io import proto
from stepnet.core.errors import ArityError, ShapeError
from stepnet.builders.synth import synth_init
from stepnet.builders.synth_widths import Classes, anchors
from stepnet.testing import make_op
from stepnet.runtime.workspace import Workspace

MODELS = Path(__file__).resolve().parent / "data" / "models"
F32 = np.float32


def net_of(*ops, outputs=("y",), name="small"):
    net = proto.NetDef(name=name)
    for type_, ins, outs, args in ops:
        net.op.append(make_op(type_, ins, outs, **args))
    net.external_output.extend(outputs)
    return net


def shapes_of(init):
    return {op.output[0]: tuple(proto.arguments(op.arg)["shape"]) for op in init.op}


def runs(net, init, feeds):
    ws = Workspace(seed=0)
    ws.run_net_once(init)
    for k, v in feeds.items():
        ws.feed(k, v)
    ws.create_net(net).run()
    return ws


def conv(x, name, y, **args):
    return ("Conv", [x, name + "_w", name + "_b"], [y], {"kernel": 1, **args})


def dw(x, name, y, group):
    return ("Conv", [x, name + "_w"], [y], {"kernel": 3, "pad": 1, "group": group})


# ------------------------------------------------------------------------------------------- the solver
def test_classes_solve_ratios_fixed_groups_and_preferences():
    c = Classes({("same", "a", "b"), ("ratio", "d", 4, "a"), ("prefer", "a", 15), ("group", "g", 96),
                 ("fixed", "f", 7), ("ratio", "h", 2, "f"), ("multiple", "m", 4), ("prefer", "m", 81)})
    assert c.widths(["a", "b", "d", "g", "f", "h", "m", "free"], 64) == {
        "a": 15, "b": 15, "d": 60, "g": 96, "f": 7, "h": 14, "m": 80, "free": 64}
    assert c.find("d") == ("a", Fraction(4)) or c.find("a")[0] == c.find("d")[0]
    assert not c.conflicts


def test_classes_round_to_what_ratios_and_groups_need():
    c = Classes({("ratio", "a", Fraction(1, 3), "b"), ("group", "b", 2)})   # a = b/3, b even
    w = c.widths(["a", "b"], 64)
    assert 3 * w["a"] == w["b"] and w["b"] % 2 == 0 and 64 in w.values()
    c = Classes({("group", "x", 32), ("group", "x", 48)})                    # read by two grouped convs: lcm 96
    assert c.widths(["x"], 64) == {"x": 96}


def test_classes_record_conflicts():
    c = Classes({("fixed", "a", 3), ("fixed", "b", 4), ("same", "a", "b")})
    assert c.conflicts


# ------------------------------------------------------------------------------------------- grouped convs
def test_depthwise_conv_follows_its_group_and_fixes_the_width_feeding_it():
    """pw (free) -> dw (group 96) -> pw: the first pw is 96 wide (the group), the dw keeps 96 (out = in = group),
    the last layer gets the classes; the net runs."""
    net = net_of(conv("x", "pw", "a"), ("Relu", ["a"], ["a"], {}), dw("a", "dw", "b", 96), conv("b", "out", "y"))
    init = synth_init(net, {"x": (1, 3, 8, 8)}, classes=10)
    assert shapes_of(init) == {"pw_w": (96, 3, 1, 1), "pw_b": (96,), "dw_w": (96, 1, 3, 3),
                               "out_w": (10, 96, 1, 1), "out_b": (10,)}
    assert runs(net, init, {"x": np.ones((1, 3, 8, 8), F32)}).fetch("y").shape == (1, 10, 8, 8)


def test_a_group_smaller_than_the_width_keeps_the_width():
    """AlexNet's group 2: the nearest multiple of the group to --width; group 48 at width 64: 48."""
    net = net_of(conv("x", "c1", "a"), ("Conv", ["a", "c2_w", "c2_b"], ["b"], {"kernel": 3, "group": 2}),
                 ("Conv", ["b", "c3_w"], ["c"], {"kernel": 1, "group": 48}), conv("c", "out", "y"))
    shapes = shapes_of(synth_init(net, {"x": (1, 3, 9, 9)}, classes=5))
    assert shapes["c1_w"] == (48, 3, 1, 1) and shapes["c2_w"] == (48, 24, 3, 3) and shapes["c3_w"] == (48, 1, 1, 1)


def test_sum_ties_the_widths_of_a_residual_block():
    """trunk (free) + branch(pw -> dw 192 -> pw): the Sum makes the branch's last pw as wide as the trunk."""
    net = net_of(conv("x", "trunk", "t"), conv("t", "pw", "p"), dw("p", "dw", "d", 192), conv("d", "pwl", "l"),
                 ("Sum", ["l", "t"], ["s"], {}), conv("s", "out", "y"))
    shapes = shapes_of(synth_init(net, {"x": (1, 3, 6, 6)}, width=24, classes=7))
    assert shapes["trunk_w"] == (24, 3, 1, 1) and shapes["pw_w"] == (192, 24, 1, 1)
    assert shapes["dw_w"] == (192, 1, 3, 3) and shapes["pwl_w"] == (24, 192, 1, 1) and shapes["out_w"] == (7, 24, 1, 1)


def test_a_given_weight_fixes_the_width_it_reads():
    net = net_of(conv("x", "a", "a"), conv("a", "b", "y"))
    shapes = shapes_of(synth_init(net, {"x": (1, 3, 4, 4)}, params={"b_w": (5, 40, 1, 1)}))
    assert shapes["a_w"] == (40, 3, 1, 1) and shapes["b_w"] == (5, 40, 1, 1)


def test_a_data_input_the_group_does_not_divide_is_still_an_error():
    net = net_of(dw("x", "dw", "y", 4), outputs=())
    with pytest.raises(ShapeError, match="group 4 does not divide the 6 input channels"):
        synth_init(net, {"x": (1, 6, 5, 5)})


@pytest.mark.parametrize("op_type", ["Conv", "Conv1D", "FC", "SpatialBN"])
def test_a_layer_missing_its_weight_input_is_a_clean_error(op_type):
    """A layer with its input alone (a hostile or truncated file): the arity error names the op, as running
    the net would, instead of the width rules indexing a weight that is not there (an IndexError once)."""
    net = net_of((op_type, ["x"], ["y"], {}))
    with pytest.raises(ArityError, match=f"op #0 \\({op_type}\\): {op_type} takes"):
        synth_init(net, {"x": (1, 3, 8, 8) if op_type != "Conv1D" else (1, 3, 8)})


# ------------------------------------------------------------------------------------------- nested nets
def test_parameters_of_nets_nested_in_if_are_shaped():
    then_net = net_of(conv("h", "t", "y"), outputs=("y",), name="then")
    else_net = net_of(conv("h", "e", "y"), ("Relu", ["y"], ["y"], {}), outputs=("y",), name="else")
    net = net_of(conv("x", "c", "h"), ("If", ["cond"], ["y"], {"then_net": then_net, "else_net": else_net}))
    init = synth_init(net, {"x": (1, 3, 4, 4), "cond": proto_bool()}, width=8)
    shapes = shapes_of(init)
    assert shapes["c_w"] == (8, 3, 1, 1) and shapes["t_w"] == (8, 8, 1, 1) and shapes["e_w"] == (8, 8, 1, 1)
    for value in (True, False):
        ws = runs(net, init, {"x": np.ones((1, 3, 4, 4), F32), "cond": np.array(value)})
        assert ws.fetch("y").shape == (1, 8, 4, 4)


def proto_bool():
    from stepnet.core.spec import spec
    return spec((), np.bool_)


# ------------------------------------------------------------------------------------------- detection
RPN = [conv("data", "rpn", "feat"), conv("feat", "cls", "logits"), ("Sigmoid", ["logits"], ["probs"], {}),
       conv("feat", "bbox", "deltas"),
       ("GenerateProposals", ["probs", "deltas", "im_info", "anchor"], ["rois", "roi_probs"],
        {"spatial_scale": 0.125, "post_nms_topN": 20, "min_size": 0.0})]
HEADS = [("RoIAlign", ["feat", "rois"], ["pooled"], {"pooled_h": 2, "pooled_w": 2, "spatial_scale": 0.125}),
         ("FC", ["pooled", "score_w", "score_b"], ["score"], {}), ("Softmax", ["score"], ["prob"], {}),
         ("FC", ["pooled", "box_w", "box_b"], ["box_deltas"], {}),
         ("BBoxTransform", ["rois", "box_deltas", "im_info"], ["boxes", "splits"], {}),
         ("BoxWithNMSLimit", ["prob", "boxes", "splits"], ["s", "b", "c"], {})]
FEEDS = {"data": np.random.default_rng(0).standard_normal((1, 3, 32, 40)).astype(F32),
         "im_info": np.array([[32, 40, 1]], F32)}


def test_detection_heads_follow_the_anchors_and_the_classes():
    """The RPN heads get A (15 by default) and 4A channels, the anchors are A real ones, the box head 4 x the
    classes; proposals and detections are shaped by running the ops on zeros; the net runs."""
    net = net_of(*RPN, *HEADS, outputs=("s", "b", "c"))
    init = synth_init(net, {"data": (1, 3, 32, 40), "im_info": (1, 3)}, width=8, classes=5)
    shapes = shapes_of(init)
    assert shapes["cls_w"] == (15, 8, 1, 1) and shapes["bbox_w"] == (60, 8, 1, 1) and shapes["anchor"] == (15, 4)
    assert shapes["score_w"] == (5, 32) and shapes["box_w"] == (20, 32)
    ws = runs(net, init, FEEDS)
    n = len(ws.fetch("s"))
    assert ws.fetch("b").shape == (n, 4) and ws.fetch("c").shape == (n,)


def test_given_rotated_anchors_set_the_rpn_widths():
    net = net_of(*RPN, outputs=("rois",))
    init = synth_init(net, {"data": (1, 3, 32, 40), "im_info": (1, 3)}, width=8, params={"anchor": (6, 5)})
    shapes = shapes_of(init)
    assert shapes["cls_w"] == (6, 8, 1, 1) and shapes["bbox_w"] == (30, 8, 1, 1) and shapes["anchor"] == (6, 5)
    assert runs(net, init, FEEDS).fetch("rois").shape[1] == 6


def test_synthesized_anchors_are_detectrons():
    a = anchors(15, 16.0)
    assert a.shape == (15, 4)
    np.testing.assert_allclose(a[1], [-8, -8, 23, 23])                  # 32 x 32, ratio 1, centred on 7.5
    widths, heights = a[:, 2] - a[:, 0] + 1, a[:, 3] - a[:, 1] + 1
    np.testing.assert_allclose(widths * heights, np.repeat([32.0, 64, 128, 256, 512], 3) ** 2, rtol=1e-5)
    np.testing.assert_allclose(heights / widths, np.tile([0.5, 1, 2], 5), rtol=1e-5)
    rotated = anchors(4, 8.0, box=5)
    np.testing.assert_allclose(rotated[:, [0, 1, 4]], [[3.5, 3.5, 0]] * 4)
    np.testing.assert_allclose(rotated[:, 2], [16, 32, 64, 128])


# ------------------------------------------------------------------------------------------- Mask R-CNN2Go
@pytest.mark.parametrize("name", ["maskrcnn2go_fp32_model.pb", "maskrcnn2go_fp32_model.pbtxt"])
def test_mask_rcnn2go_widths_follow_its_groups(name):
    net = proto.load(MODELS / name, kind="net")
    shapes = shapes_of(synth_init(net, {"data": (1, 3, 64, 96), "im_info": (1, 3)}, classes=81))
    groups = {op.input[1]: proto.arguments(op.arg)["group"] for _, op in walk_ops(net)
              if op.type == "Conv" and proto.arguments(op.arg).get("group", 1) > 1}
    assert len(groups) > 20
    for w, g in groups.items():     # every grouped conv: out = in, a multiple of its group (>= 96: exactly)
        assert shapes[w][0] % g == 0 and shapes[w][1] * g == shapes[w][0], (w, g, shapes[w])
        if g >= 96:
            assert shapes[w][0] == g, (w, g, shapes[w])
    assert shapes["cls_score_w"][0] == 81 and shapes["bbox_pred_w"][0] == 4 * 81
    assert shapes["rpn_bbox_pred_w"][0] == 4 * shapes["rpn_cls_logits_w"][0] == 4 * shapes["anchor"][0]
    assert any(w.startswith("_[mask]") for w in shapes), "the mask head in the If's else_net is shaped too"


def walk_ops(net):
    from stepnet.graph.view import walk
    return ((net_, op) for _, net_, _, op in walk(net))
