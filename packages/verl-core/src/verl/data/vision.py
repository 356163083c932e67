"""Images in the data: a row's images decoded, its `<image>` placeholders turned into image parts of the chat, and
the rendered prompt with its images turned into model inputs by the model's own image processor.

The format is upstream verl's: an `images` column holding, per row, a list of images, each encoded bytes, a
{"bytes": ..., "path": ...} dict (as Hugging Face datasets store images) or a path (absolute, or relative to the
parquet file's folder); each `<image>` in the prompt's message contents marks where the next image goes. Inputs are
Qwen2-VL style (`pixel_values` of patches, `image_grid_thw` per image, and each image's pad token repeated once per
merged patch), computed the way transformers' Qwen2.5-VL processor computes them (a test holds the two equal).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
IMAGES_FORMAT = "a list of images per row: encoded bytes, {'bytes': ..., 'path': ...} dicts, or file paths"


def load_image(value: Any, path: str, row: int, k: int) -> Image.Image:
    """Image `k` of `row` decoded as RGB, or an error naming the file, row and image and what was wrong."""
    where = f"{path}: row {row}: image {k} of column 'images'"
    if isinstance(value, dict):
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    if isinstance(value, str):
        file = value if os.path.isabs(value) else os.path.join(os.path.dirname(os.path.abspath(path)), value)
        if not os.path.isfile(file):
            raise ValueError(f"{where}: no image file {file!r} (a relative path is read from the parquet's folder)")
        with open(file, "rb") as f:
            value = f.read()
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"{where} must be {IMAGES_FORMAT}, got {type(value).__name__}")
    try:
        image = Image.open(io.BytesIO(value))
        image.load()
    except Exception as err:  # PIL raises several kinds for data it cannot read
        raise ValueError(f"{where} cannot be decoded ({len(value)} bytes): {err}") from None
    return image.convert("RGB")


def row_images(value: Any, path: str, row: int) -> list[Image.Image]:
    """The images of one row of the `images` column (None or an empty list: a row without images)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{path}: row {row}: column 'images' must be {IMAGES_FORMAT}, got {type(value).__name__}")
    return [load_image(v, path, row, k) for k, v in enumerate(value)]


def image_messages(messages: list[dict[str, Any]], n_images: int, path: str, row: int) -> list[dict[str, Any]]:
    """The conversation with each `<image>` in a content string made an image part ({"type": "image"}, the text
    around it text parts); the placeholders must be as many as the row's images."""
    found = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
    if found != n_images:
        raise ValueError(
            f"{path}: row {row}: the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) and column 'images' "
            f"holds {n_images} image(s); put one {IMAGE_PLACEHOLDER} in the message content where each image goes"
        )
    out = []
    for m in messages:
        if IMAGE_PLACEHOLDER not in m["content"]:
            out.append(m)
            continue
        parts: list[dict[str, Any]] = []
        for i, text in enumerate(m["content"].split(IMAGE_PLACEHOLDER)):
            if i:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        out.append({**m, "content": parts})
    return out


@dataclass
class VisionProcessor:
    """A vision-language model's tokenizer and image processor, as its processor would combine them."""

    tokenizer: Any
    image_processor: Any
    image_token: str  # the pad token each image's merged patches replace (<|image_pad|>)

    @property
    def merge_size(self) -> int:
        return int(self.image_processor.merge_size)

    def image_tokens(self, image: Image.Image) -> int:
        """How many pad tokens the image becomes (its merged patches), without processing its pixels."""
        patches = self.image_processor.get_number_of_image_patches(image.height, image.width, {})
        return int(patches) // self.merge_size**2

    def widen(self, text: str, tokens_per_image: list[int]) -> str:
        """The rendered prompt with its k-th image pad repeated tokens_per_image[k] times."""
        parts = text.split(self.image_token)
        if len(parts) - 1 != len(tokens_per_image):
            raise ValueError(
                f"the rendered prompt has {len(parts) - 1} {self.image_token} and {len(tokens_per_image)} images"
            )
        return parts[0] + "".join(self.image_token * n + p for n, p in zip(tokens_per_image, parts[1:]))

    def pixels(self, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        """pixel_values [patches, channels * temporal * patch * patch] and image_grid_thw [images, 3]."""
        out = self.image_processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def stacked_images(rows: Optional[Iterable[Dict[str, Any]]]) -> Optional[Dict[str, torch.Tensor]]:
    """pixel_values and image_grid_thw of a batch's rows (the `multi_modal_inputs` column: an empty dict for a text
    row) concatenated in row order, as a vision-language model takes them; None when no row has images."""
    with_images = [r for r in rows if r] if rows is not None else []
    if not with_images:
        return None
    return {key: torch.cat([r[key] for r in with_images]) for key in ("pixel_values", "image_grid_thw")}


def is_vision_model(config: Any) -> bool:
    """Whether a Hugging Face config declares a vision tower (a vision-language model)."""
    return getattr(config, "vision_config", None) is not None


def rope_index_module(model: Any) -> Any:
    """The module of a vision-language model that computes its multimodal positions (`get_rope_index`) and keeps
    the last call's offsets (`rope_deltas`), found inside peft's and FSDP's wrappers alike."""
    for m in model.modules():
        if callable(getattr(type(m), "get_rope_index", None)):
            return m
    raise ValueError(f"{type(model).__name__} has no get_rope_index: its multimodal positions are not known here")


def vision_token_ids(config: Any) -> List[int]:
    """The ids of a vision-language model's image and video markers: the prompt's to place, never a response's."""
    keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [int(getattr(config, k)) for k in keys if getattr(config, k, None) is not None]


def image_prompt(
    processor: Optional[VisionProcessor],
    tokenizer: Any,
    conversation: List[Dict[str, Any]],
    images: Any,
    path: str,
    row: int,
    tools: Any = None,
) -> Tuple[str, List[int], List[Dict[str, Any]]]:
    """One row of a file with images: its prompt text (one pad token per image), token ids (each image's pad
    widened to its merged patches) and the conversation with image parts; its images decoded once to check them."""
    from verl.data.rows import render_prompts

    if processor is None:
        raise ValueError(
            f"{path}: column 'images' holds images, and image prompts need a vision-language model's processor "
            "(model.path a vision-language model; in code, processor=verl.data.vision.load_vision_processor(...))"
        )
    decoded = row_images(images, path, row)
    parted = image_messages(conversation, len(decoded), path, row)
    (text,) = render_prompts(tokenizer, [parted], tools)
    widened = processor.widen(text, [processor.image_tokens(im) for im in decoded])
    return text, tokenizer(widened, add_special_tokens=False)["input_ids"], parted


def load_vision_processor(model_dir: str, tokenizer: Any) -> VisionProcessor | None:
    """The model's VisionProcessor when its folder has an image processor (preprocessor_config.json), else None."""
    if not os.path.isfile(os.path.join(model_dir, "preprocessor_config.json")):
        return None
    from transformers import AutoImageProcessor

    image_processor = AutoImageProcessor.from_pretrained(model_dir)
    image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    if tokenizer.convert_tokens_to_ids(image_token) in (None, tokenizer.unk_token_id):
        raise ValueError(f"{model_dir}: the tokenizer has no image token {image_token!r} for the image processor")
    return VisionProcessor(tokenizer, image_processor, image_token)
