"""A counter-based random number: a 32-bit integer hash, so that a draw depends only on what it is for.

The chance diagnostic's random rankings and the interventions' random
controls hash (seed, control, row, head, position) instead of drawing from a
generator: the same document gets the same draw in any batch, on any device,
in any process.
"""

import torch
from jaxtyping import Int
from torch import Tensor

MASK32 = 0xFFFFFFFF


def hash32(x: Int[Tensor, "*shape"]) -> Int[Tensor, "*shape"]:
    """A 32-bit integer mix (lowbias32) of int64 tensors, taken modulo 2^32 first; wraps like uint32.

    >>> hash32(torch.tensor([0, 1, 2])).tolist()
    [0, 1753845952, 3507691905]
    """
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32  # past 2^63 the int64 product wraps, and its low 32 bits stay exact
    return x ^ (x >> 16)
