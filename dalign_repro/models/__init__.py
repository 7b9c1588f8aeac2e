"""Models with width as a parameter: LLaMA-style decoders, Pythia's GPT-NeoX shapes, CIFAR ResNets.

May import: torch, torchvision and transformers only; nothing of the library.
"""

from dalign_repro.models.llama import LlamaWidthSpec, build_llama, count_parameters, ffn_width, llama_config
from dalign_repro.models.pythia import build_pythia, pythia_config, pythia_init, pythia_width_variant
from dalign_repro.models.resnet import CifarResNet, residual_block_names, resnet20

__all__ = ["LlamaWidthSpec", "build_llama", "count_parameters", "ffn_width", "llama_config", "build_pythia",
           "pythia_config", "pythia_init", "pythia_width_variant", "CifarResNet", "residual_block_names", "resnet20"]
