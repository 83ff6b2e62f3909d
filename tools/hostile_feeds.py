"""Surface 4 of the hostile campaign: --feed values. .npy files built header-first (any descr, fortran order,
lying or huge shapes, versions 0-4, lying header lengths, objects), .npz archives built member-first (odd member
names, duplicates, non-.npy members, deflate and bzip2 bombs, lying sizes, other methods, the encrypted flag,
truncation), literals (odd dtypes, nesting, ranges, number spellings, up to the 128 KiB one argv string may
hold) and images (Pillow's modes and formats, a format under another's suffix, huge dimensions patched into
small files, netpbm headers by hand, truncation), into small nets, with --save, --save-image and --fetch.
Every file is built from its parts (a header text, zip members, image chunks), not by random byte edits."""
from __future__ import annotations

import io
import random
import struct
import zipfile
import zlib

import numpy as np

from stepnet.io import proto

import hostile_values as hv

DESCRS = ["<f4", "<f4", "<f8", "<i8", "|b1", "<f2", "|u1", "<i2", ">f8", ">i4", "|O", "O", "<U5", "|S3", "|V8",
          "<c16", "<c8", "<M8[s]", "<m8[D]", "[('a', '<f4'), ('b', '<i4')]", "('<f4', (2,))", "<f16", "bogus",
          "", "<i0", "<u8", "?", "|i1", "<U0", "[('a', 'O')]"]
SHAPES = ["()", "(0,)", "(3,)", "(2, 3)", "(2, 0, 3)", "(1, 2, 2, 3)", "(1099511627776,)", "(2147483648, 2147483648)",
          "(-1,)", "(" + "1, " * 65 + ")", "(3.5,)", "('a',)", "(True,)", "[2, 3]", "(6,)", "(5000, 5000)",
          "(16777216, 4)", "None"]
LITERAL_DTYPES = ["", "", ":float32", ":float64", ":float16", ":int8", ":int16", ":int32", ":int64", ":uint8",
                  ":uint16", ":bool", ":complex64", ":object", ":str", ":U", ":float128", ":datetime64", ":uint64",
                  ":int", ":f4", ":<f4", ":", "::", ":float32:int8", ":FLOAT32", ": float32"]


def npy(rng: random.Random) -> bytes:
    """An .npy file from parts: magic, version, header length, header dict, data."""
    descr = rng.choice(DESCRS)
    shape = rng.choice(SHAPES)
    fortran = rng.choice(["False", "False", "True", "1", "'yes'", "None"])
    fields = [f"'descr': {descr!r}" if not descr.startswith("[") and not descr.startswith("(") else f"'descr': {descr}",
              f"'fortran_order': {fortran}", f"'shape': {shape}"]
    r = rng.random()
    if r < 0.1:
        fields.append("'extra': 1")
    elif r < 0.2:
        del fields[rng.randrange(3)]
    header = "{" + ", ".join(fields) + ", }"
    if rng.random() < 0.06:
        header = rng.choice(["[1, 2]", "__import__('os').system('true')", "{'descr': '<f4', 'fortran_order': "
                             "False, 'shape': (2,), 'descr': '|O'}", "{" * 5000, "\xff", ""])
    major = rng.choice([1, 1, 1, 2, 3, 4, 0])
    pad = " " * rng.choice([0, 0, 0, 100, 70000]) if major > 1 else ""
    text = (header + pad).encode("utf-8" if major == 3 else "latin1", "replace")
    fmt = "<H" if major in (1, 0, 4) else "<I"
    head = b"\x93NUMPY" + bytes([major, 0])
    total = len(head) + struct.calcsize(fmt) + len(text) + 1
    text += b" " * ((-total) % 64) + b"\n"
    hlen = len(text)
    if rng.random() < 0.08:
        hlen = rng.choice([0, 1, hlen + 1000, 65535, hlen - 3])
    try:
        hbytes = struct.pack(fmt, hlen)
    except struct.error:
        hbytes = struct.pack(fmt, 10)
    count = rng.choice([0, 1, 6, 24, 48, 100, 1000])
    data = bytes(rng.randrange(256) for _ in range(min(count * 8, 8000)))
    if rng.random() < 0.05:
        data = b"\x00" * rng.choice([(64 << 20) + 8, 20 << 20])
    if rng.random() < 0.05:
        head = rng.choice([b"\x93NUMPX\x01\x00", b"PK\x03\x04\x00\x00\x00\x00", b""])
    return head + hbytes + text + data


def good_npy(rng: random.Random, shape=None, dtype=None) -> bytes:
    a = np.zeros(shape if shape is not None else rng.choice([(2, 2), (1, 2), (3,), (), (0, 2)]),
                 dtype or rng.choice([np.float32, np.int64, np.bool_, np.float16]))
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(a) if rng.random() < 0.2 else a)
    return buf.getvalue()


def npz(rng: random.Random) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for _i in range(rng.choice([1, 1, 2, 3, 300])):
            name = rng.choice(["X.npy", "X.npy", "X", "Y.npy", "../X.npy", "/abs/X.npy", "a/b.npy", "\u00e9.npy",
                               "x" * 300 + ".npy", ".npy", "X.NPY", "X.npy/", "X.npy\x00.txt", "__stepnet__/rng.npy"])
            kind = rng.randrange(6)
            if kind == 0:
                data = npy(rng)
            elif kind == 1:
                data = good_npy(rng)
            elif kind == 2:   # compressible: a bomb under deflate's own ratio, or bzip2's
                data = good_npy(rng, (rng.choice([20, 70, 120]) << 18,), np.float32) if rng.random() < 0.5 \
                    else b"\x00" * (rng.choice([10, 70, 100]) << 20)
            elif kind == 3:
                data = hv.net_text(rng)
            else:
                data = good_npy(rng, (2, 2), np.float32)
            method = rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                                 zipfile.ZIP_LZMA])
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            try:
                z.writestr(info, data)
            except (ValueError, OSError):
                pass
    raw = buf.getvalue()
    r = rng.random()
    if r < 0.1:   # a central directory entry that lies about the sizes
        at = raw.rfind(b"PK\x01\x02")
        if at >= 0:
            raw = raw[:at + 24] + struct.pack("<I", rng.choice([0, 2**32 - 1, 1 << 30])) + raw[at + 28:]
    elif r < 0.15:
        raw = raw[:rng.randrange(len(raw) + 1)]
    elif r < 0.2:   # the encrypted flag, or an unknown method
        at = raw.rfind(b"PK\x01\x02")
        if at >= 0:
            raw = raw[:at + 8] + struct.pack("<H", rng.choice([1, 0x41])) + raw[at + 10:] if rng.random() < 0.5 \
                else raw[:at + 10] + struct.pack("<H", rng.choice([99, 9, 6, 95])) + raw[at + 12:]
    return raw


def literal(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        body = repr(np.arange(rng.choice([1, 4, 6])).reshape(-1).tolist())
    elif kind == 1:
        depth = rng.choice([2, 3, 32, 33, 64, 65, 1000])
        body = "[" * depth + rng.choice(["1", "", "1, 2"]) + "]" * depth
    elif kind == 2:
        body = rng.choice(["1e999", "-1e999", "nan", "inf", "1_000", "0x10", "0o7", "0b1", "1j", "True", "None",
                           "'a'", "b'a'", "...", "[1,]", "[,]", "()", "(1, 2)", "{1, 2}", "{'a': 1}", "[[1], [2, 3]]",
                           "[[[]]]", "[]", "[[], []]", "\u0661\u0662", "1" * 5000, "-" + "9" * 40, "2**63",
                           "[1e-400]", "[-0.0]", "[True, 2]", "[1, 'a']", "[[1, 2], 3]", " [1] ", "[1]\n", "\x00"])
    elif kind == 3:
        body = "[" + ", ".join(str(hv.edge_int(rng)) for _ in range(rng.choice([1, 2, 5]))) + "]"
    elif kind == 4:
        body = "[" + ", ".join(repr(hv.edge_float(rng)) for _ in range(rng.choice([1, 3]))) + "]"
    elif kind == 5:   # as long as one argv string may be (MAX_ARG_STRLEN: 128 KiB)
        n = rng.choice([1000, 20000])
        body = "[" + ", ".join(["1"] * n) + "]" if rng.random() < 0.5 else "[" + "[1], " * (n // 2) + "[1]]"
    elif kind == 6:
        body = "[[1, 0], [0, 1]]"
    else:
        body = "".join(rng.choice("[](){}0123456789.,-+eE:xj_ '\"") for _ in range(rng.randint(0, 40)))
    return body + rng.choice(LITERAL_DTYPES)


# ------------------------------------------------------------------------------------------- images
def pil_image(rng: random.Random, size=None):
    from PIL import Image
    mode = rng.choice(["RGB", "RGB", "RGBA", "L", "1", "P", "LA", "I", "I;16", "F", "CMYK", "YCbCr", "PA", "La"])
    size = size or (rng.choice([1, 2, 7, 64]), rng.choice([1, 3, 8, 50]))
    try:
        im = Image.new(mode, size)
    except ValueError:
        im = Image.new("RGB", size)
    if im.mode == "P" and rng.random() < 0.5:
        im.info["transparency"] = 0
    return im


FORMATS = {"png": "PNG", "jpg": "JPEG", "bmp": "BMP", "gif": "GIF", "webp": "WEBP", "ppm": "PPM", "tif": "TIFF",
           "pgm": "PPM"}


def image(rng: random.Random) -> tuple[bytes, str]:
    """(bytes, suffix): an image in some format under some suffix, perhaps with huge dims patched in or cut."""
    suffix = rng.choice(list(FORMATS) + ["jpeg", "tiff", "PNG"])
    fmt = FORMATS.get(suffix.lower(), "PNG") if rng.random() < 0.75 else rng.choice(list(FORMATS.values()))
    kind = rng.randrange(7)
    if kind == 0:   # a netpbm header, by hand
        w, h = rng.choice([(2, 2), (100000, 100000), (65535, 1), (0, 5), (-1, 3), (5000, 5000), (4000, 4000)])
        magic = rng.choice([b"P6", b"P5", b"P4", b"P1", b"P3", b"P7"])
        maxval = rng.choice([b"255", b"65535", b"0", b"70000", b"1"])
        return magic + b"\n# c\n" + f"{w} {h}".encode() + b"\n" + maxval + b"\n" + b"\x01" * rng.choice([0, 12, 999]), \
            suffix
    im = pil_image(rng, rng.choice([None, None, (4000, 4000), (4600, 4600), (1, 20000)]))
    buf = io.BytesIO()
    try:
        extra = {"save_all": True, "append_images": [im.copy()] * 3} if fmt in ("GIF", "TIFF", "WEBP") and \
            rng.random() < 0.3 else {}
        im.save(buf, format=fmt, **extra)
    except (OSError, ValueError, KeyError, RuntimeError):   # a mode or size the format cannot hold
        buf = io.BytesIO()
        try:
            im.convert("RGB").save(buf, format="PNG")
        except (OSError, ValueError, KeyError):
            buf = io.BytesIO()
            from PIL import Image
            Image.new("RGB", im.size).save(buf, format="PNG")
    data = buf.getvalue()
    if kind == 1 and data[:8] == b"\x89PNG\r\n\x1a\n":   # IHDR with other dims, CRC kept right
        w, h = rng.choice([(2**31 - 1, 2**31 - 1), (100000, 100000), (65536, 65536), (0, 0), (1, 2**31 - 1)])
        ihdr = struct.pack(">II", w, h) + data[24:29]
        chunk = b"IHDR" + ihdr
        data = data[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]
    elif kind == 2 and data[:2] == b"BM":
        data = data[:18] + struct.pack("<ii", rng.choice([2**31 - 1, 70000, -5, 0]),
                                       rng.choice([-70000, 2**31 - 1, -2**31, 3])) + data[26:]
    elif kind == 3 and data[:3] == b"GIF":
        data = data[:6] + struct.pack("<HH", 65535, 65535) + data[10:]
    elif kind == 4 and b"\xff\xc0" in data:
        at = data.index(b"\xff\xc0")
        data = data[:at + 5] + struct.pack(">HH", 65500, 65500) + data[at + 9:]
    elif kind == 5:
        data = data[:rng.randrange(len(data) + 1)]
    return data, suffix


def feed_net(rng: random.Random) -> proto.NetDef:
    op = hv.op
    kind = rng.choice(["copy", "cast", "nchw", "sum", "none", "scale"])
    ops = {"copy": [op("Copy", ["X"], ["Y"])], "cast": [op("Cast", ["X"], ["Y"], to=rng.choice([1, 10, 2, 5]))],
           "nchw": [op("NHWC2NCHW", ["X"], ["Y"])], "sum": [op("ReduceSum", ["X"], ["Y"], keepdims=0)],
           "scale": [op("Scale", ["X"], ["Y"], scale=2.0)], "none": []}[kind]
    return proto.NetDef(name="feed", op=ops, external_input=["X"], external_output=["Y"] if ops else ["X"])


def make_feed(rng: random.Random, case) -> None:
    net = case.write("net.pb", feed_net(rng).SerializeToString())
    kind = rng.choices(["npy", "npz", "literal", "image"], weights=[25, 25, 25, 25])[0]
    name = rng.choice(["X", "X", "X", "Y", "\u00e9", "a/b", "x" * 300, "__stepnet__/rng", "X:float32"])
    if kind == "npy":
        feeds = [f"{name}={case.write('f.npy', npy(rng))}"]
    elif kind == "npz":
        f = case.write("f.npz", npz(rng))
        feeds = [rng.choice([f, f"{name}={f}"])]
    elif kind == "literal":
        feeds = [f"{name}={literal(rng)}"]
    else:
        data, suffix = image(rng)
        f = case.write(f"img.{suffix}", data)
        layout = rng.choice(["", "", ":bgra", ":gray", ":rgba", ":bgr", ":RGB", ":xyz", ":"])
        feeds = [rng.choice([f"X={f}{layout}", f"{f}{layout}", f"{name}={f}{layout}"])]
    extra = rng.choice([[], [], ["--fetch", "X", "Y"], ["--save", "out.npz"], ["--save", "out.npz", "--fetch", "X"],
                        ["--save-image", rng.choice(["out.png", "out.jpg:bgra", "out.gif:gray", "out.bmp:bgr"]),
                         "--fetch", rng.choice(["X", "Y"])]])
    case.argv = ["run", net, *[w for f in feeds for w in ("--feed", f)], *extra,
                 *rng.choice([[], ["-q"], ["-q"], ["-n", "2"]])]
