"""ImageInput (caffe2/image/image_input_op.h): a batch of images and labels from a DB reader's records.

Per image, as Caffe2: read a record (io/image_records.py: a TensorProtos or, with use_caffe_datum, a Caffe
Datum), decode it (BGR, what OpenCV gives), make it color (3 channels) or gray, apply the bounding box, then
either an Inception-style random sized crop (scale_jitter_type 1, training) or a resize (OpenCV's INTER_AREA)
of the shorter side to `scale` (always) or `minsize` (only to enlarge; a random one from `random_scale`), both
sides with warp; crop crop×crop (centred with is_test, else at random), mirror at random (mirror, training),
colour jitter and lighting (training, color), subtract mean and divide by std per channel (BGR order). The data
output is float32 N×crop×crop×C (NHWC, as Caffe2's CPU op; brew.image_input adds NHWC2NCHW); with
use_gpu_transform it is what Caffe2's GPU transform gives: N×C×crop×crop in output_type (float or float16),
without jitter or lighting. Labels: label_type 0 one label per image (int32 or float32, as the records hold it),
1 sparse indices -> N×num_labels 0/1, 2 dense N×num_labels values, 3 sparse indices with weights (the record's
third tensor) -> float32 N×num_labels, 4 one label with a weight tensor that is skipped. Outputs after the
second are the records' next tensors, N×output_sizes[i]. Random draws (crops, mirrors, jitter) come from the
op's generator (its device option's random_seed, else the workspace's), so a seeded run repeats; Caffe2 draws
from per-thread generators seeded by the clock. Reads happen when the op runs (Caffe2 prefetches a batch ahead
in a thread; the sequence of batches is the same). Without an input the op opens its own reader from `db` and
`db_type` (Caffe2's old form), kept for the op's later runs.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, FileFormatError, ShapeError
from ..core.limits import check_blob
from ..core.spec import UNKNOWN, spec
from ..distributed import world
from ..io.dbreader import DBReader, check_db_type
from ..io.image_records import parse_datum, parse_tensor_protos
from ..kernels import image_transforms as T
from .db import _check_reader
from .registry import NO_GRADIENT, Arg, op
from .sums import cast_dtype

ARGS = {"batch_size": 0, "label_type": 0, "num_labels": 0, "color": 1, "color_jitter": 0,
        "img_saturation": Arg("num", 0.4), "img_brightness": Arg("num", 0.4), "img_contrast": Arg("num", 0.4),
        "color_lighting": 0, "color_lighting_std": Arg("num", 0.1), "scale_jitter_type": 0, "scale": -1,
        "minsize": -1, "warp": 0, "crop": -1, "mirror": 0, "mean": Arg("num", 0.0),
        "mean_per_channel": Arg("floats", []), "std": Arg("num", 1.0), "std_per_channel": Arg("floats", []),
        "bounding_ymin": -1, "bounding_xmin": -1, "bounding_height": -1, "bounding_width": -1, "is_test": 0,
        "use_caffe_datum": 0, "use_gpu_transform": 0, "decode_threads": 4, "output_type": Arg("any", "float"),
        "db": "", "db_type": "leveldb", "output_sizes": Arg("ints", []), "random_scale": Arg("ints", [-1, -1])}
SINGLE, SPARSE, DENSE, WEIGHTED_SPARSE, SINGLE_WEIGHTED = range(5)


def config(n_outputs: int, a: dict) -> dict:
    """The checked settings (Caffe2's constructor checks, each one line)."""
    if a["batch_size"] <= 0:
        raise ArgumentError(f"batch_size must be > 0, got {a['batch_size']}")
    if a["label_type"] not in range(5):
        raise ArgumentError(f"label_type must be 0 (one label), 1 (sparse), 2 (dense), 3 (weighted sparse) or 4 "
                            f"(one weighted label), got {a['label_type']}")
    if a["use_caffe_datum"] and a["label_type"] not in (SINGLE, SINGLE_WEIGHTED):
        raise ArgumentError("a Caffe datum holds one integer label: use_caffe_datum needs label_type 0 or 4")
    if a["label_type"] not in (SINGLE, SINGLE_WEIGHTED) and a["num_labels"] <= 0:
        raise ArgumentError(f"label_type {a['label_type']} needs num_labels > 0, got {a['num_labels']}")
    random_scale = list(a["random_scale"])
    if len(random_scale) != 2:
        raise ArgumentError(f"random_scale must be [min, max], got {random_scale}")
    randomly = -1 not in random_scale
    if randomly and random_scale[1] < random_scale[0]:
        raise ArgumentError(f"random_scale {random_scale} must be a range [min, max] with min <= max")
    scale, minsize, crop = a["scale"], random_scale[0] if randomly else a["minsize"], a["crop"]
    if (scale > 0) == (minsize > 0):
        raise ArgumentError(f"give one and only one of scale and minsize (or random_scale) > 0; got scale "
                            f"{scale}, minsize {minsize}")
    if crop <= 0:
        raise ArgumentError(f"crop must be > 0 (the output's height and width), got {crop}")
    if max(scale, minsize) < crop:
        raise ArgumentError(f"the scale/minsize {max(scale, minsize)} must be no smaller than crop {crop}")
    mean = list(a["mean_per_channel"]) or [float(a["mean"])]
    std = list(a["std_per_channel"]) or [float(a["std"])]
    if len(mean) != len(std) or len(mean) not in (1, 3):
        raise ArgumentError(f"mean and std must both have 1 or 3 values (one per channel), got {len(mean)} and "
                            f"{len(std)}")
    if 0.0 in std:
        raise ArgumentError(f"std {std} must not hold a 0 (the op divides by it)")
    if a["use_caffe_datum"] and n_outputs != 2:
        raise ArgumentError(f"with use_caffe_datum the op has 2 outputs (data, label), got {n_outputs}")
    sizes = list(a["output_sizes"]) or [1] * (n_outputs - 2)
    if len(sizes) != n_outputs - 2 or min(sizes, default=1) < 0:
        raise ArgumentError(f"output_sizes must give a size >= 0 for each of the {n_outputs - 2} additional "
                            f"outputs, got {list(a['output_sizes'])}")
    if a["color_lighting"] and a["color_lighting_std"] < 0:
        raise ArgumentError(f"color_lighting_std is the lighting noise's standard deviation and must be >= 0, got "
                            f"{a['color_lighting_std']}")
    if a["scale_jitter_type"] not in (0, 1):
        raise ArgumentError(f"scale_jitter_type must be 0 (none) or 1 (Inception-style), got {a['scale_jitter_type']}")
    out_dtype = cast_dtype(a["output_type"], "output_type")
    if a["use_gpu_transform"] and out_dtype not in (np.float32, np.float16):
        raise ArgumentError(f"output_type must be float or float16, got {a['output_type']!r}")
    box = (a["bounding_ymin"], a["bounding_xmin"], a["bounding_height"], a["bounding_width"])
    return dict(a, channels=3 if a["color"] else 1, minsize=minsize, random_scale=random_scale if randomly else None,
                mean=np.array(mean * (3 // len(mean)), np.float32), sizes=sizes, out_dtype=out_dtype,
                inv_std=np.float32(1) / np.array(std * (3 // len(std)), np.float32),
                box=box if min(box) >= 0 else None)


def _reader(ctx, readers, db, db_type) -> DBReader:
    if readers:
        return _check_reader(readers[0], 0, ctx)
    if "reader" not in ctx.state:   # Caffe2's old form: the op's own reader
        if not db:
            raise ArgumentError("ImageInput without an input needs the db argument (or give a DB reader input)")
        check_db_type(db_type)
        ctx.state["reader"] = DBReader(world.expand(db), db_type).open(ctx.workspace.limits, ctx.label)
    return ctx.state["reader"]


def prepare(img: np.ndarray, box, c: dict, rng, where: str) -> np.ndarray:
    """A decoded image, colour-converted, boxed and scaled (or Inception-cropped), before the crop."""
    img = T.to_channels(img, c["channels"])
    if box is not None:
        y, x, h, w = box
        if min(y, x) < 0 or h <= 0 or w <= 0:
            raise FileFormatError(f"{where}: bounding box [ymin {y}, xmin {x}, height {h}, width {w}] is empty or "
                                  "negative")
        if y + h <= img.shape[0] and x + w <= img.shape[1]:    # (one past the image is ignored, as in Caffe2)
            img = img[y:y + h, x:x + w]
    if c["scale_jitter_type"] == 1 and not c["is_test"]:
        cropped = T.inception_crop(img, c["crop"], rng)
        if cropped is not None:
            return cropped
    target = c["scale"] if c["scale"] > 0 else c["minsize"]
    if c["random_scale"] is not None:
        target = int(rng.integers(c["random_scale"][0], c["random_scale"][1] + 1))
    h, w = T.scaled_size(img.shape[0], img.shape[1], target, c["warp"])
    if (c["scale"] > 0 and (h, w) != img.shape[:2]) or h > img.shape[0] or w > img.shape[1]:
        img = T.area_resize(img, h, w)
    return img


def transform(img: np.ndarray, c: dict, rng, where: str) -> np.ndarray:
    """The crop (float32 normalized, or uint8 for the GPU transform's path) of a prepared image."""
    crop = c["crop"]
    if img.shape[0] < crop or img.shape[1] < crop:
        raise ShapeError(f"{where}: the scaled image is {img.shape[0]}×{img.shape[1]}, smaller than crop {crop}")
    y, x = T.crop_offsets(img.shape[0], img.shape[1], crop, bool(c["is_test"]), rng)
    gpu = c["use_gpu_transform"]
    flip = bool(c["mirror"]) and (gpu or not c["is_test"]) and rng.random() < 0.5
    window = T.crop_mirror(img, crop, y, x, flip)
    if gpu:
        return window
    out = window.astype(np.float32)
    if c["channels"] == 3 and not c["is_test"]:
        if c["color_jitter"]:
            T.color_jitter(out, c["img_saturation"], c["img_brightness"], c["img_contrast"], rng)
        if c["color_lighting"]:
            T.color_lighting(out, c["color_lighting_std"], rng)
    return T.normalize(out, c["mean"], c["inv_std"])


def _labels(rows, c: dict, where) -> np.ndarray:
    """The label output from each record's label (and weights)."""
    kind, n = c["label_type"], c["num_labels"]
    first = rows[0].label.dtype
    for rec, w in zip(rows, where):
        if rec.label.dtype != first:
            raise FileFormatError(f"{w}: the label is {rec.label.dtype}, but the batch's first is {first}; every "
                                  "record's label must have one type")
    if kind in (SINGLE, SINGLE_WEIGHTED):
        for rec, w in zip(rows, where):
            if rec.label.size != 1:
                raise FileFormatError(f"{w}: label_type {kind} reads one label, the record holds {rec.label.size}")
        return np.array([rec.label[0] for rec in rows], first)
    out = np.zeros((len(rows), n), np.float32 if kind == WEIGHTED_SPARSE else first)
    for i, (rec, w) in enumerate(zip(rows, where)):
        if kind == DENSE:
            if rec.label.size != n:
                raise FileFormatError(f"{w}: a dense label must hold num_labels={n} values, got {rec.label.size}")
            out[i] = rec.label
            continue
        idx = rec.label.astype(np.int64)    # (float indices truncated, as Caffe2's (int) cast)
        bad = idx[(idx < 0) | (idx >= n)]
        if bad.size:
            raise FileFormatError(f"{w}: label index {bad[0]} is out of range [0, num_labels={n})")
        if kind == WEIGHTED_SPARSE:
            if rec.weights.size < idx.size:
                raise FileFormatError(f"{w}: {idx.size} label indices but {rec.weights.size} weights")
            out[i, idx] = rec.weights[:idx.size]
        else:
            out[i, idx] = 1
    return out


def _extras(rows, c: dict, where) -> list[np.ndarray]:
    outs = []
    for k, size in enumerate(c["sizes"]):
        first = rows[0].extras[k].dtype
        for rec, w in zip(rows, where):
            t = rec.extras[k]
            if t.size != size or t.dtype != first:
                raise FileFormatError(f"{w}: the tensor for output {k + 2} is {t.size} {t.dtype} values; the op "
                                      f"wants {size} (output_sizes) of one type ({first}) in every record")
        outs.append(np.stack([rec.extras[k] for rec in rows]) if rows else np.zeros((0, size)))
    return outs


def _shape(specs, batch_size=0, crop=-1, color=1, use_gpu_transform=0, output_type="float", label_type=0,
           num_labels=0, **_):
    c = 3 if color else 1
    if crop <= 0 or batch_size <= 0:
        return []
    if use_gpu_transform:
        data = spec((batch_size, c, crop, crop), cast_dtype(output_type, "output_type"))
    else:
        data = spec((batch_size, crop, crop, c), np.float32)
    label = spec((batch_size, num_labels), np.float32) if label_type == WEIGHTED_SPARSE else UNKNOWN
    return [data, label]


@op("ImageInput", inputs=(0, 1), outputs=(2, None), context=True, random=True, devices="any",
    gradient=NO_GRADIENT, args=ARGS, shape=_shape)
def image_input(ctx, xp, *readers, rng, **args):
    """batch_size records of a DB reader (the input, or one opened from db/db_type) as an image batch and its
    labels; see the module's docstring for the steps."""
    c = config(len(ctx.opdef.output), args)
    reader = _reader(ctx, readers, args["db"], args["db_type"])
    limit = ctx.workspace.limits.max_blob_bytes
    n, crop, ch = c["batch_size"], c["crop"], c["channels"]
    data_dtype = np.uint8 if c["use_gpu_transform"] else np.float32
    check_blob(limit, ctx.opdef.output[0], (n, crop, crop, ch), np.float32, ctx.label)
    data = np.empty((n, crop, crop, ch), data_dtype)
    rows, wheres = [], []
    blob = ctx.opdef.output[0]
    for i in range(n):
        _, value, where = reader.read()
        if c["use_caffe_datum"]:
            rec = parse_datum(value, where, color=bool(c["color"]), limit=limit, blob=blob)
        else:
            rec = parse_tensor_protos(value, where, color=bool(c["color"]), limit=limit, blob=blob,
                                      weighted=c["label_type"] in (WEIGHTED_SPARSE, SINGLE_WEIGHTED),
                                      extras=len(c["sizes"]))
        img = prepare(rec.image, rec.box if rec.box is not None else c["box"], c, rng, where)
        data[i] = transform(img, c, rng, where)
        rows.append(rec)
        wheres.append(where)
    if c["use_gpu_transform"]:
        nchw = T.normalize(data.astype(np.float32), c["mean"], c["inv_std"]).transpose(0, 3, 1, 2)
        data = np.ascontiguousarray(nchw).astype(c["out_dtype"])
    outs = [data, _labels(rows, c, wheres), *_extras(rows, c, wheres)]
    return tuple(xp.asarray(o) for o in outs)
