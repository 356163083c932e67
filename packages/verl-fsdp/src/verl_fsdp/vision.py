"""Vision-language models on the FSDP engine: a micro-batch's images as model inputs, padded or packed.

Rows carry their images' processed pixels in the non-tensor column `multi_modal_inputs` (verl.data.vision: per row
`pixel_values` and `image_grid_thw`, an empty dict for a text row). The model takes the pixels of the images its
input holds, in the order their placeholder tokens appear, their grids, and multimodal rotary positions (time,
height, width: Qwen2-VL's mrope) in place of the 1-D positions. Those are computed by the model's own
`get_rope_index` over the padded rows and carried to each token's place in a packed layout
(verl.utils.shared_prefix, verl.utils.padding_free), where a prompt shared by several rows, and its images, is
computed once.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional

import torch

from verl.data.vision import rope_index_module, stacked_images
from verl.protocol import DataProto
from verl.utils.shared_prefix import PrefixPack


def image_rows(mb: DataProto) -> Optional[List[Dict[str, torch.Tensor]]]:
    """Each row's images (an empty dict for a text row); None when no row of the micro-batch has any."""
    rows = mb.non_tensor_batch.get("multi_modal_inputs")
    return list(rows) if rows is not None and any(rows) else None


def image_keys(rows: List[Dict[str, torch.Tensor]]) -> List[bytes]:
    """Per row, a digest of its pixels: two rows share a packed prompt only if their images are equal too (their
    placeholder tokens are the same for any two images of one size)."""
    keys = []
    for row in rows:
        digest = hashlib.blake2b(digest_size=16)
        for name in ("image_grid_thw", "pixel_values"):
            if name in row:
                digest.update(row[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        keys.append(digest.digest())
    return keys


VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")  # Qwen-VL's; LLaVA's and Gemma 3's; Idefics'


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """A vision-language model's vision tower: its image encoder (with Qwen-VL's, the merger that projects into
    the language model)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES:
            return module
    raise ValueError(
        f"actor.freeze_vision_tower: {type(model).__name__} has no vision tower (no module named "
        f"{' or '.join(VISION_TOWER_NAMES)}); set actor.freeze_vision_tower=false for a text model"
    )


def vision_inputs(
    model: torch.nn.Module,
    mb: DataProto,
    rows: List[Dict[str, torch.Tensor]],
    device: torch.device,
    pack: Optional[PrefixPack] = None,
) -> Dict[str, torch.Tensor]:
    """pixel_values, image_grid_thw and position_ids for a micro-batch with images (`rows`: its `image_rows`):
    [3, B, L] for the padded rows, or laid out as `pack` ([3, G, L] for a shared-prefix pack, [4, 1, T] for a
    padding-free stream: its 1-D positions first, which is where the model finds the sequences' boundaries)."""
    grid = stacked_images(rows)["image_grid_thw"]  # type: ignore[index]  # (rows has images)
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
    if pack is None:
        images = stacked_images(rows)
    else:
        positions = _packed_positions(positions, pack)
        images = stacked_images([rows[b] for b in _computed_prompts(pack, mask)])
    assert images is not None  # (a pack computes every distinct prompt, so some of those with images)
    return {
        "pixel_values": images["pixel_values"].to(device),
        "image_grid_thw": images["image_grid_thw"].to(device),
        "position_ids": positions.to(device),
    }


def _packed_positions(positions: torch.Tensor, pack: PrefixPack) -> torch.Tensor:
    """[3, B, S] positions of the padded rows -> each packed token's, from the row position it computes (rows that
    share a prompt have the same positions on it)."""
    assert pack.source is not None
    source = pack.source.to(positions.device)
    placed = source >= 0
    g, length = pack.input_ids.shape
    out = torch.zeros(3, g * length, dtype=positions.dtype, device=positions.device)
    out[:, source[placed]] = positions[:, placed]
    out = out.view(3, g, length)
    if pack.allowed is None:  # padding-free: the 1-D positions (restarting at each row) go first
        out = torch.cat([pack.position_ids.to(out)[None], out])
    return out


def _computed_prompts(pack: PrefixPack, mask: torch.Tensor) -> List[int]:
    """One row per prompt the pack computes, in the order the packed tokens hold them: whose images to pass."""
    assert pack.source is not None
    source, mask = pack.source.cpu(), mask.cpu().bool()
    first = mask.long().argmax(-1)  # each row's first real token: its prompt's start in the pack
    starts = source[torch.arange(len(first)), first].tolist()
    by_start: Dict[int, int] = {}
    for row, start in enumerate(starts):
        by_start.setdefault(start, row)
    return [by_start[start] for start in sorted(by_start)]
