"""Read and change what a forward pass computes, at named points (chapter 18).

Every :class:`~attention_lib.blocks.EncoderBlock` and every
:class:`~attention_lib.multihead.MultiHeadAttention` passes its intermediate arrays through
named *hook points*, one line each in their ``forward``. Nothing is installed by default, so
a point costs one Python call that returns its argument. :func:`capture` installs recorders
for the length of a ``with`` block, :func:`intervene` installs functions that replace a
value; both work on any stack of encoder blocks (:class:`~attention_lib.blocks.DecoderOnlyLM`,
SmolLM2, MiniLM, :class:`~attention_lib.blocks.Encoder`), because the points live in the
blocks that all of them run, not in a copy of their forward passes. The idea is
TransformerLens's ``HookPoint`` and ``run_with_cache`` (Nanda and Bloom, 2022); the code is
the course's own, and "cache" is kept for the KV cache: what a capture keeps is a
:class:`Recording`.

The points of block ``i``, in the order the forward pass reaches them:

==============================  ======================  ======================================
name                            shape                   what it is
==============================  ======================  ======================================
``blocks.{i}.resid_pre``        (..., T, d_model)       the residual stream entering the block
``blocks.{i}.attn.weights``     (..., H, T, T_total)    attention weights (recorded only when
                                                        asked for; read-only)
``blocks.{i}.attn.head_out``    (..., H, T, d_head)     each head's output (after the output
                                                        gate, if any), before ``W_o``
``blocks.{i}.attn_out``         (..., T, d_model)       what attention adds: ``head_out``
                                                        merged, times ``W_o``, plus ``b_o``
``blocks.{i}.resid_mid``        (..., T, d_model)       the stream between attention and the
                                                        feed-forward network
``blocks.{i}.ff_out``           (..., T, d_model)       what the feed-forward network adds
``blocks.{i}.resid_post``       (..., T, d_model)       the stream leaving the block
==============================  ======================  ======================================

In a post-LN block (MiniLM) ``resid_mid`` and ``resid_post`` are the normalized sums, as the
block passes them on. A block without attention has only ``resid_pre``, ``ff_out`` and
``resid_post``. With a KV cache every point sees the new positions only (``T`` of them) and
the weights cover every cached key (``T_total``); a point reached once per decode step is
recorded once per step (:meth:`Recording.steps`). Hooks are set on the model's objects: do
not run the same model from two threads while one is active.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping

import numpy as np

__all__ = ["Recording", "capture", "intervene", "hook_points", "zero_ablate", "mean_ablate",
           "patch", "Patch"]

BLOCK_POINTS = ("resid_pre", "attn_out", "resid_mid", "ff_out", "resid_post")
"""The points an :class:`~attention_lib.blocks.EncoderBlock` passes its arrays through."""
ATTENTION_POINTS = ("weights", "head_out")
"""The points a :class:`~attention_lib.multihead.MultiHeadAttention` passes its arrays through."""
READ_ONLY = ("weights",)
"""Points that can be recorded but not replaced (the weights are not fed back into the output:
to change what a head contributes, change ``attn.head_out``)."""


def unhooked(point: str, value):
    """What a hook point does when nothing is installed: return ``value`` unchanged."""
    return value


class HookPoints:
    """The functions installed at the points of one block or one attention layer.

    A layer calls it as ``value = hooks(point, value)``: the installed changes run first, in
    the order they were installed, then the recorders see the value the forward pass goes on
    with. Made and removed by :func:`capture` and :func:`intervene`; not used directly.
    """

    __slots__ = ("prefix", "changes", "recorders")

    def __init__(self, prefix: str):
        self.prefix = prefix  # "blocks.3." or "blocks.3.attn."
        self.changes: dict[str, list[Callable]] = {}
        self.recorders: dict[str, list[Callable]] = {}

    def wants(self, point: str) -> bool:
        """Whether anything is installed at ``point`` (the attention layer asks this before
        computing weights it would otherwise not store)."""
        return point in self.changes or point in self.recorders

    def __call__(self, point: str, value):
        for change in self.changes.get(point, ()):
            value = change(value)
        for record in self.recorders.get(point, ()):
            record(self.prefix + point, value)
        return value

    def is_empty(self) -> bool:
        return not self.changes and not self.recorders


def _blocks(model) -> list:
    """The encoder blocks of ``model``, in the order its forward pass runs them."""
    from .blocks import EncoderBlock  # here, not at the top: blocks.py imports this module

    if isinstance(model, EncoderBlock):
        blocks = [model]
    else:
        blocks = getattr(model, "blocks", None)
        if blocks is None:
            blocks = getattr(model, "layers", None)
    if not isinstance(blocks, (list, tuple)) or not blocks or not all(
            isinstance(block, EncoderBlock) for block in blocks):
        raise TypeError(f"hooks go on a stack of EncoderBlocks (a model with .blocks, such as "
                        f"DecoderOnlyLM, SmolLM2 or MiniLM, an Encoder with .layers, or one "
                        f"EncoderBlock); got {type(model).__name__}")
    if len({id(block) for block in blocks}) != len(blocks):
        raise ValueError("the same EncoderBlock object appears twice in the stack: its hook "
                         "points would have two names")
    return list(blocks)


def _sites(model) -> dict[str, tuple[object, str, str]]:
    """Every point's name -> (the layer that reaches it, its prefix, the point's local name)."""
    sites = {}
    for i, block in enumerate(_blocks(model)):
        prefix = f"blocks.{i}."
        attention = block.self_attn
        sites[prefix + "resid_pre"] = (block, prefix, "resid_pre")
        if attention is not None:
            for point in ATTENTION_POINTS:
                sites[f"{prefix}attn.{point}"] = (attention, prefix + "attn.", point)
            for point in ("attn_out", "resid_mid"):
                sites[prefix + point] = (block, prefix, point)
        for point in ("ff_out", "resid_post"):
            sites[prefix + point] = (block, prefix, point)
    return sites


def hook_points(model) -> list[str]:
    """The names of every hook point of ``model``, in the order its forward pass reaches them.

    Raises
    ------
    TypeError
        If ``model`` is not a stack of :class:`~attention_lib.blocks.EncoderBlock` s.

    Notes
    -----
    Derived in chapter 18, *What the heads do*.

    Examples
    --------
    >>> from attention_lib import DecoderOnlyLM
    >>> model = DecoderOnlyLM.init(20, 16, 4, 32, 2, np.random.default_rng(0))
    >>> hook_points(model)[:4]
    ['blocks.0.resid_pre', 'blocks.0.attn.weights', 'blocks.0.attn.head_out', 'blocks.0.attn_out']
    """
    return list(_sites(model))


def _summary(names) -> str:
    """``blocks.{i}.resid_pre, ... for i in 0..N-1``: the valid names, short enough to read."""
    kinds, layers = [], set()
    for name in names:
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
        layers.add(int(match.group(1)))
        if match.group(2) not in kinds:
            kinds.append(match.group(2))
    return (", ".join(f"blocks.{{i}}.{kind}" for kind in kinds)
            + f" for i in 0..{max(layers)} (patterns such as 'blocks.*.resid_post' work too)")


def _resolve(sites, names) -> list[str]:
    """Exact names and fnmatch patterns -> the matching point names, in forward order."""
    if isinstance(names, str):
        names = [names]
    chosen = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a hook point name is a string; got {name!r}")
        matched = [site for site in sites if fnmatch.fnmatchcase(site, name)]
        if not matched:
            raise ValueError(f"no hook point is called {name!r}; valid names: {_summary(sites)}")
        chosen.update(matched)
    return [site for site in sites if site in chosen]


@contextlib.contextmanager
def _installed(sites, kind: str, functions: dict[str, Callable]):
    """Install ``functions`` (point name -> function) as ``kind`` ("changes" or "recorders")
    for the length of a ``with`` block; remove them after it, also on an error."""
    done = []
    try:
        for name, function in functions.items():
            layer, prefix, point = sites[name]
            hooks = layer.__dict__.get("_hooks")
            if hooks is None:
                hooks = layer._hooks = HookPoints(prefix)
            getattr(hooks, kind).setdefault(point, []).append(function)
            done.append((layer, point, function))
        yield
    finally:
        for layer, point, function in reversed(done):
            hooks = layer._hooks
            installed = getattr(hooks, kind)[point]
            installed.remove(function)
            if not installed:
                del getattr(hooks, kind)[point]
            if hooks.is_empty():
                del layer._hooks  # back to the class attribute None: the unhooked path


class Recording(Mapping):
    """What :func:`capture` kept: hook point name -> the array the forward pass computed.

    ``recording[name]`` is the point's array when the point was reached once;
    :meth:`steps` gives every value of a point reached several times (one per forward call,
    for instance one per decode step with a KV cache). The arrays are read-only views of the
    forward pass's own arrays (nothing is copied).

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """

    def __init__(self):
        self._values: dict[str, list[np.ndarray]] = {}

    def _record(self, name: str, value):
        if value is None:  # attention weights the layer did not compute: cannot happen when
            return  # asked for, since asking makes the layer compute them
        view = value.view()
        view.flags.writeable = False
        self._values.setdefault(name, []).append(view)

    def __getitem__(self, name: str) -> np.ndarray:
        values = self.steps(name)
        if len(values) != 1:
            raise ValueError(f"{name!r} was recorded {len(values)} times (once per forward "
                             f"call, e.g. per decode step): use recording.steps({name!r})")
        return values[0]

    def steps(self, name: str) -> list[np.ndarray]:
        """Every value recorded at ``name``, in the order they were computed."""
        if name not in self._values:
            raise KeyError(f"{name!r} was not recorded; recorded: "
                           f"{_summary(self._values) if self._values else 'nothing'}")
        return list(self._values[name])

    def stack(self, point: str) -> np.ndarray:
        """One point of every block, stacked: ``stack("attn.weights")`` has shape
        ``(num_layers, ..., H, T, T_total)``, as ``DecoderOnlyLM.forward(...,
        return_attention=True)`` returns."""
        names = [name for name in self._values
                 if re.fullmatch(rf"blocks\.\d+\.{re.escape(point)}", name)]
        if not names:
            raise KeyError(f"no point {point!r} was recorded; recorded: "
                           f"{_summary(self._values) if self._values else 'nothing'}")
        return np.stack([self[name] for name in names])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Recording({len(self)} points)"


@contextlib.contextmanager
def capture(model, names=None) -> Iterator[Recording]:
    """Record what every forward pass of ``model`` computes inside the ``with`` block.

    Parameters
    ----------
    model : DecoderOnlyLM, SmolLM2, MiniLM, Encoder or EncoderBlock
    names : str or list of str, optional
        Hook point names or fnmatch patterns (``"blocks.*.attn.weights"``). ``None``: every
        point except the attention weights, which cost ``H T T_total`` numbers a layer and
        are computed only when a name asks for them (the layers otherwise attend a block of
        queries at a time and never store them; asking switches attention to the path that
        stores them, whose outputs equal the other path's up to rounding).

    Yields
    ------
    Recording

    Raises
    ------
    ValueError
        If a name matches no hook point (the message lists the valid names).

    Notes
    -----
    Derived in chapter 18, *What the heads do*.

    Examples
    --------
    >>> from attention_lib import DecoderOnlyLM
    >>> model = DecoderOnlyLM.init(20, 16, 4, 32, 2, np.random.default_rng(0))
    >>> with capture(model, ["blocks.1.resid_post", "blocks.*.attn.weights"]) as recording:
    ...     logits = model(np.array([[1, 2, 3]]))
    >>> recording["blocks.1.resid_post"].shape, recording.stack("attn.weights").shape
    ((1, 3, 16), (2, 1, 4, 3, 3))
    """
    sites = _sites(model)
    if names is None:
        chosen = [name for name in sites if sites[name][2] != "weights"]
    else:
        chosen = _resolve(sites, names)
    recording = Recording()
    with _installed(sites, "recorders", {name: recording._record for name in chosen}):
        yield recording


def _checked(name: str, change: Callable) -> Callable:
    """``change``, with a check that it returns an array of the shape it was given, kept in
    the dtype it was given."""
    def checked_change(value):
        new = np.asarray(change(value))
        if new.shape != value.shape:
            raise ValueError(f"the intervention at {name!r} returned shape {new.shape}; the "
                             f"point's array has shape {value.shape}")
        return new.astype(value.dtype, copy=False)
    return checked_change


@contextlib.contextmanager
def intervene(model, changes: Mapping[str, Callable]):
    """Replace values inside every forward pass of ``model`` during the ``with`` block.

    Parameters
    ----------
    model : DecoderOnlyLM, SmolLM2, MiniLM, Encoder or EncoderBlock
    changes : dict
        Hook point name (or fnmatch pattern, which leaves out the read-only weights, so that
        ``{"*": patch(recording)}`` patches every point) -> a function ``f(array) -> array``
        whose result,
        of the same shape, replaces the array in the forward pass; :func:`zero_ablate`,
        :func:`mean_ablate` and :func:`patch` make the usual ones. A :class:`Patch` from a
        :class:`Recording` takes each point's array from the recording's same point.

    Raises
    ------
    ValueError
        If a name matches no hook point (the message lists the valid names), names the
        read-only ``attn.weights``, or (during the forward pass) a function returns another
        shape.

    Notes
    -----
    Derived in chapter 18, *What the heads do*. A recorder installed by :func:`capture` at
    the same point sees the changed value (what the forward pass went on with). With a KV
    cache, a change at an early step also changes the keys and values cached for later ones.

    Examples
    --------
    >>> from attention_lib import DecoderOnlyLM
    >>> model = DecoderOnlyLM.init(20, 16, 4, 32, 2, np.random.default_rng(0))
    >>> tokens = np.array([[1, 2, 3]])
    >>> with intervene(model, {"blocks.0.attn.head_out": zero_ablate(2)}):
    ...     ablated = model(tokens)
    >>> bool(np.allclose(ablated, model(tokens)))
    False
    """
    sites = _sites(model)
    functions = {}
    for pattern, change in changes.items():
        if not callable(change):
            raise TypeError(f"the change at {pattern!r} must be a function array -> array; got "
                            f"{type(change).__name__}")
        matched = _resolve(sites, pattern)
        if pattern not in sites:  # a pattern: it leaves out the read-only points it matches
            matched = [name for name in matched if sites[name][2] not in READ_ONLY] or matched
        for name in matched:
            if sites[name][2] in READ_ONLY:
                raise ValueError(f"{name!r} can be recorded, not replaced: the weights are not "
                                 "fed back into the output. Change the heads' outputs "
                                 "(attn.head_out) instead")
            if getattr(change, "needs_heads", False) and sites[name][2] != "head_out":
                raise ValueError(f"{change.needs_heads} works on a point with a head axis, "
                                 f"(..., H, T, d_head): attn.head_out; {name!r} has none")
            if name in functions:
                raise ValueError(f"two changes name {name!r} (through {pattern!r}); give one")
            bound = change.bind(name) if isinstance(change, Patch) else change
            functions[name] = _checked(name, bound)
    with _installed(sites, "changes", functions):
        yield


def _head_index(value: np.ndarray, heads, what: str):
    if value.ndim < 3:
        raise ValueError(f"{what} works on a point with a head axis, (..., H, T, d_head) such as "
                         f"attn.head_out; got an array of shape {value.shape}")
    num_heads = value.shape[-3]
    chosen = np.zeros(num_heads, dtype=bool)
    try:
        chosen[heads] = True
    except IndexError as error:
        raise ValueError(f"{what}: heads={heads!r} is out of range for {num_heads} heads "
                         f"(array of shape {value.shape})") from error
    return chosen


def zero_ablate(heads) -> Callable:
    """A change that sets the outputs of ``heads`` to zero (use it at ``attn.head_out``).

    Equal to a forward pass with those heads' rows of ``W_o`` set to zero: the head then adds
    nothing to the residual stream (``b_o`` is still added).

    Parameters
    ----------
    heads : int, list of int or slice

    Shapes
    ------
    (..., H, T, d_head) -> (..., H, T, d_head)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    def zero(value):
        chosen = _head_index(value, heads, "zero_ablate")
        return np.where(chosen[:, None, None], np.zeros((), value.dtype), value)
    zero.needs_heads = "zero_ablate"  # intervene() refuses it at a point without heads
    return zero


def mean_ablate(heads, means) -> Callable:
    """A change that replaces the outputs of ``heads`` by ``means`` (use it at
    ``attn.head_out``), for instance their average over many inputs.

    Parameters
    ----------
    heads : int, list of int or slice
    means : array_like
        Broadcastable to the point's array ``(..., H, T, d_head)``, e.g. a recording's
        ``head_out`` averaged over the batch, ``(H, T, d_head)``, or over the batch and the
        positions, ``(H, 1, d_head)``. Only the entries of ``heads`` are used.

    Shapes
    ------
    (..., H, T, d_head) -> (..., H, T, d_head)

    Notes
    -----
    Derived in chapter 18, *What the heads do*. With means that do not depend on the position,
    equal to setting the heads' rows of ``W_o`` to zero and adding ``means @ W_o``'s rows to
    ``b_o``: the head adds a constant (tested).
    """
    means = np.asarray(means)

    def replace(value):
        chosen = _head_index(value, heads, "mean_ablate")
        try:
            target = np.broadcast_to(means, value.shape)
        except ValueError as error:
            raise ValueError(f"mean_ablate: means of shape {means.shape} do not broadcast to "
                             f"the point's shape {value.shape}") from error
        return np.where(chosen[:, None, None], target.astype(value.dtype, copy=False), value)
    replace.needs_heads = "mean_ablate"  # intervene() refuses it at a point without heads
    return replace


class Patch:
    """A change that copies values from another run: made by :func:`patch`."""

    def __init__(self, source, positions, heads, name: str | None = None):
        self.source, self.positions, self.heads, self.name = source, positions, heads, name
        # intervene() refuses a patch of chosen heads at a point without heads
        self.needs_heads = False if heads is None else "patch with heads"

    def bind(self, name: str) -> Patch:
        """The patch of point ``name`` (what :func:`intervene` does with a recording's patch)."""
        return Patch(self.source, self.positions, self.heads, name)

    def __call__(self, value):
        if isinstance(self.source, Recording):
            if self.name is None:
                raise ValueError("a patch from a Recording needs a point name: pass it to "
                                 "intervene(), which gives it one")
            source = self.source[self.name]
        else:
            source = self.source
        if source.shape != value.shape:
            where = f" at {self.name!r}" if self.name else ""
            raise ValueError(f"patch{where}: the source has shape {source.shape} but this run's "
                             f"array has shape {value.shape}")
        T = value.shape[-2]
        chosen = np.zeros(T, dtype=bool)
        try:
            chosen[slice(None) if self.positions is None else self.positions] = True
        except IndexError as error:
            raise ValueError(f"patch: positions={self.positions!r} is out of range for "
                             f"T={T} (array of shape {value.shape})") from error
        chosen = chosen[:, None]  # (T, 1): every feature of a chosen position
        if self.heads is not None:
            chosen = _head_index(value, self.heads, "patch with heads")[:, None, None] & chosen
        return np.where(chosen, source, value)


def patch(source, positions=None, heads=None) -> Patch:
    """A change that copies a point's values from another run.

    Parameters
    ----------
    source : Recording or numpy.ndarray
        A :class:`Recording` of the other run (each point takes the recording's value at the
        same name), or one array of the point's shape.
    positions : int, list of int or slice, optional
        Positions (the ``T`` axis) to copy; ``None``: all of them.
    heads : int, list of int or slice, optional
        Heads to copy, for a point with a head axis (``attn.head_out``); ``None``: all.

    Returns
    -------
    Patch
        Give it to :func:`intervene`.

    Shapes
    ------
    (..., T, d_model) or (..., H, T, d_head) -> the same; the source has the same shape

    Notes
    -----
    Derived in chapter 18, *What the heads do*. Patching every point of a run from its own
    recording changes no bit of the output (tested).
    """
    if not isinstance(source, Recording):
        source = np.asarray(source)
    return Patch(source, positions, heads)
