"""A token's own bytes, for its log-probability entry (OpenAI's `bytes`): decoding one token of
a multi-byte character alone gives U+FFFD, and the bytes let a client join such tokens back.

Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen2) spell each byte as one printable character
(`bytes_to_unicode`); SentencePiece ones (Llama 2, Mistral, Gemma) spell a byte they could not
merge as `<0xNN>` and a space as U+2581. A token in neither spelling is its decoded text."""

from functools import lru_cache

SPIECE_SPACE = "\u2581"


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's spelling of the 256 bytes (transformers keeps its `bytes_to_unicode` private to
    each tokenizer module): printable Latin-1 bytes stand for themselves, the others for
    the code points from 256 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    spelled = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in spelled:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return {char: byte for byte, char in spelled.items()}


_BYTE_OF = _byte_level_alphabet()


def token_bytes(piece: str, text: str) -> bytes:
    """`piece`, the vocabulary's spelling of a token, as bytes; `text` its decoded text."""
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    if SPIECE_SPACE in piece:
        return piece.replace(SPIECE_SPACE, " ").encode()
    if piece and all(char in _BYTE_OF for char in piece):
        return bytes(_BYTE_OF[char] for char in piece)
    return text.encode()


class TokenSpeller:
    """Each token id's text and bytes, worked out once."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.of = lru_cache(maxsize=65536)(self._of)

    def _of(self, token: int) -> tuple[str, bytes]:
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        piece = self.tokenizer.convert_ids_to_tokens(token)
        return text, token_bytes(piece if isinstance(piece, str) else "", text)
