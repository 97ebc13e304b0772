"""The trainers users launch, with Tierd turned on in one line, on CPU against a real tierd (host
engine): each trains a few steps with identical losses and parameters to the same trainer
without Tierd.

* transformers' Trainer + tier.hf.TierCallback (a tiny Llama; gradient accumulation 2)
* PyTorch Lightning + tier.lightning.TierCallback
* a torchtune/torchtitan-style recipe: tier.torch.CPUOffloadOptimizer (torchao's name),
  OffloadActivations, and tier.torch.Checkpointer (tierd + a DCP directory)
"""

import copy
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import tier.torch as tt  # noqa: E402

SMALL = dict(min_bytes=256, group_bytes=8 << 10)


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---- transformers ---------------------------------------------------------------------------

def _hf_run(callbacks, outdir):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=outdir, max_steps=3, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, learning_rate=1e-2, report_to=[], save_strategy="no",
        logging_steps=1, use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=callbacks)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, _params(model)


def test_transformers_trainer_with_tier_callback(client, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # (the Trainer needs it)
    from tier.hf import TierCallback
    ref_losses, ref_params = _hf_run([], str(tmp_path / "ref"))
    cb = TierCallback(activations=True, optimizer_state=True, client=client, **SMALL)
    losses, params = _hf_run([cb], str(tmp_path / "tier"))
    assert len(losses) == 3
    assert losses == ref_losses
    _assert_same(params, ref_params)
    stats = cb.offload.stats
    assert stats["activations"].offloaded_storages > 0
    assert stats["optimizer"][0].offloads > 0 and stats["optimizer"][0].steps == 3
    assert cb.offload.optimizer_offloaders == []  # removed at train end: state is back


# ---- Lightning ------------------------------------------------------------------------------

def _lightning():
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning")
    return pl


def _lightning_run(callbacks):
    pl = _lightning()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64),
                                     nn.GELU(), nn.Linear(64, 4))
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach().item())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g),
                                          torch.randn(64, 4, generator=g))
    module = Module()
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks,
                         accumulate_grad_batches=2, deterministic=True)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    return module.losses, _params(module)


def test_lightning_with_tier_callback(client):
    _lightning()
    from tier.lightning import TierCallback
    ref_losses, ref_params = _lightning_run([])
    cb = TierCallback(activations=True, optimizer_state=True, client=client, **SMALL)
    losses, params = _lightning_run([cb])
    assert len(losses) == 8
    assert losses == ref_losses
    _assert_same(params, ref_params)
    assert cb.offload.stats["activations"].offloaded_storages > 0
    assert cb.offload.stats["optimizer"][0].steps == 4


# ---- recipes (torchtune / torchtitan style) --------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(3))
        self.output = nn.Linear(32, 8)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.output(x)


def _recipe_steps(model, opt, steps, act=None, start=0):
    losses = []
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 8, generator=g)
        opt.zero_grad()
        ctx = act if act is not None else tt.no_offload()
        with ctx:
            out = model(x)
        nn.functional.mse_loss(out, y).backward()
        opt.step()
        losses.append(out.detach().sum().item())
    return losses


def test_recipe_cpu_offload_optimizer_and_offload_activations(client):
    torch.manual_seed(0)
    ref = _Net()
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = tt.CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2,
                                 client=client, group_bytes=4 << 10)
    act = tt.get_act_offloading_ctx_manager(model, True, client=client)
    assert _recipe_steps(model, opt, 3, act) == _recipe_steps(ref, ref_opt, 3)
    _assert_same(_params(model), _params(ref))
    assert opt._tier_state_offloader.stats.offloads > 0
    with pytest.raises(ValueError, match="offload_gradients"):
        tt.CPUOffloadOptimizer(model.parameters(), offload_gradients=True)
    # The string form a recipe's config gives
    opt2 = tt.CPUOffloadOptimizer(model.parameters(), "torch.optim.SGD", lr=0.1, momentum=0.9,
                                  client=client)
    assert isinstance(opt2, torch.optim.SGD)
    opt2._tier_state_offloader.remove()
    opt._tier_state_offloader.remove()


def test_recipe_checkpointer_tierd_and_dcp(client, daemon):
    try:
        from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: F401
    except Exception as e:  # noqa: BLE001 - absent, or an old torch's that fails to import
        pytest.skip("needs torch.distributed.checkpoint (torch >= 2.2): %s" % e)
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with tempfile.TemporaryDirectory() as d:
        ckpt = tt.Checkpointer("recipe-test", dcp_dir=d, dcp_every=2, keep=2, client=client)
        saved = {}
        for step in range(1, 4):
            _recipe_steps(model, opt, 1, start=step)
            where = ckpt.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)
            assert where == (["tierd", "dcp"] if step % 2 == 0 else ["tierd"])
            saved[step] = copy.deepcopy(model.state_dict())
        assert ckpt.tierd_steps() == [3, 2]
        assert ckpt.dcp_steps() == [2]

        def scrambled():
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            return {"model": model.state_dict(), "optim": opt.state_dict()}
        state = scrambled()
        assert ckpt.load(state) == 3  # tierd holds the newest
        model.load_state_dict(state["model"])
        for k, v in saved[3].items():
            assert torch.equal(model.state_dict()[k], v), k
        ckpt.delete()  # tierd lost it (a restarted node): DCP's step 2 it is
        state = scrambled()
        assert ckpt.load(state) == 2
        model.load_state_dict(state["model"])
        for k, v in saved[2].items():
            assert torch.equal(model.state_dict()[k], v), k
        assert os.path.isdir(os.path.join(d, "step-2"))
    daemon.wait_host_used(0)
