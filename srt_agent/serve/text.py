"""The rollout server's tokenizer: text to token ids and back, a reply's text as the client sees it (cut
before the stop string unless kept), and that text split token by token for streaming."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import RequestOutput


class TokenText:
    """Text and token ids through one tokenizer, as the server shows them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def decode(self, ids: list[int], skip_special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def shown(self, out: RequestOutput, keep_stop: bool, skip_special: bool) -> tuple[str, str | None]:
        """The reply's text as the client sees it (cut before the stop string unless `keep_stop`), and the
        stop string cut from it (None when nothing was cut)."""
        text = self.decode(list(out.token_ids), skip_special)
        if out.finish_reason == "stop" and isinstance(out.stop_reason, str) and not keep_stop:
            at = text.find(out.stop_reason)
            if at >= 0:
                return text[:at], out.stop_reason
        return text, None

    def pieces(self, ids: list[int], text: str, skip_special: bool) -> list[str]:
        """`text` split over `ids`, one piece per token (possibly empty), in the order the tokens spell it."""
        pieces, emitted = [], 0
        for i in range(len(ids)):
            prefix = self.decode(ids[: i + 1], skip_special)
            end = min(len(prefix), len(text))
            if prefix.endswith("\ufffd") or end < emitted or not text.startswith(prefix[:end]):
                pieces.append("")
                continue
            pieces.append(text[emitted:end])
            emitted = end
        if pieces:
            pieces[-1] += text[emitted:]
        return pieces
