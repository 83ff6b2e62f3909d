"""What the fresh hostile campaign (tools/hostile_campaign.py, #24) found, each kept fixed: one clear error line
where there was an internal error or a kernel's stray exception. Each test builds the hostile input by hand."""
import re

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.cli.run import main
from stepnet.core.errors import DeviceError, FileAccessError, FileFormatError
from stepnet.io import minidb, proto
from stepnet.io.proto import BlobProto, TensorProto


def _tensor_record(name: str, dims: list[int]) -> tuple[str, bytes]:
    t = TensorProto(name=name, dims=dims, data_type=TensorProto.FLOAT)
    t.float_data.extend([0.5])
    return name, BlobProto(name=name, type="Tensor", tensor=t).SerializeToString()


def test_a_tensor_of_more_dims_than_numpy_allows_is_a_file_error(tmp_path):
    """70 dims of size 1: one element, but numpy holds at most 64 dims (it raised ValueError from reshape)."""
    path = tmp_path / "ck.minidb"
    minidb.write_records(path, [_tensor_record("W", [1] * 70)])
    with pytest.raises(FileFormatError, match=r"blob 'W': tensor 'W': 70 dims; an array has at most 64"):
        minidb.load_blobs(path)
    minidb.write_records(path, [_tensor_record("W", [1] * 64)])   # the most numpy holds still loads
    assert minidb.load_blobs(path)["W"].shape == (1,) * 64


def test_a_string_blob_then_a_tensor_of_the_same_name_is_a_file_error(tmp_path):
    """A String record, then a Tensor record with the same blob name (an IndexError before)."""
    path = tmp_path / "ck.minidb"
    string = BlobProto(name="r", type="std::string", content=b"x").SerializeToString()
    minidb.write_records(path, [("r", string), _tensor_record("r", [1])])
    with pytest.raises(FileFormatError, match="blob 'r' appears twice, once as a Tensor"):
        minidb.load_blobs(path)


def test_a_db_path_with_a_nul_byte_is_refused_naming_the_op(tmp_path, monkeypatch, capsys):
    """Checkpoint's db "bad\\0.minidb": a FileAccessError naming net, op and path (realpath's ValueError before)."""
    monkeypatch.chdir(tmp_path)
    net = proto.NetDef(name="paths")
    net.op.add(type="ConstantFill", output=["it"], arg=[proto.make_argument("shape", [1]),
                                                     proto.make_argument("dtype", TensorProto.INT64)])
    net.op.add(type="Checkpoint", input=["it"], arg=[proto.make_argument("db", "bad\0.minidb"),
                                                     proto.make_argument("db_type", "minidb")])
    proto.save(net, tmp_path / "net.pb")
    assert main(["run", "net.pb", "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("stepnet: error: net 'paths', op #1 (Checkpoint): db path '")
    assert err[0].endswith("bad\\x00.minidb' holds a NUL byte, which no file name can")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.pb"]
    with pytest.raises(FileAccessError, match="NUL byte"):   # a Python program's path the same
        Workspace().run_net_once(net)


@pytest.mark.parametrize("networks, step_nets, message", [
    (["stop", "body", "stop"], ["body"], "plan 'p': two networks are named 'stop'"),
    (["body", "stop"], ["init", "stop"], "plan 'p': execution step refers to network 'init', which the plan does "
                                         "not define"),
])
def test_export_onnx_of_a_plan_with_a_bad_network_list_is_a_plan_error(tmp_path, monkeypatch, capsys, networks,
                                                                       step_nets, message):
    """export-onnx --net: a plan naming two networks alike, or a step naming no network (a KeyError before)."""
    monkeypatch.chdir(tmp_path)
    plan = proto.PlanDef(name="p")
    for name in networks:
        plan.network.add(name=name).op.add(type="Relu", input=["X"], output=["Y"])
    plan.execution_step.add(name="all", network=step_nets)
    proto.save(plan, tmp_path / "plan.pbtxt")
    assert main(["export-onnx", "plan.pbtxt", "-o", "out.onnx", "--net", "stop", "--input", "X=2,2"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"stepnet: error: {message}"]
    assert not (tmp_path / "out.onnx").exists()


def _net_with_string(n: int, escaped: bool = True) -> str:
    """A text NetDef whose one argument holds a string token of about n characters (escape-heavy or plain)."""
    body = '\\\\n\\"x\\"' * (n // 8) if escaped else "abcdefgh" * (n // 8)
    return 'name: "a" op { type: "Relu" input: "x" output: "y" arg { name: "s" s: "' + body + '" } }\n'


def test_a_string_over_the_text_string_limit_is_one_line_before_parsing(tmp_path, capsys, monkeypatch):
    """A 1.5 MiB string token in a .pbtxt: protobuf's text parser would hold ~140 bytes a character (a 16 MiB one
    took 2.3 GB); it is refused with the line and the fix. A string under the limit still parses."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.pbtxt").write_text(_net_with_string(3 << 19))
    assert main(["inspect", "big.pbtxt"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepnet: error: big.pbtxt: line 1: a string of ")
    assert "over the limit of 1048576 for a string in text format" in err[0] and "protoc --encode" in err[0]
    (tmp_path / "ok.pbtxt").write_text(_net_with_string(1 << 16))
    unescaped = (1 << 16) // 8 * 5   # each 8-character unit is 5 bytes once unescaped
    assert len(proto.load(tmp_path / "ok.pbtxt").op[0].arg[0].s) == unescaped


def test_a_net_held_as_text_in_an_argument_meets_the_same_limits(tmp_path, capsys, monkeypatch):
    """A binary net whose Do op holds its body as text: a string too long inside it, or a text over the text limit
    (16 MiB; the campaign's 55 MB one ran out of memory), is one error line naming the op."""
    monkeypatch.chdir(tmp_path)
    for text, message in ((_net_with_string(3 << 19), "a string of .* over the limit of 1048576"),
                          ('name: "n" op { type: "Relu" input: "x" output: "y" }\n' * ((17 << 20) // 52),
                           r"the text-format message is \d+ characters, over the limit of 16.0 MiB")):
        net = proto.NetDef(name="outer", external_input=["x"])
        net.op.add(type="Do", input=["x"], output=["y"]).arg.add(name="net", s=text.encode())
        proto.save(net, tmp_path / "net.pb")
        assert main(["run", "net.pb", "--feed", "x=[1.0]"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), err
        assert "net 'outer', op #0 (Do)" in err[0], err


def test_the_text_check_itself_holds_no_state_per_character():
    """check_text on a 1 MiB escape-heavy string allocates a few MiB (the old pattern, an alternation repeated
    per character, held ~90 MiB for it, as protobuf's tokenizer does)."""
    import tracemalloc

    from stepnet.io.validate import check_text
    text = _net_with_string((1 << 20) - 100)
    tracemalloc.start()
    try:
        check_text(text, "t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak   # the blanked copy (1 MiB of str) and a few tokens; 90 MiB before


def test_a_string_blob_over_max_blob_bytes_is_refused_before_it_is_kept(tmp_path):
    """A checkpoint's 70 MB string blob passed --max-blob-bytes 64M (only tensors' dims were checked)."""
    from stepnet.core.errors import ResourceError
    path = tmp_path / "ck.minidb"
    big = BlobProto(name="big_string", type="std::string", content=b"s" * (3 << 20)).SerializeToString()
    minidb.write_records(path, [("big_string", big)])
    with pytest.raises(ResourceError, match=r"record 'big_string' at byte offset 0: blob 'big_string' would be "
                                            r"\(3145728,\) uint8, 3145728 bytes \(3.0 MiB\), over the limit of "
                                            r"2097152 bytes \(2.0 MiB\) per blob"):
        minidb.load_blobs(path, max_blob_bytes=2 << 20)
    assert len(minidb.load_blobs(path, max_blob_bytes=4 << 20)["big_string"]) == 3 << 20


def test_a_message_missing_required_fields_is_a_file_error(tmp_path, capsys, monkeypatch):
    """A NetDef whose nested QTensorProto lacks its required fields: `convert` could not write it back (protobuf's
    EncodeError, an internal error before); Caffe2's parser refuses such a file, and so does stepnet's, by path."""
    monkeypatch.chdir(tmp_path)
    net = proto.NetDef(name="n")
    net.op.add(type="Relu", input=["x"], output=["y"]).arg.add(name="q").qtensors.add(dims=[1])
    (tmp_path / "net.pb").write_bytes(net.SerializePartialToString())
    assert main(["convert", "net.pb", "out.pb"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stepnet: error: net.pb: required fields missing: op[0].arg[0].qtensors[0].precision, "
                   "op[0].arg[0].qtensors[0].scale, op[0].arg[0].qtensors[0].bias and 1 more"], err
    assert not (tmp_path / "out.pb").exists()
    (tmp_path / "net.pbtxt").write_text('name: "n" op { type: "Relu" arg { name: "q" qtensors { dims: 1 } } }')
    with pytest.raises(FileFormatError, match="required fields missing: op\\[0\\].arg\\[0\\].qtensors\\[0\\]"):
        proto.load(tmp_path / "net.pbtxt")


def test_saving_an_alpha_image_as_jpeg_is_an_argument_error(tmp_path, capsys):
    """--save-image out.jpg:bgra: JPEG has no alpha channel. One line naming the fix (Pillow's OSError before)."""
    from PIL import Image
    src, out = tmp_path / "img.png", tmp_path / "out.jpg"
    Image.new("RGBA", (5, 4), (10, 20, 30, 255)).save(src)
    net = proto.NetDef(name="pass")
    net.op.add(type="Copy", input=["X"], output=["Y"])
    proto.atomic_write(tmp_path / "net.pb", net.SerializeToString())
    args = ["run", str(tmp_path / "net.pb"), "--feed", f"X={src}:bgra", "--fetch", "Y", "--file-root", str(tmp_path)]
    assert main([*args, "--save-image", f"{out}:bgra"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"cannot save a bgra image as JPEG .*drop it with layout rgb", err), err
    assert "internal error" not in err and not out.exists()
    assert main([*args, "--save-image", f"{tmp_path / 'out.png'}:bgra"]) == 0   # the same blob saves as PNG
    assert Image.open(tmp_path / "out.png").getpixel((0, 0)) == (10, 20, 30, 255)


def test_an_npz_member_that_is_not_an_npy_meets_the_blob_limit(tmp_path, capsys, monkeypatch):
    """Campaign seed 9 case 6857: an .npz member named without .npy (numpy hands its bytes over) of 70 MiB,
    deflated to 71 KB, was read whole under --max-blob-bytes 64M; its size is now checked first."""
    import zipfile
    monkeypatch.chdir(tmp_path)
    with zipfile.ZipFile(tmp_path / "f.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("X", b"\0" * (70 << 20))
    net = proto.NetDef(name="feed")
    net.op.add(type="Copy", input=["X"], output=["Y"])
    proto.atomic_write(tmp_path / "net.pb", net.SerializeToString())
    assert main(["run", "net.pb", "--feed", "f.npz", "--fetch", "Y", "--max-blob-bytes", "64M"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"--feed f.npz member 'X': blob 'X' would be \(73400320,\) uint8, .*over the limit", err), err


def test_export_onnx_with_an_int8_tensor_in_the_checkpoint(tmp_path, capsys, monkeypatch):
    """Campaign seed 9 case 6497: a checkpoint for --load holding an Int8 tensor crashed export-onnx (its
    conversion to a float array raised TypeError). A blob the net does not read is left out; one it reads is
    one error line."""
    pytest.importorskip("onnx")
    from pathlib import Path
    import numpy as np
    from stepnet.core.int8 import Int8Tensor
    monkeypatch.chdir(tmp_path)
    xor = Path(__file__).resolve().parents[1] / "models" / "xor"
    int8 = Int8Tensor(np.ones((2, 2), np.uint8), 1.0, 0)
    minidb.save_blobs(tmp_path / "ck.minidb", {"unused": int8})
    args = ["export-onnx", str(xor / "init_net.pbtxt"), str(xor / "predict_net.pbtxt"), "--load", "ck.minidb",
            "-o", "out.onnx", "--input", "X=1,2"]
    assert main(args) == 0 and (tmp_path / "out.onnx").exists()
    minidb.save_blobs(tmp_path / "ck.minidb", {"W1": int8})
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "blob 'W1' is an Int8 tensor" in err and "internal error" not in err, err


def test_an_npy_with_an_empty_string_dtype_is_refused(tmp_path, capsys, monkeypatch):
    """Campaign seed 9 case 9963: a 320-byte .npy with header '<U0' and shape (5000, 5000) became a 100 MB '<U1'
    array under --max-blob-bytes 64M (zero bytes an element passed every size check)."""
    monkeypatch.chdir(tmp_path)
    header = "{'descr': '<U0', 'fortran_order': False, 'shape': (5000, 5000), }"
    header += " " * (117 - len(header)) + "\n"
    (tmp_path / "f.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    net = proto.NetDef(name="feed")
    net.op.add(type="Copy", input=["X"], output=["Y"])
    proto.atomic_write(tmp_path / "net.pb", net.SerializeToString())
    assert main(["run", "net.pb", "--feed", "X=f.npy", "--fetch", "Y", "--max-blob-bytes", "64M"]) == 1
    err = capsys.readouterr().err
    assert "its header gives the empty dtype <U0 for shape (5000, 5000)" in err, err


def _gpu_op_net(op_type: str):
    net = proto.NetDef(name="storm")
    net.op.add(type=op_type, input=["in0"], output=["o"]).device_option.device_type = 1   # a GPU op
    net.external_output.append("o")
    return net


def test_an_empty_host_input_to_a_device_op_is_a_device_error():
    """Campaign seed 12 case 1632: an empty (0, 3, 2) host array fed to NCHW2NHWC running on the emulated device
    passed the device check (host inputs of at most one element are allowed there, meant for scalars) and reached
    the kernel, whose mixing error the executor wrapped; one element is the rule now, so it is one DeviceError.
    (A program feeds on the host unless it says otherwise; `run --feed` places a feed on its reader's device.)"""
    ws = Workspace(gpu="emulate")
    ws.feed("in0", np.zeros((0, 3, 2), np.float32))
    with pytest.raises(DeviceError, match="input 'in0' is on cpu but the op runs on emulated:0; copy it first"):
        ws.run_net_once(_gpu_op_net("NCHW2NHWC"))


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_a_one_element_host_input_to_a_device_op_is_copied_there(shape):
    """Campaign seed 15 case 1093: a 0-d host array fed to Rsqrt running on the emulated device passed the device
    check (one-element host inputs are allowed: scalars) and reached the kernel, which cannot mix a host array
    into device arithmetic; the executor now copies such a scalar to the op's device, so the op runs (1/√4)."""
    ws = Workspace(gpu="emulate")
    ws.feed("in0", np.full(shape, 4, np.float32))
    ws.run_net_once(_gpu_op_net("Rsqrt"))
    out = ws.fetch("o")
    assert out.shape == shape and out.dtype == np.float32 and float(out.reshape(-1)[0]) == 0.5
    ws.feed("in0", np.full((2,), 4, np.float32))    # two elements: still a DeviceError
    with pytest.raises(DeviceError, match="input 'in0' is on cpu but the op runs on emulated:0; copy it first"):
        ws.run_net_once(_gpu_op_net("Rsqrt"))


def test_run_feeds_an_input_on_the_device_of_the_op_that_reads_it(tmp_path, monkeypatch):
    """`run --device emulate --feed`: a fed tensor read first by a GPU-placed op is stored on that op's device
    (it was stored on the host, and an input of more than one element then stopped the run with "copy it
    first"); one read on the host by its reader's record (Reshape's new shape) stays on the host."""
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "pool.npz", in0=np.full((2, 3), 4, np.float32), shape=np.array([3, 2], np.int64))
    net = _gpu_op_net("Rsqrt")
    reshape = net.op.add(type="Reshape", input=["o", "shape"], output=["r", "old"])
    reshape.device_option.device_type = 1
    net.external_output.append("r")
    proto.atomic_write(tmp_path / "net.pb", net.SerializeToString())
    assert main(["run", "net.pb", "--feed", "pool.npz", "--device", "emulate", "--save", "out.npz", "-q"]) == 0
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["r"], np.full((3, 2), 0.5, np.float32))


@pytest.mark.parametrize("op_type, inputs", [
    ("LengthsMeanGradient", [np.array([[b"a"] * 5] * 2, "S40"), np.array([1, 1], np.int32)]),
    ("SparseLengthsMeanGradient", [np.array([[b"a"] * 5] * 2, "S40"), np.array([1, 1], np.int32)]),
    ("SparseLengthsWeightedSumGradient", [np.ones(2, np.float32), np.array([[b"a"] * 5] * 2, "S40"),
                                          np.array([1, 1], np.int32)])])
def test_a_segment_mean_gradient_of_strings_is_a_dtype_error(op_type, inputs):
    """Seed 33, case 304 of the ops surface: LengthsMeanGradient given a bytes dY (|S40) reached numpy's multiply
    (UFuncTypeError, wrapped by the executor); a mean's or weighted sum's gradient scales dY, so it must be float."""
    from stepnet.core.errors import DTypeError
    from stepnet.testing import run_op
    with pytest.raises(DTypeError, match="dY must be a float tensor, got \\|S40"):
        run_op(op_type, inputs)
