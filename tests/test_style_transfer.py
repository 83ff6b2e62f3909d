"""The real crayon style-transfer model turns a picture into a stylized picture from the command line."""
from pathlib import Path

import numpy as np
import pytest

from stepnet.cli.run import main
from stepnet.core.errors import FileFormatError, StepnetError

from PIL import Image  # noqa: E402  (Pillow is part of the test extra)

MODEL = Path(__file__).resolve().parents[1] / "models" / "style_transfer"
INIT, PREDICT = MODEL / "crayon_init.pb", MODEL / "crayon_predict.pb"


def small_photo(tmp_path, size=(96, 72)):
    photo = Image.open(MODEL / "photo.png").convert("RGB").resize(size)
    path = tmp_path / "small.png"
    photo.save(path)
    return path


def test_stylizes_a_picture(tmp_path, capsys):
    src = small_photo(tmp_path)
    out = tmp_path / "styled.png"
    rc = main(["run", str(INIT), str(PREDICT), "--feed", f"{src}:bgra", "--save-image", f"{out}:bgra"])
    assert rc == 0, capsys.readouterr().err
    before = np.asarray(Image.open(src).convert("RGB"), dtype=np.float32)
    after_img = Image.open(out)
    assert after_img.size == (96, 72) and after_img.mode == "RGBA"
    after = np.asarray(after_img.convert("RGB"), dtype=np.float32)
    assert (np.asarray(after_img)[:, :, 3] == 255).all()  # the deprocess op sets alpha opaque
    diff = np.abs(after - before).mean()
    assert diff > 20, f"the output is too close to the input (mean abs diff {diff:.1f})"
    # ... yet it is still a picture of the same scene: brightness patterns correlate.
    corr = np.corrcoef(before.mean(axis=2).ravel(), after.mean(axis=2).ravel())[0, 1]
    assert corr > 0.3, corr


def test_named_feed_and_npz_save(tmp_path):
    src = small_photo(tmp_path, (64, 48))
    out = tmp_path / "o.npz"
    assert main(["run", str(INIT), str(PREDICT), "--feed", f"data_int8_bgra={src}:bgra", "--save", str(out),
                 "-q"]) == 0
    y = np.load(out)["styled_int8_bgra"]
    assert y.shape == (1, 48, 64, 4) and y.dtype == np.uint8


def test_not_an_image(tmp_path, capsys):
    fake = tmp_path / "fake.png"
    fake.write_text("this is not a picture")
    assert main(["run", str(INIT), str(PREDICT), "--feed", f"{fake}:bgra"]) == 1
    assert "not an image" in capsys.readouterr().err
    with pytest.raises(FileFormatError, match="not an image"):
        from stepnet.io.images import read_image
        read_image(fake)


def test_wrong_layout_gives_a_clear_error(tmp_path, capsys):
    src = small_photo(tmp_path, (64, 48))
    assert main(["run", str(INIT), str(PREDICT), "--feed", f"{src}:bgrx"]) == 1
    assert "layout 'bgrx'" in capsys.readouterr().err
    assert main(["run", str(INIT), str(PREDICT), "--feed", f"{src}"]) == 1  # rgb: 3 channels, the op wants 4
    err = capsys.readouterr().err
    assert "PackedInt8BGRANHWCToNCHWCStylizerPreprocess" in err and "(1, 48, 64, 3)" in err


def test_save_image_needs_an_image_blob(tmp_path):
    from stepnet.io.images import image_bytes
    with pytest.raises(StepnetError, match="not an H×W×4 image"):
        image_bytes(np.zeros((1, 3, 8, 8), np.uint8), "bgra")
