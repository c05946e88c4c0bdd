"""Causal language models of the architectures the text pipeline serves, from tiny configs with
random weights: 2 layers, hidden 64, grouped-query attention where the architecture has it,
tiny-gpt2's offline tokenizer. Each builds in well under a second."""

from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
)

from modelbuild.causal_lm import save_seeded

SEED = 0
POSITIONS = 256
HIDDEN = 64
LAYERS = 2
# Shorter than the longest prompt, so that the layers that slide do here.
WINDOW = 8
# (query heads, key/value heads) for the architectures with grouped-query attention.
GQA = {"num_attention_heads": 4, "num_key_value_heads": 2}


def _configs(vocab: int) -> dict[str, PretrainedConfig]:
    common = {"vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
              "num_hidden_layers": LAYERS, "max_position_embeddings": POSITIONS}
    return {
        "llama": LlamaConfig(**common, **GQA),
        "qwen2": Qwen2Config(**common, **GQA),
        "mistral": MistralConfig(**common, **GQA, sliding_window=WINDOW),
        "phi3": Phi3Config(**common, **GQA, original_max_position_embeddings=POSITIONS,
                           sliding_window=WINDOW),
        "gemma2": Gemma2Config(**common, **GQA, head_dim=16, sliding_window=WINDOW),
        "gpt-neox": GPTNeoXConfig(**common, num_attention_heads=4),
        "opt": OPTConfig(vocab_size=vocab, hidden_size=HIDDEN, ffn_dim=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=4,
                         max_position_embeddings=POSITIONS, word_embed_proj_dim=HIDDEN),
    }


ARCHITECTURES = sorted(_configs(8))


def build(architecture: str, tokenizer_dir: Path, out_dir: Path) -> None:
    """Write `architecture`'s model, the tokenizer found in `tokenizer_dir` and a generation
    config to `out_dir`."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = _configs(len(tokenizer))[architecture]
    config.bos_token_id, config.eos_token_id, config.pad_token_id = eos, eos, pad
    save_seeded(AutoModelForCausalLM.from_config, config, tokenizer, out_dir, SEED)
