"""`linnet run --image` on a tiny model of any image size (the preprocessing's output and the top classes printed), and
what it refuses, as a one-line error and an exit status. Its output on a real classifier, against transformers'
processor and model on the same image, is tested with the ViT (tests/runtimes/test_parity_vit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.cli import main
from tests.conftest import EXAMPLES

pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3)).astype(np.uint8)).save(path)
    return path


def test_an_entry_without_pixel_values_is_refused(image, capsys):
    rc = main(["run", str(EXAMPLES / "mlp.linnet"), "--preset", "tiny", "--image", str(image)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "--image: entry `forward` takes no `pixel_values` (its inputs: x)" in err and "Traceback" not in err


# A classifier of three "classes" that reads any image size: the mean of each channel. Saved as vit.linnet, so with
# random weights its preprocessing is ViT's defaults (the model type is the file's name, as in the zoo).
CHANNEL_MEANS = """
config Means {
    num_channels: int = 3
}

model ChannelMeans(c: Means) {
    entry fn forward(pixel_values: [B, c.num_channels, H, W]) -> [B, c.num_channels] {
        mean(mean(pixel_values, dim=-1), dim=-1)
    }
}
"""


def test_the_image_is_preprocessed_and_the_top_classes_printed(image, tmp_path, capsys):
    source = tmp_path / "vit.linnet"
    source.write_text(CHANNEL_MEANS)
    rc = main(["run", str(source), "--image", str(image)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "vit preprocessing (the defaults of vit's checkpoints): resize 224x224 bilinear" in err
    assert "inputs pixel_values[1, 3, 224, 224]" in out
    # ViT's preprocessing: (x / 255 - 0.5) / 0.5 of the resized image, whose channel means order the "classes"
    resized = np.asarray(Image.open(image).convert("RGB").resize((224, 224), resample=2), dtype=np.float64)
    means = (resized / 255 - 0.5).mean(axis=(0, 1)) / 0.5
    probs = np.exp(means - means.max()) / np.exp(means - means.max()).sum()
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("top ")]
    expected = [f"top {n}: {i} (p {probs[i]:.4f})" for n, i in enumerate(np.argsort(-means), 1)]
    assert lines == expected


def test_a_file_that_is_not_an_image_is_refused(tmp_path, capsys):
    source = tmp_path / "vit.linnet"
    source.write_text(CHANNEL_MEANS)
    text = tmp_path / "x.png"
    text.write_text("not an image")
    rc = main(["run", str(source), "--image", str(text)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "x.png: cannot read it as an image" in err and "Traceback" not in err


def test_a_model_type_without_preprocessing_is_refused(image, tmp_path, capsys):
    source = tmp_path / "means.linnet"
    source.write_text(CHANNEL_MEANS)
    rc = main(["run", str(source), "--image", str(image)])
    assert rc == 1
    assert "model type 'means' has no default image preprocessing" in capsys.readouterr().err


def test_image_with_compare_is_a_usage_error(image, capsys):
    rc = main(["run", str(EXAMPLES / "mlp.linnet"), "--preset", "tiny", "--image", str(image), "--compare"])
    assert rc == 2
    assert "--image runs the image on one backend; drop --compare" in capsys.readouterr().err
