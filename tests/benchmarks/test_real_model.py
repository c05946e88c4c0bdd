"""The real-model benchmark's helpers: its requests and its report (no benchmark runs here)."""

from benchmarks import qwen_shape
from benchmarks import real_model as rm
from benchmarks.peers import Load


def test_requests_are_seeded_and_in_the_chat_like_ranges():
    reqs = rm.requests(64, seed=1)
    assert reqs == rm.requests(64, seed=1) and reqs != rm.requests(64, seed=2)
    assert all(50 <= r.prompt_tokens <= 400 and 32 <= r.max_new_tokens <= 256 for r in reqs)
    assert all(len(r.prompt.split()) == r.prompt_tokens for r in reqs)


def test_a_prompt_of_n_words_is_n_tokens_with_the_models_tokenizer():
    tokenizer = qwen_shape._tokenizer()
    assert len(tokenizer) == qwen_shape.VOCAB
    for r in rm.requests(4):
        ids = tokenizer(r.prompt)["input_ids"]
        assert len(ids) == r.prompt_tokens
        assert tokenizer.decode(ids) == r.prompt
    # The last four-letter word is the vocabulary's last token.
    last = qwen_shape.word(qwen_shape.WORDS - 1)
    assert tokenizer(" " + last)["input_ids"] == [qwen_shape.VOCAB - 1]


def test_the_report_states_both_ratios_and_the_memory():
    load = Load(10.0, [5.0] * 4, [100] * 4)
    faster = Load(8.0, [4.0] * 4, [100] * 4)
    r = {"n": 4, "layers": 24, "errors": [], "prompt_tokens": [50, 400, 60, 70],
         "budgets": [32, 256, 40, 50], "weights_bytes": 1_976_000_000,
         "pool": {"fibermill_kv_cache_pages": 10922.0}, "worker_rss": 7_000_000_000,
         "generate": load, "litserve": load, "fibermill": faster,
         "occupancy": [0.95, 0.97], "after": {}, "seconds": 60.0}
    text = "\n".join(rm.report(r))
    assert "Fibermill / `generate`: **1.25x**" in text
    assert "Fibermill / LitServe: **1.25x**" in text
    assert "25.77 GB" in text  # 32 full-context rows as fixed slots
    assert "median **0.960**" in text
