"""Image prompts for an engine that processes images itself (vLLM): each image as a picture again and each image's
run of pad tokens as one pad, which the engine widens to the image's merged patches.

The rows carry their images as the model's processor made them (`multi_modal_inputs`: normalized patches and their
grid, verl.data.vision); the actor and the hf rollout compute on those. The pictures rebuilt here are the processor's
resized images, pixel for pixel. Its resize (to a multiple of patch x merge pixels within its pixel bounds) leaves
them as they are wherever its bounds are apart, as in published configs, so the engine's processor makes the same
grid and the same patches from them; a picture it would resize again is refused, naming the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
from PIL import Image


@dataclass(frozen=True)
class PatchLayout:
    """How a Qwen2-VL-style image processor cut an image into patches (its preprocessor_config.json)."""

    patch: int
    temporal: int
    merge: int
    mean: Sequence[float]
    std: Sequence[float]
    rescale: float
    min_pixels: int
    max_pixels: int

    @classmethod
    def of_folder(cls, model_dir: str) -> "PatchLayout":
        """The layout the model's own image processor (its folder's preprocessor_config.json) cuts with."""
        from transformers import AutoImageProcessor

        p = AutoImageProcessor.from_pretrained(model_dir)
        size = p.size  # (Qwen2-VL's processors keep their pixel bounds as shortest_edge / longest_edge)
        return cls(
            patch=int(p.patch_size),
            temporal=int(p.temporal_patch_size),
            merge=int(p.merge_size),
            mean=tuple(p.image_mean),
            std=tuple(p.image_std),
            rescale=float(p.rescale_factor),
            min_pixels=int(getattr(size, "min_pixels", None) or size["shortest_edge"]),
            max_pixels=int(getattr(size, "max_pixels", None) or size["longest_edge"]),
        )

    def check_unchanged(self, picture: Image.Image) -> None:
        """That the processor's resize keeps `picture` as it is (else the engine would compute other patches)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # (no torchvision)

        w, h = picture.size
        again = smart_resize(h, w, self.patch * self.merge, self.min_pixels, self.max_pixels)
        if again != (h, w):
            raise ValueError(
                f"the image processor resizes its own {w}x{h} output again, to {again[1]}x{again[0]} (min_pixels "
                f"{self.min_pixels}, max_pixels {self.max_pixels} are too close): the engine would see other pixels "
                "than the actor; widen the processor's pixel bounds, or use rollout.backend=hf"
            )


def pictures(inputs: Dict[str, torch.Tensor], layout: PatchLayout) -> List[Image.Image]:
    """A row's images (`pixel_values` [patches, channels x temporal x patch x patch], `image_grid_thw` [images, 3])
    as RGB pictures: the patches put back in place, un-normalized, the first of each image's temporal copies."""
    p, t, m = layout.patch, layout.temporal, layout.merge
    mean = torch.tensor(layout.mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(layout.std, dtype=torch.float64)[:, None, None]
    out, start = [], 0
    for grid_t, grid_h, grid_w in inputs["image_grid_thw"].tolist():
        n = grid_t * grid_h * grid_w
        patches = inputs["pixel_values"][start : start + n].to(torch.float64)
        start += n
        # the processor's order: (t, h / m, w / m, m, m, channels, temporal, patch, patch)
        x = patches.reshape(grid_t, grid_h // m, grid_w // m, m, m, -1, t, p, p)
        x = x.permute(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(grid_t * t, -1, grid_h * p, grid_w * p)[0]
        values = ((x * std + mean) / layout.rescale).round().clamp(0, 255)
        out.append(Image.fromarray(values.permute(1, 2, 0).to(torch.uint8).numpy().astype(np.uint8), "RGB"))
    if start != len(inputs["pixel_values"]):
        raise ValueError(f"the grids cover {start} patches of {len(inputs['pixel_values'])}")
    return out


def one_pad_per_image(ids: Sequence[int], image_token_id: int) -> List[int]:
    """Prompt token ids with each run of image pads (one image's merged patches) as a single pad."""
    out: List[int] = []
    for token in ids:
        if token != image_token_id or not out or out[-1] != image_token_id:
            out.append(int(token))
    return out


def image_prompt(
    ids: Sequence[int], inputs: Dict[str, Any], layout: PatchLayout, image_token_id: int
) -> Dict[str, Any]:
    """One request for the engine: its token ids, an image's pads as one, and its pictures (a text row: ids only)."""
    if not inputs:
        return {"prompt_token_ids": list(ids)}
    images = pictures(inputs, layout)
    for picture in images:
        layout.check_unchanged(picture)
    collapsed = one_pad_per_image(ids, image_token_id)
    if collapsed.count(image_token_id) != len(images):
        raise ValueError(
            f"a prompt has {collapsed.count(image_token_id)} runs of image pads and {len(images)} images; two "
            "images' pads must be apart (each image sits between its vision start and end markers)"
        )
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": images}}
