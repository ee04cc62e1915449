"""Tokenise-and-batch: the input pipeline of a language model, over text held in memory."""

from __future__ import annotations

import numpy as np

SPACE = 32
MAX_WORD = 32  # letters hashed per word
MAX_WORD_LEN = 8  # letters per word in the generated corpus


class TokeniseBatch:
    """Each batch: the next stretch of an in-memory corpus is split into words, each word
    hashed and looked up in a vocabulary table (scattered reads), and the ids packed into
    fixed-length sequences that are shuffled. Little bandwidth per sample, much work per
    byte: the shape of the NLP loaders CODA found hit hardest by contention."""

    name = "tokenise"

    def __init__(self, *, seed: int = 0, corpus_mb: int = 48, vocab: int = 1 << 22, seq_len: int = 128,
                 batch: int = 64):
        self.rng = np.random.default_rng(seed)
        # A vocabulary of 50 000 words of 2-8 letters, each stored with its trailing space
        # in a padded row; the corpus is random words with the padding (zeros) squeezed out.
        rows = self.rng.integers(ord("a"), ord("z") + 1, size=(50_000, MAX_WORD_LEN + 1), dtype=np.uint8)
        lengths = self.rng.integers(2, MAX_WORD_LEN + 1, size=50_000)
        cols = np.arange(MAX_WORD_LEN + 1)
        rows[cols[None, :] == lengths[:, None]] = SPACE
        rows[cols[None, :] > lengths[:, None]] = 0
        picks = self.rng.integers(0, 50_000, size=corpus_mb * (1 << 20) // 5)
        corpus = rows[picks].ravel()
        self.corpus = corpus[corpus != 0][: corpus_mb * (1 << 20)]
        self.table = self.rng.integers(1, vocab, size=vocab, dtype=np.int32)  # hash bucket -> token id
        self.weights = self.rng.integers(1, 1 << 61, size=MAX_WORD, dtype=np.uint64)
        self.seq_len, self.batch = seq_len, batch
        self.span = seq_len * batch * 6  # bytes of text per batch, about one token per 6 bytes
        self.pos = 0

    def step(self) -> tuple[int, int]:
        if self.pos + self.span > len(self.corpus):
            self.pos = 0
        text = self.corpus[self.pos:self.pos + self.span]
        self.pos += self.span
        idx = np.arange(len(text))
        starts = np.r_[True, text[:-1] == SPACE]
        word_start = np.maximum.accumulate(np.where(starts, idx, 0))
        letters = text.astype(np.uint64) * self.weights[np.minimum(idx - word_start, MAX_WORD - 1)]
        letters[text == SPACE] = 0
        hashes = np.add.reduceat(letters, np.flatnonzero(starts))
        ids = self.table[hashes % np.uint64(len(self.table))]
        usable = len(ids) // self.seq_len * self.seq_len
        sequences = np.zeros((self.batch, self.seq_len), dtype=np.int32)  # padded where text ran short
        rows = ids[:usable].reshape(-1, self.seq_len)[: self.batch]
        sequences[: len(rows)] = rows
        sequences = sequences[self.rng.permutation(self.batch)]
        # Bytes: the text, ~6 temporaries of 8 bytes per byte of text, the lookups, the batch twice.
        moved = len(text) * (1 + 6 * 8) + len(ids) * (8 + 4) + sequences.nbytes * 2
        return self.batch, moved
