"""This process's place in a torch.distributed process group, for the checkpoint paths that
every rank calls (tier.torch.dcp, tier.torch.Checkpointer). Without a group: rank 0 of one."""


def process_group():
    """torch.distributed when a process group runs, else None."""
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


def rank():
    dist = process_group()
    return dist.get_rank() if dist is not None else 0


def is_coordinator():
    return rank() == 0


def barrier():
    dist = process_group()
    if dist is not None:
        dist.barrier()


def broadcast_from_coordinator(value):
    """The coordinator's (rank 0's) value on every rank, when a process group runs."""
    dist = process_group()
    if dist is None or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
