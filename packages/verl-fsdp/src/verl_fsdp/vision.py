"""Vision-language models on the FSDP engine: a micro-batch's images as model inputs.

Rows carry their images' processed pixels in the non-tensor column `multi_modal_inputs` (verl.data.vision: per row
`pixel_values` and `image_grid_thw`, an empty dict for a text row). The model takes the pixels of all the rows'
images in row order, their grids, and multimodal rotary positions (time, height, width: Qwen2-VL's mrope) in place
of the 1-D positions, computed here by the model's own `get_rope_index` over the padded rows.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from verl.data.vision import rope_index_module, stacked_images
from verl.protocol import DataProto


def vision_inputs(model: torch.nn.Module, mb: DataProto, device: torch.device) -> Optional[Dict[str, torch.Tensor]]:
    """pixel_values, image_grid_thw and position_ids [3, B, L] for a micro-batch with images; None without."""
    images = stacked_images(mb.non_tensor_batch.get("multi_modal_inputs"))
    if images is None:
        return None
    grid = images["image_grid_thw"]
    ids, mask = mb.batch["input_ids"], mb.batch["attention_mask"]
    config: Any = model.config  # (a transformers model's)
    image_token, merge = config.image_token_id, config.vision_config.spatial_merge_size
    tokens, expected = int((ids == image_token).sum()), int(grid.prod(-1).sum()) // merge**2
    if tokens != expected:  # (the model would fail deep inside with a less helpful message)
        raise ValueError(
            f"the rows hold {tokens} image tokens and their images {expected} merged patches: an image token in a "
            "response, or pixels that do not belong to these rows"
        )
    positions, _ = rope_index_module(model).get_rope_index(
        ids, (ids == image_token).int(), image_grid_thw=grid, attention_mask=mask
    )
    return {
        "pixel_values": images["pixel_values"].to(device),
        "image_grid_thw": grid.to(device),
        "position_ids": positions.to(device),
    }
