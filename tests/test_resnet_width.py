"""The ResNet-20 family: SGD recipe, bitwise resume with augmentation, the accuracy floor, and a smoke sweep."""

import copy
import math
from dataclasses import replace

import pandas as pd
import pytest
import torch

from dalign_repro.experiments import resnet_width
from dalign_repro.families import resnet as resnet_family
from dalign_repro.sweep.family import Splits
from dalign_repro.models.resnet import resnet20
from dalign_repro.training.checkpoints import list_checkpoints, load_weights
from dalign_repro.training.loop import TrainConfig, train


def _images(n=48, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    images = (torch.rand(n, 3, 32, 32, generator=g) * 255).to(torch.uint8)
    return images, labels


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class _Interrupt(Exception):
    pass


def test_sgd_step_schedule_divides_the_rate_at_the_milestones():
    config = TrainConfig(steps=200, lr=0.1, optimizer="sgd", schedule="step", milestones=(0.5, 0.75))
    assert [config.lr_at(s) for s in (0, 99, 100, 149, 150, 199)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    with pytest.raises(ValueError, match="fractions"):
        TrainConfig(steps=10, schedule="step", milestones=(100,))
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(steps=10, optimizer="lion")


def test_new_training_fields_leave_old_fingerprints_unchanged():
    """Checkpoints written before the optimizer fields existed must still resume under the defaults."""
    default = TrainConfig(steps=5).fingerprint()
    assert not {"optimizer", "momentum", "schedule", "milestones", "gamma"} & set(default)
    sgd = TrainConfig(steps=5, optimizer="sgd", schedule="step", milestones=(0.5,)).fingerprint()
    assert sgd["optimizer"] == "sgd" and sgd["milestones"] == [0.5]


def test_fractional_width_multiplier_builds_the_stated_channels():
    model = resnet20(0.5, num_classes=10)
    assert model.conv1.out_channels == 8 and model.fc.in_features == 32
    assert sum(p.numel() for p in resnet20(1, 10).parameters()) == 269_722  # He et al.: 0.27M
    with pytest.raises(ValueError, match="whole number"):
        resnet20(0.3)


@pytest.mark.parametrize("channels_last", [False, True])
def test_resume_with_augmentation_is_bitwise_identical(tmp_path, channels_last):
    family = resnet_family.ResNetFamily(augment=True)
    data = _images()

    def config(folder):
        return TrainConfig(steps=6, batch_size=8, lr=0.05, optimizer="sgd", schedule="step", milestones=(0.5,),
                           grad_clip=None, weight_decay=1e-4, checkpoint_every=3, checkpoint_steps=(0, 6),
                           checkpoint_dir=str(tmp_path / folder), progress=False)

    torch.manual_seed(1)
    full = resnet20(0.25, num_classes=4, channels_last=channels_last)
    train(full, data, config("full"), loss_fn=family.train_loss)

    calls = {"n": 0}

    def dies_at_step_5(model, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise _Interrupt
        return family.train_loss(model, batch)

    torch.manual_seed(1)
    with pytest.raises(_Interrupt):
        train(resnet20(0.25, num_classes=4, channels_last=channels_last), data, config("part"),
              loss_fn=dies_at_step_5)
    assert list(list_checkpoints(tmp_path / "part", resumable=True)) == [3]
    torch.manual_seed(99)  # the resumed run restores the generator state of step 3, whatever it is now
    fresh = resnet20(0.25, num_classes=4, channels_last=channels_last)
    result = train(fresh, data, config("part"), loss_fn=family.train_loss)
    assert result.resumed_from == 3 and _same(fresh, full)


def test_channels_last_is_the_same_model_in_another_memory_order(tmp_path):
    """NHWC weights and activations: the same state dict, the same outputs and gradients to float precision, and
    checkpoints that load into either order; the sweep keys its checkpoints by the order (the weights it trains
    differ at float precision)."""
    torch.manual_seed(3)
    nchw = resnet20(0.5, num_classes=4)
    torch.manual_seed(3)
    nhwc = resnet20(0.5, num_classes=4, channels_last=True)
    assert nhwc.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert not nhwc.conv1.weight.is_contiguous()
    assert _same(nchw, nhwc)  # the same draws, stored in another order
    images, labels = _images(n=8)
    # In float64, where the kernels' summation order cannot hide a wrong stride: a training-mode float32 backward
    # through BatchNorm over 8 images amplifies rounding to 1e-2 relative in the first stages, in either order.
    inputs = images.double() / 255
    pair = [copy.deepcopy(m).double() for m in (nchw, nhwc)]
    assert pair[1].layer2[0].conv1.weight.is_contiguous(memory_format=torch.channels_last)
    losses = [torch.nn.functional.cross_entropy(m(inputs), labels) for m in pair]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-12, atol=0)
    for loss in losses:
        loss.backward()
    for (name, a), b in zip(pair[0].named_parameters(), pair[1].parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)

    config = TrainConfig(steps=1, batch_size=8, lr=0.05, optimizer="sgd", grad_clip=None, checkpoint_steps=(1,),
                         checkpoint_dir=str(tmp_path / "nhwc"), progress=False)
    train(nhwc, (images, labels), config, loss_fn=resnet_width.FAMILY.train_loss)
    back = load_weights(resnet20(0.5, num_classes=4), list_checkpoints(tmp_path / "nhwc")[1])
    assert _same(back, nhwc) and back.conv1.weight.is_contiguous()

    from dalign_repro.sweep.trained import checkpoint_root
    config = resnet_width.Config.for_profile("smoke")
    roots = {checkpoint_root(replace(config, channels_last=flag), resnet_width.FAMILY) for flag in (False, True)}
    assert len(roots) == 2


def test_augment_crops_and_flips_within_the_padding():
    images = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).view(2, 1, 8, 8)
    torch.manual_seed(0)
    out = resnet_family.augment(images, padding=2)
    assert out.shape == images.shape
    # every output pixel is an input pixel of the same image, or zero padding
    for i in range(2):
        assert set(out[i].flatten().tolist()) <= set(images[i].flatten().tolist()) | {0.0}


def test_accuracy_floor_and_baseline():
    family = resnet_width.FAMILY
    config = resnet_width.Config.for_profile("smoke")
    assert family.failure(config, 1.0, 2.3, {"test_accuracy": 0.9}) == ""
    assert "below the floor" in family.failure(config, 1.0, 2.3, {"test_accuracy": 0.2})
    assert "does not beat" in family.failure(config, 2.4, 2.3, {"test_accuracy": 0.9})
    labels = torch.tensor([0, 0, 0, 1])
    splits = Splits(train=(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), labels), validation=None, test=None,
                    unit="images", summary={"num_classes": 2})
    # add-one class frequencies 4/6 and 2/6, scored on labels [0, 1]
    expected = -(math.log(4 / 6) + math.log(2 / 6)) / 2
    assert family.baseline(splits, (None, torch.tensor([0, 1])), config) == pytest.approx(expected)


def test_one_pass_evaluation_equals_the_loss_and_the_accuracy(monkeypatch):
    family, config = resnet_width.FAMILY, resnet_width.Config.for_profile("smoke")
    model = resnet20(0.25, num_classes=3).eval()
    g = torch.Generator().manual_seed(0)
    examples = (torch.randint(0, 256, (10, 3, 32, 32), generator=g, dtype=torch.uint8), torch.arange(10) % 3)
    passes = []
    monkeypatch.setattr(model, "forward", lambda x, _f=model.forward: passes.append(len(x)) or _f(x))
    loss, quality = family.evaluate(model, examples, config)
    assert sum(passes) == 10  # every image once
    assert loss == family.heldout_metric(model, examples, config)
    assert quality == family.quality(model, examples, config)


def test_smoke_sweep_on_synthetic_images(tmp_path, monkeypatch):
    monkeypatch.setenv("DALIGN_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DALIGN_CACHE", str(tmp_path / "cache"))
    config = resnet_width.Config.for_profile("smoke", widths=(4, 8, 12), steps=10, checkpoint_steps=(0, 5, 10),
                                             lr_candidates=(0.05,), resamples=200)
    out = resnet_width.run(config, out_dir=tmp_path / "results")
    runs = pd.read_csv(out / "resnet_runs.csv")
    geometry = pd.read_csv(out / "resnet_geometry.csv")
    trend = pd.read_csv(out / "resnet_trend.csv")
    assert {"dataset", "test_accuracy"} <= set(runs.columns) and {"dataset", "test_accuracy"} <= set(geometry.columns)
    assert set(runs.dataset) == {"synthetic"} and len(runs) == 3 * config.seeds
    assert set(geometry.layer) == {f"layer{s}.{b}" for s in (1, 2, 3) for b in range(3)}
    # the shared q at a block has its stage's channel count; the judged, per-position q every pixel's too
    final = geometry[(geometry.step == 10) & (geometry.width == 8)]
    shared, full = final[final.reduction == "shared"], final[final.reduction == "full"]
    assert dict(shared.groupby("layer").d.first()) == {f"layer{s}.{b}": 8 * 2 ** (s - 1) for s in (1, 2, 3)
                                                       for b in range(3)}
    side = {1: 32, 2: 16, 3: 8}  # synthetic 32x32 images, halved by each stage after the first
    assert dict(full.groupby("layer").d.first()) == {f"layer{s}.{b}": 8 * 2 ** (s - 1) * side[s] ** 2
                                                     for s in (1, 2, 3) for b in range(3)}
    redundancy = pd.read_csv(out / "resnet_redundancy.csv")
    assert set(redundancy.reduction) == {"full", "shared"} and (redundancy.layer == config.insertion_block).all()
    assert runs.test_accuracy.between(0, 1).all()
    failed = runs[~runs.trained_ok]
    assert all(isinstance(f, str) and f for f in failed.failure)
    assert "dataset" in trend.columns or trend.empty
