"""A model of Qwen2.5-0.5B's shape with seeded random weights, built at bench time: 24 layers,
896 wide, 14 query heads and 2 KV heads of 64, an MLP of 4,864, 32,768 positions, a vocabulary
of 151,936 and tied embeddings, written in bfloat16 as the published checkpoint is.

Its tokenizer is a byte-level BPE of the same vocabulary size whose merges make every spaced
four-letter word of the vocabulary one token, so a prompt of n words is n tokens (the benchmark
sets its prompts' lengths exactly) and it needs no hub.
"""

import random
from pathlib import Path

NAME = "qwen2.5-0.5b-shape"
VOCAB = 151_936
# Four-letter words in the vocabulary: what the 256 bytes, 2 special tokens and the shorter
# words leave of it.
WORDS = VOCAB - 2 - 256 - 26 - 26**2 - 26**3
CONTEXT = 32_768
EOS = "<|endoftext|>"
PAD = "<|pad|>"


def word(i: int) -> str:
    """The `i`th four-letter word of the vocabulary, in the merges' order."""
    letters = ""
    for _ in range(4):
        i, r = divmod(i, 26)
        letters = chr(ord("a") + r) + letters
    return letters


def words(rng: random.Random, n: int) -> str:
    """A prompt of exactly `n` tokens: `n` words of the vocabulary, spaced."""
    return "".join(" " + word(rng.randrange(WORDS)) for _ in range(n))


def _tokenizer():
    """A byte-level BPE (the kind AutoTokenizer builds Qwen2's tokenizer class around, whatever
    tokenizer_config.json says) whose merges join a space and four letters into one token:
    the 256 bytes, then " a".." z", " aa".." zz", " aaa".." zzz" and as many four-letter words
    as fill the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    space = "\u0120"  # how byte-level BPE writes a space
    vocab: dict[str, int] = {EOS: 0, PAD: 1}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    merges: list[tuple[str, str]] = []
    heads = [space]
    for width in range(1, 5):
        grown = []
        for head in heads:
            for r in range(26):
                letter = chr(ord("a") + r)
                token = head + letter
                if width == 4 and len(vocab) == VOCAB:
                    break
                merges.append((head, letter))
                vocab[token] = len(vocab)
                grown.append(token)
        heads = grown
    core = Tokenizer(models.BPE(vocab, merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=PAD,
                                   model_max_length=CONTEXT)


def build(out: Path, seed: int = 0, layers: int = 24) -> Path:
    """Write the model and its tokenizer to `out`; the same seed gives the same weights.
    `layers` below 24 gives a shorter model of the same width (quick runs)."""
    # Imported here: the benchmark's report needs no torch.
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = _tokenizer()
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2,  # heads of 896 / 14 = 64
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).bfloat16().eval()
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
