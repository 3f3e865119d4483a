"""Where a Loader's run is: takes what its passes report (a batch served, an epoch's last batch, a pass left
early, a restored state, set_epoch), gives the (epoch, start) the next pass serves and the position a state
saves.

Three positions can say where the next pass starts, in this order: a restored state (`load_state_dict`), the
start of a pass left early (its epoch is served again, from where that pass started), else the next epoch
from its start. The saved position is the epoch being served and the samples of its order consumed; after
an epoch's last batch it still reads that epoch, all consumed, until the pass ends, then the next epoch at 0.
"""
from __future__ import annotations


class Cursor:
    """A Loader's position over its epochs (see the module's docstring)."""

    def __init__(self) -> None:
        self.next_epoch = 0  # the epoch a fresh pass serves
        self.restored: tuple[int, int] | None = None  # (epoch, samples consumed) a restored state starts from
        self.left: tuple[int, int] | None = None  # (epoch, start) of a pass left early, served again next
        self.position = (0, 0)  # (epoch, samples of its order consumed), as state_dict reports it
        self.restored_len: int | None = None  # len() while a restored epoch is served (Loader.__len__)

    def begin(self) -> tuple[int, int]:
        """(epoch, start position) of the pass about to be served; the position moves there.

        Returns:
            A restored position, else where the last pass left early had started, else the next epoch's start.
        """
        pending = self.restored or self.left
        self.restored = self.left = None
        epoch, start = pending if pending is not None else (self.next_epoch, 0)
        self.position = (epoch, start)
        return epoch, start

    def served(self, epoch: int, position: int, last: bool) -> None:
        """A batch is about to be served: the position moves past it (`position`: samples of the epoch's
        order consumed after it); after the epoch's `last` batch the next pass serves the next epoch."""
        self.position = (epoch, position)
        if last:
            self.next_epoch = epoch + 1

    def finished(self, epoch: int) -> None:
        """The pass over `epoch` ended after its last batch: the next epoch from its start, whole epochs on."""
        self.next_epoch, self.position, self.restored_len = epoch + 1, (epoch + 1, 0), None

    def leave(self, epoch: int, start: int) -> None:
        """The pass over `epoch` that began at `start` ended early: unless its last batch was served, the
        next pass serves it again from `start`."""
        if self.next_epoch == epoch:
            self.left = (epoch, start)

    def restore(self, epoch: int, consumed: int, restored_len: int | None) -> None:
        """A saved state: the next pass serves the rest of `epoch` after `consumed` samples of its order."""
        self.restored, self.position, self.next_epoch = (epoch, consumed), (epoch, consumed), epoch
        self.left, self.restored_len = None, restored_len

    def set_epoch(self, epoch: int) -> tuple[int, int] | None:
        """The next pass serves `epoch` from its start, unless a restored state is in that epoch (kept).

        Returns:
            The restored (epoch, consumed) this drops, if any (the caller warns), else None.
        """
        if self.restored is not None and self.restored[0] == epoch:
            return None  # the loop names the epoch the restored state is in: serve the rest of it
        dropped = self.restored
        self.next_epoch, self.restored, self.position, self.restored_len, self.left = epoch, None, (epoch, 0), None, None
        return dropped

    def saved(self) -> tuple[int, int]:
        """(epoch, samples consumed) as a state saves it: a restored position not yet served, else where the run is."""
        return self.restored or self.position
