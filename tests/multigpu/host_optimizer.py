"""AdamW with its state in pinned host memory between steps, moved by the trainer itself under the
same memory bound as tier.torch.offload_optimizer_state: the reference that says what moving an
optimizer's state a group at a time costs a node without tierd (rank_overhead.py's
``inprocess-opt-groups``).

Per step, group by group (about ``group_bytes`` of state each): the copies in of the next
``prefetch`` groups run on a side stream; a group is updated once its copies landed (the current
stream waits on the GPU); its state is copied out on the side stream; before that the host waits
for the copies out of the group two before, so at most 3 + prefetch groups of state are on the
GPU at once, as in tierd's path. AdamW is elementwise per parameter, so the result is the same as
one AdamW over every parameter.
"""

import contextlib

import torch

GROUPS_GOING_OUT = 2


class HostGroupedAdamW:
    def __init__(self, params, device, group_bytes=64 << 20, prefetch=2, lr=1e-4):
        groups, current, size = [], [], 0
        for p in params:
            current.append(p)
            size += 2 * p.numel() * p.element_size()  # exp_avg and exp_avg_sq
            if size >= group_bytes:
                groups.append(current)
                current, size = [], 0
        if current:
            groups.append(current)
        self.opts = [torch.optim.AdamW(g, lr=lr) for g in groups]
        self.device = device
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self.prefetch = prefetch
        self.host = None  # per group: [(state dict, key, host tensor)]

    def zero_grad(self, set_to_none=True):
        for opt in self.opts:
            opt.zero_grad(set_to_none=set_to_none)

    def _on_side(self):
        return torch.cuda.stream(self.side) if self.cuda else contextlib.nullcontext()

    def _event(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.side)
        return event

    def _first_step(self):
        """The state is made on the GPU by a plain step; then it goes out for good."""
        for opt in self.opts:
            opt.step()
        self.host = []
        for opt in self.opts:
            moved = []
            for st in opt.state.values():
                for key, value in st.items():
                    if torch.is_tensor(value) and value.dim() > 0:
                        host = torch.empty_like(value, device="cpu",
                                                pin_memory=self.cuda).copy_(value)
                        st[key] = host
                        moved.append((st, key, host))
            self.host.append(moved)

    def _bring(self, i, arrived):
        if i >= len(self.opts) or i in arrived:
            return
        current = torch.cuda.current_stream(self.device) if self.cuda else None
        gpu = [torch.empty_like(host, device=self.device) for _, _, host in self.host[i]]
        if self.cuda:
            self.side.wait_stream(current)  # (the allocations above are the current stream's)
        with self._on_side():
            for (st, key, host), g in zip(self.host[i], gpu):
                g.copy_(host, non_blocking=True)
                if self.cuda:
                    g.record_stream(self.side)
                st[key] = g
            arrived[i] = self._event()

    def step(self):
        if self.host is None:
            self._first_step()
            return
        arrived, going_out = {}, []
        for i, opt in enumerate(self.opts):
            for j in range(i, i + 1 + self.prefetch):
                self._bring(j, arrived)
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(arrived[i])
            opt.step()
            if len(going_out) >= GROUPS_GOING_OUT:
                out = going_out.pop(0)
                if out is not None:
                    out.synchronize()  # the host waits, as tierd's path does
            if self.cuda:
                self.side.wait_stream(torch.cuda.current_stream(self.device))
            with self._on_side():
                for st, key, host in self.host[i]:
                    host.copy_(st[key], non_blocking=True)
                    st[key] = host  # the GPU copy goes back to the allocator after the side
                going_out.append(self._event())  # stream's copy (record_stream above)
