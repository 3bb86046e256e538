"""A transformer encoder with separate attention and FFN modules (Vaswani et al. 2017;
BERT's post-LayerNorm layout, Devlin et al. 2019), the foundation model of FedPFT and
Multi-LoRA on the bridge (docs/deep_methods.md, "FedPFT" and "Multi-LoRA").

Layer l maps hidden states h (batch, tokens, d) to

    a = LN_1(h + Dropout(Attn(h))),    Attn(h) = concat_heads(softmax(Q K^T / sqrt(d_h)) V) W_O^T,
    h' = LN_2(a + Dropout(FFN(a))),    FFN(a) = act(a U^T + b_1) W^T + b_2,

with Q, K, V = h W_Q^T, h W_K^T, h W_V^T (modules ``attn.q``, ``attn.k``, ``attn.v``,
``attn.o``; LoRA targets them by these names) and the FFN's fan-in U = ``ffn.fc1.weight``
(d_ff, d) and fan-out W = ``ffn.fc2.weight`` (d, d_ff); ``act`` is ReLU or GELU (erf
form, as BERT). ``norm_first=True`` gives the pre-LN layout instead. Padding positions
(``attention_mask`` 0) are never attended to and are left out of mean pooling.

Each layer's FFN may have its own width (a compressed sub-model keeps fewer neurons:
``asyncopt.deep.fedpft``). Inputs go through an embedding module:

- :class:`VectorTokenEmbedding`: a sample is a sequence of ``n_tokens`` vectors of
  ``token_dim`` features (digits: 8 rows of 8 pixels), projected to d, plus a learned
  position embedding;
- :class:`WordEmbedding`: BERT's word + position + token-type embedding and LayerNorm,
  for token ids (the packaged all-MiniLM-L6-v2, ``asyncopt.deep.pretrained``).

:meth:`TransformerEncoder.hidden_states` returns the embedding output and every layer's
output (FedPFT's layer-level distillation matches them); ``forward`` pools (mean over
real tokens, or the first token) and applies the task head ``head`` when there is one.
"""
import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with projections q, k, v, o."""

    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.d_model, self.n_heads = int(d_model), int(n_heads)
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Linear(d_model, d_model, bias=bias)
        self.o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = float(dropout)

    def _heads(self, x):
        batch, tokens, _ = x.shape
        return x.view(batch, tokens, self.n_heads, -1).transpose(1, 2)

    def forward(self, x, attention_mask=None):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        mask = None
        if attention_mask is not None:
            mask = attention_mask.to(torch.bool)[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.o(out.transpose(1, 2).reshape(x.shape))


class FeedForward(nn.Module):
    """FFN(a) = act(a U^T + b_1) W^T + b_2 with U = ``fc1.weight`` (d_ff, d) and W =
    ``fc2.weight`` (d, d_ff); neuron i is row i of U, entry i of b_1 and column i of W."""

    def __init__(self, d_model, d_ff, activation="relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                             f"got {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = ACTIVATIONS[activation]()
        self.fc2 = nn.Linear(d_ff, d_model)

    @property
    def d_ff(self):
        return self.fc1.out_features

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    """One post-LN (default) or pre-LN encoder layer: attention then FFN, each with a
    residual connection, dropout and LayerNorm (module docstring)."""

    def __init__(self, d_model, n_heads, d_ff, activation="relu", dropout=0.0,
                 attention_dropout=None, norm_first=False, eps=1e-5):
        super().__init__()
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout)
        self.attn_norm = nn.LayerNorm(d_model, eps=eps)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.ffn_norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)
        self.norm_first = bool(norm_first)

    def forward(self, x, attention_mask=None):
        if self.norm_first:
            x = x + self.drop(self.attn(self.attn_norm(x), attention_mask))
            return x + self.drop(self.ffn(self.ffn_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, attention_mask)))
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class VectorTokenEmbedding(nn.Module):
    """x (batch, n_tokens * token_dim) or (batch, n_tokens, token_dim) -> x P^T + pos."""

    def __init__(self, n_tokens, token_dim, d_model):
        super().__init__()
        self.n_tokens, self.token_dim = int(n_tokens), int(token_dim)
        self.proj = nn.Linear(token_dim, d_model)
        self.position = nn.Parameter(0.02 * torch.randn(n_tokens, d_model))

    def forward(self, x):
        x = x.reshape(x.shape[0], self.n_tokens, self.token_dim)
        return self.proj(x) + self.position


class WordEmbedding(nn.Module):
    """BERT's embedding: LN(word[ids] + position[0..T-1] + token_type[types])."""

    def __init__(self, vocab_size, max_positions, type_vocab_size, d_model, eps=1e-12,
                 dropout=0.0):
        super().__init__()
        self.word = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.token_type = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids, token_types=None):
        positions = torch.arange(ids.shape[1], device=ids.device)
        if token_types is None:
            token_types = torch.zeros_like(ids)
        x = self.word(ids) + self.position(positions)[None] + self.token_type(token_types)
        return self.drop(self.norm(x))


class TransformerEncoder(nn.Module):
    """A transformer encoder: ``embed`` -> ``layers`` -> pooling -> ``head``.

    Layer l maps h to LN_2(a + FFN(a)), a = LN_1(h + Attn(h)) (post-LN; pre-LN layers
    with ``norm_first``), Attn(h) = concat_heads(softmax(Q K^T / sqrt(d_h)) V) W_O^T and
    FFN(a) = act(a U^T + b_1) W^T + b_2 (module docstring).

    Parameters
    ----------
    embed : torch.nn.Module
        The input embedding (:class:`VectorTokenEmbedding`, :class:`WordEmbedding`).
    layers : iterable of EncoderLayer
        The encoder layers; each may have its own FFN width.
    n_classes : int, default=None
        Outputs of a linear task head; None: no head, ``forward`` returns the pooled vector.
    pool : {"mean", "first"}, default="mean"
        Mean over the tokens with ``attention_mask`` 1, or the first ([CLS]) position.
    norm : torch.nn.Module, default=None
        A final LayerNorm after the last layer (pre-LN models need one; None for post-LN).
    pad_id : int, default=None
        For token-id inputs, the id whose positions are masked when no ``attention_mask``
        is given (BERT's [PAD] = 0), so a padded id batch can go through ``model(ids)``
        alone, as the federated trainers call it.

    Attributes
    ----------
    head : torch.nn.Linear or None
        The task head.
    """

    def __init__(self, embed, layers, n_classes=None, pool="mean", norm=None, pad_id=None):
        super().__init__()
        self.pad_id = pad_id
        if pool not in ("mean", "first"):
            raise ValueError(f"pool must be 'mean' or 'first', got {pool!r}")
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.pool = pool
        d_model = self.layers[0].attn.d_model
        self.head = nn.Linear(d_model, n_classes) if n_classes else None

    @property
    def d_model(self):
        """The hidden size d.
        """
        return self.layers[0].attn.d_model

    def hidden_states(self, x, attention_mask=None):
        """Return the embedding output and every layer's output.

        FedPFT's layer-level distillation matches them; the final ``norm``, if any, is
        applied to the last.

        Parameters
        ----------
        x : torch.Tensor
            Inputs: vectors (float) or token ids (integer).
        attention_mask : torch.Tensor, default=None
            (batch, tokens), 1 for real tokens and 0 for padding; None: from ``pad_id`` for
            integer inputs, else every token is real.

        Returns
        -------
        list of torch.Tensor
            [embedding output, output of layer 1, ..., output of layer L], each
            (batch, tokens, d).
        """
        attention_mask = self.mask_of(x, attention_mask)
        h = self.embed(x)
        states = [h]
        for layer in self.layers:
            h = layer(h, attention_mask)
            states.append(h)
        if self.norm is not None:
            states[-1] = self.norm(states[-1])
        return states

    def mask_of(self, x, attention_mask=None):
        """Return the attention mask: the given one, or ``x != pad_id`` for integer inputs.

        The second only when ``pad_id`` is set.

        Parameters
        ----------
        x : torch.Tensor
            Inputs.
        attention_mask : torch.Tensor, default=None
            A given mask, returned as it is.

        Returns
        -------
        torch.Tensor or None
            The mask (None: every token is real).
        """
        if attention_mask is None and self.pad_id is not None and not x.is_floating_point():
            return (x != self.pad_id).long()
        return attention_mask

    def pooled(self, h, attention_mask=None):
        """Pool hidden states: mean over the tokens with mask 1, or the first token.

        Parameters
        ----------
        h : torch.Tensor
            Hidden states, (batch, tokens, d).
        attention_mask : torch.Tensor, default=None
            (batch, tokens); None: every token counts.

        Returns
        -------
        torch.Tensor
            (batch, d).
        """
        if self.pool == "first":
            return h[:, 0]
        if attention_mask is None:
            return h.mean(1)
        m = attention_mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1).clamp_min(1e-9)

    def forward(self, x, attention_mask=None):
        """Encode, pool and apply the task head.

        Parameters
        ----------
        x : torch.Tensor
            Inputs: vectors (float) or token ids (integer).
        attention_mask : torch.Tensor, default=None
            (batch, tokens), 1 for real tokens and 0 for padding; None: from ``pad_id`` for
            integer inputs, else every token is real.

        Returns
        -------
        torch.Tensor
            Logits (batch, n_classes), or the pooled vectors (batch, d) without a head.
        """
        attention_mask = self.mask_of(x, attention_mask)
        out = self.pooled(self.hidden_states(x, attention_mask)[-1], attention_mask)
        return self.head(out) if self.head is not None else out


def encoder_layers(n_layers, d_model, n_heads, d_ff, **layer_kwargs):
    """``n_layers`` fresh :class:`EncoderLayer` s of the same shape."""
    return [EncoderLayer(d_model, n_heads, d_ff, **layer_kwargs) for _ in range(n_layers)]


def tiny_encoder(n_tokens=8, token_dim=8, d_model=32, n_heads=4, d_ff=128, n_layers=6,
                 activation="relu", n_classes=10, dropout=0.0, seed=None):
    """Build the specification's small foundation model over digits rows as tokens.

    L = 6, d = 32, 4 heads, d_ff = 128, ReLU FFN, 8 tokens of 8 pixels, mean pooling, a
    linear head.

    Parameters
    ----------
    n_tokens : int, default=8
        Tokens per sample.
    token_dim : int, default=8
        Features per token.
    d_model : int, default=32
        Hidden size d.
    n_heads : int, default=4
        Attention heads.
    d_ff : int, default=128
        FFN width.
    n_layers : int, default=6
        Layers L.
    activation : {"relu", "gelu"}, default="relu"
        FFN activation.
    n_classes : int, default=10
        Outputs of the head.
    dropout : float, default=0.0
        Dropout rate.
    seed : int, default=None
        If given, ``torch.manual_seed(seed)`` before the parameters are drawn.

    Returns
    -------
    TransformerEncoder
        The model.
    """
    if seed is not None:
        torch.manual_seed(seed)
    embed = VectorTokenEmbedding(n_tokens, token_dim, d_model)
    layers = encoder_layers(n_layers, d_model, n_heads, d_ff, activation=activation,
                            dropout=dropout)
    return TransformerEncoder(embed, layers, n_classes=n_classes, pool="mean")


def bert_encoder(vocab_size=30522, max_positions=512, type_vocab_size=2, d_model=384,
                 n_heads=12, d_ff=1536, n_layers=6, eps=1e-12, n_classes=None,
                 dropout=0.0, pool="mean"):
    """Build a BERT-layout encoder (post-LN, GELU), all-MiniLM-L6-v2's shape by default.

    Build it under ``torch.device("meta")`` to describe a large model (RoBERTa-base: vocab
    50265, 514 positions, 1 type, d 768, 12 heads, d_ff 3072, 12 layers) without allocating
    it.

    Parameters
    ----------
    vocab_size : int, default=30522
        Word-piece vocabulary.
    max_positions : int, default=512
        Position embeddings.
    type_vocab_size : int, default=2
        Token types.
    d_model : int, default=384
        Hidden size d.
    n_heads : int, default=12
        Attention heads.
    d_ff : int, default=1536
        FFN width.
    n_layers : int, default=6
        Layers.
    eps : float, default=1e-12
        LayerNorm epsilon (BERT's).
    n_classes : int, default=None
        Outputs of a linear task head; None: no head.
    dropout : float, default=0.0
        Dropout rate.
    pool : {"mean", "first"}, default="mean"
        Pooling.

    Returns
    -------
    TransformerEncoder
        The model, with ``pad_id=0``.
    """
    embed = WordEmbedding(vocab_size, max_positions, type_vocab_size, d_model, eps=eps,
                          dropout=dropout)
    layers = encoder_layers(n_layers, d_model, n_heads, d_ff, activation="gelu",
                            dropout=dropout, eps=eps)
    return TransformerEncoder(embed, layers, n_classes=n_classes, pool=pool, pad_id=0)
