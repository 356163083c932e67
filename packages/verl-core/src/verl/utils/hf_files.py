"""Files of a Hugging Face model folder that travel with exported weights."""

from __future__ import annotations

import glob
import os
import shutil

# Everything a tokenizer (and generation defaults) is loaded from; weights and config are written anew.
TOKENIZER_GLOBS = (
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template*",
    "vocab*",
    "merges.txt",
    "generation_config.json",
)


def copy_tokenizer_files(src: str, dst: str) -> list[str]:
    """Copy the tokenizer and generation files of folder `src` into `dst`; returns the names copied."""
    copied = []
    for pattern in TOKENIZER_GLOBS:
        for f in glob.glob(os.path.join(src, pattern)):
            if os.path.isfile(f):
                shutil.copy2(f, os.path.join(dst, os.path.basename(f)))
                copied.append(os.path.basename(f))
    return sorted(copied)
