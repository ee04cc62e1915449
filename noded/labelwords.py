"""A job's labels written as ``KEY=VALUE`` words: `nodectl label JOB model=BiDAF
batch_size=32`, and the ``noded:`` part of a Slurm job's ``--comment``.

Each value is typed by its key (``batch_size=32`` an integer, ``pipelined=true`` a
boolean, ``model=1`` still a string): what a label means, and its range, is then
``JobMeta``'s to check.
"""

from __future__ import annotations

#: The labels a job's own hook may register (``jobs.RegisteredLabels``): what the job is.
#: Never ``exempt`` or ``priority``: those are the operator's (the label file, `nodectl
#: exempt`), and a job's submitter, whose words a prolog passes on, must not exempt their
#: own job. (Here, not in noded.jobs, so that a Slurm hook imports no more than it needs:
#: its Python start is a job's start.)
REGISTRABLE = ("category", "model", "batch_size", "requested_cores", "pipelined", "many_weights",
               "heavy_preprocessing", "dataset_gb", "uncached_share")

INTEGERS = ("batch_size", "requested_cores")
BOOLEANS = ("pipelined", "many_weights", "heavy_preprocessing")
NUMBERS = ("dataset_gb", "uncached_share")
BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
#: at most this many words, each at most this long (a comment is the submitter's text)
MAX_WORDS, MAX_WORD = 16, 160


class LabelWordError(ValueError):
    pass


def parse_label_words(words: list[str], *, extra: tuple[str, ...] = ()) -> dict[str, object]:
    """``["model=BiDAF", "batch_size=32"]`` -> ``{"model": "BiDAF", "batch_size": 32}``.

    ``extra`` names keys the caller takes as strings besides the labels (a Slurm hook's
    ``share``). Raises LabelWordError naming the word that is wrong.
    """
    if len(words) > MAX_WORDS:
        raise LabelWordError(f"{len(words)} label words: at most {MAX_WORDS}")
    out: dict[str, object] = {}
    for word in words:
        if len(word) > MAX_WORD:
            raise LabelWordError(f"label word {word[:40]!r}... is longer than {MAX_WORD} characters")
        key, eq, text = word.partition("=")
        if not eq or not key or not text:
            raise LabelWordError(f"{word!r} is not KEY=VALUE (e.g. model=ResNet-50)")
        if key not in REGISTRABLE and key not in extra:
            raise LabelWordError(f"{word!r}: unknown label {key!r}; known: {', '.join(REGISTRABLE + extra)}")
        if key in out:
            raise LabelWordError(f"{word!r}: label {key!r} given twice")
        out[key] = _typed(key, text, word)
    return out


def _typed(key: str, text: str, word: str) -> object:
    if key in INTEGERS:
        if not text.isascii() or not text.isdigit() or len(text) > 9:
            raise LabelWordError(f"{word!r}: {key} must be a whole number")
        return int(text)
    if key in BOOLEANS:
        if text.lower() not in BOOLEAN_WORDS:
            raise LabelWordError(f"{word!r}: {key} must be true or false")
        return BOOLEAN_WORDS[text.lower()]
    if key in NUMBERS:
        try:
            return float(text)
        except ValueError:
            raise LabelWordError(f"{word!r}: {key} must be a number") from None
    return text


MARKER = "noded:"


def comment_words(comment: str) -> list[str]:
    """The label words of a Slurm job's comment: those after the word ``noded:``, up to a
    ``;`` or the end (the rest of the comment is the submitter's, for others). A comment
    without the marker has none."""
    head, marker, tail = comment.partition(MARKER)
    if not marker or (head and not head[-1].isspace() and head[-1] != ";"):
        return []
    return tail.split(";", 1)[0].split()
