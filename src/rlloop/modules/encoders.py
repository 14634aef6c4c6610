"""Observation encoders, chosen by observation space: pixels get a CNN, vectors an MLP.

An encoder maps a batch of observations ``[B, *obs_shape]`` to features ``[B, out_dim]``.
Vector observations need none: the algorithms' MLPs take them flattened, as before. Image
observations (a uint8 ``Box`` of ``[H, W]``, ``[H, W, C]`` or ``[C, H, W]``) get the
Nature CNN (Mnih et al. 2015, Nature 518), whose first op scales the uint8 frames to
``[0, 1]``: frames cross from the host (and sit in rollout and replay storage) as uint8,
a quarter of the bytes of float32, and are converted where the network runs.

Passes that train (grad enabled) take their input in the channels-last memory format
(stored ``[B, H, W, C]``, shape unchanged), so that every activation is channels-last: on
the CPU oneDNN's kernels for it make a forward and backward pass over 256 stacks of 84x84
frames 1.4x to 1.7x faster, the first layer's weight gradient 5x. The weights stay
channels-first: converted per call at no measurable cost, and a fused Adam, which reads
its state as flat memory, never meets a reloaded state laid out unlike its parameter.
Only the layout differs; the results agree within float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor, nn

from rlloop.config.network_choices import ENCODERS as ENCODERS
from rlloop.config.network_choices import EncoderKind as EncoderKind
from rlloop.errors import ConfigError
from rlloop.modules.networks import mlp
from rlloop.system.devices import warn_if_bfloat16_is_emulated

#: Smallest side the Nature CNN's three unpadded convolutions (8/4, 4/2, 3/1) accept.
NATURE_MIN_SIDE = 36


def image_layout(shape: Sequence[int]) -> tuple[int, int, int, bool]:
    """``(channels, height, width, channels_last)`` of an image observation shape.

    A last dim of 1, 3 or 4 with a first dim that is not (an RGB or RGBA frame) is read as
    ``[H, W, C]``, anything else of three dims as ``[C, H, W]`` (frame stacks, Gymnasium's
    ``FrameStackObservation`` of grayscale frames), two dims as one grayscale ``[H, W]``.
    """
    if len(shape) == 2:
        return 1, shape[0], shape[1], False
    if len(shape) != 3:
        raise ConfigError(f"an image encoder needs observations of 2 or 3 dims, got shape "
                          f"{tuple(shape)}; use encoder=mlp")
    if shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4):
        return shape[-1], shape[0], shape[1], True
    return shape[0], shape[1], shape[2], False


def _conv_out(side: int) -> int:
    for kernel, stride in ((8, 4), (4, 2), (3, 1)):
        side = (side - kernel) // stride + 1
    return side


class NatureCNN(nn.Module):
    """Three convolutions and a 512-unit linear layer, ReLU throughout.

    uint8 input is scaled by 1/255 inside ``forward`` (on whatever device the module is);
    float input is taken as already scaled. Orthogonal initialisation with gain
    ``sqrt(2)``, as in Stable-Baselines3's and CleanRL's Atari PPO.

    ``precision="bfloat16"`` runs the convolutions and the linear layer under
    ``torch.autocast`` (frames converted straight to bfloat16): the weights stay float32
    (autocast casts a bfloat16 copy per pass, and the gradients reach the float32 weights),
    and the features come out float32.
    """

    def __init__(self, obs_shape: Sequence[int], features: int = 512,
                 precision: str = "float32") -> None:
        super().__init__()
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[precision]
        c, h, w, self.channels_last = image_layout(obs_shape)
        self.add_channel = len(obs_shape) == 2
        if min(h, w) < NATURE_MIN_SIDE:
            raise ConfigError(f"image observations of {h}x{w} are smaller than the Nature "
                              f"CNN's {NATURE_MIN_SIDE}x{NATURE_MIN_SIDE}; resize them (e.g. "
                              "gymnasium.wrappers.ResizeObservation) or use encoder=mlp")
        self.out_dim = features
        self.net = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * _conv_out(h) * _conv_out(w), features), nn.ReLU(),
        )
        for layer in self.net:
            if isinstance(layer, nn.Conv2d | nn.Linear):
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(cast(Tensor, layer.bias))

    @property
    def takes_channels_first(self) -> bool:
        """Observations are ``[C, H, W]``: storage that keeps them channels-last in
        memory (``RolloutBuffer(channels_last=True)``) spares ``forward`` a transposition."""
        return not self.channels_last and not self.add_channel

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.unsqueeze(1) if self.add_channel else obs
        if self.channels_last:  # [B, H, W, C] frames: the permuted view is channels-last
            x = x.permute(0, 3, 1, 2)
        # Forward-only passes (acting, targets) are ~8% faster in the layout they come in.
        layout = torch.channels_last if torch.is_grad_enabled() else torch.preserve_format
        # float32 precision computes in the weights' dtype (float64 ones under
        # torch.set_default_dtype(torch.float64)); bfloat16 under autocast.
        weights = cast(nn.Conv2d, self.net[0]).weight.dtype
        dtype = weights if self.dtype == torch.float32 else self.dtype
        if x.dtype == torch.uint8:
            # One conversion straight into the layout, scaled in place: a fresh float
            # batch costs page faults, a second one (out of place) as many again.
            x = x.to(dtype, memory_format=layout).mul_(1.0 / 255.0)
        else:
            x = x.to(dtype, memory_format=layout)
        if self.dtype == torch.float32:
            out: Tensor = self.net(x)
            return out
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            warn_if_bfloat16_is_emulated()
        # Each weight is read once per pass: no cast cache (which a CUDA graph must not keep).
        with torch.autocast(x.device.type, dtype=self.dtype, cache_enabled=False):
            out = self.net(x)
        return out.to(weights)


#: ``EnvSpec.obs_parts``: a Dict observation's entries as ``(key, shape, image)``.
ObsParts = Sequence[tuple[str, tuple[int, ...], bool]]


class DictEncoder(nn.Module):
    """One encoder per entry of a Dict observation, features concatenated.

    Observations arrive flat (the entries' values concatenated in order, see
    ``EnvSpec.obs_parts``); each slice is reshaped to its entry's shape. Features past
    the entries (a legal-action mask, ``EnvSpec.action_mask``) are not encoded. Image entries
    (pixel values 0-255) are scaled to ``[0, 1]`` and get the Nature CNN when both sides
    are at least 36, else (MiniGrid's 7x7 views) an MLP like vector entries do; vector
    entries get an MLP of ``hidden`` units. ``standardized`` observations
    (``normalize_obs``) arrive with every entry scaled already: none is divided by 255.
    """

    def __init__(self, parts: ObsParts, hidden: Sequence[int], activation: str,
                 cnn_precision: str = "float32", *, standardized: bool = False) -> None:
        super().__init__()
        self.shapes = [shape for _, shape, _ in parts]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        self.width = sum(self.sizes)
        self.scales = [1.0 / 255.0 if image and not standardized else 1.0
                       for _, _, image in parts]
        self.cnn = [image and len(shape) in (2, 3) and min(image_layout(shape)[1:3])
                    >= NATURE_MIN_SIDE for _, shape, image in parts]
        self.encoders = nn.ModuleList(
            NatureCNN(shape, precision=cnn_precision) if cnn else
            mlp(size, list(hidden)[:-1], list(hidden)[-1], activation=activation,
                out_gain=math.sqrt(2))
            for (_, shape, _), size, cnn in zip(parts, self.sizes, self.cnn, strict=True))
        self.activation = nn.Tanh() if activation == "tanh" else nn.ReLU()
        self.out_dim = sum(e.out_dim if cnn else list(hidden)[-1]  # type: ignore[misc]
                           for e, cnn in zip(self.encoders, self.cnn, strict=True))

    def forward(self, obs: Tensor) -> Tensor:
        features = []
        dtype = next(self.encoders.parameters()).dtype  # the float32 entries as the weights
        for x, shape, scale, cnn, encoder in zip(
                obs.flatten(1)[:, : self.width].to(dtype).split(self.sizes, 1), self.shapes,
                self.scales,
                self.cnn, self.encoders, strict=True):
            x = x * scale
            features.append(encoder(x.view(-1, *shape)) if cnn
                            else self.activation(encoder(x)))
        return torch.cat(features, 1)


def flat_input(obs: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[B, *obs] -> [B, prod(obs)]`` in ``dtype``: what an MLP with weights of that dtype
    takes. The envs hand out float32 observations whatever torch's default dtype, so a
    network built under ``torch.set_default_dtype(torch.float64)`` passes its float64 here.
    uint8 observations (pixels under ``encoder=mlp``, RAM bytes) are scaled to ``[0, 1]``
    as the Nature CNN scales them; observations already in ``dtype`` pass unchanged."""
    x = obs.flatten(1)
    if x.dtype == dtype:  # (a no-op .to() still costs a dispatch per policy call)
        return x
    return x.to(dtype).mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.to(dtype)


class NetInput(nn.Module):
    """What a user network (``ppo.net``) takes: observations ``[B, *obs_shape]`` as
    float32, not flattened, with pixel values scaled to ``[0, 1]`` as rlloop's own
    encoders scale them: uint8 observations, and the image entries of a Dict observation
    (which arrive flat, ``parts`` in order), unless ``standardized`` (``normalize_obs``)."""

    def __init__(self, parts: ObsParts = (), *, standardized: bool = False) -> None:
        super().__init__()
        sizes = [math.prod(shape) for _, shape, _ in parts]
        scales = [1.0 / 255.0 if image and not standardized else 1.0 for _, _, image in parts]
        self.width = sum(sizes)
        self.scale: Tensor | None
        # a buffer, so it moves with the module; not saved: checkpoints stay as they were
        self.register_buffer("scale", torch.tensor(scales).repeat_interleave(
            torch.tensor(sizes)) if any(scale != 1.0 for scale in scales) else None,
            persistent=False)

    def forward(self, obs: Tensor) -> Tensor:
        if obs.dtype == torch.uint8:
            return obs.float().mul_(1.0 / 255.0)
        x = obs if obs.is_floating_point() else obs.float()
        if self.scale is None:
            return x
        if x.shape[-1] == self.width:
            return x * self.scale
        return torch.cat([x[..., : self.width] * self.scale, x[..., self.width:]], -1)


class FlatInput(nn.Module):
    """:func:`flat_input` as a module (no parameters)."""

    def forward(self, obs: Tensor) -> Tensor:
        return flat_input(obs)


#: What ``build_encoder`` returns: a module with an ``out_dim`` attribute.
Encoder = NatureCNN | DictEncoder


def build_encoder(section: str, kind: str, obs_shape: Sequence[int], image: bool,
                  parts: ObsParts = (), hidden: Sequence[int] = (256, 256),
                  activation: str = "relu", cnn_precision: str = "float32", *,
                  standardized: bool = False) -> Encoder | None:
    """The encoder ``kind`` selects for observations of ``obs_shape``, or None where the
    algorithm's MLP takes the flattened observation directly.

    ``auto`` picks the Nature CNN for image observations and the MLP otherwise; ``mlp``
    flattens everything (pixels too, as floats); ``nature_cnn`` insists on the CNN.
    Dict observations (``parts``, ``EnvSpec.obs_parts``) get a :class:`DictEncoder` of
    ``hidden`` units per vector entry unless ``kind`` is ``mlp``, ``standardized`` ones
    (``normalize_obs``) with no entry scaled again. ``cnn_precision`` is the Nature CNN's
    (``<algo>.cnn_precision``).
    """
    if kind not in ENCODERS:
        raise ConfigError(f"{section}.encoder must be one of {list(ENCODERS)}, got {kind!r}")
    if parts and kind != "mlp":
        return DictEncoder(parts, hidden, activation, cnn_precision, standardized=standardized)
    if kind == "mlp" or (kind == "auto" and not image):
        return None
    return NatureCNN(obs_shape, precision=cnn_precision)
