"""Where the global options go on the command line, and the words of messages that count or
name things; without a server."""

import argparse
import io

import httpx
import pytest
from rich.console import Console

from services.cli import render
from services.cli.args import build_parser
from services.cli.client import Client
from services.cli.commands import Context, UsageError, _body, cancel

GLOBAL = ["--url", "http://before", "--api-key", "k-before", "--json", "--timeout", "3"]


def _globals(args: argparse.Namespace) -> tuple:
    return args.url, args.api_key, args.json, args.timeout


def test_global_options_go_before_the_command():
    args = build_parser().parse_args([*GLOBAL, "status", "x"])
    assert _globals(args) == ("http://before", "k-before", True, 3.0)
    assert (args.command, args.job_id) == ("status", "x")


def test_global_options_go_after_the_command():
    args = build_parser().parse_args(["jobs", "--limit", "2", "--url", "http://after",
                                      "--api-key", "k-after", "--json", "--timeout", "4"])
    assert _globals(args) == ("http://after", "k-after", True, 4.0)


def test_given_in_both_places_the_one_after_the_command_wins_and_the_rest_stay():
    args = build_parser().parse_args([*GLOBAL, "models", "--url", "http://after"])
    assert _globals(args) == ("http://after", "k-before", True, 3.0)


def test_an_option_before_the_command_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("FIBERMILL_URL", "http://from-env")
    monkeypatch.setenv("FIBERMILL_API_KEY", "k-env")
    args = build_parser().parse_args(["--url", "http://before", "models"])
    assert (args.url, args.api_key) == ("http://before", "k-env")


@pytest.mark.parametrize(("options", "task", "message"), [
    (["-m", "digits", "--max-new-tokens", "5"], "image-generation",
     "--max-new-tokens does not apply: digits is an image-generation model"),
    (["-m", "digits", "--top-k", "2", "--stop", "."], "image-generation",
     "--top-k and --stop do not apply: digits is an image-generation model"),
    (["-m", "tiny-gpt2", "--steps", "3", "--width", "8", "--negative-prompt", "x"],
     "text-generation",
     "--steps, --width and --negative-prompt do not apply: tiny-gpt2 is a text-generation "
     "model"),
])
def test_options_of_the_other_task_are_named_in_words_that_agree(options, task, message):
    args = build_parser().parse_args(["submit", "-p", "7", *options])
    with pytest.raises(UsageError) as refused:
        _body(args, task)
    assert str(refused.value) == message


def _context(handler) -> tuple[Context, io.StringIO]:
    out = io.StringIO()
    client = Client("http://api", transport=httpx.MockTransport(handler))
    return Context(client, Console(file=out, width=160), Console(file=io.StringIO())), out


@pytest.mark.parametrize(("status", "words"), [
    ("canceled", "was already canceled"), ("succeeded", "had already succeeded"),
    ("failed", "had already failed")])
def test_cancel_of_an_ended_job_says_how_it_ended(status, words):
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "GET", "an ended job is not canceled again"
        return httpx.Response(200, json={"id": "j1", "status": status})

    ctx, out = _context(handler)
    args = build_parser().parse_args(["cancel", "j1"])
    assert cancel(args, ctx) == 0
    assert out.getvalue() == f"job j1 {words}; nothing to cancel\n"


@pytest.mark.parametrize(("tokens", "words"), [(1, "(stop, 1 token)"), (3, "(stop, 3 tokens)")])
def test_a_text_result_counts_its_tokens_in_words_that_agree(tokens, words):
    out = io.StringIO()
    job = {"task": "text-generation", "input": {"prompts": ["Hi"]},
           "output": [{"text": " there", "finish_reason": "stop", "tokens": tokens}]}
    render.results(Console(file=out, width=160), job)
    assert out.getvalue() == f"  [0] 'Hi' → ' there' {words}\n"
