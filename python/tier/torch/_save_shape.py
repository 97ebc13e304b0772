"""The pack hook of a planned step, indexed by every tensor the step saves.

A plan is by candidate: the n-th saved tensor the offloader could offload. To know a saved
tensor's candidate number the full hook (ActivationOffloader._pack) must first ask whether it is
a candidate at all: its type, size, layout, device, whether it is a parameter. Those are a dozen
tensor attribute reads, about 1.5 us a saved tensor on a fast host and 3-5 us on the device's
(bench/hook_overhead_bench.py, mode kept), paid by every saved tensor although a plan keeps most
of them as they are.

So the step that runs the full hook (calibration, or any step no plan can be indexed for) records
its *shape*: for each saved tensor in order, its candidate number or -1. A planned step after it
reads a table built from that shape and the plan: saved tensor j is returned at once when it was
no candidate or the plan keeps candidate shape[j] as it is (no wrapper, no release point, not the
barrier, not the first candidate, whose save starts the step's timer). Only the others go through
the full hook, told their candidate number.

A step unlike the shape (a table entry that is no candidate now, or another count of saves) keeps
everything from there on and reports a count the plan cannot have (-1), so the policy calibrates
again, as it does when the candidates themselves differ. Kept is always safe: a save the table
returns is one the full hook would have kept.
"""


class SaveShape:
    """The last full step's shape, and the pack hook of each step (:meth:`hook`), ended by
    :meth:`end_step`. Saves returned by the table are counted in ``stats.saved`` and
    ``stats.kept`` when the step ends (its context exits), not one by one."""

    __slots__ = ("_shape", "_candidates", "_plan", "_table", "_end")

    def __init__(self):
        self._shape = None       # per saved tensor of the last full step: candidate number or -1
        self._candidates = 0     # entries >= 0 in _shape
        self._plan = None        # the plan _table was built for
        self._table = None       # bytes: 1 where the planned step returns the save at once
        self._end = None         # the step in progress: its end (see hook)

    def hook(self, off, plan):
        """The pack hook for a step of `off` (an ActivationOffloader) that follows `plan` (None:
        it calibrates): indexed where the plan fits the shape, else the full hook, recording."""
        table = self._table_for(plan) if plan is not None and off._serving else None
        if table is None:
            return self._recording(off)
        return self._indexed(off, plan, table)

    def end_step(self, count):
        """The step's forward is over (its hooks are closed). Returns the candidate count to
        report for it: `count` (the full hook's own) for a full step; for an indexed step, the
        plan's count if it saved as the shape did, else -1."""
        end, self._end = self._end, None
        return end(count) if end is not None else count

    def _table_for(self, plan):
        if self._shape is None or self._candidates != plan.count:
            return None
        if plan is not self._plan:
            plain = plan.plain
            self._table = bytes(1 if s < 0 or plain[s] else 0 for s in self._shape)
            self._plan = plan
        return self._table

    def _recording(self, off):
        pack = off._pack
        sites = []

        def recording(tensor):
            site = off._site
            out = pack(tensor)
            sites.append(site if off._site != site else -1)
            return out

        def end(count):
            self._shape = sites
            self._candidates = sum(1 for s in sites if s >= 0)
            self._plan = self._table = None
            return count

        self._end = end
        recording.offloader = off  # (compiled graphs find the offloader by its hook: _compile.py)
        return recording

    def _indexed(self, off, plan, table):
        pack = off._pack
        stats = off.stats
        shape = self._shape
        saves = 0      # every save of the step
        slow = 0       # those given to the full hook (counted by it)
        broken = False

        def indexed(tensor):
            nonlocal saves, slow, broken
            j = saves
            saves = j + 1
            try:
                if table[j]:
                    return tensor
            except IndexError:
                broken = True  # more saves than the shape had
            slow += 1  # (counted by the full hook, or below)
            if broken:
                stats.saved += 1
                stats.kept += 1
                return tensor
            site = shape[j]
            off._site = site
            out = pack(tensor)
            if off._site == site:
                broken = True  # no candidate now: the step saves otherwise than the shape
            return out

        def end(count):
            hits = saves - slow
            stats.saved += hits
            stats.kept += hits
            return plan.count if not broken and saves == len(shape) else -1

        self._end = end
        indexed.offloader = off
        return indexed
