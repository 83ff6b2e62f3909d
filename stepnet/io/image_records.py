"""The records Caffe2's ImageInput reads: a TensorProtos (the image, as one encoded file in a STRING tensor or raw
uint8 pixels H×W or H×W×C in a BYTE tensor; the label, INT32 or FLOAT; optional weights, extra tensors and a
trailing INT32 bounding box [ymin, xmin, height, width]) or a Caffe Datum (caffe.proto's message, built here
from its field numbers: Caffe's schema is not part of stepnet's). Images come out uint8 H×W×C in BGR order,
what OpenCV's imdecode gives; encoded ones are decoded with Pillow (the `image` extra), checked against the
blob limit from their header before any pixel is decoded."""
from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass

import numpy as np

from ..caffe2_pb2 import TensorProto
from ..core.errors import FileFormatError, StepnetError
from ..core.limits import check_blob
from .images import _pil
from .proto import TensorProtos
from .tensors import tensor_to_array
from .validate import parse_checked

# What OpenCV's imdecode reads, and nothing Pillow would hand to an outside program (EPS: Ghostscript)
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "PPM", "TIFF")
LABEL_TYPES = {TensorProto.INT32: np.int32, TensorProto.FLOAT: np.float32}
EXTRA_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}


@dataclass
class Record:
    image: np.ndarray             # H×W×C uint8, BGR (C = 1 or 3, as stored)
    label: np.ndarray             # 1-d, int32 or float32
    weights: np.ndarray | None    # the per-label weights (label types 3 and 4)
    extras: list                  # 1-d arrays, one per additional output
    box: tuple | None             # (ymin, xmin, height, width) from the record


def decode(data: bytes, color: bool, limit: int, blob: str, where: str) -> np.ndarray:
    """An encoded image file's pixels, uint8 H×W×3 BGR; when not color, H×W×1 where OpenCV's grayscale read has
    its own rule (a gray file, a JPEG's luma, libpng's conversion of a color PNG), else H×W×3 (the caller makes
    it gray with cvtColor's weights, as OpenCV's BMP, PPM and TIFF readers do); refused before decoding when
    H×W×C bytes pass `limit` (a few KB of PNG may hold a 13000×13000 image)."""
    Image = _pil()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=list(FORMATS))
        with im:
            width, height = im.size
            check_blob(limit, blob, (height, width, 3 if color else 1), np.uint8, f"{where}: decoding the image")
            if not color and im.format == "JPEG" and im.mode == "RGB":
                im.draft("L", im.size)     # libjpeg's luma plane, what OpenCV's grayscale read of a JPEG is
            im.load()
            if not color and im.mode == "L":
                return np.asarray(im)[:, :, None].copy()
            rgb = np.asarray(im.convert("RGB"))
            if not color and im.format == "PNG":
                return png_gray(rgb)
    except StepnetError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow meeting bad bytes raises OSError, ValueError, SyntaxError, ...
        why = "no such format starts so" if isinstance(e, Image.UnidentifiedImageError) else f"{type(e).__name__}: {e}"
        raise FileFormatError(f"{where}: the image is not a {'/'.join(FORMATS)} file Pillow can decode "
                              f"({why})") from None
    return np.ascontiguousarray(rgb[:, :, ::-1])


def png_gray(rgb: np.ndarray) -> np.ndarray:
    """H×W×3 RGB -> H×W×1 as OpenCV reads a color PNG in grayscale: libpng's rgb_to_gray with weights
    0.299 and 0.587 in 15 bits (9797, 19234 and 32768 less both, 3737 for blue), truncated."""
    r, g, b = (rgb[:, :, c].astype(np.int32) for c in range(3))
    return ((r * 9797 + g * 19234 + b * 3737) >> 15).astype(np.uint8)[:, :, None]


def raw_image(pixels: np.ndarray, where: str) -> np.ndarray:
    """Raw uint8 pixels H×W or H×W×C (C 1 or 3) as H×W×C."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3) or not pixels.shape[0] or not pixels.shape[1]:
        raise FileFormatError(f"{where}: raw image pixels must be H×W or H×W×C with C 1 or 3, H and W > 0; got "
                              f"{pixels.shape}")
    return pixels


def _image_of(proto, color: bool, limit: int, blob: str, where: str) -> np.ndarray:
    if proto.data_type == TensorProto.STRING:
        if len(proto.string_data) != 1:
            raise FileFormatError(f"{where}: the image tensor holds {len(proto.string_data)} strings; it must "
                                  "hold one encoded image file")
        return decode(proto.string_data[0], color, limit, blob, where)
    if proto.data_type == TensorProto.BYTE:
        if len(proto.dims) not in (2, 3):
            raise FileFormatError(f"{where}: raw image dims {list(proto.dims)} must be [H, W] or [H, W, C]")
        return raw_image(tensor_to_array(proto), where)
    raise FileFormatError(f"{where}: the image tensor is {TensorProto.DataType.Name(proto.data_type)}; ImageInput "
                          "reads an encoded image file (a STRING tensor) or raw uint8 pixels (BYTE)")


def values(proto) -> np.ndarray:
    """A FLOAT, INT32 or INT64 tensor's values, 1-d: its repeated field as Caffe2 reads it, whatever the dims say
    (Caffe2's test writes labels without dims); raw_data (stepnet's writers) through tensor_to_array."""
    if proto.raw_data:
        return tensor_to_array(proto).reshape(-1)
    field = {TensorProto.FLOAT: "float_data", TensorProto.INT32: "int32_data", TensorProto.INT64: "int64_data"}
    return np.asarray(getattr(proto, field[proto.data_type]), EXTRA_TYPES[proto.data_type])


def _label_of(proto, where: str, what: str = "label") -> np.ndarray:
    if proto.data_type not in LABEL_TYPES:
        raise FileFormatError(f"{where}: the {what} tensor is {TensorProto.DataType.Name(proto.data_type)}; it "
                              "must be INT32 or FLOAT")
    return values(proto)


def parse_tensor_protos(value: bytes, where: str, *, color: bool, weighted: bool, extras: int, limit: int,
                        blob: str) -> Record:
    """A TensorProtos record: image, label, [weights if weighted], extras..., [bounding box]."""
    protos = parse_checked(TensorProtos(), value, where).protos
    offset = 3 if weighted else 2
    end = offset + extras
    if len(protos) not in (end, end + 1):
        raise FileFormatError(f"{where}: the record holds {len(protos)} tensors; this ImageInput reads {end} "
                              f"(image, label{', weights' if weighted else ''}, {extras} for the additional "
                              "outputs), or one more: a bounding box")
    label = _label_of(protos[1], where)
    weights = _label_of(protos[2], where, "weights").astype(np.float32) if weighted else None
    extra = []
    for i in range(offset, end):
        if protos[i].data_type not in EXTRA_TYPES:
            raise FileFormatError(f"{where}: tensor {i} (for output {i - offset + 2}) is "
                                  f"{TensorProto.DataType.Name(protos[i].data_type)}; it must be FLOAT, INT32 or INT64")
        extra.append(values(protos[i]))
    box = None
    if len(protos) == end + 1:
        b = protos[end]
        if b.data_type != TensorProto.INT32 or len(b.int32_data) != 4:
            raise FileFormatError(f"{where}: the bounding box (tensor {end}) must be 4 INT32 values [ymin, xmin, "
                                  "height, width]")
        box = tuple(int(v) for v in b.int32_data)
    return Record(_image_of(protos[0], color, limit, blob, where), label, weights, extra, box)


@functools.cache
def datum_class():
    """caffe.Datum (channels 1, height 2, width 3, data 4, label 5, float_data 6, encoded 7) as a message class."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="stepnet_caffe_datum.proto", package="caffe", syntax="proto2")
    msg = file.message_type.add(name="Datum")
    for name, number, kind, label in (("channels", 1, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("height", 2, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("width", 3, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("data", 4, F.TYPE_BYTES, F.LABEL_OPTIONAL),
                                      ("label", 5, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("float_data", 6, F.TYPE_FLOAT, F.LABEL_REPEATED),
                                      ("encoded", 7, F.TYPE_BOOL, F.LABEL_OPTIONAL)):
        msg.field.add(name=name, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe.Datum"))


def datum_record(image: np.ndarray | bytes, label: int) -> bytes:
    """A serialized Datum: an encoded image file's bytes, or raw uint8 H×W×C pixels (stored C×H×W, as Caffe)."""
    if isinstance(image, (bytes, bytearray)):
        return datum_class()(data=bytes(image), label=label, encoded=True).SerializeToString()
    h, w, c = image.shape
    return datum_class()(channels=c, height=h, width=w, label=label,
                         data=np.ascontiguousarray(image.transpose(2, 0, 1)).tobytes()).SerializeToString()


def parse_datum(value: bytes, where: str, *, color: bool, limit: int, blob: str) -> Record:
    """A Caffe Datum record: its image (encoded, or raw C×H×W uint8) and int label."""
    datum = parse_checked(datum_class()(), value, where)
    label = np.array([datum.label], np.int32)
    if datum.encoded:
        return Record(decode(datum.data, color, limit, blob, where), label, None, [], None)
    c, h, w = datum.channels, datum.height, datum.width
    if c not in (1, 3) or h <= 0 or w <= 0 or len(datum.data) != c * h * w:
        raise FileFormatError(f"{where}: a raw Datum needs channels 1 or 3, height and width > 0 and channels·"
                              f"height·width bytes of data; got {c}×{h}×{w} with {len(datum.data)} bytes")
    pixels = np.frombuffer(datum.data, np.uint8).reshape(c, h, w).transpose(1, 2, 0)
    return Record(np.ascontiguousarray(pixels), label, None, [], None)
