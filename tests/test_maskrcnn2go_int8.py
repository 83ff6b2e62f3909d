"""The quantized Mask R-CNN2Go (facebookarchive/models mask_rcnn_2go/model/int8, real trained weights; files and
provenance in tests/data/SOURCES.md) on a real photograph, Grace Hopper's official portrait (public domain, from
matplotlib's sample data), run as a user runs it: `stepnet run init.pb model.pb --feed data=... --feed
im_info=...`, prepared as the model's own scripts prepare an image (code/blob_utils.py: BGR, no mean, no scaling,
shorter side resized to 320 with OpenCV's bilinear INTER_LINEAR, longer side at most 640).

Two checks, neither taken from the code under test:
- by eye: the boxes, classes and masks were drawn with Pillow over the picture and looked at; what a person sees
  there is written below as boxes (in the resized 320 x 375 image, where the model's BBoxTransform leaves them)
  and as pixels that must or must not be in the person's mask;
- by definition: the same net run with every Int8 op replaced by its float64 definition (dequantize the inputs,
  compute in float64, quantize to the output's Y_scale / Y_zero_point, as Caffe2's int8 docs define the ops)
  gives the same detections, up to what one rounding step per op explains. The fp32 weights of this network
  (mask_rcnn_2go/model/fp32/model_init.pb, 16 MB) are not in the models repository's snapshot, so no fp32 run
  could serve as the reference.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from stepnet import Int8Tensor, Workspace
from stepnet.cli.run import main
from stepnet.core.errors import StepnetWarning
from stepnet.io import proto
from stepnet.ops import REGISTRY
from stepnet.testing import run_op

PIL = pytest.importorskip("PIL.Image")

DATA = Path(__file__).resolve().parent / "data"
INIT, MODEL = DATA / "models" / "maskrcnn2go_int8_model_init.pb", DATA / "models" / "maskrcnn2go_int8_model.pb"
PHOTO = DATA / "photos" / "grace_hopper.jpg"     # 512 x 600 (W x H)
PERSON, TIE = 1, 28                               # COCO class ids as Detectron numbers them (0 is background)


# ------------------------------------------------------------------------------------------- the image
def linear_resize(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """OpenCV's INTER_LINEAR on a float image: sample at (i + 0.5) * in / out - 0.5, clamped at the edges, no
    antialiasing (Pillow's BILINEAR filters when it shrinks, so it is not used)."""
    def taps(n_out, n_in):
        f = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0)
        i0 = np.minimum(np.floor(f).astype(int), n_in - 1)
        return i0, np.minimum(i0 + 1, n_in - 1), f - i0
    y0, y1, ty = taps(out_h, img.shape[0])
    x0, x1, tx = taps(out_w, img.shape[1])
    rows = img[y0] * (1 - ty)[:, None, None] + img[y1] * ty[:, None, None]
    return rows[:, x0] * (1 - tx)[None, :, None] + rows[:, x1] * tx[None, :, None]


def prepare(path: Path, target: int = 320, max_size: int = 640):
    """(data 1 x 3 x H x W float32 BGR in [0, 255], im_info [[H, W, scale]]) as blob_utils.prep_im_for_blob."""
    bgr = np.asarray(PIL.open(path).convert("RGB"))[..., ::-1].astype(np.float64)
    h, w = bgr.shape[:2]
    scale = target / min(h, w)
    if round(scale * max(h, w)) > max_size:
        scale = max_size / max(h, w)
    oh, ow = round(h * scale), round(w * scale)
    data = linear_resize(bgr, oh, ow).astype(np.float32).transpose(2, 0, 1)[None].copy()
    return data, [[oh, ow, scale]]


def run_model(tmp: Path) -> dict:
    """`stepnet run` on the photograph; the detections it saves (score_nms, bbox_nms, class_nms,
    mask_fcn_probs)."""
    data, im_info = prepare(PHOTO)
    np.save(tmp / "data.npy", data)
    out = tmp / "out.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StepnetWarning)
        code = main(["run", str(INIT), str(MODEL), "--feed", f"data={tmp / 'data.npy'}", "--feed",
                     f"im_info={im_info}", "-q", "--save", str(out)])
    assert code == 0, "stepnet run failed (its message is in the captured stderr)"
    return dict(np.load(out))


# ------------------------------------------------------------------------------------------- masks and boxes
def paste_mask(mask: np.ndarray, box, height: int, width: int) -> np.ndarray:
    """A class's M x M mask as a boolean image: padded by one pixel, stretched over the box grown by (M + 2) / M
    and cut at 0.5, as the model's code/utils2.py compute_segm_results does (bilinear here, cv2.resize there)."""
    m = mask.shape[0]
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    hw, hh = (box[2] - box[0]) / 2 * (m + 2) / m, (box[3] - box[1]) / 2 * (m + 2) / m
    x0, y0, x1, y1 = (int(v) for v in (cx - hw, cy - hh, cx + hw, cy + hh))
    padded = np.zeros((m + 2, m + 2), np.float64)
    padded[1:-1, 1:-1] = mask
    w, h = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
    grown = linear_resize(padded[..., None], h, w)[..., 0] > 0.5
    full = np.zeros((height, width), bool)
    ya, yb, xa, xb = max(y0, 0), min(y1 + 1, height), max(x0, 0), min(x1 + 1, width)
    full[ya:yb, xa:xb] = grown[ya - y0:yb - y0, xa - x0:xb - x0]
    return full


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def detections(got: dict, threshold: float):
    keep = got["score_nms"] >= threshold
    return got["score_nms"][keep], got["bbox_nms"][keep], got["class_nms"][keep].astype(int), \
        got["mask_fcn_probs"][keep]


# ------------------------------------------------------------------------------------------- the run, by eye
@pytest.fixture(scope="module")
def int8_run(tmp_path_factory):
    return run_model(tmp_path_factory.mktemp("maskrcnn2go_int8"))


def test_the_photograph_is_prepared_as_the_models_scripts_prepare_it():
    data, im_info = prepare(PHOTO)
    assert data.shape == (1, 3, 375, 320) and data.dtype == np.float32
    assert im_info == [[375, 320, 0.625]]
    rgb = np.asarray(PIL.open(PHOTO).convert("RGB"), np.float64)
    # a 1.6 x shrink: output pixel (i, j) samples the photo at 1.6 i + 0.3, between rows 1.6 i and 1.6 i + 1
    i, j = 100, 50
    fy, fx = 1.6 * i + 0.3, 1.6 * j + 0.3
    y0, x0 = int(fy), int(fx)
    ty, tx = fy - y0, fx - x0
    want = ((1 - ty) * ((1 - tx) * rgb[y0, x0] + tx * rgb[y0, x0 + 1])
            + ty * ((1 - tx) * rgb[y0 + 1, x0] + tx * rgb[y0 + 1, x0 + 1]))[::-1]        # BGR
    np.testing.assert_allclose(data[0, :, i, j], want, rtol=1e-5)


def test_it_finds_the_person_and_her_tie_with_their_masks(int8_run):
    """What the picture shows (drawn and looked at): Grace Hopper in uniform, her shoulders filling the frame's
    width, cut by its bottom edge, a flag behind her on the left; a black tie knotted under a white collar, over
    the white shirt between her lapels. The model, on the 320 x 375 image it sees, should say: one person, box
    from edge to edge and from her cap's top to the bottom edge; a tie between the lapels below the knot; masks on
    her, not on the flag or the wall. (It also finds, less sure, the cap badge as a clock, the name plate as a
    cell phone and a button as a sports ball; these are not checked here.)"""
    scores, boxes, classes, masks = detections(int8_run, 0.5)
    n = len(int8_run["score_nms"])
    assert int8_run["bbox_nms"].shape == (n, 4) and int8_run["mask_fcn_probs"].shape == (n, 81, 24, 24)
    assert ((int8_run["mask_fcn_probs"] >= 0) & (int8_run["mask_fcn_probs"] <= 1)).all()
    people = np.flatnonzero(classes == PERSON)
    assert len(people) == 1, f"one person above 0.5, got classes {classes.tolist()} scores {scores.tolist()}"
    person = boxes[people[0]]
    assert scores[people[0]] > 0.95
    assert iou(person, [8, 30, 318, 374]) > 0.9, person          # shoulders to shoulders, cap to bottom edge
    ties = np.flatnonzero(classes == TIE)
    assert len(ties) >= 1 and scores[ties].max() > 0.9, (classes.tolist(), scores.tolist())
    tie = boxes[ties[np.argmax(scores[ties])]]
    assert 130 < tie[0] < tie[2] < 195 and 240 < tie[1] < tie[3] < 350, tie   # under the chin, above the badges
    mask = paste_mask(masks[people[0], PERSON], person, 375, 320)
    assert mask[150, 160] and mask[60, 160] and mask[330, 60] and mask[330, 260]   # face, cap, both shoulders
    assert not mask[60, 20] and not mask[120, 300] and not mask[200, 30]           # flag, wall, flag
    assert 0.45 < mask.mean() < 0.65                                                # about half the picture
    tie_mask = paste_mask(masks[ties[np.argmax(scores[ties])], TIE], tie, 375, 320)
    assert tie_mask.any() and tie_mask.sum() < 0.05 * tie_mask.size and mask[tie_mask].mean() > 0.95


# ------------------------------------------------------------------------------------------- float64 definitions
def arg_value(arg):
    """An Argument's value as run_op takes it."""
    for field in ("f", "i", "s"):
        if arg.HasField(field):
            value = getattr(arg, field)
            return value.decode() if field == "s" else value
    return list(arg.floats or arg.ints)


def real(t: Int8Tensor) -> np.ndarray:
    return (np.asarray(t.data).astype(np.float64) - t.zero_point) * t.scale


def quantized(y: np.ndarray, Y_scale: float, Y_zero_point: int) -> Int8Tensor:
    scale = float(np.float32(Y_scale))
    return Int8Tensor(np.clip(np.rint(y / scale) + Y_zero_point, 0, 255).astype(np.uint8), scale, Y_zero_point)


def conv64(x, w, b, stride: int, pad: int, group: int):
    """NHWC convolution by taps: x N x H x W x C, w M x K x K x C/group (group 1 or depthwise)."""
    n, h, wd, c = x.shape
    m, k, _, cg = w.shape
    assert group in (1, c) and (group == 1 or (cg == 1 and m == c)), (group, x.shape, w.shape)
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    y = np.zeros((n, oh, ow, m)) + b
    for p in range(k):
        for q in range(k):
            window = xp[:, p:p + stride * (oh - 1) + 1:stride, q:q + stride * (ow - 1) + 1:stride]
            y += window @ w[:, p, q].T if group == 1 else window * w[:, p, q, 0]
    return y


def conv_transpose64(x, w, b, stride: int, pad: int):
    """NHWC transposed convolution by taps: w C x K x K x M; input pixel (i, j) lands at (i s + p, j s + q)."""
    n, h, wd, _ = x.shape
    _, k, _, m = w.shape
    full = np.zeros((n, (h - 1) * stride + k, (wd - 1) * stride + k, m))
    for p in range(k):
        for q in range(k):
            full[:, p:p + stride * (h - 1) + 1:stride, q:q + stride * (wd - 1) + 1:stride] += x @ w[:, p, q]
    return full[:, pad:full.shape[1] - pad, pad:full.shape[2] - pad] + b


def _conv(relu):
    def kernel(xp, X, W, B, *, order, group, Y_scale, Y_zero_point, kernel=None, stride=None, pad=None, **_):
        y = conv64(real(X), real(W), B.data * (X.scale * W.scale), stride or 1, pad or 0, group)
        return quantized(np.maximum(y, 0) if relu else y, Y_scale, Y_zero_point)
    return kernel


def _conv_transpose(xp, X, W, B, *, order, legacy_pad, Y_scale, Y_zero_point, stride=None, pad=None, **_):
    return quantized(conv_transpose64(real(X), real(W), B.data * (X.scale * W.scale), stride or 1, pad or 0),
                     Y_scale, Y_zero_point)


def _average_pool(xp, X, *, order, Y_scale, Y_zero_point, kernel=None, stride=None, **_):
    x, k, s = real(X), kernel, stride or 1
    oh, ow = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
    y = sum(x[:, p:p + s * (oh - 1) + 1:s, q:q + s * (ow - 1) + 1:s] for p in range(k) for q in range(k))
    return quantized(y / (k * k), Y_scale, Y_zero_point)


def _fc(xp, X, W, B, *, Y_scale, Y_zero_point):
    x = real(X).reshape(X.shape[0], -1)
    return quantized(x @ real(W).T + B.data * (X.scale * W.scale), Y_scale, Y_zero_point)


def _softmax(xp, X, *, axis=1, Y_scale, Y_zero_point):
    x = real(X).reshape(X.shape[0], -1)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return quantized((e / e.sum(axis=1, keepdims=True)).reshape(X.shape), Y_scale, Y_zero_point)


DEFINITIONS = {   # Caffe2's Int8 ops in this net, each as float64 arithmetic between quantize / dequantize
    "Int8Quantize": lambda xp, X, *, Y_scale, Y_zero_point: quantized(np.asarray(X, np.float64), Y_scale,
                                                                      Y_zero_point),
    "Int8Dequantize": lambda xp, X: real(X).astype(np.float32),
    "Int8Conv": _conv(False), "Int8ConvRelu": _conv(True), "Int8ConvTranspose": _conv_transpose,
    "Int8Sum": lambda xp, A, B, *, Y_scale, Y_zero_point: quantized(real(A) + real(B), Y_scale, Y_zero_point),
    "Int8Relu": lambda xp, X, *, Y_scale, Y_zero_point: quantized(np.maximum(real(X), 0), Y_scale, Y_zero_point),
    "Int8AveragePool": _average_pool, "Int8FC": _fc, "Int8Softmax": _softmax,
}


def run_defined(tmp: Path, patched, **replace) -> dict:
    """The model run with the DEFINITIONS (and `replace`) in place of the Int8 kernels."""
    for op_type, kernel in {**DEFINITIONS, **replace}.items():
        patched(op_type, kernel=kernel, fused_kernel=None)
    return run_model(tmp)


def assert_same_detections(got: dict, want: dict) -> None:
    """Every detection of `want` scoring 0.25 or more is in `got` (any score): its class, a box of IoU > 0.9,
    a mask of IoU > 0.9; a confident one (0.5 or more) also with a score within 0.1. Uncertain scores move more:
    one code of a class logit (scale 0.1) moves a probability near 0.4 by about 0.02, and the codes of the
    last layers differ by several between the two runs (see the per-op test: each op is within one code, and
    those codes add up over about 90 layers)."""
    ws, wb, wc, wm = detections(want, 0.25)
    gs, gb, gc, gm = detections(got, 0.0)
    assert len(ws) >= 3, "the reference has detections to compare"
    for s, b, c, m in zip(ws, wb, wc, wm):
        match = [i for i in range(len(gs)) if gc[i] == c and iou(gb[i], b) > 0.9]
        assert match, f"class {c} at {np.round(b, 1).tolist()} (score {s:.3f}) not found in {gc.tolist()}"
        i = match[0]
        assert s < 0.5 or abs(gs[i] - s) < 0.1, f"class {c}: score {gs[i]:.3f}, reference {s:.3f}"
        a, e = paste_mask(gm[i, c], gb[i], 375, 320), paste_mask(m[c], b, 375, 320)
        assert (a & e).sum() / (a | e).sum() > 0.9, f"class {c}: masks differ"


def test_every_int8_op_is_within_one_code_of_its_definition_on_the_photographs_activations():
    """Each Int8 op of the net gave, in the run, codes within one of its float64 definition run on the same
    inputs (the photograph's real activations; every blob of this net is written once): the two differ only in
    where they round."""
    ws = Workspace()
    ws.run_net_once(proto.load(INIT))
    data, im_info = prepare(PHOTO)
    ws.feed("data", data)
    ws.feed("im_info", np.array(im_info, np.float32))
    net = proto.load(MODEL)
    ws.run_net_once(net)
    checked = set()
    for op in net.op:
        if op.type not in DEFINITIONS:
            continue
        inputs, args = [ws.fetch(name) for name in op.input], {a.name: arg_value(a) for a in op.arg}
        got = ws.fetch(op.output[0])
        with REGISTRY.patched(op.type, kernel=DEFINITIONS[op.type], fused_kernel=None):
            want = run_op(op.type, inputs, **args)
        if isinstance(want, Int8Tensor):
            assert (got.scale, got.zero_point) == (want.scale, want.zero_point), op.output[0]
            diff = np.abs(np.asarray(got.data).astype(int) - np.asarray(want.data).astype(int))
            assert diff.max() <= 1 and diff.mean() < 0.01, (op.type, op.output[0], diff.max(), diff.mean())
        else:
            np.testing.assert_array_equal(got, want, err_msg=op.output[0])
        checked.add(op.type)
    assert checked == set(DEFINITIONS)


def test_its_detections_are_those_of_the_float64_definitions(int8_run, tmp_path, patched):
    defined = run_defined(tmp_path, patched)
    assert_same_detections(int8_run, defined)
    assert_same_detections(defined, int8_run)


def test_the_comparison_catches_a_wrong_deconvolution(int8_run, tmp_path, patched):
    """The masks come from Int8ConvTranspose alone: its filter zero point dropped, the masks change and the
    comparison says so."""
    def ignores_filter_zero_point(xp, X, W, B, **args):
        return _conv_transpose(xp, X, Int8Tensor(W.data, W.scale, 0), B, **args)
    wrong = run_defined(tmp_path, patched, Int8ConvTranspose=ignores_filter_zero_point)
    with pytest.raises(AssertionError, match="masks differ"):
        assert_same_detections(wrong, int8_run)
