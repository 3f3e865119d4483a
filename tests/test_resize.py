import numpy as np
import pytest

from dataprep.images import resize


@pytest.mark.parametrize(
    "h, w, size, mode, upscale, scaled, out",
    [
        (375, 500, 256, "shorter", False, (256, 341), (256, 341)),
        (375, 500, 256, "longer", False, (192, 256), (192, 256)),
        (375, 500, 256, "center-crop", False, (256, 341), (256, 256)),
        (375, 500, 256, "pad", False, (192, 256), (256, 256)),
        (100, 80, 256, "shorter", False, (100, 80), (100, 80)),  # no upscaling by default
        (100, 80, 256, "shorter", True, (320, 256), (320, 256)),
        (100, 80, 256, "center-crop", False, (100, 80), (256, 256)),  # small: padded to the square
        (2048, 1536, 512, "shorter", False, (683, 512), (683, 512)),
    ],
)
def test_plan(h, w, size, mode, upscale, scaled, out):
    g = resize.plan(h, w, size, mode, upscale)
    assert g.scaled == scaled and g.out == out


def test_apply_center_crop_takes_the_middle():
    img = np.zeros((100, 200, 1), np.uint8)
    img[:, 50:150] = 200  # the central 100 columns are bright
    out = resize.apply(img, resize.plan(100, 200, 100, "center-crop"))
    assert out.shape == (100, 100, 1) and out.min() == 200


def test_apply_pad_centres_the_image_on_black():
    img = np.full((50, 100, 3), 255, np.uint8)
    out = resize.apply(img, resize.plan(50, 100, 100, "pad"))
    assert out.shape == (100, 100, 3)
    assert out[:25].max() == 0 and out[75:].max() == 0 and out[25:75].min() == 255


def test_apply_area_shrink_keeps_mean():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (400, 600, 3), dtype=np.uint8)
    out = resize.apply(img, resize.plan(400, 600, 100, "shorter"))
    assert out.shape == (100, 150, 3)
    assert abs(out.mean() - img.mean()) < 0.5
