"""Chat messages are rendered the way transformers renders them, in a sandbox."""

import pytest
from transformers import AutoTokenizer

from services.api.openai.chat_template import render_chat
from shared.errors import InvalidInput
from shared.registry import load_registry

CHAT = [{"role": "system", "content": "You document Python."},
        {"role": "user", "content": "  What does len do?  "},
        {"role": "assistant", "content": "Return the number of items."},
        {"role": "user", "content": "And iter?"}]


def test_the_demo_models_template_renders_as_transformers_does(model_dir):
    spec = load_registry(model_dir / "registry.yaml").get("pydoc-gpt2")
    tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
    ours = render_chat(spec.chat_template, CHAT)
    theirs = tokenizer.apply_chat_template(CHAT, chat_template=spec.chat_template,
                                           tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("User: And iter?\nAssistant:")


def test_a_conversation_the_template_refuses_names_messages():
    template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message "
                "must be the user\\'s') }}{% endif %}{{ messages[0]['content'] }}")
    with pytest.raises(InvalidInput) as refused:
        render_chat(template, [{"role": "assistant", "content": "hi"}])
    assert refused.value.field == "messages" and "first message" in refused.value.message


def test_a_template_cannot_reach_python_internals():
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InvalidInput) as refused:
        render_chat(template, [{"role": "user", "content": "x"}])
    assert "chat template failed" in refused.value.message
