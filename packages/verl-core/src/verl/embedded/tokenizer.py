"""A character-level tokenizer for the embedded models: one token per character, no model hub needed.

Every character in `CHARACTERS` is one token; anything else becomes <unk>. Decoding joins tokens with
nothing between them, so `decode(encode(text)) == text` for every text made of known characters.

The chat template has no role markup: a conversation renders as its messages' contents in order, and an
assistant turn is followed by <eos>
and a tool's result by a newline. `add_generation_prompt` adds nothing, so the prompt
[{"role": "user", "content": "12+7="}] is exactly "12+7=" and the model answers right after the "=".
No <bos> is added: a tiny model learns the arithmetic task as well without it, and prompts stay short.

The vision variant (`vision=True`, the tiny vision-language model's) adds Qwen2.5-VL's vision tokens after the
characters (so every other id stays the same) and a template that also renders content given as a list of parts,
an image part as <|vision_start|><|image_pad|><|vision_end|> (the image processor's patches later widen the pad).
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order
CHARACTERS = string.digits + "+-*/=" + " " + string.ascii_lowercase + string.ascii_uppercase + "?.,:;!'\"()\n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% if message['role'] == 'tool' %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
)
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)  # ids after the characters, in this order
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '" + VISION_START + IMAGE_PAD + VISION_END + "' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% if message['role'] == 'tool' %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
)


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first, then one id per character."""
    return {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}


def build_char_tokenizer(model_max_length: int | None = None, vision: bool = False) -> PreTrainedTokenizerFast:
    """The character tokenizer, left-padding (prompts are left-padded for generation); `vision`: with the vision
    tokens and the template for image parts."""
    backend = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    # [\s\S] matches any one character, newline included (a bare "." would skip newlines).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join tokens with no separator
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,  # the clean-up rewrites " ." to ".", breaking round trips
        chat_template=VISION_CHAT_TEMPLATE if vision else CHAT_TEMPLATE,
        **extra,
    )
    if vision:  # (special: never split into characters, kept whole by decode)
        tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tokenizer
