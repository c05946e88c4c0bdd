"""A chat model the way a real checkpoint is laid out: a Qwen2 architecture from a tiny config
(random weights) with a byte-level BPE tokenizer trained offline, whose chat template lives in
the tokenizer (chat_template.jinja), not in the registry. For tests of loading real
checkpoints: a Hugging Face cache, a template found in the tokenizer, a short context.
"""

from pathlib import Path

from transformers import Qwen2Config, Qwen2ForCausalLM

from modelbuild.causal_lm import save_seeded
from modelbuild.tokenizers import train_gpt2_tokenizer

SEED = 0
MAX_POSITIONS = 64
# Qwen2's own template, without tools: turns between <|im_start|> and <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build(out_dir: Path, max_positions: int = MAX_POSITIONS) -> None:
    """Write model, tokenizer (with its chat template) and generation config to `out_dir`."""
    out_dir = Path(out_dir)
    tokenizer = train_gpt2_tokenizer(model_max_length=max_positions)
    tokenizer.chat_template = CHAT_TEMPLATE
    eos = tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    save_seeded(Qwen2ForCausalLM, config, tokenizer, out_dir, SEED)
