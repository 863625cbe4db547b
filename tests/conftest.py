"""Shared fixtures: tiny random Hugging Face models with a character tokenizer (no download)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from tests.device import check_test_device, on_test_device
from verispec.models.hf import HFCausalLM
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an accidental hub call fails at once instead of hanging
check_test_device()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and a shared machine stays quiet; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_pair(tokenizer):
    """A tiny target and three drafters: the same weights, unrelated weights, and a perturbed copy (on the test
    device)."""
    vocab = len(tokenizer)
    target = tiny_qwen2(vocab, seed=1)
    models = {"target": target, "same": copy.deepcopy(target), "unrelated": tiny_qwen2(vocab, seed=2),
              "partial": perturb(copy.deepcopy(target), 0.03, seed=3)}
    return {role: HFCausalLM(on_test_device(model), tokenizer, name=f"tiny-{role}") for role, model in models.items()}


@pytest.fixture(scope="session")
def tiny_folder(tiny_pair, tmp_path_factory):
    """The tiny target saved as a model folder, for tests that go through `--target FOLDER` like a user."""
    folder = tmp_path_factory.mktemp("tiny-model") / "target"
    tiny_pair["target"].model.save_pretrained(folder)
    tiny_pair["target"].tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_pair_folders(tiny_pair, tmp_path_factory):
    """The tiny target and its perturbed draft ("partial") saved as model folders with their tokenizer, as a user
    passes models to the command line (--target / --draft); float64 weights."""
    root = tmp_path_factory.mktemp("tiny-pair")
    folders = {}
    for role, key in (("target", "target"), ("draft", "partial")):
        folders[role] = str(root / role)
        tiny_pair[key].model.save_pretrained(folders[role])
        tiny_pair[key].tokenizer.save_pretrained(folders[role])
    return folders
