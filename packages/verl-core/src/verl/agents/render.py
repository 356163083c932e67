"""Token ids of messages inserted between model turns (tool results, environment or user messages).

Token-in-token-out: the model's own tokens are kept exactly as sampled, never re-tokenized from text; only what
is inserted after a model turn is rendered, as the chat template renders it after an assistant message. That
piece is the template's output for [base conversation + new messages] minus its output for the base conversation
up to the end of the assistant turn (its eos token), so role markup and the next generation prompt are included.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class InsertRenderer:
    def __init__(self, tokenizer: Any, tools: Optional[List[Dict[str, Any]]] = None):
        self.tokenizer, self.tools = tokenizer, tools or None
        eos = tokenizer.eos_token_id
        eos_ids = {eos} if isinstance(eos, int) else set(eos)
        base = self._ids(_BASE, generation_prompt=False)
        ends = [i for i, t in enumerate(base) if t in eos_ids]
        if not ends:
            raise ValueError(
                "the chat template does not end an assistant turn with the eos token, so the text inserted after a "
                "model turn cannot be told apart from the turn; give the tokenizer a template that does"
            )
        self.prefix = base[: ends[-1] + 1]  # the model's turn ends at its own eos

    def _ids(self, messages: Sequence[Dict[str, Any]], generation_prompt: bool) -> List[int]:
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, add_generation_prompt=generation_prompt, tokenize=False
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def ids(self, messages: Sequence[Dict[str, Any]]) -> List[int]:
        """The ids of `messages` after an assistant turn that ended with eos, through the next generation prompt."""
        full = self._ids(_BASE + list(messages), generation_prompt=True)
        if full[: len(self.prefix)] != self.prefix:
            raise ValueError(
                "the chat template renders an assistant turn differently when messages follow it, so inserted "
                f"messages cannot be rendered on their own (roles {[m['role'] for m in messages]})"
            )
        return full[len(self.prefix) :]
