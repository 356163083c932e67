"""Image prompts: verl's RL parquet with an `images` column read with the tiny Qwen2.5-VL's processor; the inputs equal
transformers' Qwen2.5-VL processor's; bad image rows are named."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

from verl.data.rl_dataset import RLDataset, collate_rl
from verl.data.vision import load_vision_processor
from verl.embedded.shapes import make_shapes_rows


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    return tokenizer, load_vision_processor(tiny_vlm_dir, tokenizer)


def _png(size=(56, 56), colour="red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def _write(tmp_path, rows, name="images.parquet") -> str:
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path)
    return path


def _reference_processor(model_dir, tokenizer, monkeypatch, cls=Qwen2_5_VLProcessor):
    """transformers' own processor (`cls`) over the model's tokenizer and image processor. (Its constructor checks
    the class of every part, the absent video processor too, and that class lookup fails where torchvision is not
    installed; only that check is skipped.)"""
    check = ProcessorMixin.check_argument_for_proper_class

    def skip_video(self, name, arg):
        return None if name == "video_processor" and arg is None else check(self, name, arg)

    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", skip_video)
    return cls(image_processor=AutoImageProcessor.from_pretrained(model_dir), tokenizer=tokenizer)


def _assert_inputs_equal_the_reference(data, reference):
    """Every row's token ids, pixels and grids as transformers' processor makes them from its prompt and images."""
    for i in range(len(data)):
        item = data[i]
        images = [Image.open(io.BytesIO(v["bytes"])) for v in item["images"]]
        expected = reference(text=[item["raw_prompt"]], images=images, return_tensors="pt")
        assert item["input_ids"].tolist() == expected["input_ids"][0].tolist()
        for key in ("pixel_values", "image_grid_thw"):
            assert torch.equal(item["multi_modal_inputs"][key], expected[key]), key


def test_inputs_equal_transformers_qwen2_5_vl_processor(tmp_path, vlm, tiny_vlm_dir, monkeypatch):
    tokenizer, processor = vlm
    rows = make_shapes_rows(3, split="train")
    two = {**rows[0], "prompt": [{"role": "user", "content": "<image>and<image>: how many in all?"}]}
    two["images"] = [rows[0]["images"][0], {"bytes": _png((84, 56), "blue"), "path": None}]  # another size too
    data = RLDataset([_write(tmp_path, [*rows, two])], tokenizer, max_prompt_length=128, processor=processor)
    _assert_inputs_equal_the_reference(data, _reference_processor(tiny_vlm_dir, tokenizer, monkeypatch))
    # the 84 x 56 image scaled within the processor's 56 * 56 pixels: 2 x 4 patches, 1 x 2 after the 2 x 2 merge
    assert data[3]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 4]]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (data[3]["input_ids"] == pad).sum() == 4 + 2


def test_embedded_shapes_rows_collate_with_their_pixels(vlm, embedded_cache):
    tokenizer, processor = vlm
    data = RLDataset(
        ["embedded:shapes-val"], tokenizer, max_prompt_length=64, processor=processor, cache_dir=embedded_cache
    )
    assert len(data) == 200 and data.rows[0]["messages"][0]["content"][0] == {"type": "image"}
    assert data[0]["raw_prompt"] == "<|vision_start|><|image_pad|><|vision_end|>How many shapes?"
    batch = collate_rl([data[i] for i in range(4)], tokenizer, 64)
    assert batch.batch["input_ids"].shape == (4, 2 + 4 + 16)  # vision start and end, 4 image tokens, the question
    inputs = batch.non_tensor_batch["multi_modal_inputs"]
    assert [tuple(m["pixel_values"].shape) for m in inputs] == [(16, 3 * 2 * 14 * 14)] * 4


def test_a_text_prompt_beside_image_prompts_has_no_pixels(tmp_path, vlm):
    tokenizer, processor = vlm
    rows = make_shapes_rows(1, split="train")
    text = {**rows[0], "prompt": [{"role": "user", "content": "1+1="}], "images": []}
    data = RLDataset([_write(tmp_path, [rows[0], text])], tokenizer, max_prompt_length=64, processor=processor)
    assert "multi_modal_inputs" not in data[1] and data[1]["raw_prompt"] == "1+1="
    batch = collate_rl([data[0], data[1]], tokenizer, 64)
    assert batch.non_tensor_batch["multi_modal_inputs"][1] == {}


def test_an_image_path_is_read_from_the_parquets_folder(tmp_path, vlm):
    tokenizer, processor = vlm
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(_png())
    row = {**make_shapes_rows(1, split="train")[0], "images": ["pics/a.png"]}
    data = RLDataset([_write(tmp_path, [row])], tokenizer, max_prompt_length=64, processor=processor)
    assert data[0]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]


@pytest.mark.parametrize(
    "good, bad, prompt, message",
    [
        (None, [{"bytes": b"not a png"}], "<image>How many?", r"image 0 of column 'images' cannot be decoded"),
        (["pics/a.png"], ["pics/no.png"], "<image>How many?", r"image 0 of column 'images': no image file .*no.png"),
        ([7], [3], "<image>How many?", r"image 0 of column 'images' must be a list of images per row.*got int"),
        (None, [{"bytes": _png()}], "How many?", r"the prompt has 0 <image> placeholder\(s\) and column 'images'"),
        (None, [], "<image>How many?", r"the prompt has 1 <image> placeholder\(s\) and column 'images' holds 0"),
    ],
)
def test_a_bad_image_row_is_named(tmp_path, vlm, good, bad, prompt, message):
    """Row 1 is bad; row 0 holds its images the same way (a parquet column holds one kind of value)."""
    tokenizer, processor = vlm
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(_png())
    first = make_shapes_rows(1, split="train")[0]
    rows = [{**first, "images": good or first["images"]}, {**first, "prompt": [{"role": "user", "content": prompt}]}]
    rows[1]["images"] = bad
    path = _write(tmp_path, rows)
    row = 0 if good == [7] else 1  # (an int is no image in row 0 either)
    with pytest.raises(ValueError, match=f"^{path}: row {row}: " + message):
        RLDataset([path], tokenizer, max_prompt_length=64, processor=processor)


def test_image_rows_without_a_processor_say_what_they_need(tmp_path, vlm):
    tokenizer, _ = vlm
    path = _write(tmp_path, make_shapes_rows(2, split="train"))
    with pytest.raises(ValueError, match=r"column 'images' holds images, and image prompts need a vision-language"):
        RLDataset([path], tokenizer, max_prompt_length=64)


def test_a_text_model_has_no_vision_processor(tiny_model_dir, char_tokenizer):
    assert load_vision_processor(tiny_model_dir, char_tokenizer) is None


def test_sft_examples_with_images_learn_the_response_only(vlm, embedded_cache, tmp_path):
    from verl.data.sft_dataset import SFTDataset, collate_sft_batch

    tokenizer, processor = vlm
    data = SFTDataset(["embedded:shapes-sft"], tokenizer, max_length=32, processor=processor, cache_dir=embedded_cache)
    assert len(data) == 4000
    item = data[0]
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((item["input_ids"] == pad).sum()) == 4 and item["loss_mask"].sum() == 2  # the count and <eos>
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    batch = collate_sft_batch([data[0], data[1]], tokenizer.pad_token_id)
    assert len(batch.non_tensor_batch["multi_modal_inputs"]) == 2
    rows = [
        {"prompt": [{"role": "user", "content": "<image>How many?"}], "response": "1", "images": [{"bytes": _png()}]}
    ]
    with pytest.raises(ValueError, match=r"sft.parquet: column 'images' holds images, and image prompts need a vision"):
        SFTDataset([_write(tmp_path, rows, "sft.parquet")], tokenizer, max_length=32)


def test_preference_data_with_images_is_refused_not_read_as_text(tmp_path, char_tokenizer):
    from verl.data.preference_dataset import PreferenceDataset

    pairs = [{"prompt": "<image>How many?", "chosen": "1", "rejected": "2", "images": [{"bytes": _png()}]}]
    path = _write(tmp_path, pairs, "pairs.parquet")
    with pytest.raises(ValueError, match=r"pairs.parquet: column 'images' holds images, and this data set reads text"):
        PreferenceDataset([path], char_tokenizer, max_prompt_length=32, max_response_length=8)


def test_geometry3k_is_prepared_with_its_diagrams_and_scored_from_the_box(tmp_path, vlm):
    """`verl data prepare geometry3k` from its published parquet layout (image cells {"bytes", "path"}) and from
    records as the `datasets` library decodes them (PIL images): rows whose diagrams the processor reads, scored by
    `reward.fn: default` from the last box; a record whose placeholders do not match its images is named."""
    from verl.data.prepare import prepare
    from verl.reward.functions import get_reward_fn

    tokenizer, processor = vlm
    records = [
        {"images": [{"bytes": _png(), "path": None}], "problem": "<image>Find x.", "answer": "12"},
        {"images": [{"bytes": _png(colour="blue"), "path": "b.png"}], "problem": "<image>Find y.", "answer": "3"},
    ]
    source = _write(tmp_path, records, "geo.parquet")
    path = prepare("geometry3k", str(tmp_path / "geo"), source=source, quiet=True)
    rows = pd.read_parquet(path).to_dict("records")
    assert [r["data_source"] for r in rows] == ["hiyouga/geometry3k"] * 2
    assert (
        rows[0]["prompt"][0]["content"].startswith("<image>Find x. ") and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    )
    data = RLDataset([path], tokenizer, max_prompt_length=128, processor=processor)
    assert data[0]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    extra = {**rows[1]["extra_info"], "data_source": rows[1]["data_source"]}
    assert get_reward_fn("default")("", "so y = \\boxed{3}", "3", extra) == 1.0
    assert get_reward_fn("default")("", "so y = \\boxed{4}", "3", extra) == 0.0

    from verl.data.sets import geometry3k

    row = geometry3k({"images": [Image.new("RGB", (56, 56))], "problem": "<image>Find z.", "answer": "5"}, 0, "test")
    assert Image.open(io.BytesIO(row["images"][0])).size == (56, 56)
    with pytest.raises(ValueError, match=r"record 0 is not in the geometry3k layout .*1 <image> placeholders for 2"):
        prepare(
            "geometry3k",
            str(tmp_path / "bad"),
            source=_write(
                tmp_path, [{**records[0], "images": [records[0]["images"][0], records[1]["images"][0]]}], "bad.parquet"
            ),
            quiet=True,
        )


def test_inputs_equal_transformers_qwen3_vl_processor(tmp_path, embedded_cache, monkeypatch):
    """The same rows for the tiny Qwen3-VL (16-pixel patches): its processor's inputs, token for token."""
    from transformers import Qwen3VLProcessor

    from verl.embedded.models import materialize_embedded_model

    model_dir = materialize_embedded_model("tiny-qwen3-vl", embedded_cache)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = make_shapes_rows(2, split="train")
    data = RLDataset(
        [_write(tmp_path, rows)],
        tokenizer,
        max_prompt_length=128,
        processor=load_vision_processor(model_dir, tokenizer),
    )
    _assert_inputs_equal_the_reference(data, _reference_processor(model_dir, tokenizer, monkeypatch, Qwen3VLProcessor))
    assert data[0]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]  # 64 x 64: 4 image tokens
