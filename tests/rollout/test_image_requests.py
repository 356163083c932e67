"""Image prompts as vLLM takes them (verl_rollout.image_requests): the rows' processed patches rebuilt into the
processor's resized pictures, which the same processor turns back into the same patches bit for bit; each image's
run of pad tokens as one pad. (vLLM's own processing of them runs in tests/gpu: its multimodal models import
torchvision, which the CPU build here has not.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests.support.fixtures import embedded_cache  # noqa: F401
from verl.data.vision import load_vision_processor
from verl.embedded.models import materialize_embedded_model
from verl_rollout.image_requests import PatchLayout, image_prompt, one_pad_per_image, pictures


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_pictures_give_the_processor_its_patches_back(embedded_cache, name):  # noqa: F811
    folder = materialize_embedded_model(name, embedded_cache)
    processor = load_vision_processor(folder, AutoTokenizer.from_pretrained(folder))
    inputs = processor.pixels([_noise(70, 70), Image.new("RGB", (56, 56), "blue")])
    layout = PatchLayout.of_folder(folder)
    rebuilt = pictures(inputs, layout)
    side = layout.patch * layout.merge * 2  # (2 x 2 merged patches: the tiny models' fixed size)
    assert [p.size for p in rebuilt] == [(side, side)] * 2
    again = processor.pixels(rebuilt)
    assert torch.equal(again["image_grid_thw"], inputs["image_grid_thw"])
    assert torch.equal(again["pixel_values"], inputs["pixel_values"])


def test_published_pixel_bounds_keep_any_shape(tmp_path):
    """Qwen2.5-VL's published bounds (56 x 56 to 3584 x 3584 pixels): pictures of odd sizes and shapes, the one
    too large for the bounds too, come back as the same patches, and the processor would not resize them again."""
    bounds = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    Qwen2VLImageProcessorPil(size=bounds, patch_size=14, merge_size=2).save_pretrained(tmp_path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)
    layout = PatchLayout.of_folder(str(tmp_path))
    assert (layout.min_pixels, layout.max_pixels, layout.patch) == (3136, 1003520, 14)
    images = [_noise(100, 37, 1), _noise(333, 517, 2), _noise(1500, 900, 3)]
    inputs = image_processor(images=images, return_tensors="pt")
    rebuilt = pictures(inputs, layout)
    for picture, (_, h, w) in zip(rebuilt, inputs["image_grid_thw"].tolist()):
        assert picture.size == (w * 14, h * 14)
        layout.check_unchanged(picture)
    again = image_processor(images=rebuilt, return_tensors="pt")
    assert torch.equal(again["pixel_values"], inputs["pixel_values"])


def test_a_picture_the_processor_would_resize_again_is_refused(embedded_cache):  # noqa: F811
    """The tiny model's bounds are one size (56 x 56 pixels); a wide image is cut to 56 x 28, which that processor
    would blow up again: the engine would see other pixels than the actor."""
    folder = materialize_embedded_model("tiny-qwen2.5-vl", embedded_cache)
    processor = load_vision_processor(folder, AutoTokenizer.from_pretrained(folder))
    inputs = processor.pixels([_noise(90, 70)])
    with pytest.raises(ValueError, match=r"resizes its own 56x28 output again.*rollout.backend=hf"):
        image_prompt([1, 9, 9, 2], inputs, PatchLayout.of_folder(folder), image_token_id=9)


def test_each_images_pads_become_one_pad():
    start, pad, end = 5, 9, 6
    ids = [1, start, pad, pad, pad, pad, end, 3, start, pad, pad, end, pad, 4]
    assert one_pad_per_image(ids, pad) == [1, start, pad, end, 3, start, pad, end, pad, 4]
    assert image_prompt([1, 2, 3], {}, None, pad) == {"prompt_token_ids": [1, 2, 3]}  # type: ignore[arg-type]
