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
        if not text.isascii() or not text.isdigit():
            raise LabelWordError(f"{word!r}: {key} must be a whole number")
        if len(text) > 9:  # kept small: it reaches numba kernels and Prometheus labels
            raise LabelWordError(f"{word[:40]!r}: {key} must be a whole number under 10^9")
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


MARKER = b"noded:"
#: ASCII whitespace: what separates words in a comment (any other byte is part of a word)
SPACE = b" \t\n\v\f\r"
#: where a comment's noded part ends (the rest of the comment is the submitter's, for others)
SECTION_END = b";"
#: the most of a comment a hook reads (Slurm's comment is the submitter's free text)
MAX_COMMENT_BYTES = 64 * 1024
#: the most bytes between the marker and the end of its part
MAX_NODED_BYTES = 4096


def comment_words(comment: bytes | str) -> list[str]:
    """The label words of a Slurm job's comment, parsed as bytes by this grammar:

    * the noded part starts at the first word (a run of bytes that are neither ASCII
      whitespace nor ``;``, at the comment's start or after one of them) that begins with
      ``noded:``, and ends at the next ``;`` or the comment's end; a comment without such
      a word has no noded part, and no words;
    * its words are its runs of bytes that are not ASCII whitespace (the first is what
      follows the marker, where anything does: ``noded:model=A``);
    * the part is at most ``MAX_NODED_BYTES`` long, and each word UTF-8 of printable
      characters only (no controls: a label's value reaches noded's logs and metrics).

    Raises LabelWordError naming what is wrong and where. A ``str`` (the environment as
    Python decodes it) is taken as the bytes it was decoded from."""
    if isinstance(comment, str):
        comment = comment.encode("utf-8", "surrogateescape")
    start = _marker_at(comment)
    if start is None:
        return []
    part = comment[start + len(MARKER):].split(SECTION_END, 1)[0]
    if len(part) > MAX_NODED_BYTES:
        raise LabelWordError(f"the comment's noded part is {len(part)} bytes long: at most {MAX_NODED_BYTES}")
    return [_word_text(word, n) for n, word in enumerate(part.split(), 1)]


def _marker_at(comment: bytes) -> int | None:
    """Where the first word that begins with the marker starts (None: no such word)."""
    at = comment.find(MARKER)
    while at != -1:
        if at == 0 or comment[at - 1] in SPACE or comment[at - 1:at] == SECTION_END:
            return at
        at = comment.find(MARKER, at + 1)
    return None


def _word_text(word: bytes, n: int) -> str:
    shown = ascii(word[:40])[1:] + ("..." if len(word) > 40 else "")
    try:
        text = word.decode("utf-8")
    except UnicodeDecodeError:
        raise LabelWordError(f"word {n} of the comment's noded part, {shown}, is not UTF-8") from None
    if not text.isprintable():
        raise LabelWordError(f"word {n} of the comment's noded part, {shown}, holds a character that is not "
                             "printable")
    return text
