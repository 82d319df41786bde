"""The most bytes of tensors alive at once inside a block: a device-agnostic peak-memory count for tests.

Every tensor an ATen operation returns inside the block is counted by its
storage (views and in-place results share their input's storage and add
nothing) until the last tensor holding that storage is gone. What it does not
see: tensors made before the block (they are not working memory) and a
kernel's internal scratch space (a sort's or an FFT's), which no Python code
controls.
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...`` then ``live.peak``: the most bytes alive at once, of tensors made inside."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._holders: dict[int, int] = {}  # storage address -> live tensors holding it
        self._sizes: dict[int, int] = {}
        self._before: set[int] = set()  # storages of the operations' inputs (made before, or already counted)

    def _release(self, address: int) -> None:
        self._holders[address] -= 1
        if self._holders[address] == 0:
            self.current -= self._sizes.pop(address)
            del self._holders[address]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            address = storage.data_ptr()
            if address in self._holders:
                self._holders[address] += 1
            elif address in inputs or storage.nbytes() == 0:
                continue  # a view or an in-place result of a tensor made before the block
            else:
                self._holders[address] = 1
                self._sizes[address] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            weakref.finalize(t, self._release, address)
        return out
