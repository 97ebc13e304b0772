#!/usr/bin/env python3
"""transformers' Trainer with Tierd in one line: a small Llama trained for a few steps with and
without tier.hf.TierCallback (activation and optimizer state offload); the losses and the
parameters must be identical, and the run prints what Tierd moved.

    TIER_SOCKET=/path/to/tierd.sock python3 examples/hf_trainer.py [--steps 6]
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

from tier.hf import TierCallback  # noqa: E402


def run(steps, callbacks, cuda):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=8, max_position_embeddings=512,
                                   attn_implementation="eager")  # deterministic backward
    model = transformers.LlamaForCausalLM(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 1024

        def __getitem__(self, i):
            ids = torch.randint(0, 4096, (512,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="tier-hf-"), max_steps=steps,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_steps=1, seed=0, use_cpu=not cuda,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=callbacks)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, {n: p.detach().cpu() for n, p in model.named_parameters()}, peak


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the same kernels both runs
    cuda = torch.cuda.is_available()
    ref_losses, ref_params, ref_peak = run(args.steps, [], cuda)
    cb = TierCallback(activations=True, optimizer_state=True)
    losses, params, peak = run(args.steps, [cb], cuda)
    same = losses == ref_losses and all(torch.equal(ref_params[k], params[k]) for k in params)
    act, opt = cb.offload.stats["activations"], cb.offload.stats["optimizer"][0]
    print("losses without Tierd: %s" % ref_losses)
    print("losses with Tierd:    %s" % losses)
    print("peak GPU memory: %.0f MiB without, %.0f MiB with Tierd" % (ref_peak, peak))
    print("tierd moved: activations %d storages (%.1f MiB), optimizer state %d tensors "
          "(%.1f MiB) over %d steps" % (act.offloaded_storages, act.offloaded_bytes / 2**20,
                                        opt.offloads, opt.offloaded_bytes / 2**20, opt.steps))
    print("hf_trainer: %s" % ("identical" if same else "MISMATCH"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
