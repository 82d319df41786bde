"""The random controls' orders, kept across a control's N and modes within a memory budget per device.

A random control ranks a layer's rows the same way for every N and mode, so
a sweep ranks each (layer, control) once and keeps the order (an int16 per
pattern element) while that control's settings run. The order lives where
the hook computed it, on the device of the layer it belongs to; on a model
split across devices (``device_map``) each device holds only its own
layers' orders, so the budget holds per device, as ``memory_budget_mib``
does for the analysis. An order that would take its device past the budget
is not kept: the hook ranks it again in every pass, with the same result.
"""

from collections.abc import Hashable

import torch
from torch import Tensor


class ControlRankCache:
    """Orders of the random controls by (layer, control, heads, shape), at most ``budget_mib`` MiB on each device.

    Example:
        >>> cache = ControlRankCache(budget_mib=1e-5)  # about 10 bytes per device
        >>> cache.keep((0, 1), torch.zeros(4, dtype=torch.int16))
        True
        >>> cache.keep((1, 1), torch.zeros(4, dtype=torch.int16))  # the CPU's 8 bytes are taken
        False
        >>> cache.get((1, 1)) is None, cache.bytes_on(torch.device("cpu"))
        (True, 8)
    """

    def __init__(self, budget_mib: int | float) -> None:
        self.budget_bytes = budget_mib * 2**20
        self._orders: dict[Hashable, Tensor] = {}
        self._bytes: dict[torch.device, int] = {}

    def get(self, key: Hashable) -> Tensor | None:
        """The kept order of ``key``, or None."""
        return self._orders.get(key)

    def keep(self, key: Hashable, order: Tensor) -> bool:
        """Keep ``order`` (where it is) if its device's kept orders stay within the budget; whether it was kept."""
        size = order.numel() * order.element_size()
        used = self._bytes.get(order.device, 0)
        if key in self._orders or used + size > self.budget_bytes:
            return False
        self._orders[key] = order
        self._bytes[order.device] = used + size
        return True

    def drop_controls_before(self, control: int) -> None:
        """Forget the orders of the controls before ``control`` (the second item of each key): their settings ran."""
        for key in [key for key in self._orders if key[1] < control]:  # type: ignore[index]
            order = self._orders.pop(key)
            self._bytes[order.device] -= order.numel() * order.element_size()

    def bytes_on(self, device: torch.device) -> int:
        """Bytes of the orders kept on ``device``."""
        return self._bytes.get(torch.device(device), 0)

    def __len__(self) -> int:
        return len(self._orders)
