"""Words that agree with what they count or name, for the messages a person reads."""

# What `cancel` says of a job that had ended before it: "canceled" takes "was" where the
# other two are things a job does.
ALREADY = {"succeeded": "had already succeeded", "failed": "had already failed",
           "canceled": "was already canceled"}


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """1 file, 2 files; `nouns` for a plural that is not noun + s."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def listing(items: list[str]) -> str:
    """a; a and b; a, b and c."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def article(word: str) -> str:
    """The indefinite article by the word's first letter, which is enough for the names of
    tasks ("an image-generation model", "a text-generation model")."""
    return "an" if word[:1].lower() in "aeiou" else "a"
