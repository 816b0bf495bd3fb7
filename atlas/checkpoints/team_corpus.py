"""The team model's bytes-as-tokens tokenizer and its training corpus: Python's standard library
sources and the machine's licence texts, read the same way on any machine, with a held-out share.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from atlas import AtlasError

if TYPE_CHECKING:  # transformers loads lazily: `atlas --help` must stay fast
    from transformers import PreTrainedTokenizerFast

# Token ids: 0..255 are the bytes themselves, the specials follow.
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259
SPECIAL_TOKENS = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>"}


_LICENSES_DIR = Path("/usr/share/common-licenses")
# Test suites are mostly fixtures and odd strings; IDLE and lib2to3 are large and atypical.
_STDLIB_SKIP_PARTS = frozenset({"site-packages", "test", "tests", "idle_test", "idlelib", "lib2to3"})
_HELDOUT_BLOCK = 16 * 1024
HELDOUT_EVERY = 20  # every 20th block of the stream is held out: 5 %


@dataclass(frozen=True)
class CorpusFile:
    name: str  # "stdlib:json/decoder.py" or "licenses:GPL-3": the same on any machine
    size: int
    sha256: str


@dataclass(frozen=True)
class Corpus:
    files: list[CorpusFile]
    train: list[int]  # token stream, documents separated by EOS
    heldout: list[int]

    @property
    def digest(self) -> str:
        listing = "".join(f"{f.name}\t{f.size}\t{f.sha256}\n" for f in self.files)
        return hashlib.sha256(listing.encode()).hexdigest()


# ---- tokenizer ---------------------------------------------------------------------------------


def _byte_to_char() -> dict[int, str]:
    """Printable stand-in characters for the 256 bytes (the usual byte-level BPE alphabet): bytes
    that are printable Latin-1 stand for themselves, the rest are shifted above U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (id = byte value, specials after 255) that loads with no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _byte_to_char().items()}
    # No merges: every byte stays its own token.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=SPECIAL_TOKENS[PAD_ID],
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    ids = tokenizer.convert_tokens_to_ids([SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)])
    if ids != sorted(SPECIAL_TOKENS):
        raise AtlasError(f"tokenizer specials got ids {ids}, expected {sorted(SPECIAL_TOKENS)}")
    return tokenizer


# ---- corpus ------------------------------------------------------------------------------------


def _corpus_sources() -> list[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code: list[Path] = []
    for folder, subfolders, names in os.walk(stdlib):
        subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP_PARTS]
        code += [Path(folder, n) for n in names if n.endswith(".py") and Path(folder, n).is_file()]
    code.sort()
    sources = [(f"stdlib:{p.relative_to(stdlib).as_posix()}", p) for p in code]
    if _LICENSES_DIR.is_dir():
        # Symlinks (GPL -> GPL-3) would only duplicate a text.
        prose = sorted(p for p in _LICENSES_DIR.iterdir() if p.is_file() and not p.is_symlink())
        sources += [(f"licenses:{p.name}", p) for p in prose]
    return sources


def load_corpus(cap_bytes: int) -> Corpus:
    """Python's standard library sources plus Debian's licence texts, as byte tokens.

    The file order is a hash of each file's name (not the directory walk, not the alphabet), so a
    byte cap keeps a sample of the whole library and the stream interleaves code and prose."""
    sources = _corpus_sources()
    if not sources:
        raise AtlasError("no training text found (Python standard library sources or /usr/share/common-licenses)")
    sources.sort(key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    files: list[CorpusFile] = []
    stream = bytearray()
    doc_ends: list[int] = []
    for name, path in sources:
        if files and len(stream) + path.stat().st_size > cap_bytes:
            continue
        data = path.read_bytes()
        if not data.strip():
            continue
        files.append(CorpusFile(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
        stream += data
        doc_ends.append(len(stream))
    tokens: list[int] = []
    start = 0
    for end in doc_ends:
        tokens.extend(stream[start:end])
        tokens.append(EOS_ID)
        start = end
    train: list[int] = []
    heldout: list[int] = []
    # Small corpora (tests) get smaller blocks so that some text is still held out.
    block_size = heldout_block_size(len(tokens))
    for block_index, block_start in enumerate(range(0, len(tokens), block_size)):
        block = tokens[block_start : block_start + block_size]
        (heldout if block_index % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train).extend(block)
    return Corpus(files=files, train=train, heldout=heldout)


def heldout_block_size(n_tokens: int) -> int:
    return max(1, min(_HELDOUT_BLOCK, n_tokens // (HELDOUT_EVERY * 4)))
