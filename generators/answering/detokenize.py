"""An answer's text as its tokens arrive, decoding a few tokens per step instead of the whole answer.

Decoding every row's whole answer at every step made the decode loop quadratic in the answer's length. Here
each step decodes the tokens since the last stable point twice (with and without the new token) and appends
the difference: the scheme of text-generation-inference's `decode_token`. Starting the window one stable token
back keeps what a tokenizer does to a sequence's first token (SentencePiece drops its leading space) out of the
difference, and a step whose bytes end inside a character waits (U+FFFD) until the character is complete. The
text after each step equals `tokenizer.decode(ids, skip_special_tokens=True)` of the whole answer
(tests/test_detokenize.py, on each packaged tokenizer).
"""

from __future__ import annotations


class IncrementalText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.stable = ""  # the text up to `read`, which no later token changes
        self._prefix = 0  # where the decoded window starts (one stable token back)
        self._read = 0  # tokens whose text is in `stable`

    def push(self, token: int) -> str:
        """Add one token; return the answer's decoded text so far (a character still incomplete shows as U+FFFD)."""
        self.ids.append(token)
        decode = self.tokenizer.decode
        head = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        window = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(window) > len(head) and not window.endswith("\ufffd"):
            self.stable += window[len(head) :]
            self._prefix, self._read = self._read, len(self.ids)
            return self.stable
        return self.stable + window[len(head) :]


def cut_at_stop(text: str, stops: tuple[str, ...] | list[str]) -> str:
    """`text` up to the first of `stops` (a stop string is never returned, as OpenAI's `stop` and a harness's `until`
    say). Leading whitespace ends nothing: an answer that opens with a line break goes on to its first line, as
    midlens stops at the end of the first non-empty line (`stop_at_line_end`)."""
    start = len(text) - len(text.lstrip())
    ends = [e for e in (text.find(stop, start) for stop in stops if stop) if e >= 0]
    return text[: min(ends)] if ends else text
