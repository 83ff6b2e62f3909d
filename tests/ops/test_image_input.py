"""ImageInput: batches from minidb records of small PNGs made here with Pillow. The reference is a float64 numpy
pipeline written from Caffe2's description (shorter side to `scale` by area averaging, computed per output
pixel from its source rectangle; centre crop; (x - mean) / std per BGR channel), OpenCV's resize rounding,
enlarging rule and gray reads worked by hand, OpenCV itself (cv2.resize, cv2.imdecode) where it is installed,
and, for random crops and mirrors, the set of every window the op may pick."""
import io

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.caffe2_pb2 import TensorProto
from stepnet.core.errors import ArgumentError, FileFormatError, ResourceError
from stepnet.core.limits import Limits
from stepnet.io import minidb
from stepnet.io.image_records import datum_record
from stepnet.io.proto import DeviceOption, TensorProtos
from stepnet.kernels import image_transforms
from stepnet.ops import REGISTRY
from stepnet.testing import make_op

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def record(image, label, *more) -> bytes:
    """A TensorProtos: the image (PNG bytes -> STRING, uint8 array -> BYTE), the label, then more tensors."""
    protos = TensorProtos()
    t = protos.protos.add()
    if isinstance(image, bytes):
        t.data_type = TensorProto.STRING
        t.string_data.append(image)
    else:
        t.data_type, t.byte_data = TensorProto.BYTE, image.tobytes()
        t.dims.extend(image.shape)
    for value in (label, *more):
        arr = np.asarray(value)
        t = protos.protos.add()
        t.dims.extend(arr.shape)
        if arr.dtype.kind == "f":
            t.data_type = TensorProto.FLOAT
            t.float_data.extend(arr.reshape(-1).tolist())
        else:
            t.data_type = TensorProto.INT32
            t.int32_data.extend(arr.reshape(-1).tolist())
    return protos.SerializeToString()


def images(seed=0, sizes=((12, 9), (8, 8), (10, 17))):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def run_input(values, seed=1, ws=None, outputs=("data", "label"), **args):
    minidb.write_records("data.minidb", [(f"{i:04d}", v) for i, v in enumerate(values)])
    ws = ws or Workspace()
    net = NetDef(name="input")
    net.op.extend([make_op("CreateDB", [], ["reader"], db="data.minidb", db_type="minidb"),
                   make_op("ImageInput", ["reader"], list(outputs), **args)])
    net.op[1].device_option.CopyFrom(DeviceOption(random_seed=seed))
    ws.run_net_once(net)
    return [ws.fetch(o) for o in outputs]


# --------------------------------------------------------------------------------------------- the reference
def ref_area(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Downscale by area: output pixel (i, j) is the mean of source rectangle [i·sy, (i+1)·sy) × [j·sx, (j+1)·sx)
    weighted by overlap, in float64."""
    sy, sx = img.shape[0] / h, img.shape[1] / w
    out = np.zeros((h, w, img.shape[2]))
    for i in range(h):
        for j in range(w):
            acc = np.zeros(img.shape[2])
            for y in range(img.shape[0]):
                oy = max(0.0, min((i + 1) * sy, y + 1) - max(i * sy, y))
                for x in range(img.shape[1]):
                    ox = max(0.0, min((j + 1) * sx, x + 1) - max(j * sx, x))
                    acc += oy * ox * img[y, x]
            out[i, j] = acc / (sy * sx)
    return out


def reference(rgb: np.ndarray, scale: int, crop: int, mean, std) -> np.ndarray:
    bgr = rgb[:, :, ::-1].astype(np.float64)
    h, w = bgr.shape[:2]
    nh, nw = (scale, int(w * scale / h)) if h <= w else (int(h * scale / w), scale)
    scaled = np.rint(ref_area(bgr, nh, nw))   # the op holds the scaled image as uint8
    y, x = (nh - crop) // 2, (nw - crop) // 2
    return (scaled[y:y + crop, x:x + crop] - np.asarray(mean)) / np.asarray(std)


def check_batch(got, rgbs, scale, crop, mean, std):
    """Every image within one step of the uint8 rounding of the reference, and nearly all exactly on it."""
    want = np.stack([reference(im, scale, crop, mean, std) for im in rgbs])
    assert got.shape == want.shape and got.dtype == np.float32
    step = 1.0 / min(std)
    assert np.abs(got - want).max() <= step + 1e-4
    assert np.mean(np.abs(got - want) < 1e-4) > 0.97


MEAN, STD = [100.0, 110.0, 120.0], [50.0, 60.0, 70.0]


def test_center_crop_scale_and_normalize_match_the_reference():
    rgbs = images()
    data, label = run_input([record(png(im), np.array([i + 3], np.int32)) for i, im in enumerate(rgbs)],
                            batch_size=3, scale=7, crop=5, is_test=1, mean_per_channel=MEAN, std_per_channel=STD)
    check_batch(data, rgbs, 7, 5, MEAN, STD)
    assert label.dtype == np.int32 and label.tolist() == [3, 4, 5]


def test_the_check_catches_a_crop_one_pixel_off(broken):
    rgbs = images()
    kernel = REGISTRY.get("ImageInput").kernel

    def off_by_one(ctx, xp, *inputs, **args):
        data, label = kernel(ctx, xp, *inputs, **args)
        return np.roll(data, 1, axis=2), label
    broken("ImageInput", off_by_one)
    data, _ = run_input([record(png(im), np.array([0], np.int32)) for im in rgbs],
                        batch_size=3, scale=7, crop=5, is_test=1, mean_per_channel=MEAN, std_per_channel=STD)
    with pytest.raises(AssertionError):
        check_batch(data, rgbs, 7, 5, MEAN, STD)


def test_enlarging_follows_opencvs_inter_area_rule():
    """[a, b] to 3 pixels is [a, (a+b)/2, b]; to 4, [a, a, b, b] (worked from OpenCV's coefficients)."""
    row = np.array([[[10], [21]]], np.uint8)
    assert image_transforms.area_resize(row, 1, 3)[0, :, 0].tolist() == [10, 16, 21]    # 15.5: fixed point, up
    assert image_transforms.area_resize(row, 1, 4)[0, :, 0].tolist() == [10, 10, 21, 21]


def test_minsize_only_enlarges_and_gpu_transform_gives_nchw_float16():
    rgb = images(sizes=((4, 6),))[0]
    rec = [record(png(rgb), np.array([1], np.int32))]
    data, _ = run_input(rec, batch_size=1, minsize=3, crop=3, is_test=1)     # big enough: no resize
    assert np.array_equal(data[0], rgb[:, :, ::-1][0:3, 1:4].astype(np.float32))
    nchw, _ = run_input(rec, batch_size=1, minsize=3, crop=3, is_test=1, use_gpu_transform=1,
                        output_type="float16", mean=10.0, std=2.0)
    assert nchw.dtype == np.float16 and nchw.shape == (1, 3, 3, 3)
    want = ((rgb[:, :, ::-1][0:3, 1:4].astype(np.float64) - 10) / 2).transpose(2, 0, 1)
    assert np.array_equal(nchw[0], want.astype(np.float16))


def test_gray_output_and_raw_pixels_with_a_bounding_box():
    rgb = images(sizes=((6, 6),))[0]
    data, _ = run_input([record(png(rgb), np.array([0], np.int32))], batch_size=1, scale=6, crop=6, is_test=1,
                        color=0)
    gray = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    drop = gray - data[0, :, :, 0]              # a color PNG read gray: libpng's 15-bit weights, truncated
    assert data.shape == (1, 6, 6, 1) and drop.min() > -0.02 and drop.max() < 1.02 and drop.mean() > 0.25
    bgr = rgb[:, :, ::-1].copy()
    box = np.array([1, 2, 4, 3], np.int32)    # ymin, xmin, height, width
    data, _ = run_input([record(bgr, np.array([0], np.int32), box)], batch_size=1, scale=3, crop=3, is_test=1)
    boxed = bgr[1:5, 2:5].astype(np.float64)
    want = np.rint(ref_area(boxed, 4, 3))[0:3]   # shorter side 3 stays, 4 rows: centre crop from row 0
    assert np.array_equal(data[0], want.astype(np.float32))


def test_random_crops_and_mirrors_pick_windows_and_repeat_with_the_seed():
    rgb = images(sizes=((7, 7),))[0]
    bgr = rgb[:, :, ::-1].astype(np.float32)
    recs = [record(png(rgb), np.array([0], np.int32))] * 8
    data, _ = run_input(recs, batch_size=8, scale=7, crop=4, mirror=1)
    windows = [w for y in range(4) for x in range(4) for w in (bgr[y:y + 4, x:x + 4], bgr[y:y + 4, x:x + 4][:, ::-1])]
    picked = [next(k for k, w in enumerate(windows) if np.array_equal(d, w)) for d in data]
    assert len(set(picked)) > 2 and any(k % 2 for k in picked)      # several places, some mirrored
    again, _ = run_input(recs, batch_size=8, scale=7, crop=4, mirror=1)
    assert np.array_equal(again, data)


def test_jitter_and_lighting_change_training_images_only():
    rgb = images(sizes=((5, 5),))[0]
    recs = [record(png(rgb), np.array([0], np.int32))]
    plain, _ = run_input(recs, batch_size=1, scale=5, crop=5, is_test=1, color_jitter=1, color_lighting=1)
    assert np.array_equal(plain[0], rgb[:, :, ::-1].astype(np.float32))
    lit, _ = run_input(recs, batch_size=1, scale=5, crop=5, color_lighting=1, color_lighting_std=1.0)
    shift = lit[0] - rgb[:, :, ::-1]
    assert np.allclose(shift, shift[0, 0], atol=1e-4) and np.abs(shift[0, 0]).max() > 0   # one shift per channel
    unlit, _ = run_input(recs, batch_size=1, scale=5, crop=5, color_lighting=1, color_lighting_std=-0.0)
    assert np.array_equal(unlit[0], plain[0])     # std -0.0 is 0: no shift (numpy's sampler refuses its sign)


def test_label_types():
    rgb = png(images(sizes=((4, 4),))[0])
    common = dict(batch_size=2, scale=4, crop=4, is_test=1)
    _, sparse = run_input([record(rgb, np.array([0, 3], np.int32)), record(rgb, np.array([2], np.int32))],
                          label_type=1, num_labels=4, **common)
    assert sparse.tolist() == [[1, 0, 0, 1], [0, 0, 1, 0]] and sparse.dtype == np.int32
    _, dense = run_input([record(rgb, np.array([0.5, 1.5], np.float32))] * 2, label_type=2, num_labels=2, **common)
    assert dense.tolist() == [[0.5, 1.5]] * 2 and dense.dtype == np.float32
    _, weighted = run_input([record(rgb, np.array([1], np.int32), np.array([0.25], np.float32))] * 2,
                            label_type=3, num_labels=3, **common)
    assert weighted.tolist() == [[0, 0.25, 0]] * 2
    _, single = run_input([record(rgb, np.array([2.5], np.float32))] * 2, **common)
    assert single.tolist() == [2.5, 2.5] and single.dtype == np.float32
    data, label, extra = run_input([record(rgb, np.array([1], np.int32), np.array([7, 8], np.int32))] * 2,
                                   outputs=("data", "label", "extra"), output_sizes=[2], **common)
    assert extra.tolist() == [[7, 8], [7, 8]] and extra.dtype == np.int32
    with pytest.raises(FileFormatError, match=r"label index 4 is out of range \[0, num_labels=4\)"):
        run_input([record(rgb, np.array([4], np.int32))] * 2, label_type=1, num_labels=4, **common)


def test_caffe_datum_records_and_the_ops_own_reader():
    rgb = images(sizes=((5, 5),))[0]
    bgr = rgb[:, :, ::-1].copy()
    recs = [datum_record(png(rgb), 7), datum_record(bgr, 9)]
    data, label = run_input(recs, batch_size=2, scale=5, crop=5, is_test=1, use_caffe_datum=1)
    assert np.array_equal(data[0], bgr.astype(np.float32)) and np.array_equal(data[1], data[0])
    assert label.tolist() == [7, 9]
    ws = Workspace()
    op = make_op("ImageInput", [], ["d", "l"], db="data.minidb", db_type="minidb", batch_size=1, scale=5, crop=5,
                 is_test=1, use_caffe_datum=1)
    ws.create_net(NetDef(name="own", op=[op]))
    labels = []
    for _ in range(3):
        ws.run_net("own")
        labels.append(int(ws.fetch("l")[0]))
    assert labels == [7, 9, 7]


def test_bad_records_and_arguments_are_one_line_errors(tmp_path):
    ok = dict(batch_size=1, scale=4, crop=4, is_test=1)
    with pytest.raises(FileFormatError, match="record '0000'.*not a PNG/JPEG.* file Pillow can decode \\(no such"):
        run_input([record(b"%!PS-Adobe-3.0 EPSF-3.0\n", np.array([0], np.int32))], **ok)
    big = png(np.zeros((100, 100, 3), np.uint8))    # a small file for a 30,000-byte image
    with pytest.raises(ResourceError, match="decoding the image: blob 'data' would be"):
        run_input([record(big, np.array([0], np.int32))], ws=Workspace(limits=Limits(max_blob_bytes=20000)), **ok)
    ints = TensorProto(data_type=TensorProto.INT32, dims=[1], int32_data=[0])
    with pytest.raises(FileFormatError, match="the image tensor is INT32"):
        run_input([TensorProtos(protos=[ints, ints]).SerializeToString()], **ok)
    rgb = png(images(sizes=((4, 4),))[0])
    for args, msg in ((dict(ok, batch_size=0), "batch_size must be > 0"),
                      (dict(ok, minsize=4), "one and only one of scale and minsize"),
                      (dict(ok, crop=5), "must be no smaller than crop 5"),
                      (dict(ok, mean_per_channel=[1.0, 2.0]), "1 or 3 values"),
                      (dict(ok, label_type=1), "label_type 1 needs num_labels > 0"),
                      (dict(ok, color_lighting=1, color_lighting_std=-0.5), "color_lighting_std .* must be >= 0")):
        with pytest.raises(ArgumentError, match=msg):
            run_input([record(rgb, np.array([0], np.int32))], **args)


# ------------------------------------------------------------------------ OpenCV's arithmetic, worked by hand
def test_area_resize_whole_factors_round_as_opencv():
    """2×2 blocks: (sum + 2) >> 2 (10/4 -> 3); other whole factors: the float mean rounded half to even (5/2 -> 2);
    3 -> 2 pixels: shares 2/3 and 1/3 ([10, 20, 31] -> 13.33, 27.33 -> [13, 27])."""
    block = np.array([[1, 3], [2, 4]], np.uint8)[:, :, None]
    assert image_transforms.area_resize(block, 1, 1).item() == 3
    assert image_transforms.area_resize(np.array([[[2], [3]]], np.uint8), 1, 1).item() == 2
    assert image_transforms.area_resize(np.array([[[10], [20], [31]]], np.uint8), 1, 2).ravel().tolist() == [13, 27]


def test_enlarging_picks_the_source_pixel_opencvs_doubles_pick():
    """21 -> 27 pixels: output 9 reads source floor(9 · (1 / (27/21))) = floor(6.999...) = 6 with weight 1 (the
    fraction (9 + 1) - 7 · 27/21 is not > 0), not source 7 as exact arithmetic would."""
    row = (np.arange(21, dtype=np.uint8) * 10)[None, :, None]
    out = image_transforms.area_resize(row, 1, 27)[0, :, 0]
    assert out[8] == out[9] == 60 and out[10] == 77


def test_area_resize_is_opencvs_bit_for_bit():
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(5)
    for case in range(150):
        h, w, nh, nw = (int(v) for v in rng.integers(1, 40, 4))
        if case % 5 == 0:      # whole factors
            nh, nw = max(1, h // int(rng.integers(1, 4))), max(1, w // int(rng.integers(2, 4)))
            h, w = h - h % nh, w - w % nw
        img = rng.integers(0, 256, (h, w, 1 if case % 3 == 0 else 3), dtype=np.uint8)
        want = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA).reshape(nh, nw, img.shape[2])
        assert np.array_equal(image_transforms.area_resize(img, nh, nw), want), (h, w, nh, nw)


def test_gray_reads_follow_opencvs_decoders():
    """A color PNG read gray is libpng's conversion: 0.299·100 + 0.587·150 + 0.114·200 = 140.75 truncates to 140;
    raw BGR pixels go through cvtColor's rounding (141); a JPEG read gray is its luma plane."""
    rgb = np.full((2, 2, 3), (100, 150, 200), np.uint8)
    gray = dict(batch_size=1, scale=2, crop=2, is_test=1, color=0)
    data, _ = run_input([record(png(rgb), np.array([0], np.int32))], **gray)
    assert data.ravel().tolist() == [140] * 4
    data, _ = run_input([record(rgb[:, :, ::-1].copy(), np.array([0], np.int32))], **gray)
    assert data.ravel().tolist() == [141] * 4
    buf = io.BytesIO()
    Image.fromarray(images(sizes=((8, 8),))[0]).save(buf, format="JPEG", quality=80)
    jpeg = Image.open(io.BytesIO(buf.getvalue()))
    jpeg.draft("YCbCr", jpeg.size)                  # the decoder's own planes, before any color conversion
    luma = np.asarray(jpeg)[:, :, 0]
    data, _ = run_input([record(buf.getvalue(), np.array([0], np.int32))], **dict(gray, scale=8, crop=8))
    assert np.array_equal(data[0, :, :, 0], luma)


def test_decoding_is_opencvs():
    cv2 = pytest.importorskip("cv2")
    from stepnet.io.image_records import decode
    from stepnet.kernels.image_transforms import to_channels
    rgb = images(sizes=((9, 11),))[0]
    for fmt in ("PNG", "JPEG", "BMP"):
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format=fmt)
        raw = np.frombuffer(buf.getvalue(), np.uint8)
        assert np.array_equal(decode(buf.getvalue(), True, 1 << 20, "b", fmt), cv2.imdecode(raw, cv2.IMREAD_COLOR))
        gray = to_channels(decode(buf.getvalue(), False, 1 << 20, "b", fmt), 1)[:, :, 0]
        assert np.array_equal(gray, cv2.imdecode(raw, cv2.IMREAD_GRAYSCALE)), fmt


def test_labels_and_outputs_are_read_whatever_the_dims_say():
    """Caffe2's own test writes labels and extra tensors without dims: the values are what count."""
    protos = TensorProtos()
    protos.protos.add(data_type=TensorProto.STRING, string_data=[png(images(sizes=((4, 4),))[0])])
    protos.protos.add(data_type=TensorProto.INT32, int32_data=[0, 3])
    protos.protos.add(data_type=TensorProto.FLOAT, float_data=[2.5])
    protos.protos.add(data_type=TensorProto.INT32, int32_data=[7, 8, 9])
    _, label, extra, more = run_input([protos.SerializeToString()], outputs=("data", "label", "extra", "more"),
                                      batch_size=1, scale=4, crop=4, is_test=1, label_type=1, num_labels=4,
                                      output_sizes=[1, 3])
    assert label.tolist() == [[1, 0, 0, 1]] and extra.tolist() == [[2.5]] and more.tolist() == [[7, 8, 9]]
