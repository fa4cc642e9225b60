"""What a model's attention keeps in memory while it decodes: the KV cache of full, sliding-window
and latent (MLA) layers, and the constant state of recurrent (linear, delta-rule) layers, counted
from a model's published configuration (chapter 19).

The configurations of six models are in ``attention_lib/data/kv_configs.json``
(:func:`load_kv_configs`), each with the repository, path and commit its numbers were read from.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._checks import check_positive_int

__all__ = [
    "KV_CONFIGS_PATH",
    "load_kv_configs",
    "cache_numbers_per_token",
    "state_numbers",
    "layer_bytes",
    "model_bytes",
    "mha_bytes",
    "kv_table",
]

KV_CONFIGS_PATH = Path(__file__).parent / "data" / "kv_configs.json"

_KINDS = {
    "full": ("num_kv_heads", "head_dim"),
    "sliding": ("num_kv_heads", "head_dim", "window"),
    "latent": ("d_latent", "d_rope"),
    "recurrent": ("num_heads", "d_k", "d_v", "conv_channels", "conv_width"),
}


def load_kv_configs(path=None) -> list[dict]:
    """The models of ``kv_configs.json`` (or of ``path``), each checked by :func:`model_bytes`.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    models = json.loads(Path(KV_CONFIGS_PATH if path is None else path).read_text())["models"]
    for model in models:
        model_bytes(model, 1)  # checks every layer group and the layer count
    return models


def _check_layer(layer: dict) -> dict:
    kind = layer.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"layer kind must be one of {sorted(_KINDS)}; got {kind!r}")
    for field in _KINDS[kind]:
        if field not in layer:
            raise ValueError(f"a {kind!r} layer needs {', '.join(_KINDS[kind])}; "
                             f"{field!r} is missing from {layer}")
        check_positive_int(layer[field], f"{kind} layer's {field}")
    return layer


def cache_numbers_per_token(layer: dict) -> int:
    """Numbers one token adds to one layer's cache (0 for a recurrent layer).

    ``full`` and ``sliding``: a key and a value per key/value head, ``2 * num_kv_heads *
    head_dim``; ``latent`` (MLA): ``d_latent + d_rope`` whatever the number of heads;
    ``recurrent``: nothing grows with the context.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> cache_numbers_per_token({"kind": "full", "num_kv_heads": 8, "head_dim": 128})
    2048
    >>> cache_numbers_per_token({"kind": "latent", "d_latent": 512, "d_rope": 64})
    576
    """
    layer = _check_layer(layer)
    if layer["kind"] in ("full", "sliding"):
        return 2 * layer["num_kv_heads"] * layer["head_dim"]
    if layer["kind"] == "latent":
        return layer["d_latent"] + layer["d_rope"]
    return 0


def state_numbers(layer: dict) -> int:
    """Numbers of one layer's constant state (0 unless recurrent).

    A recurrent layer keeps ``num_heads`` states of ``d_v x d_k`` (the ``S`` of
    :func:`~attention_lib.variants.delta_rule`) and the last ``conv_width - 1`` inputs of
    its short convolution over ``conv_channels`` channels.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> state_numbers({"kind": "recurrent", "num_heads": 2, "d_k": 4, "d_v": 4,
    ...                "conv_channels": 10, "conv_width": 4})
    62
    """
    layer = _check_layer(layer)
    if layer["kind"] != "recurrent":
        return 0
    return (layer["num_heads"] * layer["d_k"] * layer["d_v"]
            + layer["conv_channels"] * (layer["conv_width"] - 1))


def layer_bytes(layer: dict, context: int, itemsize: int = 2) -> int:
    """Bytes one layer holds after ``context`` tokens: its cache and its state.

    A sliding-window layer keeps only the last ``min(context, window)`` tokens.
    ``itemsize`` 2 is bfloat16 (or float16).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> layer_bytes({"kind": "sliding", "num_kv_heads": 1, "head_dim": 4, "window": 3}, 10)
    48
    """
    context = check_positive_int(context, "context")
    itemsize = check_positive_int(itemsize, "itemsize")
    per_token = cache_numbers_per_token(layer)  # checks the layer's fields
    tokens = min(context, layer["window"]) if layer["kind"] == "sliding" else context
    return (per_token * tokens + state_numbers(layer)) * itemsize


def model_bytes(model: dict, context: int, itemsize: int = 2) -> int:
    """Bytes all attention layers of ``model`` hold after ``context`` tokens (batch of one).

    ``model["layers"]`` lists groups of identical layers, ``{"kind": ..., "count": n,
    ...}``; their counts must add up to ``model["num_layers"]``.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> llama = {"num_layers": 32, "layers": [{"kind": "full", "count": 32,
    ...                                       "num_kv_heads": 8, "head_dim": 128}]}
    >>> model_bytes(llama, 1)  # 32 layers x 2 x 8 x 128 numbers x 2 bytes
    131072
    """
    counts = [check_positive_int(group.get("count", 0), "count") for group in model["layers"]]
    if sum(counts) != model["num_layers"]:
        raise ValueError(f"the layer groups count {sum(counts)} layers but num_layers is "
                         f"{model['num_layers']} ({model.get('name', 'model')})")
    return sum(count * layer_bytes(group, context, itemsize)
               for count, group in zip(counts, model["layers"]))


def mha_bytes(model: dict, context: int, itemsize: int = 2) -> int:
    """Bytes plain multi-head attention would cache: every layer full, every query head with
    its own key (``d_qk``) and value (``d_v``), from ``model["mha"]``.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> mha_bytes({"num_layers": 1, "mha": {"num_heads": 2, "d_qk": 3, "d_v": 4}}, 10)
    280
    """
    context = check_positive_int(context, "context")
    itemsize = check_positive_int(itemsize, "itemsize")
    mha = model["mha"]
    per_token = check_positive_int(mha["num_heads"], "num_heads") * (
        check_positive_int(mha["d_qk"], "d_qk") + check_positive_int(mha["d_v"], "d_v"))
    return model["num_layers"] * per_token * context * itemsize


def kv_table(models: list[dict], context: int = 131072, itemsize: int = 2) -> list[dict]:
    """One row per model: what it holds per token and after ``context`` tokens, against MHA.

    Returns
    -------
    list of dict
        ``name``; ``per_token_per_layer``: bytes one token adds to one layer of each cached
        kind (``{"full": ..., "sliding": ..., "latent": ...}``, kinds the model has);
        ``state_per_layer``: bytes of a recurrent layer's constant state (0 if none);
        ``total``: :func:`model_bytes` at ``context``; ``mha_total``: :func:`mha_bytes` at
        ``context``; ``ratio``: ``mha_total / total``; ``per_token``: ``total / context``,
        the average a token costs over the whole model.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    rows = []
    for model in models:
        per_token = {group["kind"]: cache_numbers_per_token(group) * itemsize
                     for group in model["layers"] if group["kind"] != "recurrent"}
        state = max((state_numbers(group) * itemsize for group in model["layers"]), default=0)
        total = model_bytes(model, context, itemsize)
        mha_total = mha_bytes(model, context, itemsize)
        rows.append({"name": model["name"], "per_token_per_layer": per_token,
                     "state_per_layer": state, "total": total, "mha_total": mha_total,
                     "ratio": mha_total / total, "per_token": total / context})
    return rows
